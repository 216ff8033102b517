package main

import (
	"os"

	"github.com/alecthomas/kingpin/v2"

	"github.com/zonewatch/zonewatch/analyze"
)

// addAnalyze declares the offline `analyze` command on app and returns the
// function that runs it (its exit code) once app.Parse has chosen it.
func addAnalyze(app *kingpin.Application) func() int {
	return analyze.AddCommand(app, os.Stdout, os.Stderr)
}
