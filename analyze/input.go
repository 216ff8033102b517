package analyze

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/collector/gpu"
	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/topology"
)

// kubeFile is a kubectl dump as a JSON stream: the file itself, or its
// YAML documents converted one by one (kubectl get -o yaml).
type kubeFile struct {
	path string
	json []byte
	// docLine is the first line of each YAML document; nil for JSON.
	docLine []int
}

func readKubeFile(what, path string) (*kubeFile, error) {
	if path == "" {
		return nil, fmt.Errorf("no %s file given", what)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	f := &kubeFile{path: path, json: b}
	if t := bytes.TrimSpace(b); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		return f, nil
	}
	f.json = nil
	f.docLine = []int{}
	for _, d := range yamlDocuments(b) {
		j, err := yaml.YAMLToJSON(d.text)
		if err != nil {
			return nil, fmt.Errorf("%s:%s", path, yamlLine(err, d.line))
		}
		if t := bytes.TrimSpace(j); len(t) == 0 || string(t) == "null" {
			continue // only comments
		}
		f.json = append(append(f.json, j...), '\n')
		f.docLine = append(f.docLine, d.line)
	}
	return f, nil
}

type yamlDoc struct {
	text []byte
	line int // of its first line
}

// yamlDocuments splits a YAML stream at "---" lines (as kubectl and
// apimachinery do), keeping each document's first line for errors.
func yamlDocuments(b []byte) []yamlDoc {
	var docs []yamlDoc
	cur := yamlDoc{line: 1}
	for n, line := range bytes.SplitAfter(b, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("---")) {
			docs = append(docs, cur)
			cur = yamlDoc{line: n + 2}
			continue
		}
		cur.text = append(cur.text, line...)
	}
	return append(docs, cur)
}

var yamlLineRE = regexp.MustCompile(`line (\d+):`)

// yamlLine renders a YAML error as "LINE: message", the line counted
// from the start of the file rather than of the document.
func yamlLine(err error, first int) string {
	msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
	if m := yamlLineRE.FindStringSubmatchIndex(msg); m != nil {
		n, _ := strconv.Atoi(msg[m[2]:m[3]])
		return fmt.Sprintf("%d: %s", first+n-1, strings.Join(strings.Fields(msg[:m[0]]+msg[m[1]:]), " "))
	}
	return fmt.Sprintf("%d: %s", first, msg)
}

var documentRE = regexp.MustCompile(`^document (\d+)`)

// wrap names the file and, where it can, the line of a loader error: the
// line of a JSON syntax error, the first line of a YAML document.
func (f *kubeFile) wrap(err error) error {
	var syn *json.SyntaxError
	if f.docLine == nil && errors.As(err, &syn) && syn.Offset > 0 && int(syn.Offset) <= len(f.json) {
		line := 1 + bytes.Count(f.json[:syn.Offset-1], []byte("\n"))
		return fmt.Errorf("%s:%d: %w", f.path, line, err)
	}
	if m := documentRE.FindStringSubmatch(err.Error()); m != nil && f.docLine != nil {
		if n, _ := strconv.Atoi(m[1]); n >= 1 && n <= len(f.docLine) {
			return fmt.Errorf("%s:%d: %w", f.path, f.docLine[n-1], err)
		}
	}
	return fmt.Errorf("%s: %w", f.path, err)
}

// nodeInfo is what the suggested fix needs of a node and the index does
// not keep.
type nodeInfo struct {
	zone   string
	gpu    bool
	taints []corev1.Taint // NoSchedule and NoExecute only
	// What roomByZone needs: a node that is not Ready or is cordoned
	// takes no pod.
	labels               map[string]string
	allocatable          corev1.ResourceList
	ready, unschedulable bool
}

func loadNodes(index *topology.Index, path string) (map[string]nodeInfo, error) {
	f, err := readKubeFile("nodes", path)
	if err != nil {
		return nil, err
	}
	if _, err := kube.LoadNodes(index, bytes.NewReader(f.json)); err != nil {
		return nil, f.wrap(err)
	}
	nodes := map[string]nodeInfo{}
	err = kube.DecodeObjects(bytes.NewReader(f.json), "Node", func(raw json.RawMessage) error {
		var n corev1.Node
		if err := json.Unmarshal(raw, &n); err != nil {
			return err
		}
		// A dump without conditions (hand-written) is taken as Ready.
		info := nodeInfo{gpu: isGPUNode(&n), labels: n.Labels, allocatable: n.Status.Allocatable, unschedulable: n.Spec.Unschedulable, ready: true}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				info.ready = c.Status == corev1.ConditionTrue
			}
		}
		info.zone, _, _ = index.NodeZone(n.Name)
		for _, t := range n.Spec.Taints {
			if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
				info.taints = append(info.taints, t)
			}
		}
		nodes[n.Name] = info
		return nil
	})
	if err != nil {
		return nil, f.wrap(err)
	}
	return nodes, nil
}

