package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRepoRoot finds the root from this package's folder; a nested
// module's go.mod (internal/ctmappeer) is not taken for it.
func TestRepoRoot(t *testing.T) {
	r := RepoRoot()
	if _, err := os.Stat(filepath.Join(r, "internal", "testenv", "root.go")); err != nil {
		t.Fatalf("RepoRoot %s: %v", r, err)
	}
	if goModNames(filepath.Join(r, "internal", "ctmappeer", "go.mod"), modulePath) {
		t.Errorf("the nested module's go.mod read as %s's", modulePath)
	}
}
