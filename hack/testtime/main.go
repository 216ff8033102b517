// Command testtime stands between `go test -json` and the log: it prints
// the test output as go test would have printed it, records how long each
// test took, and prints make test's time table.
//
//	go test -json PACKAGES | testtime [-v] [-tier NAME -record FILE]
//	testtime -table DIR [-n 10]
//
// In the first form it reads go test's JSON events (go doc cmd/test2json;
// build output: go help buildjson) from standard input and prints their
// Output text:
//
//   - with -v, every line as `go test -v` prints it, each package's lines
//     together (the first package still running streams live; the others
//     wait for it, as go test's own output does). One difference remains:
//     a subtest's "--- PASS" line comes when the subtest ends, not gathered
//     under its parent's;
//   - without -v, as go test prints a package list: a passing package as
//     its one "ok" line, a failing one as its direct prints, the reports of
//     its failed tests (subtests indented under their parents) and its FAIL
//     lines. A test's indented lines (t.Log's) are its report; lines that
//     are not indented count as printed to stdout (fmt.Println), as go test
//     shows them.
//
// Build output goes to standard error, as go test writes it, and a run with
// a failure ends with go test's closing "FAIL" line. Lines that are not
// JSON are printed as they are. testtime exits 0 when it could read its
// input: the Makefile keeps go test's exit status with `set -o pipefail`.
//
// With -record, each test's and each package's result is appended to FILE
// as it arrives, one tab-separated line each: tier, package, test (empty
// for the package), action (pass, fail, skip), seconds.
//
// In the second form it prints the time table from DIR/tiers.tsv (one line
// per tier: name, start and end in Unix seconds, exit status, or "not run")
// and DIR/tests.tsv (the records): each tier's wall time and the N slowest
// top-level tests.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

func main() {
	verbose := flag.Bool("v", false, "print every test's output, as go test -v does")
	tier := flag.String("tier", "", "the tier written in each record")
	record := flag.String("record", "", "append each test's elapsed time to this file")
	table := flag.String("table", "", "print the time table of this folder (tiers.tsv, tests.tsv) and exit")
	slowest := flag.Int("n", 10, "with -table: how many of the slowest tests to list")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "testtime: no arguments expected; see go doc ./hack/testtime")
		os.Exit(2)
	}

	if *table != "" {
		if err := printTable(os.Stdout, *table, *slowest); err != nil {
			fmt.Fprintln(os.Stderr, "testtime:", err)
			os.Exit(1)
		}
		return
	}

	var rec io.Writer
	if *record != "" {
		f, err := os.OpenFile(*record, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			// The tests' output matters more than their times: say so and go on.
			fmt.Fprintln(os.Stderr, "testtime: not recording times:", err)
		} else {
			defer f.Close()
			rec = f
		}
	}
	out := bufio.NewWriter(os.Stdout)
	f := newFilter(out, os.Stderr, rec, *tier, *verbose)
	if err := f.run(os.Stdin); err != nil {
		out.Flush()
		fmt.Fprintln(os.Stderr, "testtime:", err)
		os.Exit(1)
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "testtime:", err)
		os.Exit(1)
	}
}

// event is one line of go test -json: a test2json TestEvent or a go build
// BuildEvent (ImportPath, Action build-output or build-fail).
type event struct {
	Action      string
	Package     string
	Test        string
	Elapsed     *float64
	Output      string
	FailedBuild string
	ImportPath  string
}

// filter turns a go test -json stream back into go test's text.
type filter struct {
	out, errOut *bufio.Writer
	rec         io.Writer
	tier        string
	verbose     bool

	pkgs   map[string]*pkg
	queue  []*pkg // packages in the order they appeared; queue[0] prints live
	failed bool   // a package or a build failed: go test ends with "FAIL"

	// waited: seconds a test said it waited for a lane (LaneWaitPrefix),
	// by package and test; recorded times leave them out.
	waited map[[2]string]float64
}

