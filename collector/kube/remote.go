package kube

import (
	"context"
	"time"

	"github.com/zonewatch/zonewatch/topology"
)

// Remote jobs on demand. The per-node view names a remote pod's job from
// its security identity (topology/remote.go), but an identity cannot tell
// what needs the job's pods: a rule's minimum of pods (a RayJob's
// submitter, a batch Job of one pod) and an Indexed Job's completion index
// (Cilium's label filter drops it). When a lookup meets such an identity
// (a flow, a drop or a connection of this node with a pod of that job at
// its far end), the index hands its selector over (Want) and the view
// lists the job as it lists its own node's jobs: every selector of the job
// (jobSelsLocked: a RayJob's submitter and its RayCluster's pods), so the
// index holds the whole job and decides it as the cluster-wide view does.
// A remote job's feeds are bounded in number (MaxRemoteJobs), started at
// most RemoteStartsPerSecond a second, and stopped once no lookup has met
// the job for RemoteIdle, or once the job has ended (its feeds listed and
// hold no pod): what they put in the index leaves it with them.
// Until the feed has listed, the job's pods name no job here: a flow of
// no job is held by the Hubble client for its pod's hold window and
// counted once the feed has placed it (docs/hubble.md).

// Bounds of the remote jobs' feeds of one per-node view.
const (
	MaxRemoteJobs         = 64
	RemoteStartsPerSecond = 8
	RemoteIdle            = 10 * time.Minute
)

// RemoteStats counts the per-node view's remote jobs.
type RemoteStats struct {
	Started  int64 // remote jobs whose feeds were started
	Stopped  int64 // ... stopped: RemoteIdle without a lookup, or the job ended
	Deferred int64 // demands that had to wait (MaxRemoteJobs, the start rate)
	Dropped  int64 // demands that waited RemoteIdle without a lookup and were let go
}

// remoteGroup is a remote job listed on demand: the demand, the
// selectors whose feeds it holds, and when a lookup last met it.
type remoteGroup struct {
	d    *topology.Demand
	sels map[jobSel]bool
	last time.Time
}

// Want implements topology.RemoteFeeds: it queues the demand for
// runRemote without waiting (the index's lock is held).
func (l *Live) Want(d *topology.Demand) {
	l.wantMu.Lock()
	l.wants = append(l.wants, d)
	l.wantMu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// runRemote starts the feeds of new demands and stops idle ones, at once
// when a demand arrives and each second.
func (l *Live) runRemote(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		case <-t.C:
		}
		l.remoteStep(time.Now())
	}
}

func (l *Live) remoteStep(now time.Time) {
	l.wantMu.Lock()
	wants := l.wants
	l.wants = nil
	l.wantMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	for _, d := range wants {
		l.pending[d] = now
	}
	for sel, g := range l.remote {
		if g.d.TakeUsed() || l.index.TakeJobUsed(g.d.Namespace, g.d.Name) {
			g.last = now
			continue
		}
		if now.Sub(g.last) >= l.remoteIdle || l.remoteEndedLocked(g) {
			delete(l.remote, sel)
			for s := range g.sels {
				l.releaseLocked(s, true)
			}
			g.d.Done()
			l.remoteStat.Stopped++
		}
	}
	if now.Sub(l.second) >= time.Second {
		l.second, l.starts = now, 0
	}
	for d, last := range l.pending {
		if d.TakeUsed() {
			last = now
			l.pending[d] = now
		}
		sel := jobSel{d.Namespace, d.Label, d.Value}
		switch {
		case l.remote[sel] != nil:
			// The index keeps one demand per selector: another one can
			// only be stale; it asks again when met.
			delete(l.pending, d)
			if l.remote[sel].d != d {
				d.Done()
			}
		case len(l.remote) < l.remoteMax && l.starts < l.remoteRate:
			delete(l.pending, d)
			l.starts++
			g := &remoteGroup{d: d, sels: map[jobSel]bool{}, last: now}
			l.remote[sel] = g
			l.regroupRemoteLocked(g)
			l.remoteStat.Started++
		case now.Sub(last) >= l.remoteIdle:
			delete(l.pending, d)
			d.Done()
			l.remoteStat.Dropped++
		case last == now:
			l.remoteStat.Deferred++
		}
	}
}

// remoteEndedLocked reports whether a remote job has ended: each of its
// feeds has listed and holds no pod (a job deleted since it was asked for
// need not wait RemoteIdle to give its place up).
func (l *Live) remoteEndedLocked(g *remoteGroup) bool {
	for s := range g.sels {
		if f := l.feeds[s]; f == nil || !f.synced() || f.held > 0 || len(f.inf.GetStore().ListKeys()) > 0 {
			return false
		}
	}
	return true
}

// regroupRemoteLocked runs a feed for every selector of a remote job (as
// for a job of this node, from its identity's selector and kind).
func (l *Live) regroupRemoteLocked(g *remoteGroup) {
	sel := jobSel{g.d.Namespace, g.d.Label, g.d.Value}
	l.resel(g.sels, l.jobSelsLocked(jobID{g.d.Namespace, g.d.Name}, map[jobSel]string{sel: g.d.Kind}), true)
}

// RemoteJobs reports how many remote jobs the per-node view lists on
// demand now, and its counts so far.
func (l *Live) RemoteJobs() (int, RemoteStats) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.remote), l.remoteStat
}
