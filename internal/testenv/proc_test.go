package testenv

import (
	"os"
	"syscall"
	"testing"
)

// TestProcCPU agrees with the kernel's getrusage for this process, within
// the clock tick /proc counts in and the time between the two reads.
func TestProcCPU(t *testing.T) {
	x := 0
	for i := range 200_000_000 {
		x ^= i
	}
	_ = x
	got, err := ProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	want := float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	if got <= 0 || got > want+0.02 || got < want-0.05 {
		t.Errorf("ProcCPU = %.3f s, getrusage %.3f s", got, want)
	}
	if _, err := ProcCPU(-1); err == nil {
		t.Error("ProcCPU(-1): no error")
	}
}
