package bench

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// hedge-tail, tiny: every (variant, budget, fault) row exists, no read
// fails, the hedging rows carry their extra-request ratio, the files are
// written. Nothing here checks timing.
func TestHedgeTailTiny(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	res, err := RunHedgeTail(ctx, HedgeTailConfig{
		Variants: []string{"hedge-off", "hedge-p99"}, Keys: 50, Rate: 200,
		RunDuration: 600 * time.Millisecond, Warmup: 200 * time.Millisecond, PauseLen: 50 * time.Millisecond,
		OutDir: dir, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	// hedge-off, hedge-p99 (default budget), hedge-p99-nocap; 3 faults.
	if len(res.Rows) != 9 {
		t.Fatalf("%d rows, want 3 runs × 3 faults: %+v", len(res.Rows), res.Rows)
	}
	var labels []string
	for _, r := range res.Runs {
		row := r.Row
		if r.Fault == FaultReadPause {
			labels = append(labels, row.Variant)
		}
		pauses := 1
		if r.Fault == FaultSlowLeader {
			pauses = 0
		}
		if row.Ops == 0 || row.Failed != 0 || row.QPS <= 0 || row.P9999Ms <= 0 || r.PausesInjected != pauses {
			t.Errorf("%s %s: %+v, %d pauses", row.Variant, row.Param, row, r.PausesInjected)
		}
		if hedged := row.Variant != "hedge-off"; hedged != (row.ExtraRequestRatio != nil && row.HedgesWon != nil) {
			t.Errorf("%s %s: extra ratio %v, hedges won %v", row.Variant, row.Param, row.ExtraRequestRatio, row.HedgesWon)
		}
	}
	if want := []string{"hedge-off", "hedge-p99", "hedge-p99-nocap"}; !slices.Equal(labels, want) {
		t.Errorf("read-pause rows %v, want %v", labels, want)
	}
	doc, err := ReadResults(filepath.Join(dir, "hedge-tail", "results.json"))
	if err != nil || doc.Scenario != "hedge-tail" || len(doc.Rows) != 9 {
		t.Fatalf("results.json: %+v %v", doc, err)
	}
	report, err := os.ReadFile(filepath.Join(dir, "hedge-tail", "report.md"))
	if err != nil || !strings.Contains(string(report), "## The pause schedule") || !strings.Contains(string(report), "percentiles-read-pause.png") ||
		!strings.Contains(string(report), "## slow-leader") || !strings.Contains(string(report), "no cap") {
		t.Fatalf("report.md: %v\n%s", err, report)
	}
}
