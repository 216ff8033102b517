package analyze

import (
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/zonewatch/zonewatch/collector/kube"
	"github.com/zonewatch/zonewatch/topology"
)

// The opt-in admission policy: what it adds, generated here beside the fix
// advice from the same rules and constants, rendered into the chart by
// TestAdmissionPolicyChart (-update).
const (
	// AdmissionPolicyName names the MutatingAdmissionPolicy and its binding.
	AdmissionPolicyName = "zonewatch-colocate-training-pods"
	// AdmissionNamespaceLabel is the label a namespace sets to "true" to opt in
	// (the chart's default namespaceSelector).
	AdmissionNamespaceLabel = "zonewatch.io/colocate-training-pods"
	// GPUTaintKey is the taint GPU clusters put on GPU nodes
	// (nvidia.com/gpu=present:NoSchedule); GPUNodeLabel the label GPU
	// feature discovery puts on them.
	GPUTaintKey  = "nvidia.com/gpu"
	GPUNodeLabel = "nvidia.com/gpu.present"
)

// celString quotes s as a CEL string literal.
func celString(s string) string { return fmt.Sprintf("%q", s) }

// AdmissionPolicy returns the MutatingAdmissionPolicy and its binding
// (admissionregistration.k8s.io apiVersion as given: v1 from Kubernetes
// 1.36, v1beta1 on 1.34-1.35 with the MutatingAdmissionPolicy feature
// gate and that API enabled) for pods that the rules recognise as pods of
// a training job, in namespaces matched by namespaceSelector.
//
// Admission cannot see free capacity, so the policy adds preferences
// only, never a requirement: each such pod prefers (weight 100) the zone
// where pods of its own job already run, and a pod without GPUs tolerates
// the GPU taint and prefers GPU nodes, so that a coordinator scheduled
// first lands in a zone with GPUs instead of on a CPU node elsewhere. A
// preference and a toleration only widen or rank the nodes a pod may use:
// a pod that would have been scheduled without the policy still is.
func AdmissionPolicy(rules []topology.Rule, apiVersion string, namespaceSelector map[string]any) (policy, binding map[string]any) {
	// The first rule whose name label the pod carries decides, as in
	// topology.Identify; a rule for Indexed Jobs needs the completion index.
	var keys []string
	var indexed []string
	for _, r := range rules {
		keys = append(keys, celString(r.NameLabel))
		if r.Indexed {
			indexed = append(indexed, fmt.Sprintf("(k != %s || %s in object.metadata.labels || (has(object.metadata.annotations) && %s in object.metadata.annotations))",
				celString(r.NameLabel), celString(topology.LabelCompletionIndex), celString(topology.LabelCompletionIndex)))
		}
	}
	filter := "has(object.metadata.labels) && k in object.metadata.labels && object.metadata.labels[k] != \"\""
	for _, c := range indexed {
		filter += " && " + c
	}
	jobKeys := fmt.Sprintf("[%s].filter(k, %s)", strings.Join(keys, ", "), filter)

	// The selector: the job's name label, with the group label of rules
	// that split an object into jobs (a LeaderWorkerSet group).
	selector := "{variables.jobKeys[0]: object.metadata.labels[variables.jobKeys[0]]}"
	for i := len(rules) - 1; i >= 0; i-- {
		r := rules[i]
		if r.GroupLabel == "" {
			continue
		}
		n, g := celString(r.NameLabel), celString(r.GroupLabel)
		selector = fmt.Sprintf("variables.jobKeys[0] == %s && %s in object.metadata.labels ? {%s: object.metadata.labels[%s], %s: object.metadata.labels[%s]} : %s",
			n, g, n, n, g, g, selector)
	}
	gpuRes := `r == "nvidia.com/gpu" || r.startsWith("nvidia.com/mig-")`
	hasGPU := fmt.Sprintf("object.spec.containers.exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, %s)) || (has(c.resources.requests) && c.resources.requests.exists(r, %s))))", gpuRes, gpuRes)

	const (
		aff  = "object.spec.affinity"
		pa   = "Object.spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution"
		na   = "Object.spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
		tol  = "Object.spec.tolerations"
		path = "/spec/affinity"
	)
	patch := func(p, v string) string {
		return fmt.Sprintf("JSONPatch{op: \"add\", path: %s, value: %s}", celString(p), v)
	}
	// ensure adds an empty parent where the pod has none ("add" on a member
	// that exists would replace it).
	ensure := func(has, p, v string) string { return fmt.Sprintf("(%s ? [] : [%s])", has, patch(p, v)) }
	hasAff := "has(" + aff + ")"
	hasPA := hasAff + " && has(" + aff + ".podAffinity)"
	hasNA := hasAff + " && has(" + aff + ".nodeAffinity)"
	podAffinity := strings.Join([]string{
		ensure(hasAff, path, "Object.spec.affinity{}"),
		ensure(hasPA, path+"/podAffinity", "Object.spec.affinity.podAffinity{}"),
		ensure(hasPA+" && has("+aff+".podAffinity.preferredDuringSchedulingIgnoredDuringExecution)", path+"/podAffinity/preferredDuringSchedulingIgnoredDuringExecution", "[]"),
		"[" + patch(path+"/podAffinity/preferredDuringSchedulingIgnoredDuringExecution/-",
			fmt.Sprintf("%s{weight: 100, podAffinityTerm: %s.podAffinityTerm{topologyKey: %s, labelSelector: %s.podAffinityTerm.labelSelector{matchLabels: variables.selector}}}",
				pa, pa, celString(kube.LabelZone), pa)) + "]",
	}, " +\n")
	toleration := fmt.Sprintf("%s{key: %s, operator: \"Exists\", effect: \"NoSchedule\"}", tol, celString(GPUTaintKey))
	noGPU := strings.Join([]string{
		fmt.Sprintf("(has(object.spec.tolerations) ? [%s] : [%s])", patch("/spec/tolerations/-", toleration), patch("/spec/tolerations", "["+toleration+"]")),
		ensure(hasNA, path+"/nodeAffinity", "Object.spec.affinity.nodeAffinity{}"),
		ensure(hasNA+" && has("+aff+".nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution)", path+"/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution", "[]"),
		"[" + patch(path+"/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/-",
			fmt.Sprintf("%s{weight: 100, preference: %s.preference{matchExpressions: [%s.preference.matchExpressions{key: %s, operator: \"In\", values: [\"true\"]}]}}",
				na, na, na, celString(GPUNodeLabel))) + "]",
	}, " +\n")

	policy = map[string]any{
		"apiVersion": apiVersion,
		"kind":       "MutatingAdmissionPolicy",
		"metadata":   map[string]any{"name": AdmissionPolicyName},
		"spec": map[string]any{
			// A policy error admits the pod unchanged: never block a pod.
			"failurePolicy":      "Ignore",
			"reinvocationPolicy": "Never",
			"matchConstraints": map[string]any{"resourceRules": []any{map[string]any{
				"apiGroups": []any{""}, "apiVersions": []any{"v1"}, "operations": []any{"CREATE"}, "resources": []any{"pods"},
			}}},
			"matchConditions": []any{map[string]any{
				"name":       "training-job-pod",
				"expression": "size(" + jobKeys + ") > 0",
			}},
			"variables": []any{
				map[string]any{"name": "jobKeys", "expression": jobKeys},
				map[string]any{"name": "selector", "expression": selector},
				map[string]any{"name": "gpu", "expression": hasGPU},
			},
			"mutations": []any{map[string]any{
				"patchType": "JSONPatch",
				"jsonPatch": map[string]any{"expression": podAffinity + " +\n(variables.gpu ? [] : " + noGPU + ")"},
			}},
		},
	}
	binding = map[string]any{
		"apiVersion": apiVersion,
		"kind":       "MutatingAdmissionPolicyBinding",
		"metadata":   map[string]any{"name": AdmissionPolicyName},
		"spec": map[string]any{
			"policyName":     AdmissionPolicyName,
			"matchResources": map[string]any{"namespaceSelector": namespaceSelector},
		},
	}
	return policy, binding
}

// AdmissionPolicyYAML renders the policy and binding as one YAML stream.
func AdmissionPolicyYAML(rules []topology.Rule, apiVersion string, namespaceSelector map[string]any) ([]byte, error) {
	p, b := AdmissionPolicy(rules, apiVersion, namespaceSelector)
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
