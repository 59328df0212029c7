package ycsbdb_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/magiconair/properties"
	"github.com/pingcap/go-ycsb/pkg/ycsb"

	"github.com/hedgekv/hedgekv/bench"
	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestRowKeyAndProperties(t *testing.T) {
	if got := string(ycsbdb.RowKey("usertable", "user42")); got != "usertable/user42" {
		t.Fatalf("RowKey = %q", got)
	}
	p := properties.NewProperties()
	o, err := ycsbdb.OptionsFromProperties(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Endpoints) != 3 || o.Read.Replica != client.ReplicaLeader || o.Read.MaxStaleness != 0 {
		t.Fatalf("defaults: %+v", o)
	}
	for k, v := range map[string]string{
		ycsbdb.PropEndpoints:    " a:1, b:2 ,",
		ycsbdb.PropZone:         "dc-b",
		ycsbdb.PropRead:         "closest",
		ycsbdb.PropMaxStaleness: "250ms",
		ycsbdb.PropHedge:        "min(p99,50ms)",
		ycsbdb.PropHedgeBudget:  "0.01",
	} {
		_, _, _ = p.Set(k, v)
	}
	if o, err = ycsbdb.OptionsFromProperties(p); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(o.Endpoints) != "[a:1 b:2]" || o.Zone != "dc-b" || o.Read.Replica != client.ReplicaClosest || o.Read.MaxStaleness != 250*time.Millisecond ||
		o.Read.Hedge.String() != "min(p99,50ms)" || o.Read.HedgeBudget != 0.01 {
		t.Fatalf("parsed: %+v", o)
	}
	for k, v := range map[string]string{
		ycsbdb.PropRead:         "nearest",
		ycsbdb.PropMaxStaleness: "5 parsecs",
		ycsbdb.PropEndpoints:    ",",
		ycsbdb.PropHedge:        "sometimes",
		ycsbdb.PropHedgeBudget:  "1.5",
	} {
		bad := properties.NewProperties()
		_, _, _ = bad.Set(k, v)
		if _, err := ycsbdb.OptionsFromProperties(bad); err == nil {
			t.Errorf("%s=%q accepted", k, v)
		}
	}
	if ycsb.GetDBCreator(ycsbdb.Name) == nil {
		t.Fatal("hedgekv is not registered with go-ycsb")
	}
}

