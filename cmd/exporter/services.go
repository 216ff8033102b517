package main

import (
	"context"

	"github.com/alecthomas/kingpin/v2"
)

func init() { register("services", &servicesPart{}) }

// servicesPart turns the Service and EndpointSlice informers of the
// Kubernetes feed (startKube) on or off.
type servicesPart struct{ enabled *bool }

func (p *servicesPart) flags(cmd *kingpin.CmdClause) {
	p.enabled = flagOf(cmd, "kube.services.enabled", "Watch the cluster's Services and EndpointSlices, so that a connection to a ClusterIP the datapath left untranslated is placed as its one backend (--no-kube.services.enabled: a cluster IP is an address of no pod, and such a connection counts to no job; no Service or EndpointSlice is listed or watched).").Default("true").Bool()
}

func (p *servicesPart) input(in *inputs) { in.noServices = !*p.enabled }

func (p *servicesPart) start(context.Context, *wiring, *inputs) error { return nil }
