package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testSpec(workload string) Spec {
	return Spec{
		Workload:         workload,
		Records:          200,
		Ops:              600,
		Threads:          4,
		Load:             true,
		Run:              true,
		Variant:          "mem",
		Param:            workload,
		ProgressInterval: -1,
		Logger:           quietLogger(),
	}
}

func TestRunEveryWorkload(t *testing.T) {
	for _, w := range Workloads() {
		t.Run(w, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			db := newMemDB()
			spec := testSpec(w)
			spec.Instance = db
			var summary bytes.Buffer
			spec.Summary = &summary
			res, err := Run(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			if res.Load == nil || res.Run == nil {
				t.Fatal("missing phase result")
			}
			if got := res.Load.Row.Ops; got != spec.Records {
				t.Errorf("load ops = %d, want %d", got, spec.Records)
			}
			if db.len() < int(spec.Records) {
				t.Errorf("loaded %d records, want at least %d", db.len(), spec.Records)
			}
			row := res.Run.Row
			if row.Ops != spec.Ops {
				t.Errorf("run ops = %d, want %d", row.Ops, spec.Ops)
			}
			if row.Failed != 0 {
				t.Errorf("run failed = %d (%s)", row.Failed, res.Run.Total.FirstErr)
			}
			if row.QPS <= 0 || row.P50Ms < 0 || row.P50Ms > row.P99Ms || row.P99Ms > row.P999Ms || row.P999Ms > row.P9999Ms {
				t.Errorf("implausible row %+v", row)
			}
			if row.Variant != "mem" || row.Param != w {
				t.Errorf("labels = %q/%q", row.Variant, row.Param)
			}
			if !strings.Contains(res.Run.Summary, "TOTAL") || !strings.Contains(summary.String(), "go-ycsb summary") {
				t.Errorf("go-ycsb summary missing:\n%s", summary.String())
			}
			// The per-op breakdown follows the workload's mix.
			var opSum int64
			byOp := map[string]OpStats{}
			for _, o := range res.Run.Ops {
				byOp[o.Op] = o
				opSum += o.Ops
			}
			switch w {
			case "c":
				if byOp[OpRead].Ops != spec.Ops || len(byOp) != 1 {
					t.Errorf("workload c ops: %+v", byOp)
				}
			case "scan":
				if byOp[OpScan].Ops != spec.Ops || len(byOp) != 1 {
					t.Errorf("scan ops: %+v", byOp)
				}
			case "a":
				if byOp[OpRead].Ops == 0 || byOp[OpUpdate].Ops == 0 || opSum != spec.Ops {
					t.Errorf("workload a ops: %+v", byOp)
				}
			case "f":
				// A read-modify-write is one YCSB operation but a READ and
				// an UPDATE call.
				if byOp[OpUpdate].Ops == 0 || opSum != spec.Ops+byOp[OpUpdate].Ops {
					t.Errorf("workload f ops: %+v", byOp)
				}
			case "d", "e":
				if byOp[OpInsert].Ops == 0 {
					t.Errorf("workload %s made no inserts: %+v", w, byOp)
				}
			}
		})
	}
}

func TestRunThroughRegistry(t *testing.T) {
	spec := testSpec("b")
	spec.DB = memDBName
	res, err := Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Run.Row.Ops != spec.Ops {
		t.Fatalf("ops = %d", res.Run.Row.Ops)
	}
	if res.Properties["recordcount"] != "200" || res.Properties["readproportion"] != "0.95" {
		t.Fatalf("properties: %v", res.Properties)
	}

	spec.DB = "no-such-db"
	if _, err := Run(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "no-such-db") {
		t.Fatalf("unknown DB: %v", err)
	}
	spec.DB = memDBName
	spec.Properties = map[string]string{"memdb.fail_create": "yes"}
	if _, err := Run(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "create failed") {
		t.Fatalf("failing creator: %v", err)
	}
}

