package main

import (
	"strings"
	"testing"
)

// TestBenchFollowerLeaseFlags: bad flags are one usage line, an unknown
// variant one error line, before any cluster starts.
func TestBenchFollowerLeaseFlags(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "follower-lease", "--threads", "-1"},
		{"bench", "follower-lease", "--topology", "default", "--no-wan"},
	} {
		code, stdout, stderr := runCLI(t, args...)
		if code != exitUsage || stdout != "" || stderr == "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d", args, code, stdout, stderr, exitUsage)
		}
		oneLine(t, stderr)
	}
	code, _, stderr := runCLI(t, "bench", "follower-lease", "--variants", "writes-nowhere", "--out", t.TempDir())
	if code != exitFailure || !strings.Contains(stderr, `unknown variant "writes-nowhere"`) {
		t.Errorf("unknown variant: exit %d, %q", code, stderr)
	}
	oneLine(t, stderr)
}
