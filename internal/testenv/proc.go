package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's utime and stime
// (100 on every Linux architecture Go supports).
const clockTicks = 100

// ProcCPU is a process's CPU time so far in seconds (user + system), from
// /proc/<pid>/stat, what top reads: for processes that export no
// process_cpu_seconds_total of their own.
func ProcCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("pid %d: unreadable stat %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime is field 14, stime 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("pid %d: short stat %q", pid, s)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("pid %d: stat %q: %v %v", pid, s, err1, err2)
	}
	return float64(ut+st) / clockTicks, nil
}
