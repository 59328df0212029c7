package bench

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestRecorderConcurrent(t *testing.T) {
	rec := newRecorder(10*time.Millisecond, quietLogger())
	const threads, per = 8, 500
	var wg sync.WaitGroup
	for th := range threads {
		ctx := context.WithValue(context.Background(), shardKey{}, &rec.shards[th%recorderShards])
		wg.Go(func() {
			for i := range per {
				start := time.Now().Add(-time.Duration(i+1) * time.Millisecond) // latencies 1..500 ms
				var err error
				if i%100 == 0 {
					err = errors.New("boom")
				}
				rec.record(ctx, OpRead, start, err)
				rec.recordTotal(ctx, start, err)
			}
		})
	}
	// A cancelled operation is neither a success nor a failure.
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec.record(cctx, OpRead, time.Now(), context.Canceled)
	rec.recordTotal(cctx, time.Now(), nil)
	wg.Wait()

	ops, total, timeline := rec.snapshot(time.Second)
	if len(ops) != 1 || ops[0].Op != OpRead {
		t.Fatalf("ops %+v", ops)
	}
	wantFailed := int64(threads * per / 100)
	if total.Failed != wantFailed || total.Ops != threads*per-wantFailed || ops[0].Failed != wantFailed {
		t.Fatalf("total %+v", total)
	}
	if total.FirstErr != "boom" {
		t.Fatalf("first error %q", total.FirstErr)
	}
	// 1..500 ms uniform: p50 ≈ 250 ms, p99 ≈ 495 ms (3 significant digits).
	if total.P50Ms < 240 || total.P50Ms > 260 || total.P99Ms < 485 || total.P99Ms > 505 || total.P9999Ms < total.P999Ms {
		t.Fatalf("percentiles %+v", total)
	}
	if total.QPS != float64(total.Ops) {
		t.Fatalf("qps %v over 1s for %d ops", total.QPS, total.Ops)
	}
	var ok, failed int64
	for _, p := range timeline {
		ok += p.OK
		failed += p.Failed
	}
	if ok != total.Ops || failed != total.Failed {
		t.Fatalf("timeline sums %d/%d", ok, failed)
	}
	if rec.done.Load() != threads*per || rec.failed.Load() != wantFailed {
		t.Fatalf("progress counters %d/%d", rec.done.Load(), rec.failed.Load())
	}
	row := RowFromStats("v", "p", total)
	if row.Ops != threads*per || row.Failed != wantFailed {
		t.Fatalf("row %+v", row)
	}
}
