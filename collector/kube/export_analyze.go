package kube

import (
	"encoding/json"
	"io"
)

// DecodeObjects calls fn for each object of kind ("Node", "Pod") in
// `kubectl get -o json` output, the way LoadNodes and LoadPods read it: a
// List, a <kind>List or single objects, several documents in a row; errors
// name the document and item. Offline analysis uses it to read what the
// index does not keep (node taints and GPU capacity, pod tolerations).
func DecodeObjects(r io.Reader, kind string, fn func(json.RawMessage) error) error {
	return decodeObjects(r, kind, fn)
}
