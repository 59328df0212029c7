//go:build unix

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestNodeKill runs a tiny node-kill against three real server processes:
// the leader's store is killed with SIGKILL, the stale-hedge variant fails
// no read, the killed store is restarted for the next variant, and every
// process started has exited at the end.
func TestNodeKill(t *testing.T) {
	t.Parallel()
	bin := hedgekvBinary(t)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := RunNodeKill(ctx, NodeKillConfig{
		Binary: bin, Records: 200, Threads: 4, Variants: []string{"hedge-stale", "no-protection"},
		Warmup: 300 * time.Millisecond, KillAfter: time.Second, RunAfterKill: 1500 * time.Millisecond,
		// Longer than the benchmark's 1s: under -race, beside other
		// packages' tests on two cores, a healthy read may take that long.
		OpTimeout: 2 * time.Second,
		Dir:       t.TempDir(), OutDir: out, NoPlots: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2 {
		t.Fatalf("%d runs, want 2", len(res.Runs))
	}
	for _, r := range res.Runs {
		if r.KilledStore == 0 || r.KilledPID == 0 || r.KillAt <= 0 {
			t.Errorf("%s: no kill recorded: store %d pid %d at %v", r.Variant.Name, r.KilledStore, r.KilledPID, r.KillAt)
		}
		if r.Row.Ops == 0 || len(r.Row.Timeline) == 0 {
			t.Errorf("%s: no reads recorded", r.Variant.Name)
		}
		var okAfter int64
		for _, p := range r.Row.Timeline {
			if time.Duration(p.TMs)*time.Millisecond > r.KillAt {
				okAfter += p.OK
			}
		}
		if okAfter == 0 {
			t.Errorf("%s: no read succeeded after the kill", r.Variant.Name)
		}
	}
	var stale NodeKillRun
	for _, r := range res.Runs {
		if r.Variant.Name == "hedge-stale" {
			stale = r
		}
	}
	if stale.Row.Failed != 0 {
		t.Errorf("hedge-stale: %d of %d reads failed (first: %s)", stale.Row.Failed, stale.Row.Ops, stale.FirstErr)
	}
	// Each variant killed a live leader: the second kill needed the first
	// killed store restarted or a new leader elected, and a new process.
	if res.Runs[0].KilledPID == res.Runs[1].KilledPID {
		t.Errorf("both variants killed pid %d", res.Runs[0].KilledPID)
	}
	if len(res.PIDs) != 4 { // three stores and one restart (the last kill is not restarted)
		t.Errorf("started %d processes, want 4: %v", len(res.PIDs), res.PIDs)
	}
	for _, pid := range res.PIDs {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("server process %d still exists after the run (kill 0: %v)", pid, err)
		}
	}

	b, err := os.ReadFile(filepath.Join(out, "node-kill", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Scenario string `json:"scenario"`
		Rows     []struct {
			Variant  string          `json:"variant"`
			Failed   *int64          `json:"failed"`
			KillMs   int64           `json:"kill_ms"`
			Timeline []TimelinePoint `json:"timeline"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Scenario != "node-kill" || len(got.Rows) != 2 {
		t.Fatalf("results.json: %s", b)
	}
	for _, r := range got.Rows {
		if r.Failed == nil || r.KillMs <= 0 || len(r.Timeline) == 0 {
			t.Errorf("results.json row %s: failed %v, kill_ms %d, %d timeline points", r.Variant, r.Failed, r.KillMs, len(r.Timeline))
		}
	}
	if _, err := os.Stat(filepath.Join(out, "node-kill", "report.md")); err != nil {
		t.Error(err)
	}
}
