// Package e2e holds zonewatch's end-to-end tests: the real exporter binary,
// one process per simulated GPU node, against a real kube-apiserver,
// Prometheus and Alertmanager, fed by fakes that speak the real protocols
// (Hubble Observer gRPC, kubelet PodResources gRPC, a dcgm-exporter page,
// Cilium conntrack maps pinned in a BPF filesystem). The tests live in the
// _test.go files; the section "End-to-end tests" of docs/development.md says what they prove.
package e2e
