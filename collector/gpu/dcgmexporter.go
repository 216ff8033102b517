package gpu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxPage bounds a dcgm-exporter page; eight GPUs with every field are a
// few hundred kilobytes.
const maxPage = 32 << 20

// dcgm-exporter metric names (DCGM field names) read from a page.
const (
	metricGPUUtil      = "DCGM_FI_DEV_GPU_UTIL"            // field 203, percent
	metricGrEngActive  = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"   // field 1001, ratio
	metricSMActive     = "DCGM_FI_PROF_SM_ACTIVE"          // field 1002, ratio
	metricTensorActive = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" // field 1004, ratio
)

// DCGMExporter scrapes a dcgm-exporter /metrics page. It needs no cgo and
// no DCGM library: dcgm-exporter owns the host engine.
type DCGMExporter struct {
	url     string
	client  *http.Client
	skipped prometheus.Counter
}

// NewDCGMExporter returns a source reading url. skipped counts series it
// cannot place on a GPU (no UUID label); nil for none.
func NewDCGMExporter(url string, skipped prometheus.Counter) *DCGMExporter {
	return &DCGMExporter{url: url, client: &http.Client{}, skipped: skipped}
}

// Read fetches and parses the page.
func (d *DCGMExporter) Read(ctx context.Context) ([]Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url, nil)
	if err != nil {
		return nil, fmt.Errorf("dcgm-exporter request %s: %w", d.url, err)
	}
	// Ask for the classic text format: the parser below reads only that.
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetching dcgm-exporter page: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetching dcgm-exporter page %s: %s", d.url, resp.Status)
	}
	ss, skipped, err := ParseDCGMExporter(io.LimitReader(resp.Body, maxPage), time.Now())
	if err != nil {
		return nil, fmt.Errorf("parsing dcgm-exporter page %s: %w", d.url, err)
	}
	if d.skipped != nil && skipped > 0 {
		d.skipped.Add(float64(skipped))
	}
	return ss, nil
}

// ErrNoGPUSeries: a dcgm-exporter page has series, but none that names a
// GPU's utilization the way zonewatch reads it. Read wraps it with the
// reason (1.x names, a counters CSV without the fields, no UUID labels).
var ErrNoGPUSeries = errors.New("dcgm-exporter page has no GPU utilization series")

// ParseDCGMExporter reads a dcgm-exporter page in the Prometheus text
// format. It accepts the label spellings of every dcgm-exporter release
// (UUID or uuid, Hostname or hostname, pod or pod_name), converts GPU_UTIL
// from percent, and drops values out of range (DCGM blank sentinels).
// skipped counts series with no UUID, which cannot be placed on a GPU. A
// page with series but no GPU sample is ErrNoGPUSeries with the reason; an
// empty page is no GPUs.
func ParseDCGMExporter(r io.Reader, at time.Time) (samples []Sample, skipped int, err error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, 0, err
	}
	type key struct {
		uuid string
		gi   int
	}
	byGPU := map[key]*Sample{}
	var order []key
	for _, f := range []struct {
		name  string
		scale float64
		set   func(*Sample, float64)
	}{
		{metricGPUUtil, 100, func(s *Sample, v float64) { s.Util = v }},
		{metricGrEngActive, 1, func(s *Sample, v float64) { s.GraphicsActive = v }},
		{metricSMActive, 1, func(s *Sample, v float64) { s.SMActive = v }},
		{metricTensorActive, 1, func(s *Sample, v float64) { s.TensorActive = v }},
	} {
		fam := fams[f.name]
		for _, m := range fam.GetMetric() {
			l := labelsOf(m)
			uuid := first(l, "UUID", "uuid")
			if uuid == "" {
				skipped++
				continue
			}
			k := key{uuid: uuid, gi: NoInstance}
			if gi, err := strconv.Atoi(first(l, "GPU_I_ID", "gpu_i_id")); err == nil && gi >= 0 {
				k.gi = gi
			}
			s := byGPU[k]
			if s == nil {
				idx := -1
				if n, err := strconv.Atoi(first(l, "gpu")); err == nil && n >= 0 {
					idx = n
				}
				s = &Sample{UUID: uuid, Index: idx, GI: k.gi, Device: first(l, "device"), Node: first(l, "Hostname", "hostname"),
					Util: NA, GraphicsActive: NA, SMActive: NA, TensorActive: NA, Time: at,
					Namespace: first(l, "namespace", "pod_namespace"), Pod: first(l, "pod", "pod_name")}
				byGPU[k] = s
				order = append(order, k)
			}
			f.set(s, ratio(value(fam, m), f.scale))
		}
	}
	samples = make([]Sample, 0, len(order))
	for _, k := range order {
		s := byGPU[k]
		// DCGM has no GPU_UTIL for a MIG instance: its engine activity is
		// its utilization.
		s.Util = utilization(s.Util, s.GraphicsActive)
		samples = append(samples, *s)
	}
	if len(samples) == 0 {
		if err := noGPUSeries(fams, skipped); err != nil {
			return nil, skipped, err
		}
	}
	return normalize(samples), skipped, nil
}

// noGPUSeries says why a page with series yields no GPU sample; nil for a
// page without series (a dcgm-exporter that sees no GPU).
func noGPUSeries(fams map[string]*dto.MetricFamily, skipped int) error {
	var old, fields, total int
	for name, f := range fams {
		n := len(f.GetMetric())
		total += n
		switch {
		case strings.HasPrefix(name, "dcgm_"):
			old += n
		case strings.HasPrefix(name, "DCGM_FI_"):
			fields += n
		}
	}
	switch {
	case total == 0:
		return nil
	case skipped > 0:
		return fmt.Errorf("%w: its %d utilization series carry no UUID label", ErrNoGPUSeries, skipped)
	case old > 0 && fields == 0:
		return fmt.Errorf("%w: it has %d series in dcgm-exporter's 1.x naming (dcgm_*: --use-old-namespace or the 1.x-compatibility counters CSV); run dcgm-exporter with its default DCGM_FI_* names", ErrNoGPUSeries, old)
	case fields > 0:
		return fmt.Errorf("%w: its counters CSV has none of %s, %s, %s, %s (%d other DCGM_FI_* series); use dcgm-exporter's default counters or add them", ErrNoGPUSeries,
			metricGPUUtil, metricGrEngActive, metricSMActive, metricTensorActive, fields)
	}
	return fmt.Errorf("%w: none of its %d series is a DCGM field; is this a dcgm-exporter page?", ErrNoGPUSeries, total)
}

func labelsOf(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

func first(l map[string]string, names ...string) string {
	for _, n := range names {
		if v := l[n]; v != "" {
			return v
		}
	}
	return ""
}

func value(f *dto.MetricFamily, m *dto.Metric) float64 {
	switch f.GetType() {
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_UNTYPED:
		return m.GetUntyped().GetValue()
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	}
	return math.NaN()
}
