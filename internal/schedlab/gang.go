package schedlab

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/zonewatch/zonewatch/internal/testenv"
)

// GangFeatureGates turn on kube-scheduler v1.37.2's workload-aware
// scheduling (pkg/features/kube_features.go): GenericWorkload (beta in
// 1.37, off by default) serves PodGroups and the pods'
// spec.schedulingGroup and adds the GangScheduling plugin to the default
// profile; TopologyAwareWorkloadScheduling (alpha since 1.36) serves
// PodGroup spec.schedulingConstraints and adds the TopologyPlacementGenerator
// and PodGroupPodsCount plugins (pkg/scheduler/apis/config/v1
// default_plugins.go applyFeatureGates). Both go to the apiserver and the
// scheduler: with a gate off the apiserver drops its fields on write,
// silently.
const GangFeatureGates = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"

// PodGroupFinalizer is what the PodGroupProtection admission plugin (on by
// default in 1.37) puts on every new PodGroup; only kube-controller-manager's
// podgroup-protection controller removes it, once no active pod names the
// group (pkg/controller/scheduling/podgroupprotection).
const PodGroupFinalizer = "scheduling.k8s.io/podgroup-protection"

// StartGang starts the lab with gang and topology scheduling on: the
// gates on the apiserver and the scheduler, and the scheduling.k8s.io/v1beta1
// API served (--runtime-config).
func StartGang(t testing.TB) *Lab {
	t.Helper()
	testenv.ToolsBin(t, "etcd", "kube-apiserver", "kube-scheduler")
	api := testenv.StartAPIServer(t, testenv.WithArgs("--feature-gates", GangFeatureGates,
		"--runtime-config", "scheduling.k8s.io/v1beta1=true"))
	return attach(t, api, "--feature-gates", GangFeatureGates)
}

// PodGroup is a gang of minCount pods to be placed together in one domain
// of topologyKey ("" for none).
func PodGroup(namespace, name string, minCount int32, topologyKey string) *schedulingv1beta1.PodGroup {
	pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
			Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: minCount}}}}
	if topologyKey != "" {
		pg.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{
			Topology: []schedulingv1beta1.TopologyConstraint{{Key: topologyKey}}}
	}
	return pg
}

// CreatePodGroup creates the PodGroup and checks that the apiserver kept
// what a gate off would drop (the gang policy, the topology constraint)
// and that PodGroupProtection put its finalizer on.
func (l *Lab) CreatePodGroup(ctx context.Context, pg *schedulingv1beta1.PodGroup) error {
	got, err := l.Client.SchedulingV1beta1().PodGroups(pg.Namespace).Create(ctx, pg, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating PodGroup %s/%s: %w", pg.Namespace, pg.Name, err)
	}
	if got.Spec.SchedulingPolicy.Gang == nil || got.Spec.SchedulingPolicy.Gang.MinCount != pg.Spec.SchedulingPolicy.Gang.MinCount {
		return fmt.Errorf("PodGroup %s/%s: the apiserver kept schedulingPolicy %+v, want gang minCount %d", pg.Namespace, pg.Name, got.Spec.SchedulingPolicy, pg.Spec.SchedulingPolicy.Gang.MinCount)
	}
	if pg.Spec.SchedulingConstraints != nil && (got.Spec.SchedulingConstraints == nil || len(got.Spec.SchedulingConstraints.Topology) != 1 ||
		got.Spec.SchedulingConstraints.Topology[0].Key != pg.Spec.SchedulingConstraints.Topology[0].Key) {
		return fmt.Errorf("PodGroup %s/%s: the apiserver dropped schedulingConstraints (TopologyAwareWorkloadScheduling off?): %+v", pg.Namespace, pg.Name, got.Spec)
	}
	has := false
	for _, f := range got.Finalizers {
		has = has || f == PodGroupFinalizer
	}
	if !has {
		return fmt.Errorf("PodGroup %s/%s: no %s finalizer (PodGroupProtection admission off?): %v", pg.Namespace, pg.Name, PodGroupFinalizer, got.Finalizers)
	}
	return nil
}

// CheckSchedulingGroups checks that every pod of the namespace kept the
// spec.schedulingGroup it was created with (GenericWorkload off on the
// apiserver drops it, and the pod is then scheduled alone).
func (l *Lab) CheckSchedulingGroups(ctx context.Context, namespace, podGroup string) error {
	list, err := l.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, p := range list.Items {
		if sg := p.Spec.SchedulingGroup; sg == nil || sg.PodGroupName == nil || *sg.PodGroupName != podGroup {
			return fmt.Errorf("pod %s/%s: spec.schedulingGroup is %+v, want podGroupName %q", namespace, p.Name, sg, podGroup)
		}
	}
	return nil
}

// DeletePodGroups deletes the namespace's PodGroups once its pods are gone
// and removes the protection finalizer as kube-controller-manager's
// podgroup-protection controller would (the lab runs no controller
// manager), then waits until they are gone.
func (l *Lab) DeletePodGroups(ctx context.Context, namespace string) error {
	if pods, err := l.pods.Pods(namespace).List(labels.Everything()); err != nil || len(pods) > 0 {
		return fmt.Errorf("namespace %s: %d pods still name a PodGroup (%v)", namespace, len(pods), err)
	}
	c := l.Client.SchedulingV1beta1().PodGroups(namespace)
	list, err := c.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, pg := range list.Items {
		if err := c.Delete(ctx, pg.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		if _, err := c.Patch(ctx, pg.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("removing the finalizer of PodGroup %s/%s: %w", namespace, pg.Name, err)
		}
	}
	for {
		list, err := c.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(list.Items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s: %d PodGroups left: %w", namespace, len(list.Items), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// SettleQuiet waits until the namespace has want pods and either all are
// bound, or none was bound for quiet and every unbound pod has been found
// unschedulable, or none was bound for 6*quiet. A gang's pods that wait
// for the rest of the gang or for its PodGroup are held by the
// GangScheduling plugin's PreEnqueue, which leaves no condition on the pod
// (Settle would wait for one); a whole gang that fits no domain is marked
// unschedulable ("pod group is unschedulable, ...").
func (l *Lab) SettleQuiet(ctx context.Context, namespace string, want int, quiet time.Duration) (Placement, error) {
	return l.settle(ctx, namespace, want, func(n, bound, unschedulable int, still time.Duration) bool {
		return bound == n || (still >= quiet && bound+unschedulable == n) || still >= 6*quiet
	})
}

// Unschedulable returns the message of the first pod of the namespace the
// scheduler marked unschedulable ("" for none): for a gang that cannot fit
// in one domain, "pod group is unschedulable, ...".
func (l *Lab) Unschedulable(namespace string) string {
	list, err := l.pods.Pods(namespace).List(labels.Everything())
	if err != nil {
		return ""
	}
	for _, pod := range list {
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				return c.Message
			}
		}
	}
	return ""
}
