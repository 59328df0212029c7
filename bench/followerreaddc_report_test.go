package bench

import (
	"strings"
	"testing"
)

// A --quick run is judged against no target (issue 21: the demo's quick
// run marked all five "not met"); a full run still is.
func TestDCTargetsTableQuick(t *testing.T) {
	ts := []dcTarget{
		{What: "follower-local ops/s ÷ leader-remote ops/s", Scan: 100, Measured: 1.4, Target: 4.5},
		{What: "lease-local client p99 ÷ stale-local client p99", Scan: 10, Measured: 1.1, Target: 1.5, AtMost: true},
	}
	full := dcTargetsTable(ts, false)
	if !strings.Contains(full, "not met") || !strings.Contains(full, "**met**") {
		t.Errorf("full run table:\n%s", full)
	}
	quick := dcTargetsTable(ts, true)
	if strings.Contains(quick, "not met") || !strings.Contains(quick, "targets apply to full runs") || !strings.Contains(quick, "met (quick run)") {
		t.Errorf("quick run table:\n%s", quick)
	}
}

// When local follower reads of short scans are slower than the remote
// leader's, the report says why; otherwise it says nothing.
func TestDCShortScanNote(t *testing.T) {
	cfg := &FollowerReadDCConfig{Quick: true}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	run := func(variant string, scan int, qps float64) DCRun {
		return DCRun{Variant: DCVariant{Name: variant}, ScanLength: scan, Phase: &PhaseResult{Row: Row{QPS: qps}}, ServerP50Ms: 40}
	}
	runs := []DCRun{run("leader-remote", 10, 830), run("follower-local", 10, 567), run("leader-remote", 100, 300), run("follower-local", 100, 450)}
	note := cfg.dcShortScanNote(runs)
	for _, w := range []string{"fewer 10-key scans than `leader-remote` (567 vs 830/s)", "one ReadIndex batch at a time", "1.5 round trips"} {
		if !strings.Contains(note, w) {
			t.Errorf("note does not say %q:\n%s", w, note)
		}
	}
	runs[1] = run("follower-local", 10, 900)
	if note := cfg.dcShortScanNote(runs); note != "" {
		t.Errorf("follower-local faster, yet a note:\n%s", note)
	}
}
