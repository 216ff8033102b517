package trainlab_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/internal/kubeapi"
	"github.com/zonewatch/zonewatch/internal/schedlab"
	"github.com/zonewatch/zonewatch/internal/trainlab"
	"github.com/zonewatch/zonewatch/topology"
)

// TestRealMPIAndRay (issue 43 items 1-2) is TestRealControllers for the
// MPI Operator v0.8.0 and KubeRay v1.6.0, in a bed of their own (the MPI
// Operator's v2beta1 MPIJob CRD and training-operator's v1 mpijobs share
// a name). ShapeMPIJob holds schedlab's hand-written MPIJob v2beta1 pods
// to the operator's.
func TestRealMPIAndRay(t *testing.T) {
	bed := trainlab.Start(t)
	bed.StartMPIOperator(t)
	bed.StartKubeRay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v := watchBed(ctx, t, bed)
	t.Run("MPIJob", func(t *testing.T) { v.t = t; mpiJob(ctx, v) })
	t.Run("RayCluster", func(t *testing.T) { v.t = t; rayCluster(ctx, v) })
	t.Run("RayJob", func(t *testing.T) { v.t = t; rayJob(ctx, v) })
	// The last MPIJob shape is v2beta1 (schedlab's mpiV2). KubeRay's pods
	// are not compared: their names are random, not a Job's.
	t.Run("ShapeMPIJob", func(t *testing.T) { v.t = t; handWritten(ctx, v, "MPIJob", mpiDesc) })
}

