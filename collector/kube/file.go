package kube

import (
	"encoding/json"
	"fmt"
	"github.com/zonewatch/zonewatch/topology"
	"io"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// fileSource is the feed source number used for pods read from files.
const fileSource = 63

// LoadNodes reads `kubectl get nodes -o json` output (a List, a NodeList
// or a single Node) into the index and returns how many were read.
func LoadNodes(index *topology.Index, r io.Reader) (int, error) {
	var n int
	err := decodeObjects(r, "Node", func(raw json.RawMessage) error {
		var node corev1.Node
		if err := json.Unmarshal(raw, &node); err != nil {
			return err
		}
		index.UpsertNode(NodeFrom(&node))
		n++
		return nil
	})
	return n, err
}

// LoadPods reads `kubectl get pods -o json` output into the index, keeping
// the pods that rules identify as job pods, each with its top owner
// resolved through owners (LoadOwners of the same dump, for one; nil: the
// pods' own owner references). It returns pods read and job pods kept.
func LoadPods(index *topology.Index, rules []topology.Rule, owners topology.Owners, r io.Reader) (read, kept int, err error) {
	err = decodeObjects(r, "Pod", func(raw json.RawMessage) error {
		var pod corev1.Pod
		if err := json.Unmarshal(raw, &pod); err != nil {
			return err
		}
		read++
		p := PodWithOwners(rules, owners, &pod)
		if p.Identity.Name != "" {
			index.UpsertPod(fileSource, p)
			kept++
		}
		return nil
	})
	return read, kept, err
}

// OwnerTable holds owner objects' controller references, read from a
// dump: topology.Owners for offline identity.
type OwnerTable map[ownerKey]topology.OwnerRef

type ownerKey struct{ group, kind, namespace, name string }

// ControllerOf returns the controller reference of the owner object o.
func (t OwnerTable) ControllerOf(namespace string, o topology.OwnerRef) (topology.OwnerRef, bool) {
	gv, err := schema.ParseGroupVersion(o.APIVersion)
	if err != nil {
		return topology.OwnerRef{}, false
	}
	r, ok := t[ownerKey{gv.Group, o.Kind, namespace, o.Name}]
	return r, ok
}

// LoadOwners reads the objects of a `kubectl get pods,jobs,jobsets,rayclusters
// -A -o json` List other than pods and nodes (batch Jobs, JobSets,
// RayClusters, or any owner object) and keeps each one's controller
// reference. A dump of pods alone gives an empty table.
func LoadOwners(r io.Reader) (OwnerTable, error) {
	t := OwnerTable{}
	dec := json.NewDecoder(r)
	for doc := 1; ; doc++ {
		var head struct {
			Kind  string            `json:"kind"`
			Items []json.RawMessage `json:"items"`
		}
		if err := dec.Decode(&head); err == io.EOF {
			return t, nil
		} else if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if head.Kind != "List" {
			continue
		}
		for _, item := range head.Items {
			var o metav1.PartialObjectMetadata
			if err := json.Unmarshal(item, &o); err != nil || o.Kind == "Pod" || o.Kind == "Node" {
				continue
			}
			c := metav1.GetControllerOfNoCopy(&o)
			gv, err := schema.ParseGroupVersion(o.APIVersion)
			if c == nil || err != nil {
				continue
			}
			t[ownerKey{gv.Group, o.Kind, o.Namespace, o.Name}] = topology.OwnerRef{APIVersion: c.APIVersion, Kind: c.Kind, Name: c.Name}
		}
	}
}

// decodeObjects calls fn for each object of kind in a List or for a single
// object. Several JSON documents may follow each other in one stream.
func decodeObjects(r io.Reader, kind string, fn func(json.RawMessage) error) error {
	dec := json.NewDecoder(r)
	for doc := 1; ; doc++ {
		var head struct {
			Kind  string            `json:"kind"`
			Items []json.RawMessage `json:"items"`
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err == io.EOF {
			if doc == 1 {
				return fmt.Errorf("no JSON document found")
			}
			return nil
		} else if err != nil {
			return fmt.Errorf("document %d: %w", doc, err)
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			return fmt.Errorf("document %d: not a Kubernetes object: %w", doc, err)
		}
		switch head.Kind {
		case kind:
			if err := fn(raw); err != nil {
				return fmt.Errorf("document %d: %s: %w", doc, kind, err)
			}
		case "List", kind + "List":
			for i, item := range head.Items {
				var ik struct {
					Kind string `json:"kind"`
				}
				_ = json.Unmarshal(item, &ik)
				if ik.Kind != "" && ik.Kind != kind {
					continue // a mixed List (kubectl get nodes,pods) holds other kinds too
				}
				if err := fn(item); err != nil {
					return fmt.Errorf("document %d item %d: %w", doc, i, err)
				}
			}
		default:
			return fmt.Errorf("document %d: kind %q, want %s or a List of them", doc, head.Kind, kind)
		}
	}
}
