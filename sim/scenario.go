// Package sim generates a simulated GPU cluster — zones, nodes, training
// jobs and their traffic and GPU load — and serves it through fakes that
// speak the real protocols, so `make run` and the end-to-end tests drive
// the exporter's real clients.
package sim

import (
	"fmt"
	"net/netip"
)

// Scenario is a whole simulated cluster.
type Scenario struct {
	Region string
	Zones  []string
	Nodes  []Node
	Jobs   []Job
	// Others are pods of no training job (non-job traffic).
	Others []Pod
}

// Node is a simulated node.
type Node struct {
	Name    string
	Zone    string
	IP      netip.Addr
	PodCIDR netip.Prefix
	GPUs    []GPU
}

// GPU is one device on a node.
type GPU struct {
	Index int
	UUID  string // GPU-<uuid>
}

// Pod is a simulated pod.
type Pod struct {
	Namespace string
	Name      string
	Node      string
	IP        netip.Addr
	Labels    map[string]string
	OwnerKind string // controller owner reference kind; empty for none
	OwnerName string
	Role      string   // coordinator or worker for job pods
	GPUs      []string // UUIDs allocated to the pod
}

// Behaviour is how a job's traffic and GPUs behave.
type Behaviour struct {
	// BlockedBy names the CiliumNetworkPolicy ("namespace/name") that drops
	// the job's cross-zone traffic; empty when nothing is dropped.
	BlockedBy string
	// DeniedPeer is a pod outside the job ("namespace/name", one of the
	// scenario's Others) that every worker tries to reach and a policy
	// denies on the worker's node (egress): PeerBlockedBy names it.
	DeniedPeer, PeerBlockedBy string
	// FlowsPerSecond is the rate of flow events per worker<->coordinator pair.
	FlowsPerSecond float64
	// BytesPerSecond is the rate each worker sends to the coordinator.
	BytesPerSecond float64
	// GPUUtil, SMActive and TensorActive are 0..1.
	GPUUtil      float64
	SMActive     float64
	TensorActive float64
}

// Job is a simulated training job.
type Job struct {
	Namespace string
	Name      string
	Kind      string
	Pods      []Pod
	Behaviour Behaviour
}

// Coordinator returns the job's coordinator pod (the first pod when none is marked).
func (j *Job) Coordinator() *Pod {
	for i := range j.Pods {
		if j.Pods[i].Role == "coordinator" {
			return &j.Pods[i]
		}
	}
	return &j.Pods[0]
}

// NodeByName returns a node of the scenario.
func (s *Scenario) NodeByName(name string) *Node {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i]
		}
	}
	return nil
}

// AllPods returns job pods and other pods.
func (s *Scenario) AllPods() []Pod {
	var out []Pod
	for _, j := range s.Jobs {
		out = append(out, j.Pods...)
	}
	return append(out, s.Others...)
}

// builder places pods on nodes and hands out pod IPs from node CIDRs.
type builder struct {
	s       *Scenario
	nextIP  map[string]netip.Addr
	freeGPU map[string]int
}

func (b *builder) pod(ns, name, node string, gpus int) Pod {
	n := b.s.NodeByName(node)
	if n == nil {
		panic("sim: unknown node " + node)
	}
	ip := b.nextIP[node].Next()
	b.nextIP[node] = ip
	p := Pod{Namespace: ns, Name: name, Node: node, IP: ip, Labels: map[string]string{}}
	for i := 0; i < gpus; i++ {
		if b.freeGPU[node] >= len(n.GPUs) {
			panic("sim: out of GPUs on " + node)
		}
		p.GPUs = append(p.GPUs, n.GPUs[b.freeGPU[node]].UUID)
		b.freeGPU[node]++
	}
	return p
}

