package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// tierTime is one line of tiers.tsv.
type tierTime struct {
	name       string
	start, end float64 // Unix seconds; both 0 when the tier did not run
	status     string  // exit status, or "not run"
}

// testTime is one line of tests.tsv (see the package comment).
type testTime struct {
	tier, pkg, test, action string
	seconds                 float64
}

// printTable prints the time table of dir: the tiers' wall times, then the
// n slowest top-level tests (subtests are part of their parent's time).
func printTable(w io.Writer, dir string, n int) error {
	tiers, err := readTiers(filepath.Join(dir, "tiers.tsv"))
	if err != nil {
		return err
	}
	tests, err := readTests(filepath.Join(dir, "tests.tsv"))
	if err != nil {
		return err
	}

	fmt.Fprintf(w, "\ntime table (%s)\n", dir)
	width := len("total")
	for _, t := range tiers {
		width = max(width, len(t.name))
	}
	row := func(name, wall, status string) {
		fmt.Fprintf(w, "%-*s  %7s  %s\n", width, name, wall, status)
	}
	row("tier", "wall", "exit")
	var total float64
	for _, t := range tiers {
		if t.status == "not run" {
			row(t.name, "-", t.status)
			continue
		}
		d := t.end - t.start
		total += d
		row(t.name, wall(d), t.status)
	}
	fmt.Fprintf(w, "%-*s  %7s\n", width, "total", wall(total))

	var top []testTime
	for _, t := range tests {
		if t.test != "" && !strings.Contains(t.test, "/") {
			top = append(top, t)
		}
	}
	sort.SliceStable(top, func(i, j int) bool { return top[i].seconds > top[j].seconds })
	if len(top) == 0 {
		fmt.Fprintln(w, "\nno test times recorded")
		return nil
	}
	fmt.Fprintf(w, "\nthe %d slowest tests (of %d)\n", min(n, len(top)), len(top))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "seconds\ttier\tpackage\ttest\tresult")
	for _, t := range top[:min(n, len(top))] {
		fmt.Fprintf(tw, "%7.1f\t%s\t%s\t%s\t%s\n", t.seconds, t.tier, t.pkg, t.test, t.action)
	}
	return tw.Flush()
}

// wall formats seconds as 12m05s (or 4.2s under a minute).
func wall(s float64) string {
	if s < 60 {
		return fmt.Sprintf("%.1fs", s)
	}
	d := time.Duration(s * float64(time.Second)).Round(time.Second)
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}

func readTiers(path string) ([]tierTime, error) {
	var tiers []tierTime
	err := readTSV(path, 4, func(f []string) error {
		t := tierTime{name: f[0], status: f[3]}
		if t.status != "not run" {
			var err error
			if t.start, err = seconds(f[1]); err != nil {
				return err
			}
			if t.end, err = seconds(f[2]); err != nil {
				return err
			}
		}
		tiers = append(tiers, t)
		return nil
	})
	return tiers, err
}

func readTests(path string) ([]testTime, error) {
	var tests []testTime
	err := readTSV(path, 5, func(f []string) error {
		s, err := seconds(f[4])
		if err != nil {
			return err
		}
		tests = append(tests, testTime{tier: f[0], pkg: f[1], test: f[2], action: f[3], seconds: s})
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		// No test tier ran (the tools or lint failed).
		return nil, nil
	}
	return tests, err
}

// seconds parses 1733461234.567890 (bash's $EPOCHREALTIME, whose decimal
// separator follows the locale) or 12.345.
func seconds(s string) (float64, error) {
	return strconv.ParseFloat(strings.Replace(s, ",", ".", 1), 64)
}

func readTSV(path string, fields int, each func([]string) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		if sc.Text() == "" {
			continue
		}
		fs := strings.Split(sc.Text(), "\t")
		if len(fs) != fields {
			return fmt.Errorf("%s:%d: %d fields, want %d", path, n, len(fs), fields)
		}
		if err := each(fs); err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
	}
	return sc.Err()
}
