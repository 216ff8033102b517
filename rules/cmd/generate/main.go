// Command generate writes the rule pack's committed artifacts from
// rules.DefaultConfig(). Run it from the repository root:
//
//	go run ./rules/cmd/generate
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/zonewatch/zonewatch/rules"
)

func main() {
	root := flag.String("root", ".", "repository root to write the files under")
	flag.Parse()
	files, err := rules.Artifacts()
	if err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
	for _, f := range files {
		path := filepath.Join(*root, f.Path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "generate:", err)
			os.Exit(1)
		}
		if err := os.WriteFile(path, f.Data, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "generate:", err)
			os.Exit(1)
		}
	}
}