// LaneWaitPrefix starts the line a parallel test logs after it waited for
// its turn in a lane of tests that run one at a time (e2e's inLane):
// "lane: waited 12.345s". Go test counts that wait in the test's elapsed
// time; the record leaves it out, so that the table's seconds are the
// test's own.
const LaneWaitPrefix = "lane: waited "

// pkg is one package's output while it runs.
type pkg struct {
	name    string
	pending strings.Builder // printed when the package reaches the head of the queue
	done    bool

	// Without -v:
	text  strings.Builder // what go test prints for it if it fails
	last  string          // its last package-level line: "ok ..." when it passes
	tests map[string]*test
	order []string // tests in the order they started, for what a broken stream leaves
}

// test is a running test's report without -v: the "--- FAIL" line and the
// lines under it (its logs, its failed subtests' reports, indented).
type test struct {
	header string
	body   strings.Builder
}

func newFilter(out io.Writer, errOut io.Writer, rec io.Writer, tier string, verbose bool) *filter {
	return &filter{
		out:     asBuffered(out),
		errOut:  asBuffered(errOut),
		rec:     rec,
		tier:    tier,
		verbose: verbose,
		pkgs:    map[string]*pkg{},
	}
}

func asBuffered(w io.Writer) *bufio.Writer {
	if b, ok := w.(*bufio.Writer); ok {
		return b
	}
	return bufio.NewWriter(w)
}

// run reads the stream to its end, then prints what is still held (a
// package whose end never came) and go test's closing FAIL line.
func (f *filter) run(r io.Reader) error {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			f.line(line)
			// Each event as it comes, for a live -v log.
			if err := f.flush(); err != nil {
				return err
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	for _, p := range f.queue {
		if !p.done {
			f.finish(p, false)
		}
	}
	if f.failed {
		f.out.WriteString("FAIL\n")
	}
	return f.flush()
}

func (f *filter) flush() error {
	if err := f.errOut.Flush(); err != nil {
		return err
	}
	return f.out.Flush()
}

func (f *filter) line(line string) {
	var e event
	if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil || e.Action == "" {
		f.out.WriteString(line)
		return
	}
	switch e.Action {
	case "build-output":
		f.errOut.WriteString(e.Output)
		return
	case "build-fail":
		f.failed = true
		return
	}
	p := f.pkg(e.Package)
	switch e.Action {
	case "output":
		f.laneWait(e)
		f.output(p, e)
	case "pass", "fail", "skip":
		f.record(e)
		if e.Action == "fail" {
			f.failed = true
		}
		if e.Test == "" {
			f.finish(p, e.Action == "fail")
		} else if !f.verbose {
			f.testEnd(p, e.Test, e.Action == "fail")
		}
	}
}

func (f *filter) pkg(name string) *pkg {
	p := f.pkgs[name]
	if p == nil {
		p = &pkg{name: name, tests: map[string]*test{}}
		f.pkgs[name] = p
		f.queue = append(f.queue, p)
	}
	return p
}

// emit prints text for p now if p is the package printing live, else holds
// it until p's turn.
func (f *filter) emit(p *pkg, text string) {
	if len(f.queue) > 0 && f.queue[0] == p {
		f.out.WriteString(text)
		return
	}
	p.pending.WriteString(text)
}

func (f *filter) output(p *pkg, e event) {
	if f.verbose {
		f.emit(p, e.Output)
		return
	}
	if e.Test == "" {
		p.text.WriteString(e.Output)
		p.last = e.Output
		return
	}
	t := p.tests[e.Test]
	if t == nil {
		t = &test{}
		p.tests[e.Test] = t
		p.order = append(p.order, e.Test)
	}
	switch {
	case t.header != "":
		// After its "--- FAIL" line: a panic's trace, part of the report.
		t.body.WriteString(e.Output)
	case isFramingLine(e.Output):
	case isResultLine(e.Output, e.Test):
		t.header = e.Output
	case strings.HasPrefix(e.Output, "    "):
		t.body.WriteString(e.Output)
	default:
		// Printed to stdout by the test: go test shows it where it came.
		p.text.WriteString(e.Output)
	}
}

// isFramingLine reports the lines only -v prints: a test starting, pausing,
// continuing or taking the output back.
func isFramingLine(s string) bool {
	for _, w := range []string{"=== RUN ", "=== PAUSE ", "=== CONT ", "=== NAME "} {
		if strings.HasPrefix(s, w) {
			return true
		}
	}
	return false
}

// isResultLine reports the test's own "--- PASS: Name (0.00s)" line.
func isResultLine(s, name string) bool {
	for _, w := range []string{"--- PASS: ", "--- FAIL: ", "--- SKIP: ", "--- BENCH: "} {
		if strings.HasPrefix(s, w+name+" (") {
			return true
		}
	}
	return false
}

// testEnd files a finished test's report without -v: a failed test's goes
// under its parent, indented, or into the package's text; a passed or
// skipped test's is dropped, as go test drops it.
func (f *filter) testEnd(p *pkg, name string, failed bool) {
	t := p.tests[name]
	delete(p.tests, name)
	if t == nil || !failed {
		return
	}
	report := t.header + t.body.String()
	for i := strings.LastIndexByte(name, '/'); i > 0; i = strings.LastIndexByte(name[:i], '/') {
		if parent := p.tests[name[:i]]; parent != nil {
			parent.body.WriteString(indent(report))
			return
		}
	}
	p.text.WriteString(report)
}

// indent puts four spaces before each line, as the testing package does
// with a subtest's report in its parent's.
func indent(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		i := strings.IndexByte(s, '\n') + 1
		if i == 0 {
			i = len(s)
		}
		b.WriteString("    ")
		b.WriteString(s[:i])
		s = s[i:]
	}
	return b.String()
}

