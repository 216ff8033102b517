package main

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/report"
)

// commandLineFlags is every flag of every command, by name (a name two
// commands share, --kube.job-rule, maps to both).
func commandLineFlags(t *testing.T) map[string][]*kingpin.FlagModel {
	t.Setenv("NODE_NAME", "")
	t.Setenv("KUBECONFIG", "")
	app, _, o := newApp()
	addAnalyze(app, o.jobRules)
	report.AddCommand(app, io.Discard, io.Discard)
	out := map[string][]*kingpin.FlagModel{}
	add := func(fs []*kingpin.FlagModel) {
		for _, f := range fs {
			out[f.Name] = append(out[f.Name], f)
		}
	}
	add(app.Model().Flags)
	for _, c := range app.Model().Commands {
		add(c.Flags)
	}
	return out
}

// enumOptions are the values an Enum or Enums flag accepts (kingpin keeps
// them unexported), nil for any other flag.
func enumOptions(f *kingpin.FlagModel) []string {
	v := reflect.ValueOf(f.Value)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	switch v.Elem().Type().Name() {
	case "enumValue", "enumsValue":
	default:
		return nil
	}
	opts := v.Elem().FieldByName("options")
	var out []string
	for i := range opts.Len() {
		out = append(out, opts.Index(i).String())
	}
	return out
}

var (
	flagName   = regexp.MustCompile("`-(?:-\\[no-\\]|-)([a-z0-9][a-z0-9.-]*)")
	backticked = regexp.MustCompile("`([^`]+)`")
	bareWord   = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
)

// TestDocFlagTables checks the flag tables of the per-source docs (a table
// whose first column is "flag": hubble.md, gpu.md, conntrack.md,
// analyze.md, ...) against the command line, which docs/flags.md is
// generated from: every flag named exists; a default written as code
// (`10s`) is the flag's; an enum flag's row names every value it accepts
// and, as code, no other word (gpu.md once offered `dcgm`, which
// --gpu.source refuses).
func TestDocFlagTables(t *testing.T) {
	flags := commandLineFlags(t)
	files, _ := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	rows := 0
	for _, file := range files {
		if filepath.Base(file) == "flags.md" { // generated: TestFlagsDoc
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		base := "docs/" + filepath.Base(file)
		var header []string
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "|") {
				header = nil
				continue
			}
			c := cells(line)
			if header == nil {
				header = c
				continue
			}
			if header[0] != "flag" || strings.HasPrefix(c[0], "---") {
				continue
			}
			names := flagName.FindAllStringSubmatch(c[0], -1)
			if len(names) == 0 {
				continue
			}
			rows++
			for _, n := range names {
				fs := flags[n[1]]
				if len(fs) == 0 {
					t.Errorf("%s: the flag table names --%s, which no command has (docs/flags.md lists them all)", base, n[1])
					continue
				}
				f := fs[0]
				if i := slices.Index(header, "default"); i > 0 && i < len(c) {
					if got, ok := codeList(c[i]); ok {
						want := slices.DeleteFunc(slices.Clone(f.Default), func(s string) bool { return s == "" })
						if len(want) == 0 && f.IsBoolFlag() {
							want = []string{"false"}
						}
						sort.Strings(want)
						if !slices.Equal(got, want) {
							t.Errorf("%s: --%s's default is %q in the table, %q on the command line", base, f.Name, got, want)
						}
					}
				}
				opts := enumOptions(f)
				if opts == nil {
					continue
				}
				var words []string
				for _, m := range backticked.FindAllStringSubmatch(strings.Join(c[1:], " | "), -1) {
					if bareWord.MatchString(m[1]) {
						words = append(words, m[1])
					}
				}
				for _, o := range opts {
					if !slices.Contains(words, o) {
						t.Errorf("%s: --%s accepts %q, which its row does not name (%v)", base, f.Name, o, opts)
					}
				}
				for _, w := range words {
					if !slices.Contains(opts, w) {
						t.Errorf("%s: --%s's row names `%s`, which the flag refuses (it accepts %v)", base, f.Name, w, opts)
					}
				}
			}
		}
	}
	t.Logf("%d flag rows in docs/*.md", rows)
	if rows < 10 {
		t.Fatalf("read %d flag rows in docs/*.md: the table reader is broken", rows)
	}
}

// codeList reads a cell that is only code spans ("`a`", "`a`, `b`"): ok
// false for prose ("true", "empty (system roots)", "required").
func codeList(cell string) ([]string, bool) {
	rest := backticked.ReplaceAllString(cell, "")
	if strings.Trim(rest, ", ") != "" || cell == "" {
		return nil, false
	}
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	sort.Strings(out)
	return out, true
}
