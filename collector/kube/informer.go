package kube

import (
	"context"
	"fmt"
	"github.com/zonewatch/zonewatch/topology"
	"log/slog"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Live feeds the index from a kube-apiserver: one node informer and, per
// job rule, one pod informer selecting pods that carry the rule's name
// label, so only job pods (not all 100k pods) are listed and watched.
type Live struct {
	index    *topology.Index
	rules    []topology.Rule
	logger   *slog.Logger
	synced   []cache.InformerSynced
	isSynced atomic.Bool
	errors   atomic.Int64
}

// NewLive prepares informers; Run starts them.
func NewLive(client kubernetes.Interface, index *topology.Index, rules []topology.Rule, resync time.Duration, logger *slog.Logger) (*Live, []informers.SharedInformerFactory, error) {
	l := &Live{index: index, rules: rules, logger: logger}
	var factories []informers.SharedInformerFactory

	nf := informers.NewSharedInformerFactoryWithOptions(client, resync)
	ni := nf.Core().V1().Nodes().Informer()
	if err := ni.SetTransform(StripNode); err != nil {
		return nil, nil, fmt.Errorf("node informer transform: %w", err)
	}
	if _, err := ni.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { l.node(o) },
		UpdateFunc: func(_, o any) { l.node(o) },
		DeleteFunc: func(o any) {
			if n, ok := tombstone(o).(*corev1.Node); ok {
				index.DeleteNode(n.Name)
			}
		},
	}); err != nil {
		return nil, nil, fmt.Errorf("node informer handler: %w", err)
	}
	l.synced = append(l.synced, ni.HasSynced)
	factories = append(factories, nf)

	strip := PodStripper(rules)
	for i, label := range topology.NameLabels(rules) {
		source := i
		pf := informers.NewSharedInformerFactoryWithOptions(client, resync,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = label }))
		pi := pf.Core().V1().Pods().Informer()
		if err := pi.SetTransform(strip); err != nil {
			return nil, nil, fmt.Errorf("pod informer transform: %w", err)
		}
		if _, err := pi.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { l.pod(source, o) },
			UpdateFunc: func(_, o any) { l.pod(source, o) },
			DeleteFunc: func(o any) {
				if p, ok := tombstone(o).(*corev1.Pod); ok {
					index.DeletePod(source, p.Namespace, p.Name)
				}
			},
		}); err != nil {
			return nil, nil, fmt.Errorf("pod informer handler: %w", err)
		}
		l.synced = append(l.synced, pi.HasSynced)
		factories = append(factories, pf)
	}
	return l, factories, nil
}

// Run starts the informers and waits for their first sync (or ctx).
func (l *Live) Run(ctx context.Context, factories []informers.SharedInformerFactory) error {
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), l.synced...) {
		return fmt.Errorf("waiting for node and pod informers to sync: %w", ctx.Err())
	}
	l.isSynced.Store(true)
	n, p, j := l.index.Counts()
	l.logger.Info("kubernetes informers synced", "nodes", n, "job_pods", p, "jobs", j)
	return nil
}

// Up reports whether the informers have synced (zonewatch_source_up{source="kubernetes"}).
func (l *Live) Up() bool {
	if !l.isSynced.Load() {
		return false
	}
	for _, s := range l.synced {
		if !s() {
			return false
		}
	}
	return true
}

func (l *Live) node(o any) {
	n, ok := o.(*corev1.Node)
	if !ok {
		l.errors.Add(1)
		return
	}
	l.index.UpsertNode(NodeFrom(n))
}

func (l *Live) pod(source int, o any) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		l.errors.Add(1)
		return
	}
	l.index.UpsertPod(source, PodFrom(l.rules, p))
}

func tombstone(o any) any {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return o
}
