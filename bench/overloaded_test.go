package bench

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// overloaded-replica, tiny: both rows exist with p95, no read fails, and
// round-robin reads every store. Nothing here checks timing.
func TestOverloadedTiny(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	res, err := RunOverloaded(ctx, OverloadedConfig{
		Clients: 4, Keys: 50, Rate: 200, Delay: 20 * time.Millisecond,
		RunDuration: 600 * time.Millisecond, Warmup: 200 * time.Millisecond,
		OutDir: dir, NoPlots: true, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != len(OverloadedVariants) {
		t.Fatalf("%d rows, want one per variant: %+v", len(res.Rows), res.Rows)
	}
	for i, r := range res.Runs {
		row := r.Row
		if row.Variant != OverloadedVariants[i].Name || row.Ops == 0 || row.Failed != 0 || row.QPS <= 0 || row.P95Ms == nil || row.ServedBy == "" {
			t.Errorf("row %+v", row)
		}
		if row.Variant == "round-robin" {
			for _, id := range res.Stores {
				if r.Share[id] == 0 {
					t.Errorf("round-robin: store %d served nothing: %s", id, row.ServedBy)
				}
			}
		}
	}
	doc, err := ReadResults(filepath.Join(dir, "overloaded-replica", "results.json"))
	if err != nil || doc.Scenario != "overloaded-replica" || len(doc.Rows) != 2 || doc.Rows[0].P95Ms == nil {
		t.Fatalf("results.json: %+v %v", doc, err)
	}
}
