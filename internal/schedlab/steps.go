package schedlab

import (
	corev1 "k8s.io/api/core/v1"
)

// Step is a group of a job's pods that its controller creates at once,
// after the step before it is bound (Ready, no kubelet here) or, with
// Complete, has succeeded.
type Step struct {
	Pods []*corev1.Pod
	// Complete: the step's pods must succeed before the next is created.
	Complete bool
}

// StepShape is a controller shape whose pods come in steps, and how.
type StepShape struct {
	*Shape
	Steps func(j *Job) ([]Step, error)
}

// StepShapes are the controllers that create a job's pods in steps (the
// citations are in analyze/steps.go): a TrainJob whose runtime has
// dataset and model initializers (trainer v2.2.0 runtimes: node
// dependsOn them, status Complete); a JobSet whose workers dependsOn its
// leader, status Ready (jobset v0.11.1); an MPIJob v2beta1 with
// launcherCreationPolicy WaitForWorkersReady (mpi-operator v0.8.0); a
// RayJob whose submitter Job comes once its cluster is ready (KubeRay).
func StepShapes() []*StepShape {
	byRJob := func(order ...string) func(j *Job) ([]Step, error) {
		return func(j *Job) ([]Step, error) {
			coords, workers, _, err := j.Pods()
			if err != nil {
				return nil, err
			}
			var steps []Step
			for _, rj := range order {
				s := Step{Complete: rj == "initializers"}
				for _, p := range append(append([]*corev1.Pod(nil), coords...), workers...) {
					name := p.Labels["jobset.sigs.k8s.io/replicatedjob-name"]
					if name == rj || (rj == "initializers" && (name == "dataset-initializer" || name == "model-initializer")) {
						s.Pods = append(s.Pods, p)
					}
				}
				steps = append(steps, s)
			}
			return steps, nil
		}
	}

	tj := trainJob()
	tj.Name = "TrainJob with initializers"
	tj.runtime = initializerRuntime

	js := jobSet()
	js.Name = "JobSet dependsOn Ready"
	base := js.manifest
	js.manifest = func(name string, sz Size) map[string]any {
		m := base(name, sz)
		rjs := Dig(m, "spec")["replicatedJobs"].([]any)
		rjs[1].(map[string]any)["dependsOn"] = []any{map[string]any{"name": "leader", "status": "Ready"}}
		return m
	}

	mpi := mpiV2()
	mpi.Name = "MPIJob WaitForWorkersReady"
	mpiBase := mpi.manifest
	mpi.manifest = func(name string, sz Size) map[string]any {
		m := mpiBase(name, sz)
		Dig(m, "spec")["launcherCreationPolicy"] = "WaitForWorkersReady"
		return m
	}

	ray := rayJob()
	ray.Name = "RayJob with submitter"
	rayPods := ray.pods
	ray.pods = func(j *Job) (coords, workers []*corev1.Pod, owners []map[string]any, err error) {
		coords, workers, owners, err = rayPods(j)
		if err != nil {
			return nil, nil, nil, err
		}
		// KubeRay's submitter Job "<rayjob>" (rayjob_controller.go
		// createNewK8sJob), its pod with the RayJob's labels (as in
		// topology's identity test).
		sub, err := newPod(j, j.Name+"-s9x2k", podTemplate("ray-job-submitter", false, Size{CoordCPU: "500m", CoordMem: "200Mi"}, "Never"),
			map[string]string{"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": j.Name, "app.kubernetes.io/created-by": "kuberay-operator",
				"batch.kubernetes.io/job-name": j.Name, "job-name": j.Name}, nil, ownerRef("batch/v1", "Job", j.Name))
		if err != nil {
			return nil, nil, nil, err
		}
		owners = append(owners, ownerObject("batch/v1", "Job", j.Namespace, j.Name, ownerRef("ray.io/v1", "RayJob", j.Name)))
		return coords, append(workers, sub), owners, nil
	}

	return []*StepShape{
		{Shape: tj, Steps: byRJob("initializers", "node")},
		{Shape: js, Steps: byRJob("leader", "workers")},
		{Shape: mpi, Steps: func(j *Job) ([]Step, error) {
			coords, workers, _, err := j.Pods()
			return []Step{{Pods: workers}, {Pods: coords}}, err
		}},
		{Shape: ray, Steps: func(j *Job) ([]Step, error) {
			coords, workers, _, err := j.Pods()
			if err != nil {
				return nil, err
			}
			cluster := append([]*corev1.Pod(nil), coords...)
			var sub []*corev1.Pod
			for _, p := range workers {
				if p.Labels["ray.io/node-type"] == "" {
					sub = append(sub, p)
				} else {
					cluster = append(cluster, p)
				}
			}
			return []Step{{Pods: cluster}, {Pods: sub}}, nil
		}},
	}
}