// finish ends a package: without -v it prints its "ok" line, or all it
// has when it failed or its end never came; then the next packages in the
// queue print what they hold.
func (f *filter) finish(p *pkg, failed bool) {
	if p.done {
		return
	}
	p.done = true
	if !f.verbose {
		complete := p.last != "" && len(p.tests) == 0
		if failed || !complete {
			// Tests whose end never came (the stream broke off) print what they had.
			for _, name := range p.order {
				if t := p.tests[name]; t != nil {
					p.text.WriteString(t.header + t.body.String())
				}
			}
			f.emit(p, p.text.String())
		} else {
			f.emit(p, p.last)
		}
	}
	for len(f.queue) > 0 && f.queue[0].done {
		f.queue = f.queue[1:]
		if len(f.queue) > 0 {
			next := f.queue[0]
			f.out.WriteString(next.pending.String())
			next.pending.Reset()
		}
	}
}

func (f *filter) record(e event) {
	if f.rec == nil || e.Elapsed == nil {
		return
	}
	elapsed := *e.Elapsed - f.waited[[2]string{e.Package, e.Test}]
	// Best effort, as the opening: the output goes on if the disk is full.
	fmt.Fprintf(f.rec, "%s\t%s\t%s\t%s\t%.3f\n", f.tier, e.Package, e.Test, e.Action, max(elapsed, 0))
}

// laneWait notes a test's "lane: waited 12.345s" line (t.Logf's, after
// the file:line prefix).
func (f *filter) laneWait(e event) {
	if e.Test == "" {
		return
	}
	i := strings.Index(e.Output, LaneWaitPrefix)
	if i < 0 {
		return
	}
	d, err := time.ParseDuration(strings.TrimSpace(e.Output[i+len(LaneWaitPrefix):]))
	if err != nil {
		return
	}
	if f.waited == nil {
		f.waited = map[[2]string]float64{}
	}
	f.waited[[2]string{e.Package, e.Test}] += d.Seconds()
}
