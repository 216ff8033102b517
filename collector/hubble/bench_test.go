package hubble

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zonewatch/zonewatch/sim"
)

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time per op since start
// (cpu-ns/op, garbage collection included): on a loaded machine ns/op
// also counts the time the benchmark waited for a core.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

func labelsOf(ns, app string, n int) []string {
	l := []string{"k8s:app=" + app, "k8s:io.kubernetes.pod.namespace=" + ns, "k8s:io.cilium.k8s.policy.cluster=prod",
		"k8s:io.cilium.k8s.policy.serviceaccount=" + app, "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=" + ns}
	for i := len(l); i < n; i++ {
		l = append(l, fmt.Sprintf("k8s:example.com/label-%d=value-%d", i, i))
	}
	return l
}

// typicalFlow is a forwarded L3/L4 trace event as Hubble sends it without
// a field mask: the cross-zone worker -> coordinator packet on the
// sender's node.
func typicalFlow() *flowpb.Flow {
	f := trace("gpu-a1", bertWorker, bertCoord, flowpb.TraceObservationPoint_TO_OVERLAY, false)
	f.Uuid = "c2ecde95-7124-4b42-846c-fb0038e78aa8"
	f.Type = flowpb.FlowType_L3_L4
	f.Ethernet = &flowpb.Ethernet{Source: "92:34:10:65:b5:ee", Destination: "c2:3c:0f:7f:7d:73"}
	f.IP.IpVersion = flowpb.IPVersion_IPv4
	f.L4.GetTCP().Flags = &flowpb.TCPFlags{PSH: true, ACK: true}
	f.EventType.SubType = 4
	f.TrafficDirection = flowpb.TrafficDirection_EGRESS
	f.TraceReason = flowpb.TraceReason_ESTABLISHED
	f.NodeLabels = []string{"kubernetes.io/arch=amd64", "kubernetes.io/hostname=gpu-a1", "kubernetes.io/os=linux",
		"node.kubernetes.io/instance-type=p5.48xlarge", "topology.kubernetes.io/region=us-east-1", "topology.kubernetes.io/zone=us-east-1a"}
	f.Source.Labels = labelsOf("research", "bert-slow", 8)
	f.Source.ClusterName = "prod"
	f.Source.Workloads = []*flowpb.Workload{{Name: "bert-slow", Kind: "JobSet"}}
	f.Destination.Labels = labelsOf("research", "bert-slow", 8)
	f.Destination.ClusterName = "prod"
	f.Destination.Workloads = []*flowpb.Workload{{Name: "bert-slow", Kind: "JobSet"}}
	f.Interface = &flowpb.NetworkInterface{Index: 7, Name: "cilium_vxlan"}
	f.Summary = "TCP Flags: ACK, PSH"
	return f
}

