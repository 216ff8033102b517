// Package broken does not compile on purpose (an int is not a string): its
// build failure is part of the go test output the testtime tests replay.
package broken

import "testing"

func TestNever(t *testing.T) {
	var s string = 1
	_ = s
}
