//go:build unix

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The data set of TestScaleQuick: --quick's, halved, with regions split at
// half --quick's size (2 MiB, not 4), so the load splits the regions as
// often as --quick's does (about 11 MB into about 9 regions; the baseline
// once) and the deletes merge as many back, in half the time (the load and
// the deletes were two thirds of the test's 90 s on 2 cores).
const (
	scaleTestRecords  = 10000
	scaleTestBaseline = 2500
	scaleTestSplitMax = 2 << 20
)

// TestScaleQuick runs bench scale --quick, on scaleTestRecords records of
// 1 KB, against three real server processes: the report has every
// section, results.json the contract's fields, and the figures are sane.
// Failed operations are reported, not asserted away: the store's behaviour
// at scale is what the scenario measures, so failures are logged, and the
// test checks they are counted consistently (the interval recorder, the
// runner and go-ycsb agree).
func TestScaleQuick(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("loads 10,000 records into three server processes")
	}
	bin := hedgekvBinary(t)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := ScaleConfig{Binary: bin, Quick: true, Dir: t.TempDir(), OutDir: out, Logger: quietLogger(),
		Records: scaleTestRecords, SplitMaxBytes: scaleTestSplitMax,
		Baseline: scaleTestBaseline, CompareFor: 3 * time.Second, DeleteAll: true, MergeWait: 90 * time.Second}
	start := time.Now()
	res, err := RunScale(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("scale --quick in %v: load %+v", time.Since(start).Round(time.Millisecond), res.Load.Row)
	for _, e := range res.Errors {
		t.Logf("reported error: %s", e)
	}

	checkScaleProcesses(t, res)
	checkScaleLoad(t, res)
	checkScaleMoveAndRestart(t, res)
	checkScaleMemoryAndDisk(t, res)
	checkScaleCompare(t, res, filepath.Join(out, "scale"))
	checkScaleDelete(t, res, filepath.Join(out, "scale"))
	checkScaleFiles(t, filepath.Join(out, "scale"))
}

// checkScaleDelete: every record was deleted, nothing is left, the
// regions merged back to the count before the load (plus one), and the
// merged regions' replicas agree.
func checkScaleDelete(t *testing.T, res *ScaleResult, dir string) {
	t.Helper()
	d := res.Delete
	if d == nil {
		t.Fatal("no delete-everything step")
	}
	t.Logf("delete everything: %+v", *d)
	if d.Err != "" || d.Failed > 0 || d.Deleted != res.Load.Row.Ops-res.Load.Row.Failed {
		t.Errorf("deleted %d (%d failed, error %q), want the %d records loaded", d.Deleted, d.Failed, d.Err, res.Load.Row.Ops-res.Load.Row.Failed)
	}
	if d.KeysLeft != 0 {
		t.Errorf("%d keys left after deleting everything", d.KeysLeft)
	}
	if d.RegionsBefore <= d.Target || !d.Settled || d.RegionsEnd > d.Target {
		t.Errorf("regions %d when the deletes began, %d at the end (settled %v), want them merged to at most %d", d.RegionsBefore, d.RegionsEnd, d.Settled, d.Target)
	}
	if d.Check.Err != "" || d.Check.Agreed != d.RegionsEnd {
		t.Errorf("ctl check after the merges: %+v; want all %d regions' replicas to agree", d.Check, d.RegionsEnd)
	}
	report, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(report), "## Delete everything, then merge") {
		t.Error("report.md has no delete-everything section")
	}
}

