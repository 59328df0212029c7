package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// follower-lease, tiny, on one machine: every row exists, nothing fails,
// the follower rows are served by the followers, and the kill rows have a
// stall and a timeline. Nothing here checks timing: the bound on the
// stall is what the full run reports. Whether a follower read was served
// from a lease is timing too: a grant counts from when the follower asked,
// and on a loaded machine (-race, load 9 and up) it can arrive with its
// lease already spent, so the follower serves by ReadIndex instead, as it
// must; that is logged, not failed. test/cluster's follower lease specs
// check the leases themselves.
func TestFollowerLeaseTiny(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	res, err := RunFollowerLease(ctx, FollowerLeaseConfig{
		Records: 50, Threads: 4, MaxOps: 40, WriteThreads: 2, WriteKeys: 20,
		RunDuration: 450 * time.Millisecond, Warmup: -1, NoWAN: true,
		OutDir: dir, NoPlots: true, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != len(FollowerLeaseVariants) {
		t.Fatalf("%d rows, want one per variant (%d): %+v", len(res.Rows), len(FollowerLeaseVariants), res.Rows)
	}
	for _, r := range res.Runs {
		row := r.Row
		if row.Ops == 0 || row.Failed != 0 || row.QPS <= 0 || row.Param == "" {
			t.Errorf("row %+v", row)
		}
		switch {
		case row.Variant == "follower-lease":
			if !strings.HasPrefix(row.ServedBy, "store ") || strings.Contains(row.ServedBy, "store 1 ") {
				t.Errorf("follower-lease served by %s, want the followers only", row.ServedBy)
			} else if !strings.Contains(row.ServedBy, "follower-lease") {
				t.Logf("follower-lease: no read served from a lease (a loaded machine?): %s", row.ServedBy)
			}
		case row.Variant == "leader-lease":
			if !strings.HasPrefix(row.ServedBy, "store 1 (dc-a) 100%") {
				t.Errorf("leader-lease served by %s", row.ServedBy)
			}
		case r.Variant.Kill || r.Variant.Move:
			if row.MaxStallMs == nil || len(row.Timeline) == 0 || r.KilledAt == 0 {
				t.Errorf("%s: no stall, timeline or kill: %+v", row.Variant, r)
			}
			if r.Variant.Kill && r.Variant.Leases && !r.VictimLease {
				t.Logf("%s: store %d held no lease just before the kill", row.Variant, flVictim)
			}
		}
	}
	doc, err := ReadResults(filepath.Join(dir, "follower-lease", "results.json"))
	if err != nil || doc.Scenario != "follower-lease" || len(doc.Rows) != len(FollowerLeaseVariants) {
		t.Fatalf("results.json: %+v %v", doc, err)
	}
	report, err := os.ReadFile(filepath.Join(dir, "follower-lease", "report.md"))
	if err != nil || !strings.Contains(string(report), "longest write stall after a lease holder dies") {
		t.Fatalf("report.md: %v\n%s", err, report)
	}
}