// isGPUNode: NVIDIA GPUs in the node's capacity (whole or MIG: the
// resource names the GPU collector matches), or the GPU operator's
// feature label.
func isGPUNode(n *corev1.Node) bool {
	if n.Labels["nvidia.com/gpu.present"] == "true" {
		return true
	}
	for _, list := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
		for name, q := range list {
			if (gpu.ResourceFilter{}).Match(string(name)) && !q.IsZero() {
				return true
			}
		}
	}
	return false
}

// jobPods is what the suggested fix needs of a job's pods (every pod,
// pending ones too) that the index does not keep.
type jobPods struct {
	// selector is the label that names the job (the matching rule's).
	selector string
	// replicas maps each raw replica type to whether it coordinates.
	replicas map[string]bool
	// rayGroups are the worker group names of a RayCluster.
	rayGroups []string
	// set is the object the job is a group of (a LeaderWorkerSet).
	set string
	// explicit: some pod coordinates by name or label; guesses are the
	// rank-0 guesses, which count only without one.
	explicit bool
	guesses  []string // replica types
	// demand is every unfinished pod of the job, pending ones too.
	demand []podDemand
	// done is every finished pod of the job: a step that ended (a
	// TrainJob's initializer) is made again when the job is re-created.
	done []podDemand
	// seen counts the pods of each replica type, finished ones too.
	seen map[string]int
	// kueuePreferred: some pod asks Kueue TAS for a preferred (not a
	// required) topology: Kueue may have admitted it across zones.
	kueuePreferred bool
	// jobSet is the job's JobSet (a TrainJob's too) when the dump holds
	// it: whether its replicated jobs start in steps.
	jobSet *jobSetSpec
	// submitter is a RayJob's submitter container as its pod ran it
	// (name, image, resources), headImage its head's image: the
	// advice's submitterPodTemplate is made of them.
	submitter *corev1.Container
	headImage string
}

// podSet is what loadPods reads: each job's pods, and what every
// unfinished pod bound to a node requests there (every pod of the dump,
// not only job pods: they all take room).
type podSet struct {
	jobs map[jobKey]*jobPods
	used map[string]corev1.ResourceList
	// podGroups: the dump holds a PodGroup with a topology constraint.
	podGroups bool
}

