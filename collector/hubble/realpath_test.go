package hubble

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/zonewatch/zonewatch/sim"
)

// The real path's server runs in a child process (this test binary, run
// again with realPathEnv set), so that the parent's CPU time is the
// client's alone, as an exporter's is beside its agent.
const realPathEnv = "ZONEWATCH_BENCH_HUBBLE_SERVER"

func TestMain(m *testing.M) {
	if sock := os.Getenv(realPathEnv); sock != "" {
		serveRealPath(sock)
		return
	}
	os.Exit(m.Run())
}

// realPathFlows is what the lab's short connections make Hubble send:
// the sender's forwarded trace (counted), the receiver's copy and the
// SYN-ACK reply (filtered out by the whitelist at the server), and now and
// then a policy drop.
func realPathFlows() []*flowpb.Flow {
	fwd := typicalFlow()
	recv := typicalFlow()
	recv.NodeName = "prod/gpu-c1"
	recv.TraceObservationPoint = flowpb.TraceObservationPoint_TO_ENDPOINT
	drop := typicalFlow()
	drop.Verdict, drop.DropReasonDesc = flowpb.Verdict_DROPPED, flowpb.DropReason_POLICY_DENIED
	drop.EventType = &flowpb.CiliumEventType{Type: eventDrop}
	return []*flowpb.Flow{fwd, recv, fwd, recv, fwd, recv, drop}
}

// serveRealPath serves a fake Observer on sock and, once a stream is
// open, publishes ZONEWATCH_BENCH_FLOWS flows at ZONEWATCH_BENCH_RATE a
// second (0: as fast as the ring takes them), then waits to be killed.
func serveRealPath(sock string) {
	n, _ := strconv.Atoi(os.Getenv("ZONEWATCH_BENCH_FLOWS"))
	rate, _ := strconv.Atoi(os.Getenv("ZONEWATCH_BENCH_RATE"))
	h := sim.NewHubble(testScenario(), "", 1<<16)
	if err := h.Start(sock); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for h.Streams().Open == 0 {
		time.Sleep(time.Millisecond)
	}
	flows := realPathFlows()
	start := time.Now()
	for i := 0; i < n; {
		batch := 256
		if rate > 0 {
			// Publish what is due: flows arrive one by one at low rates.
			due := int(time.Since(start).Seconds()*float64(rate)) - i
			if due <= 0 {
				time.Sleep(200 * time.Microsecond)
				continue
			}
			batch = due
		}
		batch = min(batch, n-i)
		out := make([]*flowpb.Flow, batch)
		for j := range out {
			f := proto.Clone(flows[(i+j)%len(flows)]).(*flowpb.Flow)
			f.Time = timestamppb.New(t0.Add(time.Duration(i+j) * time.Microsecond))
			out[j] = f
		}
		if rate == 0 {
			for h.Seen()-h.Streams().Flows > 1<<14 { // do not overrun the ring
				time.Sleep(100 * time.Microsecond)
			}
		}
		h.Publish(out...)
		i += batch
	}
	select {}
}

// BenchmarkRealPath is the exporter's Hubble path as it runs: a gRPC
// Observer in another process streams masked flows over a unix socket
// into the real client, classification and counting. cpu-us/flow is the
// client process's whole CPU time (gRPC's receive, goroutine wake-ups, GC)
// per flow received, the figure the lab measures on the exporter; at low
// rates each flow arrives in its own read.
func BenchmarkRealPath(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		rate     int
		coalesce time.Duration
	}{{500, -1}, {500, 0}, {500, 10 * time.Millisecond}, {5000, -1}, {5000, 0}, {12000, 0}, {0, -1}, {0, 0}} {
		rate := bc.rate
		name := fmt.Sprintf("rate=%d,coalesce=%v", rate, bc.coalesce)
		switch bc.coalesce {
		case -1:
			name = fmt.Sprintf("rate=%d,coalesce=off", rate)
		case 0:
			name = fmt.Sprintf("rate=%d", rate)
		}
		b.Run(name, func(b *testing.B) {
			sock := shortSocket(b)
			cmd := exec.Command(exe)
			cmd.Env = append(os.Environ(), realPathEnv+"="+sock, "ZONEWATCH_BENCH_FLOWS="+strconv.Itoa(b.N), "ZONEWATCH_BENCH_RATE="+strconv.Itoa(rate))
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			for {
				if _, err := os.Stat(sock); err == nil {
					break
				}
				time.Sleep(time.Millisecond)
			}
			agg := NewAggregator(indexOf(testScenario()), "", time.Minute, nil)
			c := NewClient(Config{Address: "unix://" + sock, Since: t0.Add(-time.Second), BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, ReadCoalesce: bc.coalesce}, agg)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			b.ReportAllocs()
			b.ResetTimer()
			start, began, runs := cpuTime(), time.Now(), threadSleeps()
			go func() { c.Run(ctx); close(done) }()
			for received(c) < uint64(b.N) {
				time.Sleep(20 * time.Millisecond) // rarely: the wait's own wake-ups are the parent's CPU too
			}
			cpu, took, runs := cpuTime()-start, time.Since(began), threadSleeps()-runs
			b.StopTimer()
			cancel()
			<-done
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/flow")
			b.ReportMetric(float64(b.N)/took.Seconds(), "flows/s")
			b.ReportMetric(float64(runs)/float64(b.N), "sleeps/flow")
			if lost := testutil.ToFloat64(agg.Metrics().lost[flowpb.LostEventSource_HUBBLE_RING_BUFFER]); lost > 0 {
				b.Errorf("%v flows lost: the server outran the client", lost)
			}
		})
	}
}

// threadSleeps is how often the process's threads blocked in the kernel
// (voluntary context switches: futex, epoll_wait, nanosleep), each a
// sleep and a wake-up, whatever the load beside.
func threadSleeps() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Nvcsw
}

// BenchmarkRealPathIdle is the client's CPU on an open stream that
// carries nothing, per second (idle-cpu-us/s), to set against
// BenchmarkRealPath's per-flow figure at low rates.
func BenchmarkRealPathIdle(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	sock := shortSocket(b)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), realPathEnv+"="+sock, "ZONEWATCH_BENCH_FLOWS=0")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	c := NewClient(Config{Address: "unix://" + sock}, NewAggregator(indexOf(testScenario()), "", time.Minute, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	time.Sleep(500 * time.Millisecond) // connected
	b.ResetTimer()
	start, began := cpuTime(), time.Now()
	for range b.N {
		time.Sleep(100 * time.Millisecond)
	}
	cpu, took := cpuTime()-start, time.Since(began)
	b.StopTimer()
	cancel()
	<-done
	b.ReportMetric(float64(cpu.Microseconds())/took.Seconds(), "idle-cpu-us/s")
}