// watchBed adds four nodes in two zones to the bed and runs the exporter's
// live feed into a topology index on it, as TestRealControllers does.
func watchBed(ctx context.Context, t *testing.T, bed *trainlab.Bed) *viewer {
	t.Helper()
	var nodes []schedlab.Node
	for _, z := range []string{"a", "b"} {
		for i := 1; i <= 2; i++ {
			nodes = append(nodes, schedlab.Node{Name: fmt.Sprintf("node-%s%d", z, i), Zone: "zone-" + z, CPU: "32", Memory: "256Gi", GPUs: 8})
		}
	}
	if err := bed.AddNodes(ctx, nodes...); err != nil {
		t.Fatal(err)
	}
	meta, err := metadata.NewForConfig(bed.API.Config)
	if err != nil {
		t.Fatal(err)
	}
	idx := topology.NewIndex()
	live, fs, err := kube.NewLive(kubeapi.NewForConfigOrDie(bed.API.Config), idx, topology.DefaultRules(), 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	live.WithOwners(meta, kubeapi.NewForConfigOrDie(bed.API.Config))
	if err := live.Run(ctx, fs); err != nil {
		t.Fatal(err)
	}
	return &viewer{t: t, bed: bed, idx: idx}
}

// mpiJob: an MPIJob v2beta1 of a launcher and two workers
// (launcherCreationPolicy AtStartup, cleanPodPolicy None: the workers stay
// after the launcher finished). The launcher (a batch Job "pi-launcher"
// owned by the MPIJob; its pod carries job-role=launcher and no
// replica-index) is the coordinator while it runs.
//
// The identity question of issue 43: once the launcher succeeded (the
// MPIJob is Succeeded, its workers still running under cleanPodPolicy
// None), worker-0 becomes the job's coordinator: the Kubeflow rule's
// rank-0 guess (replica-index 0 of type worker) applies as soon as no
// running pod is a coordinator by label. On MPI that is a misnomer (the
// workers only ran sshd for mpirun; nothing coordinates a finished job),
// but it matters little: the job is done and its workers are idle.
func mpiJob(ctx context.Context, v *viewer) {
	const ns = "mpi"
	v.namespace(ctx, ns)
	tmpl := func(name string) map[string]any {
		return map[string]any{"spec": map[string]any{
			"containers": []any{map[string]any{"name": name, "image": "registry.example.com/mpi:1"}},
		}}
	}
	v.create(ctx, trainlab.MPIJobGVR, map[string]any{
		"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": map[string]any{"name": "pi", "namespace": ns},
		"spec": map[string]any{
			"slotsPerWorker": 1,
			"runPolicy":      map[string]any{"cleanPodPolicy": "None"},
			"mpiReplicaSpecs": map[string]any{
				"Launcher": map[string]any{"replicas": 1, "restartPolicy": "Never", "template": tmpl("launcher")},
				"Worker":   map[string]any{"replicas": 2, "template": tmpl("worker")},
			},
		},
	})
	desc := mpiDesc
	v.want(ctx, ns, desc, "MPIJob/pi launcher=coordinator worker-0=worker worker-1=worker")
	v.owner(ctx, jobGVR, ns, "pi-launcher", "MPIJob/pi")
	v.owner(ctx, podGVR, ns, "pi-worker-0", "MPIJob/pi")

	v.exit(ctx, v.running(ctx, ns, desc, "launcher"), 0)
	v.want(ctx, ns, desc, mpiAfterLauncher)

	v.delete(ctx, trainlab.MPIJobGVR, ns, "pi")
	v.gone(ctx, ns, "pi")
}

// mpiAfterLauncher is the view of the MPIJob once its launcher succeeded:
// worker-0 is the coordinator (the rank-0 guess, see mpiJob).
const mpiAfterLauncher = "MPIJob/pi worker-0=coordinator worker-1=worker"

func mpiDesc(p *corev1.Pod) string {
	d := p.Labels["training.kubeflow.org/job-role"]
	if i, ok := p.Labels["training.kubeflow.org/replica-index"]; ok {
		d += "-" + i
	}
	return d
}

// rayTemplate is a Ray node's pod template.
func rayTemplate() map[string]any {
	return map[string]any{"spec": map[string]any{
		"containers": []any{map[string]any{"name": "ray", "image": "registry.example.com/ray:2.40.0"}},
	}}
}

func rayClusterSpec(groups ...map[string]any) map[string]any {
	ws := []any{}
	for _, g := range groups {
		g["rayStartParams"] = map[string]any{}
		g["template"] = rayTemplate()
		ws = append(ws, g)
	}
	return map[string]any{
		"rayVersion":       "2.40.0",
		"headGroupSpec":    map[string]any{"rayStartParams": map[string]any{}, "template": rayTemplate()},
		"workerGroupSpecs": ws,
	}
}

// rayCluster: a RayCluster of a head and two worker groups (two GPU
// workers, one CPU worker); the head coordinates. A worker deleted is
// re-created by KubeRay (a new name: the view names pods by group).
func rayCluster(ctx context.Context, v *viewer) {
	const ns = "ray"
	v.namespace(ctx, ns)
	v.create(ctx, trainlab.RayClusterGVR, map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": map[string]any{"name": "rc", "namespace": ns},
		"spec": rayClusterSpec(
			map[string]any{"groupName": "gpu", "replicas": 2, "minReplicas": 0, "maxReplicas": 2},
			map[string]any{"groupName": "cpu", "replicas": 1, "minReplicas": 0, "maxReplicas": 1}),
	})
	desc := rayDesc
	all := "RayCluster/rc head/headgroup=coordinator worker/cpu=worker worker/gpu=worker worker/gpu=worker"
	v.want(ctx, ns, desc, all)
	failed := v.pod(ns, desc, "worker/cpu")
	zero := int64(0)
	if err := v.bed.Client.CoreV1().Pods(ns).Delete(ctx, failed.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		v.t.Fatal(err)
	}
	v.want(ctx, ns, desc, all)
	v.replaced(ctx, ns, desc, "worker/cpu", failed)

	v.delete(ctx, trainlab.RayClusterGVR, ns, "rc")
	v.gone(ctx, ns, "rc")
}

