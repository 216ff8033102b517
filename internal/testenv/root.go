package testenv

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// modulePath is this repository's module: the folder whose go.mod names
// it is the repository root.
const modulePath = "github.com/zonewatch/zonewatch"

var root struct {
	once sync.Once
	dir  string
}

// RepoRoot is the repository root, found from the working folder (a
// test's is its package's folder) up to the go.mod of this module. Not
// runtime.Caller: the tests are built with -trimpath (the Makefile's
// GOFLAGS, so that vet, the tests, make build and the image compile the
// packages once), which makes the file names it reports module paths.
// Panics when no such go.mod is above the working folder: a test run
// from outside the repository.
func RepoRoot() string {
	root.once.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			panic("testenv: working folder: " + err.Error())
		}
		for d := dir; ; d = filepath.Dir(d) {
			if goModNames(filepath.Join(d, "go.mod"), modulePath) {
				root.dir = d
				return
			}
			if filepath.Dir(d) == d {
				panic("testenv: no go.mod of " + modulePath + " above " + dir)
			}
		}
	})
	return root.dir
}

// goModNames reports whether the go.mod at path declares module mod.
func goModNames(path, mod string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`) == mod
		}
	}
	return false
}
