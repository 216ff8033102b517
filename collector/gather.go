package collector

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// Gatherer serves reg's families and the placement collector's, merged by
// name, as the registry would: the placement series skip the registry
// (its per-series checks, hashing and sort: 2 allocations and a third of
// the time per series), since they are rendered once, valid, and already
// in its order. The placement's scrape duration and success join the
// zonewatch_scrape_collector_* families as collector="placement". p must
// not also be added to a collector reg gathers.
func Gatherer(reg prometheus.Gatherer, p *Placement) prometheus.Gatherer {
	return &gatherer{reg: reg, p: p}
}

type gatherer struct {
	reg prometheus.Gatherer
	p   *Placement
}

func gaugeFamily(name, help string) *dto.MetricFamily {
	return &dto.MetricFamily{Name: proto.String(name), Help: proto.String(help), Type: dto.MetricType_GAUGE.Enum()}
}

// Gather implements prometheus.Gatherer.
func (g *gatherer) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := g.reg.Gather()
	start := time.Now()
	info, zones, split := gaugeFamily(jobPodInfoName, jobPodInfoHelp), gaugeFamily(jobZonesName, jobZonesHelp), gaugeFamily(jobSplitName, jobSplitHelp)
	var multi *dto.MetricFamily // made for the first such series: most clusters have none
	g.p.each(func(s *gauge) {
		switch s.desc {
		case jobPodInfoDesc:
			info.Metric = append(info.Metric, &s.m)
		case jobZonesDesc:
			zones.Metric = append(zones.Metric, &s.m)
		case jobMultiZoneDesc:
			if multi == nil {
				multi = gaugeFamily(jobMultiZoneName, jobMultiZoneHelp)
			}
			multi.Metric = append(multi.Metric, &s.m)
		default:
			split.Metric = append(split.Metric, &s.m)
		}
	})
	took := time.Since(start).Seconds()
	for _, f := range []*dto.MetricFamily{info, zones, split, multi} {
		if f != nil && len(f.Metric) > 0 {
			var dup error
			if mfs, dup = insertFamily(mfs, f); dup != nil && err == nil {
				err = dup
			}
		}
	}
	self := []struct {
		desc  *prometheus.Desc
		value float64
	}{{scrapeDurationDesc, took}, {scrapeSuccessDesc, 1}}
	for _, s := range self {
		var m dto.Metric
		if werr := prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, s.value, "placement").Write(&m); werr != nil {
			return mfs, werr
		}
		mfs = insertSeries(mfs, s.desc, &m)
	}
	return mfs, err
}

func byName(m *dto.MetricFamily, name string) int { return strings.Compare(m.GetName(), name) }

// insertFamily adds f to the families sorted by name.
func insertFamily(mfs []*dto.MetricFamily, f *dto.MetricFamily) ([]*dto.MetricFamily, error) {
	i, found := slices.BinarySearchFunc(mfs, f.GetName(), byName)
	if found {
		return mfs, fmt.Errorf("%s gathered twice: the placement collector is also registered", f.GetName())
	}
	return slices.Insert(mfs, i, f), nil
}

// insertSeries adds m (one label, collector) to its family among the
// families sorted by name, in label order; the family is made when absent.
// The registry's families are its own per Gather, so they may grow.
func insertSeries(mfs []*dto.MetricFamily, d *prometheus.Desc, m *dto.Metric) []*dto.MetricFamily {
	name := fqName(d)
	i, found := slices.BinarySearchFunc(mfs, name, byName)
	if !found {
		f := gaugeFamily(name, helpOf(d))
		mfs = slices.Insert(mfs, i, f)
	}
	f := mfs[i]
	j, _ := slices.BinarySearchFunc(f.Metric, m.Label[0].GetValue(), func(x *dto.Metric, v string) int {
		return cmp.Compare(x.GetLabel()[0].GetValue(), v)
	})
	f.Metric = slices.Insert(f.Metric, j, m)
	return mfs
}

// The two self families' names and help, as collector.go declares them.
func fqName(d *prometheus.Desc) string {
	if d == scrapeDurationDesc {
		return scrapeDurationName
	}
	return scrapeSuccessName
}

func helpOf(d *prometheus.Desc) string {
	if d == scrapeDurationDesc {
		return scrapeDurationHelp
	}
	return scrapeSuccessHelp
}