// rayJob: a RayJob (K8sJobMode) with a cluster of a head and one worker.
// KubeRay creates the cluster, and the submitter (a batch Job named after
// the RayJob) only once the cluster is ready (the kubelet stand-in makes
// its pods Ready).
//
// KubeRay v1.6.0 puts the ray.io/originated-from-* labels on the
// RayCluster and the submitter Job objects, not on any pod (asserted
// below, from the real objects): the cluster's pods carry ray.io/cluster
// of "rj-<random>", the submitter's pod only the Job controller's
// job-name labels, and neither names the RayJob. The exporter finds it
// through the owners (pod -> RayCluster -> RayJob; pod -> Job "rj" ->
// RayJob): the submitter is one more worker of the RayJob while it runs
// (its zone is the job's too), in the cluster-wide view and in every
// node's per-node view; once it finished it is left out.
func rayJob(ctx context.Context, v *viewer) {
	const ns = "rayjob"
	v.namespace(ctx, ns)
	views := nodeViews(ctx, v)
	// The cluster in zone a, the submitter in zone b: one job of two zones.
	spec := rayClusterSpec(map[string]any{"groupName": "small", "replicas": 1, "minReplicas": 0, "maxReplicas": 1})
	inZone(spec["headGroupSpec"].(map[string]any)["template"].(map[string]any), "zone-a")
	inZone(spec["workerGroupSpecs"].([]any)[0].(map[string]any)["template"].(map[string]any), "zone-a")
	submitterPod := map[string]any{"spec": map[string]any{"restartPolicy": "Never",
		"containers": []any{map[string]any{"name": "ray-job-submitter", "image": "registry.example.com/ray:2.40.0"}}}}
	inZone(submitterPod, "zone-b")
	v.create(ctx, trainlab.RayJobGVR, map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": map[string]any{"name": "rj", "namespace": ns},
		"spec": map[string]any{
			"entrypoint":           "python -c 'print(1)'",
			"rayClusterSpec":       spec,
			"submitterPodTemplate": submitterPod,
		},
	})
	desc := rayDesc
	cluster := "RayJob/rj head/headgroup=coordinator worker/small=worker"
	submitter := v.running(ctx, ns, desc, "submitter")
	v.want(ctx, ns, desc, "RayJob/rj head/headgroup=coordinator submitter=worker worker/small=worker")
	v.owner(ctx, jobGVR, ns, "rj", "RayJob/rj")
	v.originatedFrom(ctx, jobGVR, ns, "rj", true)
	v.originatedFrom(ctx, podGVR, ns, submitter.Name, false)
	for _, p := range v.runningPods(ns) {
		v.originatedFrom(ctx, podGVR, ns, p.Name, false)
	}
	rcs, err := v.bed.Dyn.Resource(trainlab.RayClusterGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(rcs.Items) != 1 {
		v.t.Fatalf("RayClusters of the RayJob: %v, %v", rcs, err)
	}
	v.originatedFrom(ctx, trainlab.RayClusterGVR, ns, rcs.Items[0].GetName(), true)
	v.zonesOfPods(ctx, ns, "rj")
	if jp, _ := placementOf(v.idx, ns, "rj"); !slices.Equal(jp.Zones, []string{"zone-a", "zone-b"}) {
		v.t.Errorf("RayJob rj placed in %v, want zone-a (its cluster) and zone-b (its submitter)", jp.Zones)
	}
	v.sameOnNodes(ctx, ns, "rj", views)

	v.exit(ctx, submitter, 0)
	v.want(ctx, ns, desc, cluster)
	v.sameOnNodes(ctx, ns, "rj", views)

	v.delete(ctx, trainlab.RayJobGVR, ns, "rj")
	v.gone(ctx, ns, "rj")
}

// inZone pins a pod template to a zone (a node selector).
func inZone(tmpl map[string]any, zone string) {
	tmpl["spec"].(map[string]any)["nodeSelector"] = map[string]any{"topology.kubernetes.io/zone": zone}
}

// originatedFrom checks whether an object carries KubeRay's
// ray.io/originated-from-crd=RayJob and originated-from-cr-name labels.
func (v *viewer) originatedFrom(ctx context.Context, gvr schema.GroupVersionResource, ns, name string, want bool) {
	v.t.Helper()
	u, err := v.bed.Dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		v.t.Fatal(err)
	}
	l := u.GetLabels()
	got := l["ray.io/originated-from-crd"] == "RayJob" && l["ray.io/originated-from-cr-name"] != ""
	if got != want || (!want && (l["ray.io/originated-from-crd"] != "" || l["ray.io/originated-from-cr-name"] != "")) {
		v.t.Errorf("%s %s/%s labels %v: originated-from labels %v, want %v", gvr.Resource, ns, name, l, got, want)
	}
}

