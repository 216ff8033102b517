package main

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
)

// checkSocket tries the host socket a source reads once at start and, when
// the exporter's user may not connect to it (EACCES: the socket's mode and
// owner), logs at error what the chart must give it. The source's own
// retries only say "permission denied" in a warning, every time.
func checkSocket(logger *slog.Logger, source, address, fix string) {
	path, ok := strings.CutPrefix(address, "unix://")
	if !ok {
		if path, ok = strings.CutPrefix(address, "unix:"); !ok {
			if !strings.HasPrefix(address, "/") {
				return
			}
			path = address
		}
	}
	c, err := net.Dial("unix", path)
	if err == nil {
		c.Close()
		return
	}
	if !errors.Is(err, syscall.EACCES) && !errors.Is(err, syscall.EPERM) {
		return // absent or not listening yet: the source reports it
	}
	groups, _ := os.Getgroups()
	logger.Error("permission denied on a host socket: "+fix, "starved_source", source, "socket", path,
		"uid", os.Geteuid(), "gid", os.Getegid(), "groups", groups, "err", err)
}
