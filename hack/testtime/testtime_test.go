package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The recorded streams are go test's own, of the packages under
// testdata/sample (one fails to build, one fails with subtests, parallel
// subtests and a print to stdout, one has no tests, one passes), recorded
// from the repository root with
//
//	P=./hack/testtime/testdata/sample/...
//	go test -count=1 -json $P > hack/testtime/testdata/sample.json
//	go test -count=1 $P > hack/testtime/testdata/sample.stdout 2> hack/testtime/testdata/sample.stderr
//
// Both runs exit 1. sample.stdout and sample.stderr are what go test printed
// without -json: the filter must print the same from sample.json, but for
// the durations (two runs).
const (
	recordedJSON   = "testdata/sample.json"
	recordedStdout = "testdata/sample.stdout"
	recordedStderr = "testdata/sample.stderr"
	samplePrefix   = "github.com/zonewatch/zonewatch/hack/testtime/testdata/sample/"
)

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// runFilter feeds stream through the filter and returns its stdout and stderr.
func runFilter(t *testing.T, stream string, verbose bool, rec *bytes.Buffer, tier string) (string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	f := newFilter(&out, &errOut, nil, tier, verbose)
	if rec != nil {
		f.rec = rec
	}
	if err := f.run(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String()
}

var durations = regexp.MustCompile(`[0-9]+\.[0-9]+s\b`)

func TestAsGoTestPrintsIt(t *testing.T) {
	out, errOut := runFilter(t, readFile(t, recordedJSON), false, nil, "")
	want := readFile(t, recordedStdout)
	if got, want := durations.ReplaceAllString(out, "N.NNs"), durations.ReplaceAllString(want, "N.NNs"); got != want {
		t.Errorf("stdout differs from go test's (durations aside)\n--- got\n%s--- want (%s)\n%s", got, recordedStdout, want)
	}
	if want := readFile(t, recordedStderr); errOut != want {
		t.Errorf("stderr differs from go test's\n--- got\n%s--- want (%s)\n%s", errOut, recordedStderr, want)
	}
	// What the plain output must not show: passing tests' logs, -v framing.
	for _, hidden := range []string{"logged by a passing test", "=== RUN", "--- PASS", "skipped on purpose"} {
		if strings.Contains(out, hidden) {
			t.Errorf("stdout shows %q, which go test without -v does not", hidden)
		}
	}
}

// outputsByPackage is every Output of the stream's test events, each
// package's together, packages in the order they first appear, read here
// without the filter's code.
func outputsByPackage(t *testing.T, stream string) (string, []string) {
	t.Helper()
	texts := map[string]*strings.Builder{}
	var order []string
	sc := bufio.NewScanner(strings.NewReader(stream))
	for sc.Scan() {
		var e struct{ Action, Package, Output string }
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		if e.Package == "" { // a build event
			continue
		}
		if texts[e.Package] == nil {
			texts[e.Package] = &strings.Builder{}
			order = append(order, e.Package)
		}
		texts[e.Package].WriteString(e.Output)
	}
	var all strings.Builder
	for _, p := range order {
		all.WriteString(texts[p].String())
	}
	return all.String(), order
}

func TestVerbose(t *testing.T) {
	stream := readFile(t, recordedJSON)
	out, errOut := runFilter(t, stream, true, nil, "")
	want, order := outputsByPackage(t, stream)
	if len(order) != 4 {
		t.Fatalf("the recording has packages %q, want the four of testdata/sample", order)
	}
	want += "FAIL\n" // go test's last line when something failed
	if out != want {
		t.Errorf("-v: got\n%s--- want every Output, package by package\n%s", out, want)
	}
	if want := readFile(t, recordedStderr); errOut != want {
		t.Errorf("-v stderr: got\n%s--- want\n%s", errOut, want)
	}
	// The recording interleaves packages (go test -json runs them at
	// once), so the filter has put them back together.
	var switches int
	var last string
	for _, m := range regexp.MustCompile(`"Action":"output","Package":"([^"]+)"`).FindAllStringSubmatch(stream, -1) {
		if m[1] != last {
			switches++
			last = m[1]
		}
	}
	if switches <= len(order) {
		t.Errorf("the recording's output does not interleave packages (%d switches): re-record it", switches)
	}
}

func TestRecord(t *testing.T) {
	var rec bytes.Buffer
	runFilter(t, readFile(t, recordedJSON), false, &rec, "integration")
	got := map[string]string{} // package/test -> action seconds
	for _, line := range strings.Split(strings.TrimSuffix(rec.String(), "\n"), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 5 || f[0] != "integration" {
			t.Fatalf("record line %q: want 5 tab-separated fields, tier first", line)
		}
		got[strings.TrimPrefix(f[1], samplePrefix)+"/"+f[2]] = f[3] + " " + f[4]
	}
	// The elapsed times as the recording states them.
	for key, want := range map[string]string{
		"fail/TestSlowFail":              "fail 0.150",
		"fail/TestSubtests/fails/deeper": "fail 0.000",
		"fail/TestSkip":                  "skip 0.000",
		"fail/TestParallel/90ms":         "pass 0.090",
		"pass/TestSlow":                  "pass 0.200",
		"notests/":                       "skip 0.000",
		"broken/":                        "fail 0.000",
	} {
		if got[key] != want {
			t.Errorf("record of %s: %q, want %q", key, got[key], want)
		}
	}
	if n := strings.Count(readFile(t, recordedJSON), `"Elapsed":`); len(got) != n {
		t.Errorf("%d records, want one per result with an elapsed time (%d)", len(got), n)
	}
}

// A stream that breaks off (go test killed) loses none of the output the
// filter holds: the running package's failed reports and the test still
// running print at the end.
func TestBrokenStream(t *testing.T) {
	stream := readFile(t, recordedJSON)
	i := strings.Index(stream, `"Output":"    fail_test.go:47: failed on purpose\n"`)
	if i < 0 {
		t.Fatal("the recording lacks TestSlowFail's failure")
	}
	cut := stream[:i+strings.IndexByte(stream[i:], '\n')+1]
	out, _ := runFilter(t, cut, false, nil, "")
	for _, want := range []string{"--- FAIL: TestSubtests (", "a grandchild fails", "fail_test.go:47: failed on purpose"} {
		if !strings.Contains(out, want) {
			t.Errorf("a broken stream's output lacks %q:\n%s", want, out)
		}
	}
}

func TestNotJSON(t *testing.T) {
	out, _ := runFilter(t, "go: something went wrong\n{not json\n", false, nil, "")
	if out != "go: something went wrong\n{not json\n" {
		t.Errorf("lines that are not events: got %q, want them as they are", out)
	}
}

func TestTable(t *testing.T) {
	dir := t.TempDir()
	tiers := "tools\t1000.0\t1001.5\t0\n" +
		"lint\t1001,5\t1071.5\t0\n" + // a locale's decimal comma
		"integration\t1071.5\t1799.5\t2\n" +
		"e2e\t\t\tnot run\n"
	var tests strings.Builder
	tests.WriteString("integration\tex/a\t\tpass\t700.000\n") // a package, not a test
	for i := 1; i <= 12; i++ {
		tests.WriteString("integration\tex/a\tTestN" + string(rune('A'+i-1)) + "\tpass\t" + string(rune('0'+i%10)) + ".500\n")
	}
	tests.WriteString("integration\tex/b\tTestBig\tfail\t300.000\n")
	tests.WriteString("integration\tex/b\tTestBig/sub\tfail\t299.000\n") // part of its parent
	for name, text := range map[string]string{"tiers.tsv": tiers, "tests.tsv": tests.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	if err := printTable(&b, dir, 10); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log("\n" + out)
	lines := strings.Split(out, "\n")
	find := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), prefix) {
				return strings.Join(strings.Fields(l), " ")
			}
		}
		t.Errorf("no line %q in\n%s", prefix, out)
		return ""
	}
	for prefix, want := range map[string]string{
		"tools":       "tools 1.5s 0",
		"lint":        "lint 1m10s 0",
		"integration": "integration 12m08s 2",
		"e2e":         "e2e - not run",
		"total":       "total 13m20s",
		"the ":        "the 10 slowest tests (of 13)",
		"300.0":       "300.0 integration ex/b TestBig fail",
	} {
		if got := find(prefix); got != want {
			t.Errorf("line %q, want %q", got, want)
		}
	}
	if strings.Contains(out, "TestBig/sub") || strings.Contains(out, "700.0") {
		t.Error("the slowest tests list a subtest or a package")
	}
	// TestNI (9.5 s) comes second; TestNJ (0.5 s), TestNA and TestNK
	// (1.5 s) are past the tenth.
	if i, j := strings.Index(out, "TestBig"), strings.Index(out, "TestNI"); i < 0 || j < i {
		t.Error("the slowest tests are not in descending order")
	}
	for _, past := range []string{"TestNJ", "TestNA", "TestNK"} {
		if strings.Contains(out, past) {
			t.Errorf("%s listed: more than the 10 slowest", past)
		}
	}
}