// runningPods are the namespace's running pods.
func (v *viewer) runningPods(ns string) []*corev1.Pod {
	pods, _ := v.bed.Pods(ns)
	var out []*corev1.Pod
	for _, p := range pods {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// zonesOfPods waits until the exporter places the job in the zones of
// the nodes of the namespace's running pods, each pod in its node's zone.
func (v *viewer) zonesOfPods(ctx context.Context, ns, job string) {
	v.t.Helper()
	nodes, err := v.bed.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		v.t.Fatal(err)
	}
	zone := map[string]string{}
	for _, n := range nodes.Items {
		zone[n.Name] = n.Labels["topology.kubernetes.io/zone"]
	}
	v.until(ctx, func() (bool, string) {
		var want, pods []string
		for _, p := range v.runningPods(ns) {
			want = append(want, zone[p.Spec.NodeName])
			pods = append(pods, p.Name+"@"+zone[p.Spec.NodeName])
		}
		slices.Sort(want)
		want = slices.Compact(want)
		slices.Sort(pods)
		jp, _ := placementOf(v.idx, ns, job)
		var got []string
		for _, pp := range jp.Pods {
			got = append(got, pp.Pod+"@"+pp.Zone)
		}
		slices.Sort(got)
		return slices.Equal(jp.Zones, want) && slices.Equal(got, pods),
			fmt.Sprintf("job %s/%s placed in %v as %v, want %v as %v", ns, job, jp.Zones, got, want, pods)
	})
}

// nodeViews runs the exporter's per-node view (kube.NewLocal with the
// owner informers, as the DaemonSet runs it) on each of the bed's nodes.
func nodeViews(ctx context.Context, v *viewer) map[string]*topology.Index {
	v.t.Helper()
	nodes, err := v.bed.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		v.t.Fatal(err)
	}
	meta, err := metadata.NewForConfig(v.bed.API.Config)
	if err != nil {
		v.t.Fatal(err)
	}
	views := map[string]*topology.Index{}
	for _, n := range nodes.Items {
		idx := topology.NewIndex()
		l, fs, err := kube.NewLocal(kubeapi.NewForConfigOrDie(v.bed.API.Config), idx, topology.DefaultRules(), n.Name, 0, slog.New(slog.DiscardHandler))
		if err != nil {
			v.t.Fatal(err)
		}
		l.WithOwners(meta, kubeapi.NewForConfigOrDie(v.bed.API.Config))
		if err := l.Run(ctx, fs); err != nil {
			v.t.Fatal(err)
		}
		views[n.Name] = idx
	}
	return views
}

// sameOnNodes waits until each node's per-node view places the job as the
// cluster-wide view does (pods, roles, nodes, zones) where the job has a
// placed pod on the node.
func (v *viewer) sameOnNodes(ctx context.Context, ns, job string, views map[string]*topology.Index) {
	v.t.Helper()
	v.until(ctx, func() (bool, string) {
		wide, ok := placementOf(v.idx, ns, job)
		if !ok {
			return false, fmt.Sprintf("job %s/%s not placed cluster-wide", ns, job)
		}
		want := placed(wide)
		for node, idx := range views {
			here := slices.ContainsFunc(wide.Pods, func(p topology.PodPlacement) bool { return p.Node == node })
			jp, ok := placementOf(idx, ns, job)
			if here && (!ok || placed(jp) != want) {
				return false, fmt.Sprintf("node %s places %s/%s as %q, the cluster-wide view as %q", node, ns, job, placed(jp), want)
			}
		}
		return true, ""
	})
}

// placementOf is the index's placement of a job.
func placementOf(idx *topology.Index, ns, job string) (topology.JobPlacement, bool) {
	for _, jp := range idx.Placements("") {
		if jp.Job.Namespace == ns && jp.Job.Name == job {
			return jp, true
		}
	}
	return topology.JobPlacement{}, false
}