// initializerRuntime is the torch runtime with Trainer's dataset and model
// initializers before the nodes (trainer v2.2.0
// manifests/base/runtimes/torchtune: dependsOn, status Complete).
func initializerRuntime(sz Size) map[string]any {
	rt := torchRuntime(sz)
	initJob := func(name string) map[string]any {
		return map[string]any{"name": name, "replicas": 1, "template": map[string]any{"spec": map[string]any{
			"parallelism": 1, "completions": 1, "completionMode": "Indexed", "template": podTemplate(name, false, sz, "Never")}}}
	}
	node := rt["replicatedJobs"].([]any)[0].(map[string]any)
	node["dependsOn"] = []any{map[string]any{"name": "dataset-initializer", "status": "Complete"}, map[string]any{"name": "model-initializer", "status": "Complete"}}
	rt["replicatedJobs"] = []any{initJob("dataset-initializer"), initJob("model-initializer"), node}
	return rt
}

// ManyPodSetShapes are jobs of three pod sets, each of its own shape (a
// Kueue pod group makes a pod set of each shape): a TFJob with a Chief, 2
// parameter servers and workers; a RayJob with two worker groups; a
// JobSet of three replicated jobs. Their GPUs are the workers' of Size,
// split over two pod sets where a shape has two.
func ManyPodSetShapes() []*Shape {
	half := func(sz Size) Size {
		sz.WorkerGPUs /= 2
		sz.WorkerCPU = "3"
		return sz
	}
	tf := kubeflow("TFJob Chief + PS + Worker", "TFJob", "kubeflow.org/v1", "tfReplicaSpecs", "Chief", "tfjob-controller")
	tfBase := tf.manifest
	tf.manifest = func(name string, sz Size) map[string]any {
		m := tfBase(name, sz)
		ps := map[string]any{"spec": map[string]any{"restartPolicy": "OnFailure", "containers": []any{container("tensorflow", "3", "12Gi", 0)}}}
		Dig(m, "spec", "tfReplicaSpecs")["PS"] = map[string]any{"replicas": 2, "restartPolicy": "OnFailure", "template": ps}
		return m
	}

	ray := rayJob()
	ray.Name = "RayJob with two worker groups"
	rayBase := ray.manifest
	ray.manifest = func(name string, sz Size) map[string]any {
		m := rayBase(name, sz)
		rc := Dig(m, "spec", "rayClusterSpec")
		g := rc["workerGroupSpecs"].([]any)[0].(map[string]any)
		g["replicas"] = sz.Workers / 2
		rc["workerGroupSpecs"] = append(rc["workerGroupSpecs"].([]any), map[string]any{"groupName": "gpu-half", "replicas": sz.Workers,
			"template": podTemplate("ray-worker", true, half(sz), "Always")})
		return m
	}

	js := jobSet()
	js.Name = "JobSet of three replicated jobs"
	jsBase := js.manifest
	js.manifest = func(name string, sz Size) map[string]any {
		m := jsBase(name, sz)
		spec := Dig(m, "spec")
		rjs := spec["replicatedJobs"].([]any)
		w := rjs[1].(map[string]any)
		jobSpec := Dig(w, "template", "spec")
		jobSpec["parallelism"], jobSpec["completions"] = sz.Workers/2, sz.Workers/2
		spec["replicatedJobs"] = append(rjs, map[string]any{"name": "workers-half", "replicas": 1, "template": map[string]any{"spec": map[string]any{
			"parallelism": sz.Workers, "completions": sz.Workers, "completionMode": "Indexed", "template": podTemplate("worker", true, half(sz), "Never")}}})
		return m
	}
	return []*Shape{tf, ray, js}
}
