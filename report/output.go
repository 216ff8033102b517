package report

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Formats are the output formats Write knows.
var Formats = []string{"text", "csv", "json", "markdown"}

// Write writes r in format (one of Formats).
func (r *Report) Write(w io.Writer, format string) error {
	switch format {
	case "text":
		return r.writeText(w)
	case "csv":
		return r.writeCSV(w)
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case "markdown":
		return r.writeMarkdown(w)
	}
	return fmt.Errorf("unknown format %q (want one of %s)", format, strings.Join(Formats, ", "))
}

// Every format shows dollars to the cent and GB to the MB, from the same
// numbers, so the four agree.
func usd(d float64) string   { return strconv.FormatFloat(d, 'f', 2, 64) }
func gb(g float64) string    { return strconv.FormatFloat(g, 'f', 3, 64) }
func hrs(h float64) string   { return strconv.FormatFloat(h, 'f', 2, 64) }
func count(n float64) string { return strconv.FormatFloat(n, 'f', 0, 64) }

func policies(l Line) string {
	if len(l.DenyingPolicies) == 0 {
		return "-"
	}
	return strings.Join(l.DenyingPolicies, "; ")
}

func (r *Report) period() string {
	return fmt.Sprintf("%s to %s (%s)", r.From.Format(time.RFC3339), r.To.Format(time.RFC3339), r.To.Sub(r.From))
}

func (r *Report) priceLine() string {
	return fmt.Sprintf("Prices (rule pack): cross-zone %s USD/GB, cross-region %s USD/GB, GPU %s USD/hour; bytes counted once, at the sender.",
		strconv.FormatFloat(r.Prices.CrossZoneDollarsPerGB, 'f', -1, 64),
		strconv.FormatFloat(r.Prices.CrossRegionDollarsPerGB, 'f', -1, 64),
		strconv.FormatFloat(r.Prices.GPUDollarsPerHour, 'f', -1, 64))
}

var header = []string{"cross-zone GB", "cross-region GB", "transfer $", "idle GPU-h", "idle GPU $", "total $", "policy drops", "denying policies"}

func cells(l Line) []string {
	return []string{gb(l.CrossZoneGB), gb(l.CrossRegionGB), usd(l.TransferDollars), hrs(l.IdleGPUHours), usd(l.IdleGPUDollars), usd(l.TotalDollars), count(l.PolicyDropEvents), policies(l)}
}

func (r *Report) writeText(w io.Writer) error {
	fmt.Fprintf(w, "zonewatch cost report, %s\n%s\n", r.period(), r.priceLine())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	table := func(title string, first []string, lines []Line, key func(Line) []string) {
		fmt.Fprintf(tw, "\n%s\n", title)
		fmt.Fprintln(tw, strings.Join(append(first, header...), "\t")+"\t")
		for _, l := range lines {
			fmt.Fprintln(tw, strings.Join(append(key(l), cells(l)...), "\t")+"\t")
		}
	}
	table("Per job", []string{"namespace", "job"}, r.Jobs, func(l Line) []string { return []string{l.Namespace, l.Job} })
	table("Per namespace", []string{"namespace"}, r.Namespaces, func(l Line) []string { return []string{l.Namespace} })
	table("Period", []string{""}, []Line{r.Total, r.MonthlyProjection}, nil2(r))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nWhat this cannot see:")
	for _, n := range r.Notes {
		fmt.Fprintln(w, "- "+n)
	}
	return nil
}

// nil2 labels the two period lines.
func nil2(r *Report) func(Line) []string {
	i := 0
	return func(Line) []string {
		i++
		if i == 1 {
			return []string{"total"}
		}
		return []string{fmt.Sprintf("per month (%d h)", HoursPerMonth)}
	}
}

func (r *Report) writeCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"scope", "namespace", "job_name", "cross_zone_gb", "cross_region_gb", "transfer_usd", "idle_gpu_hours", "idle_gpu_usd", "total_usd", "policy_drop_events", "denying_policies", "from", "to"})
	row := func(scope string, l Line) {
		_ = cw.Write(append(append([]string{scope, l.Namespace, l.Job}, cells(l)[:7]...),
			strings.Join(l.DenyingPolicies, ";"), r.From.Format(time.RFC3339), r.To.Format(time.RFC3339)))
	}
	for _, l := range r.Jobs {
		row("job", l)
	}
	for _, l := range r.Namespaces {
		row("namespace", l)
	}
	row("total", r.Total)
	row("monthly_projection", r.MonthlyProjection)
	cw.Flush()
	return cw.Error()
}

func (r *Report) writeMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "## zonewatch cost report\n\n%s\n\n%s\n", r.period(), r.priceLine())
	table := func(title string, first []string, lines []Line, key func(Line) []string) {
		fmt.Fprintf(w, "\n### %s\n\n| %s |\n|%s\n", title, strings.Join(append(first, header...), " | "), strings.Repeat(" --- |", len(first)+len(header)))
		for _, l := range lines {
			c := append(key(l), cells(l)...)
			for i := range c {
				c[i] = strings.ReplaceAll(c[i], "|", `\|`)
			}
			fmt.Fprintf(w, "| %s |\n", strings.Join(c, " | "))
		}
	}
	table("Per job", []string{"namespace", "job"}, r.Jobs, func(l Line) []string { return []string{l.Namespace, l.Job} })
	table("Per namespace", []string{"namespace"}, r.Namespaces, func(l Line) []string { return []string{l.Namespace} })
	table("Period", []string{""}, []Line{r.Total, r.MonthlyProjection}, nil2(r))
	fmt.Fprintln(w, "\n**What this cannot see**")
	fmt.Fprintln(w)
	for _, n := range r.Notes {
		fmt.Fprintln(w, "- "+n)
	}
	return nil
}
