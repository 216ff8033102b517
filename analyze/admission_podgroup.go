package analyze

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

// PodGroupPolicyName names the MutatingAdmissionPolicy (and its binding)
// that joins pods to the PodGroup their template's PodGroupLabel names.
const PodGroupPolicyName = "zonewatch-join-pod-groups"

// PodGroupPolicy returns the opt-in policy that sets
// spec.schedulingGroup.podGroupName on a new pod from its PodGroupLabel
// (a label every controller copies from its templates, where
// spec.schedulingGroup is dropped by their CRDs and Go types). It acts only
// on pods that carry the label and have no scheduling group, in namespaces
// the selector matches: a pod joins a gang only when its job asked for one
// by name. The apiserver must serve spec.schedulingGroup (GenericWorkload
// on): without it the patch's field is dropped and the pod is scheduled
// alone, as without the policy.
func PodGroupPolicy(apiVersion string, namespaceSelector map[string]any) (policy, binding map[string]any) {
	label := celString(PodGroupLabel)
	policy = map[string]any{
		"apiVersion": apiVersion,
		"kind":       "MutatingAdmissionPolicy",
		"metadata":   map[string]any{"name": PodGroupPolicyName},
		"spec": map[string]any{
			"failurePolicy":      "Ignore",
			"reinvocationPolicy": "Never",
			"matchConstraints": map[string]any{"resourceRules": []any{map[string]any{
				"apiGroups": []any{""}, "apiVersions": []any{"v1"}, "operations": []any{"CREATE"}, "resources": []any{"pods"},
			}}},
			"matchConditions": []any{map[string]any{
				"name": "names-a-pod-group",
				"expression": fmt.Sprintf("has(object.metadata.labels) && %s in object.metadata.labels && object.metadata.labels[%s] != \"\" && !has(object.spec.schedulingGroup)",
					label, label),
			}},
			"mutations": []any{map[string]any{
				"patchType": "JSONPatch",
				"jsonPatch": map[string]any{"expression": fmt.Sprintf(
					"[JSONPatch{op: \"add\", path: \"/spec/schedulingGroup\", value: Object.spec.schedulingGroup{podGroupName: object.metadata.labels[%s]}}]", label)},
			}},
		},
	}
	binding = map[string]any{
		"apiVersion": apiVersion,
		"kind":       "MutatingAdmissionPolicyBinding",
		"metadata":   map[string]any{"name": PodGroupPolicyName},
		"spec": map[string]any{
			"policyName":     PodGroupPolicyName,
			"matchResources": map[string]any{"namespaceSelector": namespaceSelector},
		},
	}
	return policy, binding
}

// PodGroupPolicyYAML renders the policy and binding as one YAML stream.
func PodGroupPolicyYAML(apiVersion string, namespaceSelector map[string]any) ([]byte, error) {
	p, b := PodGroupPolicy(apiVersion, namespaceSelector)
	pb, err := yaml.Marshal(p)
	if err != nil {
		return nil, err
	}
	bb, err := yaml.Marshal(b)
	if err != nil {
		return nil, err
	}
	return append(append(pb, "---\n"...), bb...), nil
}
