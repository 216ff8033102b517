// Package pass is one of the packages whose go test output the testtime
// tests replay: it passes, so without -v go test shows only its ok line.
package pass

import (
	"fmt"
	"testing"
	"time"
)

func TestSlow(t *testing.T) {
	fmt.Println("printed to stdout by a passing test")
	t.Log("logged by a passing test")
	time.Sleep(200 * time.Millisecond)
}

func TestFast(t *testing.T) {}