// heavyFlow is an L7 HTTP event with many labels, names and policies, the
// biggest kind Hubble sends.
func heavyFlow() *flowpb.Flow {
	f := typicalFlow()
	f.Type = flowpb.FlowType_L7
	f.EventType = &flowpb.CiliumEventType{Type: 129}
	f.IsReply = wrapperspb.Bool(false)
	f.Source.Labels = labelsOf("research", "bert-slow", 24)
	f.Destination.Labels = labelsOf("research", "bert-slow", 24)
	f.DestinationNames = []string{"bert-slow-workers-0-0.bert-slow.research.svc.cluster.local"}
	f.DestinationService = &flowpb.Service{Name: "bert-slow", Namespace: "research"}
	f.L7 = &flowpb.Layer7{Type: flowpb.L7FlowType_REQUEST, LatencyNs: 1234567, Record: &flowpb.Layer7_Http{Http: &flowpb.HTTP{
		Method: "POST", Url: "http://bert-slow-workers-0-0:29500/v1/rendezvous/keys/some/long/path?attempt=3", Protocol: "HTTP/1.1",
		Headers: []*flowpb.HTTPHeader{{Key: "Accept", Value: "application/json"}, {Key: "User-Agent", Value: "torch-elastic/2.6"},
			{Key: "X-Request-Id", Value: "49116c2c-3017-4237-97e7-1ff4e16bfe28"}, {Key: "Content-Type", Value: "application/json"},
			{Key: "Traceparent", Value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}}}}
	f.TraceContext = &flowpb.TraceContext{Parent: &flowpb.TraceParent{TraceId: "4bf92f3577b34da6a3ce929d0e0e4736"}}
	f.EgressAllowedBy = []*flowpb.Policy{{Name: "allow-rendezvous", Namespace: "research", Kind: "CiliumNetworkPolicy",
		Labels: []string{"k8s:io.cilium.k8s.policy.derived-from=CiliumNetworkPolicy", "k8s:io.cilium.k8s.policy.name=allow-rendezvous"}, Revision: 42}}
	f.Summary = "HTTP/1.1 POST http://bert-slow-workers-0-0:29500/v1/rendezvous/keys/some/long/path?attempt=3"
	return f
}

func maskedFlow(tb testing.TB) *flowpb.Flow {
	f, err := sim.MaskFlow(typicalFlow(), FieldMaskPaths)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

func benchFlows(b *testing.B) []struct {
	name string
	data []byte
} {
	var out []struct {
		name string
		data []byte
	}
	for _, c := range []struct {
		name string
		f    *flowpb.Flow
	}{{"typical", typicalFlow()}, {"heavy", heavyFlow()}, {"typical-masked", maskedFlow(b)}} {
		data, err := proto.Marshal(c.f)
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, struct {
			name string
			data []byte
		}{c.name, data})
	}
	return out
}

// BenchmarkDecode is the floor: proto.Unmarshal of one Flow into a new
// message, as the gRPC codec does.
func BenchmarkDecode(b *testing.B) {
	for _, c := range benchFlows(b) {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.data)))
			start := cpuTime()
			for b.Loop() {
				f := &flowpb.Flow{}
				if err := proto.Unmarshal(c.data, f); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkDecodeClassifyAggregate is the exporter's per-flow work: decode,
// classify, count.
func BenchmarkDecodeClassifyAggregate(b *testing.B) {
	agg := NewAggregator(indexOf(testScenario()), "", time.Minute, nil)
	for _, c := range benchFlows(b) {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.data)))
			for b.Loop() {
				f := &flowpb.Flow{}
				if err := proto.Unmarshal(c.data, f); err != nil {
					b.Fatal(err)
				}
				agg.Observe(f)
			}
		})
	}
}

// BenchmarkClassifyAggregate is the part on top of decoding; it must not
// allocate, with the live exporter's hold (every counted flow of a job
// asks whether it waits for its peer) or without (files).
func BenchmarkClassifyAggregate(b *testing.B) {
	for _, hold := range []time.Duration{0, DefaultHold} {
		b.Run(fmt.Sprintf("hold=%v", hold), func(b *testing.B) { benchClassifyAggregate(b, hold) })
	}
}

