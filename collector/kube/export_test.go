package kube

import "time"

// HandlerEvent is one handler or job-feed list/watch call of the per-node
// view (Feed "" is the node's pod informer, else the job's selector
// "namespace/label=value"; Op is add, update, delete, list or watch).
type HandlerEvent = handlerEvent

// SetHook makes the per-node view run each handler and job-feed list/watch
// call through h (h must call call once); before Run.
func SetHook(l *Live, h func(ev HandlerEvent, call func())) { l.hook = h }

// FeedStored lists the pods (namespace/name) the job feed of the selector
// holds in its informer's store: what its watch delivered, whether or not
// its handler ran yet. Nil when no such feed runs.
func FeedStored(l *Live, namespace, label, value string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.feeds[jobSel{namespace, label, value}]
	if f == nil {
		return nil
	}
	return f.inf.GetStore().ListKeys()
}

// RemoteOnlyFeeds lists the job feeds (namespace/label=value) that run
// for remote jobs only (no job of the node uses or used them).
func RemoteOnlyFeeds(l *Live) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for s, f := range l.feeds {
		if f.remote > 0 && f.local == 0 && !f.lingering {
			out = append(out, s.String())
		}
	}
	return out
}

// SetRemoteBounds sets how many remote jobs the per-node view lists at
// once and after how long without a lookup one is let go; before Run.
func SetRemoteBounds(l *Live, most int, idle time.Duration) { l.remoteMax, l.remoteIdle = most, idle }
