package analyze

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/zonewatch/zonewatch/collector/fence"
)

// loadPolicies reads `kubectl get cnp,ccnp -A -o json`, `kubectl get
// networkpolicies -A -o json`, or one file with all kinds (a List, or the
// objects themselves, JSON or YAML) into a fence set; nil without a file.
// An object of another kind is left out; one that cannot be read is
// skipped with a warning: it names no fence.
func loadPolicies(path string, warn io.Writer) (*fence.Set, error) {
	if path == "" {
		return nil, nil
	}
	f, err := readKubeFile("policies", path)
	if err != nil {
		return nil, err
	}
	set := fence.NewSet()
	dec := json.NewDecoder(bytes.NewReader(f.json))
	n, skipped := 0, 0
	for {
		var doc struct {
			Kind  string           `json:"kind"`
			Items []map[string]any `json:"items"`
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		items := doc.Items
		if doc.Kind != "List" && !bytes.HasSuffix([]byte(doc.Kind), []byte("List")) {
			var one map[string]any
			if err := json.Unmarshal(raw, &one); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			items = []map[string]any{one}
		}
		for _, it := range items {
			kind, _ := it["kind"].(string)
			var p *fence.Policy
			var err error
			switch kind {
			case "CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy":
				p, err = fence.PolicyFrom(it, kind == "CiliumClusterwideNetworkPolicy")
			case fence.KindNetworkPolicy:
				if api, _ := it["apiVersion"].(string); api != "networking.k8s.io/v1" {
					continue // not a Kubernetes NetworkPolicy
				}
				p, err = fence.NetworkPolicyFrom(it)
			default:
				continue
			}
			if err != nil {
				skipped++
				fmt.Fprintf(warn, "%s: %s skipped (names no fence): %v\n", path, kind, err)
				continue
			}
			set.Put(p)
			n++
		}
	}
	if n == 0 && skipped == 0 {
		fmt.Fprintf(warn, "%s: no CiliumNetworkPolicy, CiliumClusterwideNetworkPolicy or NetworkPolicy\n", path)
	}
	return set, nil
}