func TestRunMoreThreadsThanOps(t *testing.T) {
	// go-ycsb would exit the process; the runner gives the phase fewer threads.
	spec := testSpec("c")
	spec.Instance = newMemDB()
	spec.Records, spec.Ops, spec.Threads = 3, 5, 64
	res, err := Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Load.Threads != 3 || res.Run.Threads != 5 || res.Run.Row.Ops != 5 {
		t.Fatalf("threads %d/%d ops %d", res.Load.Threads, res.Run.Threads, res.Run.Row.Ops)
	}
}

func TestRunCountsFailuresAndAborts(t *testing.T) {
	// Reads of records that were never loaded fail but the phase completes.
	spec := testSpec("c")
	spec.Instance = newMemDB()
	spec.Load = false
	spec.AbortAfterFailures = -1
	res, err := Run(context.Background(), spec)
	if !errors.Is(err, ErrAllFailed) {
		t.Fatalf("err = %v, want ErrAllFailed", err)
	}
	if res.Run.Row.Failed != spec.Ops || res.Run.Row.Ops != spec.Ops || res.Run.Total.Ops != 0 {
		t.Fatalf("row %+v", res.Run.Row)
	}
	if !strings.Contains(res.Run.Total.FirstErr, "not found") {
		t.Fatalf("first error %q", res.Run.Total.FirstErr)
	}

	// A DB that fails everything is abandoned early.
	spec = testSpec("c")
	spec.DB = failingDBName
	spec.Records, spec.Ops = 100000, 1000000
	start := time.Now()
	res, err = Run(context.Background(), spec)
	if !errors.Is(err, ErrAllFailed) {
		t.Fatalf("err = %v, want ErrAllFailed", err)
	}
	if res.Load == nil || res.Run != nil || time.Since(start) > 10*time.Second {
		t.Fatalf("load not aborted quickly: %+v after %v", res.Load, time.Since(start))
	}
}

func TestRunMaxDurationAndTimeline(t *testing.T) {
	spec := testSpec("c")
	spec.Instance = &slowDB{memDB: newMemDB(), delay: time.Millisecond}
	spec.Ops = 1 << 40
	spec.MaxDuration = 300 * time.Millisecond
	spec.TimelineStep = 100 * time.Millisecond
	start := time.Now()
	res, err := Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("took %v", el)
	}
	if !res.Run.Stopped || res.Run.Row.Ops == 0 || res.Run.Row.Failed != 0 {
		t.Fatalf("run %+v", res.Run.Row)
	}
	var ok int64
	for i, p := range res.Run.Row.Timeline {
		if p.TMs != int64(i)*100 {
			t.Fatalf("timeline point %d at %d ms", i, p.TMs)
		}
		ok += p.OK
	}
	if ok != res.Run.Row.Ops || len(res.Run.Row.Timeline) < 2 {
		t.Fatalf("timeline %+v sums to %d, row has %d ops", res.Run.Row.Timeline, ok, res.Run.Row.Ops)
	}
	if res.Run.Row.P50Ms < 1 {
		t.Fatalf("p50 %.3f ms below the injected 1 ms delay", res.Run.Row.P50Ms)
	}
}

type slowDB struct {
	*memDB
	delay time.Duration
}