// placed writes a placement down: kind, zones, and each pod's name, role,
// node and zone, sorted.
func placed(jp topology.JobPlacement) string {
	var ps []string
	for _, p := range jp.Pods {
		ps = append(ps, p.Pod+"="+p.Role+"@"+p.Node+"/"+p.Zone)
	}
	slices.Sort(ps)
	return jp.Job.Kind + " " + strings.Join(jp.Zones, ",") + " " + strings.Join(ps, " ")
}

// rayDesc names a Ray pod "<node type>/<group>", the submitter "submitter".
func rayDesc(p *corev1.Pod) string {
	if t := p.Labels["ray.io/node-type"]; t != "" {
		return t + "/" + p.Labels["ray.io/group"]
	}
	return "submitter"
}

// TestRealTrainer (issue 43 items 1-2): TestRealControllers for Kubeflow
// Trainer v2.2.0, which runs a TrainJob as a JobSet (JobSet v0.11.1 in the
// same bed).
func TestRealTrainer(t *testing.T) {
	bed := trainlab.Start(t)
	bed.StartJobSet(t)
	bed.StartTrainer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v := watchBed(ctx, t, bed)
	trainJob(ctx, v)
}

// trainJob: a TrainJob of two nodes on a ClusterTrainingRuntime written in
// the shape of upstream's (manifests/base/runtimes/torchtune): a dataset
// and a model initializer, then the trainer nodes, which depend on both
// having completed (JobSet's dependsOn). While the initializers run they
// are the job, neither a coordinator; once both succeeded the nodes are
// created and node 0 (rank 0) coordinates; the finished initializers are
// left out.
func trainJob(ctx context.Context, v *viewer) {
	const ns = "trainer"
	v.namespace(ctx, ns)
	step := func(name, ancestor string) map[string]any {
		return map[string]any{"name": name, "template": map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"trainer.kubeflow.org/trainjob-ancestor-step": ancestor}},
			"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": name, "image": "registry.example.com/" + name + ":1"}},
			}}},
		}}
	}
	node := step("node", "trainer")
	node["dependsOn"] = []any{
		map[string]any{"name": "dataset-initializer", "status": "Complete"},
		map[string]any{"name": "model-initializer", "status": "Complete"},
	}
	v.create(ctx, trainlab.ClusterTrainingRuntimeGVR, map[string]any{
		"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
		"metadata": map[string]any{"name": "trainlab-torch", "labels": map[string]any{"trainer.kubeflow.org/framework": "torch"}},
		"spec": map[string]any{
			"mlPolicy": map[string]any{"numNodes": 1, "torch": map[string]any{}},
			"template": map[string]any{"spec": map[string]any{"replicatedJobs": []any{
				step("dataset-initializer", "dataset-initializer"), step("model-initializer", "model-initializer"), node,
			}}},
		},
	})
	v.create(ctx, trainlab.TrainJobGVR, map[string]any{
		"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": map[string]any{"name": "tj", "namespace": ns},
		"spec": map[string]any{
			"runtimeRef":  map[string]any{"name": "trainlab-torch"},
			"initializer": map[string]any{"dataset": map[string]any{"storageUri": "hf://example/data"}, "model": map[string]any{"storageUri": "hf://example/model"}},
			"trainer":     map[string]any{"numNodes": 2},
		},
	})
	desc := jobSetDesc
	v.want(ctx, ns, desc, "TrainJob/tj dataset-initializer-0-0=worker model-initializer-0-0=worker")
	v.owner(ctx, trainlab.JobSetGVR, ns, "tj", "TrainJob/tj")
	v.exit(ctx, v.running(ctx, ns, desc, "dataset-initializer-0-0"), 0)
	v.want(ctx, ns, desc, "TrainJob/tj model-initializer-0-0=worker")
	v.exit(ctx, v.running(ctx, ns, desc, "model-initializer-0-0"), 0)
	v.want(ctx, ns, desc, "TrainJob/tj node-0-0=coordinator node-0-1=worker")

	v.delete(ctx, trainlab.TrainJobGVR, ns, "tj")
	v.gone(ctx, ns, "tj")
}