// TestRecordLeavesOutLaneWaits: a parallel test that waited for its lane
// (e2e's inLane logs "lane: waited D") is recorded with its own time, the
// wait left out; its subtests and other tests keep theirs.
func TestRecordLeavesOutLaneWaits(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestLab"}`,
		`{"Action":"output","Package":"p","Test":"TestLab","Output":"    stack_test.go:65: lane: waited 1m30.5s\n"}`,
		`{"Action":"run","Package":"p","Test":"TestLab/sub"}`,
		`{"Action":"pass","Package":"p","Test":"TestLab/sub","Elapsed":20}`,
		`{"Action":"pass","Package":"p","Test":"TestLab","Elapsed":120.75}`,
		`{"Action":"output","Package":"p","Test":"TestOther","Output":"    x_test.go:1: said lane: waited nonsense\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestOther","Elapsed":3}`,
		`{"Action":"pass","Package":"p","Elapsed":124}`,
	}, "\n") + "\n"
	var rec bytes.Buffer
	runFilter(t, stream, true, &rec, "e2e")
	want := "e2e\tp\tTestLab/sub\tpass\t20.000\n" +
		"e2e\tp\tTestLab\tpass\t30.250\n" +
		"e2e\tp\tTestOther\tpass\t3.000\n" +
		"e2e\tp\t\tpass\t124.000\n"
	if rec.String() != want {
		t.Errorf("record\n%s\nwant\n%s", rec.String(), want)
	}
}
