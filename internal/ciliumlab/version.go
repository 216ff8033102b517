package ciliumlab

import (
	"os"
	"path/filepath"
	"strings"
)

// agentVersion is the Cilium version the folder's agent was built as:
// the first word of the .version stamp hack/tools.sh writes ("1.18.11
// zwlab <date>"), empty when there is none. The lab's agent flags are the
// same for the versions it runs (v1.20.2, v1.18.11: every flag checked in
// each version's source).
func agentVersion(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, ".version"))
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}