// TestRealTrainingOperator (issue 43 items 1-2): TestRealControllers for
// the Kubeflow Training Operator v1.9.3's PyTorchJob and TFJob, in a bed
// of its own (its v1 mpijobs CRD).
func TestRealTrainingOperator(t *testing.T) {
	bed := trainlab.Start(t)
	bed.StartTrainingOperator(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v := watchBed(ctx, t, bed)
	t.Run("PyTorchJob", func(t *testing.T) {
		v.t = t
		kubeflowV1(ctx, v, trainlab.PyTorchJobGVR, "PyTorchJob", "pytorchReplicaSpecs", []string{"Master", "Worker"},
			"PyTorchJob/pt master-0=coordinator worker-0=worker worker-1=worker", "master-0")
	})
	t.Run("TFJob", func(t *testing.T) {
		v.t = t
		kubeflowV1(ctx, v, trainlab.TFJobGVR, "TFJob", "tfReplicaSpecs", []string{"Chief", "PS", "Worker"},
			"TFJob/tf chief-0=coordinator ps-0=worker worker-0=worker worker-1=worker", "chief-0")
	})
}

// kubeflowV1: a Kubeflow v1 job of one replica of each type but two
// workers (restartPolicy Never: the kubelet stand-in ends pods, it does
// not restart containers; cleanPodPolicy Running). The master or chief
// (job-role=master) coordinates; once it succeeded the job succeeded and
// the operator deletes the pods still running: no pod of it is placed
// (its finished coordinator stays until the job is deleted).
func kubeflowV1(ctx context.Context, v *viewer, gvr schema.GroupVersionResource, kind, field string, types []string, all, coordinator string) {
	ns := strings.ToLower(kind)
	name := map[string]string{"PyTorchJob": "pt", "TFJob": "tf"}[kind]
	v.namespace(ctx, ns)
	specs := map[string]any{}
	for _, rt := range types {
		n := 1
		if rt == "Worker" {
			n = 2
		}
		specs[rt] = map[string]any{"replicas": n, "restartPolicy": "Never", "template": map[string]any{"spec": map[string]any{
			"containers": []any{map[string]any{"name": map[string]string{"PyTorchJob": "pytorch", "TFJob": "tensorflow"}[kind], "image": "registry.example.com/train:1"}},
		}}}
	}
	v.create(ctx, gvr, map[string]any{
		"apiVersion": "kubeflow.org/v1", "kind": kind, "metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"runPolicy": map[string]any{"cleanPodPolicy": "Running"}, field: specs},
	})
	desc := kubeflowDesc
	v.want(ctx, ns, desc, all)
	v.owner(ctx, podGVR, ns, name+"-worker-1", kind+"/"+name)

	v.exit(ctx, v.running(ctx, ns, desc, coordinator), 0)
	// The workers deleted, the coordinator finished: nothing is placed.
	v.want(ctx, ns, desc)
	v.delete(ctx, gvr, ns, name)
	v.gone(ctx, ns, name)
}

// kubeflowDesc names a Training Operator pod "<replica type>-<index>".
func kubeflowDesc(p *corev1.Pod) string {
	return p.Labels["training.kubeflow.org/replica-type"] + "-" + p.Labels["training.kubeflow.org/replica-index"]
}

// running waits until the live pod that desc names d runs (the kubelet
// stand-in has seen it: Kubelet.Exit ends only running pods) and returns it.
func (v *viewer) running(ctx context.Context, ns string, desc func(*corev1.Pod) string, d string) *corev1.Pod {
	v.t.Helper()
	var p *corev1.Pod
	v.until(ctx, func() (bool, string) {
		p = v.live(ns, desc, d)
		return p != nil && p.Status.Phase == corev1.PodRunning, fmt.Sprintf("no running pod %s in %s: %s", d, ns, v.pods(ns, desc))
	})
	return p
}
