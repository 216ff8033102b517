package main

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/zonewatch/zonewatch/collector/kube"
)

// TestSkippedAddressesExported: the Service informers' skipped addresses
// (kube.Services.SkippedServices and SkippedSlices, counted where the
// informers strip the objects) are what
// zonewatch_kube_addresses_skipped_total exports, per resource (issue 45,
// item 7).
func TestSkippedAddressesExported(t *testing.T) {
	s := &kube.Services{}
	s.SkippedServices.Add(2)
	s.SkippedSlices.Add(5)
	want := `
# HELP zonewatch_kube_addresses_skipped_total Addresses of Services (cluster IPs, resource=services) and EndpointSlices (ready endpoints, resource=endpointslices) that do not parse: skipped, never placed.
# TYPE zonewatch_kube_addresses_skipped_total counter
zonewatch_kube_addresses_skipped_total{resource="endpointslices"} 5
zonewatch_kube_addresses_skipped_total{resource="services"} 2
`
	if err := testutil.CollectAndCompare(skippedAddresses{s}, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