// checkScaleCompare: both clusters ran every compared workload, the
// ratios are this run's rates over the baseline's, and the report says
// them.
func checkScaleCompare(t *testing.T, res *ScaleResult, dir string) {
	t.Helper()
	c := res.Compare
	if c == nil || c.Err != "" {
		t.Fatalf("comparison with the baseline: %+v", c)
	}
	for _, r := range []ScaleRates{c.Baseline, c.Full} {
		if r.InsertsPS <= 0 || r.UpdatesPS <= 0 || r.ReadsPS <= 0 || r.ScansPS <= 0 {
			t.Errorf("rates %+v: every one must be measured", r)
		}
	}
	if c.Baseline.Records != scaleTestBaseline || c.Full.Records != scaleTestRecords {
		t.Errorf("records %d beside %d, want %d beside %d", c.Full.Records, c.Baseline.Records, scaleTestRecords, scaleTestBaseline)
	}
	want := map[string]float64{"inserts": c.Full.InsertsPS / c.Baseline.InsertsPS, "updates": c.Full.UpdatesPS / c.Baseline.UpdatesPS,
		"reads": c.Full.ReadsPS / c.Baseline.ReadsPS, "scans": c.Full.ScansPS / c.Baseline.ScansPS}
	for k, w := range want {
		if got := c.Ratios[k]; got < w-0.001 || got > w+0.001 {
			t.Errorf("ratio %s = %v, want %v", k, got, w)
		}
	}
	t.Logf("beside the baseline: %s", c.line())
	report, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(report), "## Beside a small data set") || !strings.Contains(string(report), "| updates |") {
		t.Error("report.md has no comparison with the baseline")
	}
}

// checkScaleProcesses: every process started (three stores, the joined
// one, the restart) has exited.
func checkScaleProcesses(t *testing.T, res *ScaleResult) {
	t.Helper()
	if len(res.PIDs) != 5 { // three stores, the joined one, the restart
		t.Errorf("started %d processes, want 5: %v", len(res.PIDs), res.PIDs)
	}
	for _, pid := range res.PIDs {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("server process %d still exists after the run (kill 0: %v)", pid, err)
		}
	}
}

// checkScaleLoad: every record attempted is counted, ok or failed, the
// three counts of failures agree, the regions split, and the logical bytes
// are the records'.
func checkScaleLoad(t *testing.T, res *ScaleResult) {
	t.Helper()
	load := res.Load
	if load == nil || load.Row.Ops != scaleTestRecords {
		t.Fatalf("load row %+v, want %d operations (ok + failed)", load, scaleTestRecords)
	}
	if load.Row.Failed > 0 {
		t.Logf("load: %d of %d inserts FAILED (first errors %v)", load.Row.Failed, load.Row.Ops, load.FirstErrors)
	}
	for _, p := range []*ScalePhase{res.Load, res.Move} {
		if p == nil {
			t.Error("a phase did not run")
			continue
		}
		checkScalePhase(t, p)
	}
	if res.RegionsBefore < 1 || res.RegionsAfterLoad <= res.RegionsBefore {
		// 11 MB in regions split at 2 MiB: there must be splits.
		t.Errorf("regions %d before, %d after the load: no split", res.RegionsBefore, res.RegionsAfterLoad)
	}
	if want := int64(scaleTestRecords * 1000); res.LogicalBytes+load.Row.Failed*1200 < want || res.LogicalBytes > want*12/10 {
		t.Errorf("logical bytes %d for %d records of 1000 bytes", res.LogicalBytes, scaleTestRecords)
	}
}

// checkScaleMoveAndRestart: the store was removed, its data moved, and
// the restarted store was ready within a minute, its raft log read.
func checkScaleMoveAndRestart(t *testing.T, res *ScaleResult) {
	t.Helper()
	mv := res.MoveInfo
	if !mv.Done {
		t.Errorf("store %d not removed: %s", mv.Removed, mv.Err)
	} else if mv.RemoveS <= 0 || mv.TotalS < mv.RemoveS || mv.MovedLogicalBytes <= 0 || mv.MBPerS <= 0 {
		t.Errorf("move %+v", mv)
	}
	rs := res.Restart
	if rs.Err != "" || rs.ReadyS <= 0 || rs.ReadyS > 60 { // --quick restarts within 1m
		t.Errorf("restart %+v", rs)
	}
	if rs.Err == "" && !hasBucket(rs.Buckets, "raftlog") {
		t.Errorf("no raftlog bucket read: %+v", rs.Buckets)
	}
	if ck := res.Check; ck.Err != "" || ck.Agreed < res.RegionsAfterLoad {
		t.Errorf("ctl check at the end: %+v; want every region's replicas to agree (%d regions after the load)", ck, res.RegionsAfterLoad)
	}
}

