package kube

import (
	"encoding/json"
	"fmt"
	"github.com/zonewatch/zonewatch/topology"
	"io"

	corev1 "k8s.io/api/core/v1"
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
// the pods that rules identify as job pods. It returns pods read and job
// pods kept.
func LoadPods(index *topology.Index, rules []topology.Rule, r io.Reader) (read, kept int, err error) {
	err = decodeObjects(r, "Pod", func(raw json.RawMessage) error {
		var pod corev1.Pod
		if err := json.Unmarshal(raw, &pod); err != nil {
			return err
		}
		read++
		p := PodFrom(rules, &pod)
		if p.Identity.Name != "" {
			index.UpsertPod(fileSource, p)
			kept++
		}
		return nil
	})
	return read, kept, err
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