// TestAgainstLocalCluster exercises every DB method against a real
// three-store cluster running in this process, then a small YCSB run.
func TestAgainstLocalCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stores, err := cluster.StartLocal(ctx, cluster.LocalConfig{Dir: t.TempDir(), NoSync: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer stores.Stop()

	db, err := ycsbdb.Open(ctx, ycsbdb.Options{
		Endpoints:      stores.Endpoints,
		Read:           client.ReadPolicy{Replica: client.ReplicaFollower},
		DialTimeout:    5 * time.Second,
		RequestTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	checkReadsAndUpdates(ctx, t, db)
	checkScans(ctx, t, db)
	checkBatchesAndDeletes(ctx, t, db)
	runSmallYCSB(ctx, t, stores.Endpoints)
	checkHedgeMetrics(ctx, t, stores.Endpoints)
}

// rec is record i: two fields.
func rec(i int) map[string][]byte {
	return map[string][]byte{"field0": fmt.Appendf(nil, "a%d", i), "field1": fmt.Appendf(nil, "b%d", i)}
}

// checkReadsAndUpdates inserts records k00-k09 of table t (and one of a
// neighbouring table), reads them whole and by field, and updates one.
func checkReadsAndUpdates(ctx context.Context, t *testing.T, db *ycsbdb.DB) {
	t.Helper()
	for i := range 10 {
		if err := db.Insert(ctx, "t", fmt.Sprintf("k%02d", i), rec(i)); err != nil {
			t.Fatal(err)
		}
	}
	// A neighbouring table must not show up in scans of "t".
	if err := db.Insert(ctx, "t0", "k00", rec(99)); err != nil {
		t.Fatal(err)
	}
	got, err := db.Read(ctx, "t", "k03", nil)
	if err != nil || string(got["field0"]) != "a3" || string(got["field1"]) != "b3" {
		t.Fatalf("read all fields: %q %v", got, err)
	}
	got, err = db.Read(ctx, "t", "k03", []string{"field1"})
	if err != nil || len(got) != 1 || string(got["field1"]) != "b3" {
		t.Fatalf("read one field: %q %v", got, err)
	}
	if _, err := db.Read(ctx, "t", "nope", nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("read missing: %v", err)
	}

	if err := db.Update(ctx, "t", "k03", map[string][]byte{"field1": []byte("B3"), "field2": []byte("c3")}); err != nil {
		t.Fatal(err)
	}
	got, err = db.Read(ctx, "t", "k03", nil)
	if err != nil || string(got["field0"]) != "a3" || string(got["field1"]) != "B3" || string(got["field2"]) != "c3" {
		t.Fatalf("update did not merge: %q %v", got, err)
	}
	if err := db.Update(ctx, "t", "nope", rec(0)); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("update missing: %v", err)
	}
}

// checkScans scans table t, in one call and in pages.
func checkScans(ctx context.Context, t *testing.T, db *ycsbdb.DB) {
	t.Helper()
	scan, err := db.Scan(ctx, "t", "k05", 3, nil)
	if err != nil || len(scan) != 3 || string(scan[0]["field0"]) != "a5" || string(scan[2]["field0"]) != "a7" {
		t.Fatalf("scan: %q %v", scan, err)
	}
	restore := ycsbdb.SetScanPage(2) // several RPCs per scan
	scan, err = db.Scan(ctx, "t", "k05", 100, []string{"field0"})
	restore()
	if err != nil || len(scan) != 5 || string(scan[4]["field0"]) != "a9" || len(scan[0]) != 1 {
		t.Fatalf("paged scan to the end of the table: %q %v", scan, err)
	}
}

// checkBatchesAndDeletes: batch reads, inserts, updates and deletes, and
// a delete.
func checkBatchesAndDeletes(ctx context.Context, t *testing.T, db *ycsbdb.DB) {
	t.Helper()
	batch, err := db.BatchRead(ctx, "t", []string{"k01", "missing", "k02"}, nil)
	if err != nil || len(batch) != 3 || string(batch[0]["field0"]) != "a1" || batch[1] != nil || string(batch[2]["field1"]) != "b2" {
		t.Fatalf("batch read: %q %v", batch, err)
	}
	if err := db.BatchInsert(ctx, "t", []string{"x1", "x2"}, []map[string][]byte{rec(1), rec(2)}); err != nil {
		t.Fatal(err)
	}
	if err := db.BatchUpdate(ctx, "t", []string{"x1", "x2"}, []map[string][]byte{{"field0": []byte("u1")}, {"field0": []byte("u2")}}); err != nil {
		t.Fatal(err)
	}
	if got, err := db.Read(ctx, "t", "x2", nil); err != nil || string(got["field0"]) != "u2" || string(got["field1"]) != "b2" {
		t.Fatalf("batch update: %q %v", got, err)
	}
	if err := db.BatchDelete(ctx, "t", []string{"x1", "x2"}); err != nil {
		t.Fatal(err)
	}
	if err := db.Delete(ctx, "t", "k00"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Read(ctx, "t", "k00", nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("read after delete: %v", err)
	}
}

// runSmallYCSB runs a small YCSB workload through go-ycsb's registry, as
// the CLI does it.
func runSmallYCSB(ctx context.Context, t *testing.T, endpoints []string) {
	t.Helper()
	res, err := bench.Run(ctx, bench.Spec{
		DB: ycsbdb.Name,
		Properties: map[string]string{
			ycsbdb.PropEndpoints: endpoints[0] + "," + endpoints[1] + "," + endpoints[2],
			ycsbdb.PropRead:      "follower",
		},
		Workload: "a", Records: 100, Ops: 300, Threads: 4, Load: true, Run: true,
		ProgressInterval: -1, Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Load.Row.Failed != 0 || res.Run.Row.Failed != 0 || res.Run.Row.Ops != 300 {
		t.Fatalf("ycsb: load %+v run %+v (%s)", res.Load.Row, res.Run.Row, res.Run.Total.FirstErr)
	}
}

// checkHedgeMetrics: a hedging client's counters are on ycsbdb.Metrics
// while it is open.
func checkHedgeMetrics(ctx context.Context, t *testing.T, endpoints []string) {
	t.Helper()
	hedged, err := ycsbdb.Open(ctx, ycsbdb.Options{
		Endpoints:      endpoints,
		Read:           client.ReadPolicy{Replica: client.ReplicaLeader, Hedge: client.HedgeAfter(time.Millisecond)},
		DialTimeout:    5 * time.Second,
		RequestTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hedged.Read(ctx, "t", "k03", nil); err != nil {
		t.Fatal(err)
	}
	primaries := func() (n float64) {
		mfs, err := ycsbdb.Metrics.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "hedgekv_client_hedge_primaries_total" {
				for _, m := range mf.GetMetric() {
					n += m.GetCounter().GetValue()
				}
			}
		}
		return n
	}
	if got := primaries(); got < 1 {
		t.Fatalf("hedgekv_client_hedge_primaries_total = %v on ycsbdb.Metrics after a hedged read", got)
	}
	if err := hedged.Close(); err != nil {
		t.Fatal(err)
	}
	if got := primaries(); got != 0 {
		t.Fatalf("hedgekv_client_hedge_primaries_total = %v after the hedging client closed", got)
	}
}
