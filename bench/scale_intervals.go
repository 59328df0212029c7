package bench

// The scale scenario's per-interval measurement: throughput, latency and
// stalls per interval of a phase, recorded by a wrapper around the DB.

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/pingcap/go-ycsb/pkg/ycsb"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
)

// ScaleInterval is one interval of a phase.
type ScaleInterval struct {
	// T is the interval's start, seconds since the scenario started.
	T       float64 `json:"t_s"`
	OK      int64   `json:"ok"`
	Failed  int64   `json:"failed"`
	QPS     float64 `json:"qps"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	P999Ms  float64 `json:"p999_ms"`
	MaxMs   float64 `json:"max_ms"`
	Stalls  int64   `json:"stalls"`
	Regions int     `json:"regions,omitempty"` // at the interval's end (0: not sampled)
}

// ScaleStall is one operation slower than the stall threshold.
type ScaleStall struct {
	At  time.Time `json:"at"`
	T   float64   `json:"t_s"` // seconds since the scenario started
	Op  string    `json:"op"`
	Key string    `json:"key"`
	Ms  float64   `json:"ms"`
	Err string    `json:"error,omitempty"`
}

// maxWorstStalls is how many of the slowest stalls a phase keeps.
const maxWorstStalls = 15

type intervalBucket struct {
	hist       *hdrhistogram.Histogram
	ok, failed int64
	stalls     int64
}

// intervalRec measures the calls of one phase per interval: latency of
// the successful ones, failures (every error), stalls. Safe for
// concurrent use.
type intervalRec struct {
	origin, start time.Time // of the scenario, of the phase
	step          time.Duration
	stall         time.Duration

	mu       sync.Mutex
	buckets  []*intervalBucket
	stalls   int64
	worst    []ScaleStall
	failed   map[string]int64
	firstErr map[string]string
	// spans, kept if keepSpans, are every call, for the splits' windows
	// (scale_splits.go): 16 bytes a call.
	keepSpans bool
	spans     []opSpan

	logicalBytes atomic.Int64 // keys and values of successful inserts
}

func newIntervalRec(origin time.Time, step, stall time.Duration) *intervalRec {
	return &intervalRec{origin: origin, start: time.Now(), step: step, stall: stall,
		failed: map[string]int64{}, firstErr: map[string]string{}}
}

func (r *intervalRec) record(op, key string, begin time.Time, err error) {
	now := time.Now()
	lat := now.Sub(begin)
	r.mu.Lock()
	defer r.mu.Unlock()
	i := max(0, int(now.Sub(r.start)/r.step))
	for len(r.buckets) <= i {
		r.buckets = append(r.buckets, &intervalBucket{hist: newHist()})
	}
	b := r.buckets[i]
	if r.keepSpans {
		r.spans = append(r.spans, opSpan{begin: begin.Sub(r.start), lat: lat})
	}
	if err != nil {
		b.failed++
		r.failed[op]++
		if r.firstErr[op] == "" {
			r.firstErr[op] = err.Error()
		}
	} else {
		b.ok++
		recordLatency(b.hist, lat)
	}
	if lat < r.stall {
		return
	}
	b.stalls++
	r.stalls++
	s := ScaleStall{At: begin, T: round(begin.Sub(r.origin).Seconds(), 3), Op: op, Key: key, Ms: round(float64(lat.Microseconds())/1000, 1)}
	if err != nil {
		s.Err = err.Error()
	}
	if len(r.worst) < maxWorstStalls || s.Ms > r.worst[len(r.worst)-1].Ms {
		r.worst = append(r.worst, s)
		slices.SortStableFunc(r.worst, func(a, b ScaleStall) int {
			switch {
			case a.Ms > b.Ms:
				return -1
			case a.Ms < b.Ms:
				return 1
			}
			return 0
		})
		r.worst = r.worst[:min(len(r.worst), maxWorstStalls)]
	}
}

// intervals returns the phase's intervals (the last one possibly short:
// its rate is over the time it covered, up to end).
func (r *intervalRec) intervals(end time.Time) []ScaleInterval {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ScaleInterval, 0, len(r.buckets))
	for i, b := range r.buckets {
		from := r.start.Add(time.Duration(i) * r.step)
		span := min(r.step, end.Sub(from))
		iv := ScaleInterval{
			T: round(from.Sub(r.origin).Seconds(), 3), OK: b.ok, Failed: b.failed, Stalls: b.stalls,
			P50Ms: quantileMs(b.hist, 50), P99Ms: quantileMs(b.hist, 99), P999Ms: quantileMs(b.hist, 99.9),
		}
		if b.hist.TotalCount() > 0 {
			iv.MaxMs = microsToMs(b.hist.Max())
		}
		if span > 0 {
			iv.QPS = round(float64(b.ok)/span.Seconds(), 1)
		}
		out = append(out, iv)
	}
	return out
}

// totalFailed is every failed call of the phase.
func (r *intervalRec) totalFailed() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for _, f := range r.failed {
		n += f
	}
	return n
}

// scaleDB is the hedgekv binding with every call recorded per interval.
type scaleDB struct {
	inner ycsb.DB
	rec   atomic.Pointer[intervalRec]
}

var _ ycsb.DB = (*scaleDB)(nil)

func (d *scaleDB) Close() error { return nil }
func (d *scaleDB) InitThread(ctx context.Context, id, n int) context.Context {
	return d.inner.InitThread(ctx, id, n)
}
func (d *scaleDB) CleanupThread(ctx context.Context) { d.inner.CleanupThread(ctx) }

func (d *scaleDB) Read(ctx context.Context, table, key string, fields []string) (map[string][]byte, error) {
	begin := time.Now()
	v, err := d.inner.Read(ctx, table, key, fields)
	d.rec.Load().record(OpRead, key, begin, err)
	return v, err
}

func (d *scaleDB) Scan(ctx context.Context, table, startKey string, count int, fields []string) ([]map[string][]byte, error) {
	begin := time.Now()
	v, err := d.inner.Scan(ctx, table, startKey, count, fields)
	d.rec.Load().record(OpScan, startKey, begin, err)
	return v, err
}

func (d *scaleDB) Update(ctx context.Context, table, key string, values map[string][]byte) error {
	begin := time.Now()
	err := d.inner.Update(ctx, table, key, values)
	d.rec.Load().record(OpUpdate, key, begin, err)
	return err
}

func (d *scaleDB) Insert(ctx context.Context, table, key string, values map[string][]byte) error {
	begin := time.Now()
	err := d.inner.Insert(ctx, table, key, values)
	rec := d.rec.Load()
	rec.record(OpInsert, key, begin, err)
	if err == nil {
		rec.logicalBytes.Add(int64(len(ycsbdb.RowKey(table, key)) + len(ycsbdb.EncodeRecord(values))))
	}
	return err
}

func (d *scaleDB) Delete(ctx context.Context, table, key string) error {
	begin := time.Now()
	err := d.inner.Delete(ctx, table, key)
	d.rec.Load().record(OpDelete, key, begin, err)
	return err
}