func loadPods(index *topology.Index, rules []topology.Rule, path string) (*podSet, error) {
	f, err := readKubeFile("pods", path)
	if err != nil {
		return nil, err
	}
	// Owner objects in the same dump (kubectl get pods,jobs,jobsets,rayclusters)
	// resolve top owners as the exporter's owner informers do.
	owners, err := kube.LoadOwners(bytes.NewReader(f.json))
	if err != nil {
		return nil, f.wrap(err)
	}
	if _, _, err := kube.LoadPods(index, rules, owners, bytes.NewReader(f.json)); err != nil {
		return nil, f.wrap(err)
	}
	jobs := map[jobKey]*jobPods{}
	used := map[string]corev1.ResourceList{}
	err = kube.DecodeObjects(bytes.NewReader(f.json), "Pod", func(raw json.RawMessage) error {
		var pod corev1.Pod
		if err := json.Unmarshal(raw, &pod); err != nil {
			return err
		}
		// A finished pod holds no room (the scheduler does not count it)
		// and is not placed (the index does not count it); its replica
		// type still names a template of the manifest.
		finished := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
		req := podRequests(&pod)
		if pod.Spec.NodeName != "" && !finished {
			used[pod.Spec.NodeName] = addList(used[pod.Spec.NodeName], req)
		}
		p := kube.PodWithOwners(rules, owners, &pod)
		if p.Identity.Name == "" || pod.DeletionTimestamp != nil {
			return nil
		}
		k := jobKey{p.Namespace, p.Identity.Name}
		j := jobs[k]
		if j == nil {
			j = &jobPods{replicas: map[string]bool{}, seen: map[string]int{}, set: p.Identity.Set}
			for _, r := range rules {
				if pod.Labels[r.NameLabel] != "" {
					j.selector = r.NameLabel
					break
				}
			}
			jobs[k] = j
		}
		d := podDemand{replicaType: p.Identity.ReplicaType, requests: req, gpus: gpuCount(req),
			tolerations: pod.Spec.Tolerations, nodeSelector: pod.Spec.NodeSelector, node: pod.Spec.NodeName}
		if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
			d.required = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
		}
		if !finished {
			j.demand = append(j.demand, d)
		} else {
			j.done = append(j.done, d)
		}
		j.seen[p.Identity.ReplicaType]++
		if pod.Annotations[KueuePreferredTopologyAnnotation] != "" && pod.Annotations[KueueTopologyAnnotation] == "" {
			j.kueuePreferred = true
		}
		coord := p.Identity.Role == topology.RoleCoordinator
		if _, ok := j.replicas[p.Identity.ReplicaType]; !ok {
			j.replicas[p.Identity.ReplicaType] = false
		}
		switch {
		case coord && p.Identity.Guess:
			// Decided below: a rank-0 guess yields to a coordinator by name
			// or label, as in the index.
			j.guesses = append(j.guesses, p.Identity.ReplicaType)
		case coord:
			j.explicit = true
			j.replicas[p.Identity.ReplicaType] = true
		}
		if p.Identity.Kind == "RayJob" && len(pod.Spec.Containers) > 0 {
			c := &pod.Spec.Containers[0]
			switch p.Identity.ReplicaType {
			case "head":
				j.headImage = c.Image
			case rayJobSubmitter:
				j.submitter = &corev1.Container{Name: c.Name, Image: c.Image, Resources: c.Resources}
			}
		}
		if g := pod.Labels["ray.io/group"]; g != "" && !coord && !slices.Contains(j.rayGroups, g) {
			j.rayGroups = append(j.rayGroups, g)
		}
		return nil
	})
	if err != nil {
		return nil, f.wrap(err)
	}
	// The dump need not hold PodGroups at all (a single Pod, a List of
	// pods): only PodGroups, alone or in a List, are looked at.
	served := false
	for dec := json.NewDecoder(bytes.NewReader(f.json)); ; {
		var doc struct {
			Kind  string            `json:"kind"`
			Items []json.RawMessage `json:"items"`
		}
		var raw json.RawMessage
		if dec.Decode(&raw) != nil || json.Unmarshal(raw, &doc) != nil {
			break // the pod decode above already reported a malformed dump
		}
		if doc.Kind == "PodGroup" {
			served = served || servesPodGroups(raw)
		}
		for _, item := range doc.Items {
			var ik struct {
				Kind string `json:"kind"`
			}
			if json.Unmarshal(item, &ik) == nil && ik.Kind == "PodGroup" {
				served = served || servesPodGroups(item)
			}
		}
	}
	for _, j := range jobs {
		if j.headImage != "" && j.submitter == nil {
			// A RayJob whose submitter is not created yet (KubeRay makes
			// it once the cluster is ready): KubeRay v1.6.0's default
			// one (common.GetDefaultSubmitterContainer), which the
			// advice must hold to the zone as well.
			c := defaultRaySubmitter(j.headImage)
			j.submitter = &c
			j.replicas[rayJobSubmitter] = false
			j.done = append(j.done, podDemand{replicaType: rayJobSubmitter, requests: c.Resources.Requests})
		}
	}
	// JobSets in the dump (kubectl get pods,jobsets) say whether their
	// replicated jobs start in steps; a dump without them is no error.
	_ = kube.DecodeObjects(bytes.NewReader(f.json), "JobSet", func(raw json.RawMessage) error {
		ns, name, js, err := decodeJobSet(raw)
		if err == nil {
			if j := jobs[jobKey{ns, name}]; j != nil {
				j.jobSet = js
			}
		}
		return nil
	})
	for _, j := range jobs {
		if j.explicit {
			continue
		}
		for _, rt := range j.guesses {
			j.replicas[rt] = true
		}
	}
	return &podSet{jobs: jobs, used: used, podGroups: served}, nil
}
