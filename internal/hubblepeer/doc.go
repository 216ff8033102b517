// Package hubblepeer tests zonewatch's Hubble client against Cilium's own
// server side: the local Observer (pkg/hubble/observer) with its ring,
// filters (pkg/hubble/filters) and field mask (pkg/hubble/parser/fieldmask),
// fed through Cilium's parser (pkg/hubble/parser) with raw monitor events
// (drop, trace and policy-verdict notifications around real packets, L7
// access-log records, lost events), served over gRPC on a unix socket.
//
// It is a module of its own so that the main module does not depend on
// Cilium's server side; it uses the main module's Cilium version
// (v1.20.2) and pins Kubernetes to the version that Cilium is built
// against (see go.mod). It holds tests only.
package hubblepeer
