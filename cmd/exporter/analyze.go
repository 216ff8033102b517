package main

import (
	"os"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/analyze"
)

// addAnalyze declares the offline `analyze` command on app and returns the
// function that runs it (its exit code) once app.Parse has chosen it.
// jobRules is the --kube.job-rule flag both commands share.
func addAnalyze(app *kingpin.Application, jobRules *[]string) func() int {
	return analyze.AddCommand(app, jobRules, os.Stdout, os.Stderr)
}
