//go:build linux

package bench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestRegionsTiny runs bench regions with 20 regions and a short load
// against three real server processes: every figure is filled in, the
// baseline comes first, and every process started has exited.
func TestRegionsTiny(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts two clusters of three server processes")
	}
	bin := hedgekvBinary(t)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := RunRegions(ctx, RegionsConfig{
		Binary: bin, Counts: []int{20}, Window: time.Second, IdleWait: 20 * time.Second,
		ExtraArgs: []string{"--hibernate-after=1s"}, // regions idle within the test's time
		Load:      true, LoadRegions: 5, LoadDuration: time.Second, LoadThreads: 4,
		OutDir: out, Logger: quietLogger(), Out: os.Stderr,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2 || !res.Runs[0].Baseline || res.Runs[0].Count != 5 || res.Runs[1].Count != 20 {
		t.Fatalf("runs %+v, want the baseline of 5 regions, then 20", res.Runs)
	}
	for _, r := range res.Runs {
		if len(r.Errors) > 0 || r.SplitErrors > 0 {
			t.Errorf("%d regions: errors %v, %d failed splits", r.Count, r.Errors, r.SplitErrors)
		}
		if len(r.Stores) != 3 {
			t.Fatalf("%d regions: %d stores measured, want 3", r.Count, len(r.Stores))
		}
		for _, s := range r.Stores {
			if s.Err != "" || s.RSS <= 0 || s.OpenFiles <= 0 || s.Goroutines <= 0 || s.Regions != r.Count {
				t.Errorf("%d regions: store %+v, want its figures and %d regions", r.Count, s, r.Count)
			}
		}
		if r.ReadyS <= 0 || r.StartupS <= 0 || r.StartupS > r.ReadyS || r.AfterRestart == nil {
			t.Errorf("%d regions: restart serving %.2fs, ready %.2fs, want 0 < serving <= ready", r.Count, r.StartupS, r.ReadyS)
		}
		if r.LoadOps <= 0 || r.LoadRatio <= 0 {
			t.Errorf("%d regions: %d writes, ratio %v, want some", r.Count, r.LoadOps, r.LoadRatio)
		}
		if !r.Idle {
			t.Errorf("%d regions: not idle %.1fs after the splits", r.Count, r.IdleAfterS)
		}
		if !r.IdleAgain || r.IdleAgainS <= 0 {
			t.Errorf("%d regions: idle again %v after %.1fs; the load must find them hibernating", r.Count, r.IdleAgain, r.IdleAgainS)
		}
	}
	for _, pid := range res.PIDs {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("server process %d still exists after the run (kill 0: %v)", pid, err)
		}
	}
	for _, f := range []string{"results.json", "report.md", "details.json"} {
		if _, err := os.Stat(filepath.Join(out, "regions", f)); err != nil {
			t.Error(err)
		}
	}
}