// checkScaleMemoryAndDisk: every store's memory and disk figures are sane.
func checkScaleMemoryAndDisk(t *testing.T, res *ScaleResult) {
	t.Helper()
	if len(res.Mem) == 0 || len(res.Disk) == 0 {
		t.Fatalf("memory %v, disk %v", res.Mem, res.Disk)
	}
	for _, m := range res.Mem {
		if runtime.GOOS != "linux" {
			break
		}
		if m.Err != "" || m.RSS <= 0 || m.Anon <= 0 || m.File <= 0 || m.Anon+m.File+m.Shmem > m.RSS+1<<20 {
			t.Errorf("memory %+v", m)
		}
	}
	for _, d := range res.Disk {
		if d.Bytes <= 0 || d.PerLogical < 0.5 || d.PerLogical > 100 {
			t.Errorf("disk %+v", d)
		}
	}
}

// checkScaleFiles: report.md has every section; results.json the
// contract's fields; the details and plots are there.
func checkScaleFiles(t *testing.T, dir string) {
	t.Helper()
	report, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range []string{"## Summary", "## Load", "#### Per interval", "#### Stalls", "### Splits",
		"## Join and remove under load", "foreground p99 during the move", "## Restart with all the data",
		"## Memory", "RssAnon", "## Disk", "bytes per logical byte", "### Raft log after compaction", "--quick run", "## Plots"} {
		if !strings.Contains(string(report), sec) {
			t.Errorf("report.md lacks %q", sec)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Scenario string           `json:"scenario"`
		Rows     []map[string]any `json:"rows"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Scenario != "scale" || len(got.Rows) != 2 {
		t.Fatalf("results.json: %s", b)
	}
	for _, r := range got.Rows {
		for _, k := range []string{"variant", "param", "ops", "qps", "p50_ms", "p99_ms", "p999_ms", "p9999_ms", "failed"} {
			if _, ok := r[k]; !ok {
				t.Errorf("results.json row %v lacks %s", r["variant"], k)
			}
		}
	}
	for _, f := range []string{"details.json", "throughput.png", "latency.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}

// checkScalePhase: a phase's figures are sane and its failures are
// counted alike by its intervals, the runner and go-ycsb.
func checkScalePhase(t *testing.T, p *ScalePhase) {
	t.Helper()
	r := p.Row
	if r.Ops <= 0 || r.QPS <= 0 || r.Failed < 0 || r.Failed > r.Ops {
		t.Errorf("%s: row %+v", p.Name, r)
	}
	if r.Ops > r.Failed && !(r.P50Ms > 0 && r.P50Ms <= r.P99Ms && r.P99Ms <= r.P999Ms && r.P999Ms <= r.P9999Ms) {
		t.Errorf("%s: percentiles out of order: %+v", p.Name, r)
	}
	var ok, failed, stalls int64
	for _, iv := range p.Intervals {
		ok += iv.OK
		failed += iv.Failed
		stalls += iv.Stalls
		if iv.OK > 0 && (iv.P99Ms > iv.MaxMs || iv.QPS <= 0) {
			t.Errorf("%s: interval %+v", p.Name, iv)
		}
	}
	// One YCSB operation is one database call in workloads load and A.
	if ok+failed != r.Ops || failed != r.Failed {
		t.Errorf("%s: intervals count %d ok and %d failed, the row %d operations and %d failed", p.Name, ok, failed, r.Ops, r.Failed)
	}
	var ycsbFailed int64
	for _, n := range p.YCSBErrors {
		ycsbFailed += n
	}
	if ycsbFailed != r.Failed {
		t.Errorf("%s: go-ycsb counts %d errors (%v), the row %d failed", p.Name, ycsbFailed, p.YCSBErrors, r.Failed)
	}
	if stalls != p.Stalls || int64(len(p.Worst)) > p.Stalls || len(p.Worst) > maxWorstStalls {
		t.Errorf("%s: %d stalls in intervals, %d counted, %d listed", p.Name, stalls, p.Stalls, len(p.Worst))
	}
	for i, s := range p.Worst {
		if s.Ms < 100 || s.At.IsZero() || (i > 0 && s.Ms > p.Worst[i-1].Ms) {
			t.Errorf("%s: stall %d %+v", p.Name, i, s)
		}
	}
	if r.Failed > 0 {
		t.Logf("%s: %d of %d operations FAILED: %v", p.Name, r.Failed, r.Ops, p.FirstErrors)
	}
}

func hasBucket(bs []BucketStat, name string) bool {
	for _, b := range bs {
		if b.Name == name && b.Keys > 0 {
			return true
		}
	}
	return false
}
