// Package fail is one of the packages whose go test output the testtime
// tests replay (see ../../../testtime_test.go for how it is recorded). Its
// tests fail on purpose: the go tool runs no package under testdata unless
// named.
package fail

import (
	"fmt"
	"testing"
	"time"
)

func TestPass(t *testing.T) {
	t.Log("logged by a passing test")
	time.Sleep(20 * time.Millisecond)
}

func TestPrint(t *testing.T) {
	fmt.Println("printed to stdout by a passing test")
}

func TestSkip(t *testing.T) {
	t.Skip("skipped on purpose")
}

func TestSubtests(t *testing.T) {
	t.Log("the parent's own line")
	t.Run("ok", func(t *testing.T) { time.Sleep(10 * time.Millisecond) })
	t.Run("fails", func(t *testing.T) {
		t.Log("a line before the failure,\nand its second line")
		t.Run("deeper", func(t *testing.T) { t.Error("a grandchild fails") })
		t.Error("failed on purpose")
	})
}

func TestParallel(t *testing.T) {
	for _, d := range []time.Duration{30 * time.Millisecond, 90 * time.Millisecond} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			time.Sleep(d)
		})
	}
}

func TestSlowFail(t *testing.T) {
	time.Sleep(150 * time.Millisecond)
	t.Fatal("failed on purpose")
}
