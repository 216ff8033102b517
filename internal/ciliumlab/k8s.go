package ciliumlab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

var (
	crdGVR  = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	cnpGVR  = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}
	ccnpGVR = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumclusterwidenetworkpolicies"}
)

// installCRDs creates Cilium's CRDs from the module (crds/ beside the
// binaries; the operator would install them) and waits until the
// apiserver serves them: the agents wait for them otherwise.
func (l *Lab) installCRDs(ctx context.Context) error {
	files, err := filepath.Glob(filepath.Join(l.cfg.Cilium, "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRDs in %s/crds (make tools copies them from the module): %v", l.cfg.Cilium, err)
	}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal(b, &obj.Object); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := l.Dynamic.Resource(crdGVR).Create(ctx, &obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating CRD %s: %w", obj.GetName(), err)
		}
		names = append(names, obj.GetName())
	}
	for _, name := range names {
		for {
			obj, err := l.Dynamic.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err == nil && established(obj) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established: %v", name, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func established(obj *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// EnsureNamespace creates a namespace if it is missing.
func (l *Lab) EnsureNamespace(ctx context.Context, name string) error {
	_, err := l.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// ApplyPolicy creates a CiliumNetworkPolicy, or a
// CiliumClusterwideNetworkPolicy (namespace ""), from YAML; Close deletes
// it if it is still there.
func (l *Lab) ApplyPolicy(ctx context.Context, manifest string) (namespace, name string, err error) {
	var obj unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(manifest), &obj.Object); err != nil {
		return "", "", err
	}
	namespace, name = obj.GetNamespace(), obj.GetName()
	if obj.GetKind() == "CiliumClusterwideNetworkPolicy" {
		namespace = ""
		if _, err := l.Dynamic.Resource(ccnpGVR).Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
			return "", "", fmt.Errorf("creating CiliumClusterwideNetworkPolicy %s: %w", name, err)
		}
	} else {
		if err := l.EnsureNamespace(ctx, namespace); err != nil {
			return "", "", err
		}
		if _, err := l.Dynamic.Resource(cnpGVR).Namespace(namespace).Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
			return "", "", fmt.Errorf("creating CiliumNetworkPolicy %s/%s: %w", namespace, name, err)
		}
	}
	l.onUndo("CiliumNetworkPolicy "+namespace+"/"+name, func() error {
		err := l.DeletePolicy(context.Background(), namespace, name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	return namespace, name, nil
}

// DeletePolicy deletes a CiliumNetworkPolicy, or a
// CiliumClusterwideNetworkPolicy when namespace is "".
func (l *Lab) DeletePolicy(ctx context.Context, namespace, name string) error {
	if namespace == "" {
		return l.Dynamic.Resource(ccnpGVR).Delete(ctx, name, metav1.DeleteOptions{})
	}
	return l.Dynamic.Resource(cnpGVR).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{})
}

// WaitSelects waits until the agent's selector cache has a selector
// containing each of the substrings that selects the identity each of pods
// has at the time of the look (Pod.CurrentIdentity, read anew at every
// look: an identity read once goes stale when the pod's agent learns its
// labels): the agent has the policy and knows the pods as they are. With
// pods empty it waits until no such selector is left (the policy is gone).
func (n *Node) WaitSelects(ctx context.Context, pods []*Pod, substrings ...string) error {
	var names []string
	for _, p := range pods {
		names = append(names, p.Ref())
	}
	return n.poll(ctx, time.Minute, fmt.Sprintf("selects the identities of %v with %q", names, substrings), func() (bool, string) {
		ids := make([]int64, len(pods))
		for i, p := range pods {
			id, _, why := p.CurrentIdentity(ctx)
			if why != "" {
				return false, why
			}
			ids[i] = id
		}
		var cache []struct {
			Selector   string  `json:"selector"`
			Identities []int64 `json:"identities"`
		}
		if err := n.getJSON(ctx, "/v1/policy/selectors", &cache); err != nil {
			return false, err.Error()
		}
		var found []string
	next:
		for _, s := range cache {
			for _, sub := range substrings {
				if !strings.Contains(s.Selector, sub) {
					continue next
				}
			}
			if len(pods) == 0 {
				return false, "still there: " + s.Selector
			}
			found = append(found, fmt.Sprintf("%s -> %v", s.Selector, s.Identities))
			all := true
			for _, id := range ids {
				all = all && slices.Contains(s.Identities, id)
			}
			if all {
				return true, ""
			}
		}
		return len(pods) == 0, fmt.Sprintf("identities now %v; selectors: %v", ids, found)
	})
}