func benchClassifyAggregate(b *testing.B, hold time.Duration) {
	agg := NewAggregator(indexOf(testScenario()), "", time.Minute, nil)
	agg.SetHold(hold)
	d := flowOf("gpu-b1", llmWorker, llmMaster, flowpb.Verdict_DROPPED, eventPolicyVerdict)
	d.DropReasonDesc, d.TrafficDirection = flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS
	d.IngressDeniedBy = []*flowpb.Policy{{Namespace: "ml-team", Name: "zone-isolation"}}
	for _, c := range []struct {
		name string
		f    *flowpb.Flow
	}{{"forwarded", typicalFlow()}, {"policy-drop", d}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			start := cpuTime()
			for b.Loop() {
				agg.Observe(c.f)
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkEndToEnd streams flows from the fake Observer over a unix
// socket into the client, with and without the field mask; the server
// (masking, encoding) shares the CPUs with the client.
func BenchmarkEndToEnd(b *testing.B) {
	s := testScenario()
	flows := []*flowpb.Flow{typicalFlow(), typicalFlow(), typicalFlow(), heavyFlow()}
	flows[1].NodeName = "prod/gpu-c1" // the receiving side's copy
	flows[1].TraceObservationPoint = flowpb.TraceObservationPoint_TO_ENDPOINT
	flows[2].Verdict, flows[2].DropReasonDesc = flowpb.Verdict_DROPPED, flowpb.DropReason_POLICY_DENIED // a drop notification
	flows[2].EventType = &flowpb.CiliumEventType{Type: eventDrop}
	flows[3].EventType = &flowpb.CiliumEventType{Type: eventTrace} // passes the filter
	for _, mask := range []bool{true, false} {
		name := "mask"
		if !mask {
			name = "nomask"
		}
		b.Run(name, func(b *testing.B) {
			const capacity = 1 << 15
			h, sock := startHubble(b, s, "", capacity)
			agg := NewAggregator(indexOf(s), "", time.Minute, nil)
			processed := func() int { return int(testutil.ToFloat64(agg.Metrics().Processed)) }
			b.ReportAllocs()
			start := time.Now()
			b.ResetTimer()
			follow(b, sock, agg, mask)
			sent := 0
			for sent < b.N {
				if sent-processed() > capacity/2 {
					time.Sleep(100 * time.Microsecond)
					continue
				}
				n := min(1024, b.N-sent)
				batch := make([]*flowpb.Flow, n)
				for i := range batch {
					batch[i] = flows[(sent+i)%len(flows)]
				}
				h.Publish(batch...)
				sent += n
			}
			for processed() < b.N {
				time.Sleep(100 * time.Microsecond)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "flows/s")
			if lost := testutil.ToFloat64(agg.Metrics().lost[flowpb.LostEventSource_HUBBLE_RING_BUFFER]); lost > 0 {
				b.Errorf("%v flows lost: the publisher outran the client", lost)
			}
		})
	}
}

// BenchmarkDecodeWire is the stream's wire decoder on the flows of
// BenchmarkDecode (wrapped in a GetFlowsResponse, as the stream carries
// them), into the reused response.
func BenchmarkDecodeWire(b *testing.B) {
	for _, c := range benchFlows(b) {
		var f flowpb.Flow
		if err := proto.Unmarshal(c.data, &f); err != nil {
			b.Fatal(err)
		}
		data := wireBytes(b, &f)
		b.Run(c.name, func(b *testing.B) {
			var w wireResponse
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			start := cpuTime()
			for b.Loop() {
				w.decode(data)
				if w.kind != respFlow {
					b.Fatal(w.err)
				}
			}
			reportCPU(b, start)
		})
	}
}

func wireBytes(tb testing.TB, f *flowpb.Flow) []byte {
	data, err := proto.Marshal(&observerpb.GetFlowsResponse{ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: f},
		NodeName: f.GetNodeName(), Time: f.GetTime()})
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// clientReceiveFlows are the GetFlowsResponse bytes Cilium's server sends
// for the typical flow, under the field mask and whole.
func clientReceiveFlows(b *testing.B) []struct {
	name string
	data []byte
} {
	return []struct {
		name string
		data []byte
	}{{"mask", wireBytes(b, maskedFlow(b))}, {"nomask", wireBytes(b, typicalFlow())}}
}

// BenchmarkClientReceive is the client alone, per flow, from the wire:
// the GetFlowsResponse bytes Cilium's server encodes (under the field
// mask, or whole) as gRPC hands them to the stream's codec, decoded into
// the reused response, then the resume check, classification and
// counting. No server, no socket.
func BenchmarkClientReceive(b *testing.B) {
	for _, c := range clientReceiveFlows(b) {
		b.Run(c.name, func(b *testing.B) {
			cl := NewClient(Config{}, NewAggregator(indexOf(testScenario()), "", time.Minute, nil))
			codec := newWireCodec()
			resp := &wireResponse{}
			data := mem.BufferSlice{mem.SliceBuffer(c.data)}
			b.ReportAllocs()
			b.SetBytes(int64(len(c.data)))
			start := cpuTime()
			for b.Loop() {
				if err := codec.Unmarshal(data, resp); err != nil {
					b.Fatal(err)
				}
				cl.receive(resp)
			}
			reportCPU(b, start)
			if got := testutil.ToFloat64(cl.m.Processed); got < float64(b.N) {
				b.Fatalf("%v flows processed of %d", got, b.N)
			}
		})
	}
}

// BenchmarkClientReceiveGenerated is BenchmarkClientReceive with the
// generated decoder (the client before the wire decoder), for comparison
// in the same run.
func BenchmarkClientReceiveGenerated(b *testing.B) {
	for _, c := range clientReceiveFlows(b) {
		b.Run(c.name, func(b *testing.B) {
			cl := NewClient(Config{}, NewAggregator(indexOf(testScenario()), "", time.Minute, nil))
			resp := &observerpb.GetFlowsResponse{}
			b.ReportAllocs()
			b.SetBytes(int64(len(c.data)))
			start := cpuTime()
			for b.Loop() {
				if err := proto.Unmarshal(c.data, resp); err != nil {
					b.Fatal(err)
				}
				cl.handle(resp)
			}
			reportCPU(b, start)
		})
	}
}
