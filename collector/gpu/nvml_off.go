//go:build !nvml

package gpu

import (
	"log/slog"
)

// NVMLBuiltIn reports whether this binary has the NVML adapter.
const NVMLBuiltIn = false

func openNVML(*slog.Logger) (Source, error) {
	return nil, errNVMLNotBuilt
}