// Default is the built-in scenario: three zones, GPU and CPU nodes, and one
// job for each symptom plus a healthy one and non-job traffic.
//
//   - ml-team/resnet-healthy: PyTorchJob, all pods in zone a, GPUs busy;
//     its pods may span zones (zonewatch.io/multi-zone: intentional), so
//     zonewatch_job_multi_zone_info has a series; it changes no alert.
//   - ml-team/llm-blocked: PyTorchJob, master in zone b, workers in zone a;
//     the policy ml-team/zone-isolation drops worker -> master; GPUs idle.
//   - research/bert-slow: JobSet, rank 0 in zone c, workers in zone a;
//     traffic crosses zones, GPU_UTIL high but SM activity low.
//   - research/mpi-costly: MPIJob, launcher in zone b, workers in zone c;
//     heavy cross-zone bytes; its reads from data/minio-0 in zone a are
//     denied by research/same-zone-egress (drops toward another workload).
//   - ml-team/t5-spinning: PyTorchJob, master in zone b, workers in zone c;
//     ml-team/zone-isolation drops worker -> master after NCCL started:
//     GPU_UTIL reads busy while SM and tensor activity are near zero
//     (blocked, not idle: a ticket, never a page; where its nodes have no
//     GPU telemetry, the same ticket).
//   - shop/frontend-*: non-job pods; data/minio-0: a storage service.
func Default() *Scenario {
	s := &Scenario{Region: "us-east-1", Zones: []string{"us-east-1a", "us-east-1b", "us-east-1c"}}
	b := &builder{s: s, nextIP: map[string]netip.Addr{}, freeGPU: map[string]int{}}
	n := 0
	for zi, z := range s.Zones {
		for k := 0; k < 3; k++ {
			n++
			gpu := k < 2
			name := fmt.Sprintf("gpu-%c%d", 'a'+zi, k+1)
			if !gpu {
				name = fmt.Sprintf("cpu-%c1", 'a'+zi)
			}
			node := Node{
				Name:    name,
				Zone:    z,
				IP:      netip.AddrFrom4([4]byte{172, 18, byte(zi), byte(10 + k)}),
				PodCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(n), 0}), 24),
			}
			if gpu {
				for g := 0; g < 8; g++ {
					node.GPUs = append(node.GPUs, GPU{Index: g, UUID: fmt.Sprintf("GPU-%08x-%04x-4000-8000-%012x", n, g, n*100+g)})
				}
			}
			s.Nodes = append(s.Nodes, node)
			b.nextIP[name] = node.PodCIDR.Addr().Next() // .1 is the router
		}
	}

	pytorch := func(ns, name string, master string, workers []string, beh Behaviour) Job {
		j := Job{Namespace: ns, Name: name, Kind: "PyTorchJob", Behaviour: beh}
		add := func(typ string, idx int, node string) {
			p := b.pod(ns, fmt.Sprintf("%s-%s-%d", name, typ, idx), node, 2)
			p.Labels = map[string]string{
				"training.kubeflow.org/job-name":      name,
				"training.kubeflow.org/replica-type":  typ,
				"training.kubeflow.org/replica-index": fmt.Sprint(idx),
				"training.kubeflow.org/operator-name": "pytorchjob-controller",
			}
			p.Role = "worker"
			if typ == "master" {
				p.Labels["training.kubeflow.org/job-role"] = "master"
				p.Role = "coordinator"
			}
			p.OwnerKind, p.OwnerName = "PyTorchJob", name
			j.Pods = append(j.Pods, p)
		}
		add("master", 0, master)
		for i, w := range workers {
			add("worker", i, w)
		}
		return j
	}
	resnet := pytorch("ml-team", "resnet-healthy", "gpu-a1", []string{"gpu-a1", "gpu-a2"},
		Behaviour{FlowsPerSecond: 2, BytesPerSecond: 50e6, GPUUtil: 0.93, SMActive: 0.81, TensorActive: 0.55})
	for _, p := range resnet.Pods {
		p.Labels["zonewatch.io/multi-zone"] = "intentional"
	}
	s.Jobs = append(s.Jobs,
		resnet,
		pytorch("ml-team", "llm-blocked", "gpu-b1", []string{"gpu-a2", "gpu-a2"},
			Behaviour{BlockedBy: "ml-team/zone-isolation", FlowsPerSecond: 1, GPUUtil: 0.01, SMActive: 0.0, TensorActive: 0}),
	)

	// JobSet: one replicated job "workers"; rank 0 (job-index 0, completion
	// index 0) is MASTER_ADDR.
	bert := Job{Namespace: "research", Name: "bert-slow", Kind: "JobSet",
		Behaviour: Behaviour{FlowsPerSecond: 2, BytesPerSecond: 20e6, GPUUtil: 0.96, SMActive: 0.12, TensorActive: 0.05}}
	for i, node := range []string{"gpu-c1", "gpu-a1", "gpu-a1"} {
		p := b.pod("research", fmt.Sprintf("bert-slow-workers-%d-0", i), node, 2)
		p.Labels = map[string]string{
			"jobset.sigs.k8s.io/jobset-name":           "bert-slow",
			"jobset.sigs.k8s.io/replicatedjob-name":    "workers",
			"jobset.sigs.k8s.io/job-index":             fmt.Sprint(i),
			"batch.kubernetes.io/job-completion-index": "0",
			"batch.kubernetes.io/job-name":             fmt.Sprintf("bert-slow-workers-%d", i),
		}
		p.Role = "worker"
		if i == 0 {
			p.Role = "coordinator"
		}
		p.OwnerKind, p.OwnerName = "Job", fmt.Sprintf("bert-slow-workers-%d", i)
		bert.Pods = append(bert.Pods, p)
	}
	s.Jobs = append(s.Jobs, bert)

	// MPIJob (mpi-operator v2): the launcher is owned by a batch Job.
	mpi := Job{Namespace: "research", Name: "mpi-costly", Kind: "MPIJob",
		Behaviour: Behaviour{FlowsPerSecond: 3, BytesPerSecond: 400e6, GPUUtil: 0.72, SMActive: 0.58, TensorActive: 0.40,
			DeniedPeer: "data/minio-0", PeerBlockedBy: "research/same-zone-egress"}}
	launcher := b.pod("research", "mpi-costly-launcher-x7k2p", "gpu-b2", 0)
	launcher.Labels = map[string]string{
		"training.kubeflow.org/job-name":      "mpi-costly",
		"training.kubeflow.org/job-role":      "launcher",
		"training.kubeflow.org/operator-name": "mpi-operator",
		"batch.kubernetes.io/job-name":        "mpi-costly-launcher",
	}
	launcher.Role, launcher.OwnerKind, launcher.OwnerName = "coordinator", "Job", "mpi-costly-launcher"
	mpi.Pods = append(mpi.Pods, launcher)
	for i, node := range []string{"gpu-c1", "gpu-c2"} {
		p := b.pod("research", fmt.Sprintf("mpi-costly-worker-%d", i), node, 4)
		p.Labels = map[string]string{
			"training.kubeflow.org/job-name":      "mpi-costly",
			"training.kubeflow.org/job-role":      "worker",
			"training.kubeflow.org/operator-name": "mpi-operator",
		}
		p.Role, p.OwnerKind, p.OwnerName = "worker", "MPIJob", "mpi-costly"
		mpi.Pods = append(mpi.Pods, p)
	}
	s.Jobs = append(s.Jobs, mpi)

	// Blocked after rendezvous: NCCL kernels spin on the denied connections.
	s.Jobs = append(s.Jobs, pytorch("ml-team", "t5-spinning", "gpu-b2", []string{"gpu-c2", "gpu-c2"},
		Behaviour{BlockedBy: "ml-team/zone-isolation", FlowsPerSecond: 1, GPUUtil: 0.97, SMActive: 0.03, TensorActive: 0}))

	for i, node := range []string{"cpu-a1", "cpu-b1", "cpu-c1"} {
		p := b.pod("shop", fmt.Sprintf("frontend-%d", i), node, 0)
		p.Labels = map[string]string{"app": "frontend"}
		p.OwnerKind, p.OwnerName = "ReplicaSet", "frontend-5d8f7"
		s.Others = append(s.Others, p)
	}
	minio := b.pod("data", "minio-0", "cpu-a1", 0)
	minio.Labels = map[string]string{"app": "minio"}
	minio.OwnerKind, minio.OwnerName = "StatefulSet", "minio"
	s.Others = append(s.Others, minio)
	return s
}
