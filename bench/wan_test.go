package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The WAN scenarios, tiny: every variant must produce its row, no
// operation may fail, and the reads must be served where the variant
// says. Nothing here checks timing, nor what depends on it on a loaded
// machine (-race, load 9 and up): whether a follower lease was valid when
// a read came (a grant can arrive with its lease already spent; the
// follower then serves by ReadIndex, as it must), or whether an election
// moved the leader during a run (the run is then logged, and where its
// reads were served is not checked: they followed the leader).

func TestFollowerReadDCTiny(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	var out, progress bytes.Buffer
	res, err := RunFollowerReadDC(ctx, FollowerReadDCConfig{
		Records: 60, Threads: 4, ScanLengths: []int{10}, MaxOps: 40,
		RunDuration: time.Minute, Warmup: -1,
		OutDir: dir, Logger: quietLogger(), Out: &out, Progress: &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != len(DCVariants) {
		t.Fatalf("%d rows, want one per variant (%d): %+v", len(res.Rows), len(DCVariants), res.Rows)
	}
	for i, r := range res.Runs {
		row := r.Phase.Row
		if row.Variant != DCVariants[i].Name || row.Param != "10" || row.Ops != 40 || row.Failed != 0 || row.QPS <= 0 {
			t.Errorf("row %+v", row)
		}
		if row.ServerP99Ms == nil || row.WANBytesPerOp == nil {
			t.Errorf("%s: no server p99 or WAN bytes: %+v", row.Variant, row)
		}
		if r.LeaderMoved != "" {
			t.Logf("%s: %s (an election on a loaded machine?); where its reads were served is not checked", row.Variant, r.LeaderMoved)
			continue
		}
		// Where the reads were served (the client zone is dc-b, the
		// leader on store 1 in dc-a).
		switch row.Variant {
		case "leader-remote":
			if r.LocalShare != 0 || !strings.HasPrefix(r.ServedBy, "store 1 (dc-a) 100%") {
				t.Errorf("leader-remote served by %s", r.ServedBy)
			}
			// Up to ten rows of ~1 KB crossed the WAN per scan: fewer when
			// a scan starts within ten keys of the end of the 60 records
			// (uniform starts: 9.25 rows on average), so at least half.
			if *row.WANBytesPerOp < 5*1000 {
				t.Errorf("leader-remote: %v WAN bytes per scan of ten 1 KB rows", *row.WANBytesPerOp)
			}
		case "follower-local":
			if r.LocalShare != 1 || !strings.Contains(r.ServedBy, "store 2 (dc-b) 100%: read-index 100%") {
				t.Errorf("follower-local served by %s", r.ServedBy)
			}
		case "stale-local", "same-zone":
			if r.LocalShare != 1 {
				t.Errorf("%s served by %s", row.Variant, r.ServedBy)
			}
		case "lease-local":
			// Linearizable, from dc-b's follower's lease: no ReadIndex.
			// A read that arrives before the first grant, or while a
			// renewal is late, takes the round trip instead, so not all;
			// on a loaded machine, perhaps none.
			if r.LocalShare != 1 || !strings.Contains(r.ServedBy, "store 2 (dc-b) 100%: ") {
				t.Errorf("lease-local served by %s", r.ServedBy)
			} else if !strings.Contains(r.ServedBy, "follower-lease") {
				t.Logf("lease-local: no read served from a lease (a loaded machine?): %s", r.ServedBy)
			}
		}
	}
	doc, err := ReadResults(filepath.Join(dir, "follower-read-dc", "results.json"))
	if err != nil || doc.Scenario != "follower-read-dc" || len(doc.Rows) != len(DCVariants) {
		t.Fatalf("results.json: %+v %v", doc, err)
	}
	report, err := os.ReadFile(filepath.Join(dir, "follower-read-dc", "report.md"))
	if err != nil || !strings.Contains(string(report), "## Where the reads were served") || !strings.Contains(string(report), "cdf-scan-10.png") {
		t.Fatalf("report.md: %v\n%s", err, report)
	}
	if _, err := os.Stat(filepath.Join(dir, "follower-read-dc", "cdf-scan-10.png")); err != nil {
		t.Error(err)
	}
	if !strings.Contains(out.String(), "| follower-local | 10 |") {
		t.Errorf("printed table:\n%s", out.String())
	}
	if !strings.Contains(progress.String(), "same-zone      scan 10") || !strings.Contains(progress.String(), "done in") {
		t.Errorf("progress:\n%s", progress.String())
	}
}

func TestHotRegionTiny(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	res, err := RunHotRegion(ctx, HotRegionConfig{
		Records: 60, ThreadsPerZone: 2, ScanLength: 10, MaxOps: 30,
		RunDuration: time.Minute, Warmup: -1, OutDir: dir, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != len(HotVariants) {
		t.Fatalf("%d rows, want one per variant: %+v", len(res.Rows), res.Rows)
	}
	for i, r := range res.Runs {
		row := r.Phase.Row
		if row.Variant != HotVariants[i].Name || row.Ops != 30 || row.Failed != 0 || row.QPS <= 0 {
			t.Errorf("row %+v", row)
		}
		var zoneOps int64
		for _, n := range r.ZoneOps {
			if n == 0 {
				t.Errorf("%s: a zone's clients read nothing: %v", row.Variant, r.ZoneOps)
			}
			zoneOps += n
		}
		if zoneOps != 30 {
			t.Errorf("%s: zones read %v, want 30 in all", row.Variant, r.ZoneOps)
		}
		switch row.Variant {
		case "leader-only":
			if r.StoreShare[1] != 1 {
				t.Errorf("leader-only served by %s", r.ServedBy)
			}
		case "follower":
			if r.StoreShare[1] != 0 {
				t.Errorf("follower served by %s", r.ServedBy)
			}
		}
	}
	doc, err := ReadResults(filepath.Join(dir, "hot-region", "results.json"))
	if err != nil || doc.Scenario != "hot-region" || len(doc.Rows) != len(HotVariants) {
		t.Fatalf("results.json: %+v %v", doc, err)
	}
	for _, f := range []string{"report.md", "hot-region-throughput.png", "hot-region-cdf.png"} {
		if _, err := os.Stat(filepath.Join(dir, "hot-region", f)); err != nil {
			t.Error(err)
		}
	}
}

func TestParseServerHist(t *testing.T) {
	text := `# HELP hedgekv_server_request_duration_seconds Server-side latency
# TYPE hedgekv_server_request_duration_seconds histogram
hedgekv_server_request_duration_seconds_bucket{method="KV.Get",le="0.001"} 5
hedgekv_server_request_duration_seconds_bucket{method="KV.Scan",le="0.001"} 10
hedgekv_server_request_duration_seconds_bucket{method="KV.Scan",le="0.002"} 90
hedgekv_server_request_duration_seconds_bucket{method="KV.Scan",le="0.004"} 100
hedgekv_server_request_duration_seconds_bucket{method="KV.Scan",le="+Inf"} 100
hedgekv_server_request_duration_seconds_sum{method="KV.Scan"} 0.15
`
	h, err := parseServerHist(strings.NewReader(text), "KV.Scan")
	if err != nil || len(h.Bounds) != 4 || h.Count() != 100 {
		t.Fatalf("%+v %v", h, err)
	}
	if p50, _ := h.Quantile(0.5); p50 < 1.49 || p50 > 1.51 { // rank 50 of (10, 90] in (1, 2] ms
		t.Errorf("p50 = %v ms", p50)
	}
	if p99, _ := h.Quantile(0.99); p99 < 3.79 || p99 > 3.81 {
		t.Errorf("p99 = %v ms", p99)
	}
	before := ServerHist{Bounds: h.Bounds, Counts: []float64{10, 50, 50, 50}}
	if d := h.Sub(before); d.Count() != 50 {
		t.Errorf("delta %+v", d)
	}
	if _, ok := (ServerHist{}).Quantile(0.99); ok {
		t.Error("quantile of an empty histogram")
	}
}

func TestProgressPlain(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf, "demo", 2, time.Hour)
	p.Step("load", 100, 0)
	p.Update(50, 1)
	p.mu.Lock()
	p.drawLocked(true) // what the ticker does every interval
	p.mu.Unlock()
	p.Printf("a message")
	p.Step("run", 0, time.Hour)
	p.Done()
	out := buf.String()
	for _, want := range []string{"demo:  25% 1/2 load | 50 ops", "1 FAILED", "a message\n", "demo: done in"} {
		if !strings.Contains(out, want) {
			t.Errorf("progress output lacks %q:\n%s", want, out)
		}
	}
	var nilP *Progress
	nilP.Step("x", 1, 0) // a nil Progress does nothing
	nilP.Done()
}

// TestProgressStepETA: the bar's estimate is the current step's, at the
// step's own rate, not the scenario's elapsed time over its share of
// steps done: bench scale's bar (load, then two short steps) said three
// times what its load line said.
func TestProgressStepETA(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf, "scale", 3, time.Hour)
	defer p.Done()
	p.Step("load", 1000, 0)
	p.mu.Lock()
	// 10 s into the scenario and the load, 250 of 1000 records done: at
	// that rate the load has 30 s left.
	p.start = p.start.Add(-10 * time.Second)
	p.stepStart = p.stepStart.Add(-10 * time.Second)
	p.rateStart = p.stepStart
	p.done = 250
	line := p.lineLocked(0)
	p.mu.Unlock()
	left, ok := p.StepLeft()
	if !ok || left < 29*time.Second || left > 31*time.Second {
		t.Errorf("StepLeft = %v, %v; want about 30s", left, ok)
	}
	if !strings.Contains(line, "step ~0:30 left") {
		t.Errorf("bar %q does not say the load's 0:30 left", line)
	}
	// A time-capped step: what is left of its cap.
	p.Step("run", 0, time.Minute)
	p.mu.Lock()
	p.stepStart = p.stepStart.Add(-15 * time.Second)
	p.mu.Unlock()
	if left, ok := p.StepLeft(); !ok || left < 44*time.Second || left > 45*time.Second {
		t.Errorf("capped step: StepLeft = %v, %v; want 45s", left, ok)
	}
}
