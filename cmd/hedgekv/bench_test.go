package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchWANFlags: the WAN scenarios' bad flags are one usage line,
// caught before any cluster starts.
func TestBenchWANFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "follower-read-dc", "--topology", filepath.Join(t.TempDir(), "missing.toml")}, "--topology"},
		{[]string{"bench", "follower-read-dc", "--scan-lengths", "10,x"}, "--scan-lengths"},
		{[]string{"bench", "follower-read-dc", "--threads", "-1"}, "must not be negative"},
		{[]string{"bench", "hot-region", "--topology", "default", "--link-mbit", "10"}, "--link-mbit"},
		{[]string{"bench", "hot-region", "--scan-length", "-5"}, "must not be negative"},
		{[]string{"bench", "peer-etcd", "--topology", filepath.Join(t.TempDir(), "missing.toml")}, "--topology"},
		{[]string{"bench", "peer-etcd", "--topology", "default", "--workloads", "a"}, "--workloads"},
		{[]string{"bench", "peer-etcd", "--topology", "default", "--scan-lengths", "10,x"}, "--scan-lengths"},
		{[]string{"bench", "peer-etcd", "--scan-lengths", "10"}, "--scan-lengths applies with --topology only"},
	} {
		code, stdout, stderr := runCLI(t, tt.args...)
		if code != exitUsage || stdout != "" || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d naming %s", tt.args, code, stdout, stderr, exitUsage, tt.want)
		}
		oneLine(t, stderr)
	}
	// A variant that does not exist is refused before anything starts.
	code, _, stderr := runCLI(t, "bench", "follower-read-dc", "--variants", "leader-nowhere", "--out", t.TempDir())
	if code != exitFailure || !strings.Contains(stderr, `unknown variant "leader-nowhere"`) {
		t.Errorf("unknown variant: exit %d, %q", code, stderr)
	}
	oneLine(t, stderr)
}

// TestBenchFollowerReadDCTiny runs one variant, tiny, through the CLI.
func TestBenchFollowerReadDCTiny(t *testing.T) {
	out := t.TempDir()
	code, stdout, stderr := runCLI(t, "bench", "follower-read-dc", "--variants", "stale-local", "--records", "40",
		"--threads", "2", "--scan-lengths", "10", "--duration", "300ms", "--warmup", "-1s", "--no-plots", "--out", out)
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "| stale-local | 10 |") {
		t.Errorf("stdout:\n%s", stdout)
	}
	report, err := os.ReadFile(filepath.Join(out, "follower-read-dc", "report.md"))
	if err != nil || !strings.Contains(string(report), "--variants stale-local") {
		t.Errorf("report.md does not quote the command: %v\n%s", err, report)
	}
}