func (db *slowDB) Read(ctx context.Context, table, key string, fields []string) (map[string][]byte, error) {
	select {
	case <-time.After(db.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return db.memDB.Read(ctx, table, key, fields)
}

func TestRunCancelled(t *testing.T) {
	spec := testSpec("c")
	spec.Instance = &slowDB{memDB: newMemDB(), delay: time.Millisecond}
	spec.Ops = 1 << 40
	// Long enough for the load phase on a loaded machine (at 200 ms, a CI
	// run under -race ended in the load, before any run result existed).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res, err := Run(ctx, spec)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if res == nil || res.Run == nil {
		t.Fatal("partial result missing")
	}
}

func TestScanLengths(t *testing.T) {
	db := newMemDB()
	spec := testSpec("scan")
	spec.Instance = db
	spec.MaxScanLength = 7
	spec.ScanLengthDistribution = "constant"
	if _, err := Run(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	var lens []int
	db.scanLens.Range(func(k, _ any) bool { lens = append(lens, k.(int)); return true })
	if !reflect.DeepEqual(lens, []int{7}) {
		t.Fatalf("constant scan lengths %v, want [7]", lens)
	}

	db = newMemDB()
	spec.Instance = db
	spec.ScanLengthDistribution = ""
	spec.ScanInsert = true
	res, err := Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	db.scanLens.Range(func(k, _ any) bool {
		if n := k.(int); n < 1 || n > 7 {
			t.Errorf("uniform scan length %d outside [1,7]", n)
		}
		return true
	})
	if res.Properties["scanproportion"] != "0.95" || db.inserts.Load() <= spec.Records {
		t.Fatalf("scan+insert: props %v inserts %d", res.Properties["scanproportion"], db.inserts.Load())
	}
}

func TestBuildPropertiesValidation(t *testing.T) {
	base := testSpec("a")
	bad := []func(*Spec){
		func(s *Spec) { s.Workload = "z" },
		func(s *Spec) { s.Records = 0 },
		func(s *Spec) { s.Ops = 0 },
		func(s *Spec) { s.ScanLengthDistribution = "normal" },
		func(s *Spec) { s.Properties = map[string]string{"requestdistribution": "pareto"} },
		func(s *Spec) { s.Properties = map[string]string{"insertstart": "500"} },
		func(s *Spec) { s.Properties = map[string]string{"insertcount": "300"} },
		func(s *Spec) { s.Properties = map[string]string{"fieldcount": "0"} },
		func(s *Spec) { s.Properties = map[string]string{"batch.size": "10"} },
		func(s *Spec) { s.Properties = map[string]string{"workload": "site.ycsb.workloads.TimeSeriesWorkload"} },
	}
	for i, mutate := range bad {
		s := base
		mutate(&s)
		if _, err := BuildProperties(s); err == nil {
			t.Errorf("case %d: invalid spec accepted", i)
		}
	}
	s := base
	s.Properties = map[string]string{"fieldcount": "3", "recordcount": "5"}
	p, err := BuildProperties(s)
	if err != nil {
		t.Fatal(err)
	}
	if p["fieldcount"] != "3" || p["recordcount"] != "200" || p["threadcount"] != "4" || p["updateproportion"] != "0.5" {
		t.Fatalf("layering wrong: %v", p)
	}
}

// TestResultsFiles runs the ycsb scenario against the in-memory DB and checks
// the results.json shape (docs/BENCHMARKS.md).
func TestResultsFiles(t *testing.T) {
	dir := t.TempDir()
	cfg := YCSBScenario{
		DB:               memDBName,
		Workloads:        []string{"a", "scan"},
		Records:          100,
		Ops:              300,
		Threads:          3,
		Load:             true,
		OutDir:           dir,
		Logger:           quietLogger(),
		Out:              io.Discard,
		ProgressInterval: -1,
	}
	if _, err := RunYCSBScenario(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "ycsb", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["scenario"] != "ycsb" {
		t.Fatalf("scenario = %v", doc["scenario"])
	}
	rows, ok := doc["rows"].([]any)
	if !ok || len(rows) != 2 {
		t.Fatalf("rows = %v", doc["rows"])
	}
	want := []string{"variant", "param", "ops", "qps", "p50_ms", "p99_ms", "p999_ms", "p9999_ms", "failed"}
	for _, r := range rows {
		row := r.(map[string]any)
		for _, k := range want {
			if _, ok := row[k]; !ok {
				t.Errorf("row lacks %q: %v", k, row)
			}
		}
		if _, ok := row["variant"].(string); !ok {
			t.Errorf("variant is not a string: %v", row)
		}
		for _, k := range want[2:] {
			if _, ok := row[k].(float64); !ok {
				t.Errorf("%s is not a number: %v", k, row)
			}
		}
		if row["ops"].(float64) != 300 {
			t.Errorf("ops = %v", row["ops"])
		}
	}
	report, err := os.ReadFile(filepath.Join(dir, "ycsb", "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"| variant |", "scan-100", "go-ycsb"} {
		if !strings.Contains(string(report), s) {
			t.Errorf("report.md lacks %q", s)
		}
	}

	// A second invocation merges its rows into results.json.
	cfg.Workloads = []string{"c"}
	cfg.Load = false
	if _, err := RunYCSBScenario(context.Background(), cfg); err == nil {
		t.Fatal("run without load against a fresh in-memory DB should fail every read")
	}
	res, err := ReadResults(filepath.Join(dir, "ycsb", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 3 || res.Rows[2].Param != "c" || res.Rows[2].Failed == 0 || res.Rows[2].QPS != 0 {
		t.Fatalf("merged rows: %+v", res.Rows)
	}
}

func TestMergeRows(t *testing.T) {
	old := []Row{{Variant: "a", Param: "1", Ops: 1}, {Variant: "b", Param: "1", Ops: 2}}
	got := MergeRows(old, []Row{{Variant: "b", Param: "1", Ops: 3}, {Variant: "c", Ops: 4}})
	if len(got) != 3 || got[1].Ops != 3 || got[2].Variant != "c" || old[1].Ops != 2 {
		t.Fatalf("merge: %+v", got)
	}
}

// flakyDB fails every nth read, after a delay like slowDB's.
type flakyDB struct {
	*slowDB
	n     int64
	reads atomic.Int64
}

func (db *flakyDB) Read(ctx context.Context, table, key string, fields []string) (map[string][]byte, error) {
	v, err := db.slowDB.Read(ctx, table, key, fields)
	if err == nil && db.reads.Add(1)%db.n == 0 {
		return nil, errInjected
	}
	return v, err
}

// TestRunFailuresMatchGoYCSB: every failed call go-ycsb counts (its
// READ_ERROR line) is a failed operation in the row, and a run ended by
// MaxDuration fails none of the calls in flight (before, those failed with
// context.Canceled: go-ycsb printed READ_ERROR Count: 4 beside failed 0).
func TestRunFailuresMatchGoYCSB(t *testing.T) {
	for _, every := range []int64{0, 3} {
		spec := testSpec("c")
		slow := &slowDB{memDB: newMemDB(), delay: 20 * time.Millisecond}
		spec.Instance = slow
		if every > 0 {
			spec.Instance = &flakyDB{slowDB: slow, n: every}
		}
		spec.Ops = 1 << 40
		spec.MaxDuration = 300 * time.Millisecond
		res, err := Run(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		r := res.Run
		var failed int64
		for _, o := range r.Ops {
			failed += o.Failed
			if o.Failed != r.YCSBErrors[o.Op] {
				t.Errorf("every %d: %s failed %d, go-ycsb says %d\n%s", every, o.Op, o.Failed, r.YCSBErrors[o.Op], r.Summary)
			}
		}
		for op, n := range r.YCSBErrors {
			if !slices.ContainsFunc(r.Ops, func(o OpStats) bool { return o.Op == op }) {
				t.Errorf("every %d: go-ycsb counts %d %s errors the recorder has no row for", every, n, op)
			}
		}
		if r.Row.Failed != failed {
			t.Errorf("every %d: row failed %d, calls failed %d", every, r.Row.Failed, failed)
		}
		if every == 0 && failed != 0 {
			t.Errorf("a run ended by MaxDuration failed %d calls:\n%s", failed, r.Summary)
		}
		if every > 0 && (failed == 0 || failed < r.Row.Ops/int64(every)-int64(spec.Threads)) {
			t.Errorf("every %d: %d of %d failed", every, failed, r.Row.Ops)
		}
	}
}

func TestYCSBErrorCounts(t *testing.T) {
	got := ycsbErrorCounts("READ   - Takes(s): 0.3, Count: 56, OPS: 199.1\nREAD_ERROR - Takes(s): 0.0, Count: 8, OPS: 6780.2\nINSERT_ERROR - Takes(s): 1.0, Count: 12, OPS: 1\nTOTAL  - Takes(s): 0.3, Count: 56\n")
	if !reflect.DeepEqual(got, map[string]int64{"READ": 8, "INSERT": 12}) {
		t.Fatalf("got %v", got)
	}
}
