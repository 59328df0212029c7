package bench

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Latencies are recorded in microseconds, from 1 µs to one hour, with three
// significant digits (the same range and precision as go-ycsb's histograms).
const (
	histMaxMicros = int64(time.Hour / time.Microsecond)
	histSigFigs   = 3
	// recorderShards bounds memory (one histogram per operation per shard)
	// and lock contention: thread i records into shard i % recorderShards.
	recorderShards = 16
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, histMaxMicros, histSigFigs) }

// Operation names, as go-ycsb's own measurement names them.
const (
	OpRead        = "READ"
	OpScan        = "SCAN"
	OpUpdate      = "UPDATE"
	OpInsert      = "INSERT"
	OpDelete      = "DELETE"
	OpBatchRead   = "BATCH_READ"
	OpBatchUpdate = "BATCH_UPDATE"
	OpBatchInsert = "BATCH_INSERT"
	OpBatchDelete = "BATCH_DELETE"
	OpTotal       = "TOTAL"
)

type opRec struct {
	hist     *hdrhistogram.Histogram // successful operations only
	failed   int64
	firstErr error
}

type tlBucket struct{ ok, failed int64 }

type recShard struct {
	mu       sync.Mutex
	ops      map[string]*opRec
	timeline []tlBucket
}

// recorder measures every operation a ycsb.DB performs: a latency histogram
// of successful operations and a failure count per operation type, plus
// optionally ok/failed counts per time step. Safe for concurrent use.
type recorder struct {
	start time.Time
	step  time.Duration // timeline step; 0 disables the timeline
	// ops, if set, is what the phase's database calls run under
	// (opContext): cancelled when the phase is interrupted or aborted,
	// not when it merely reaches its end (MaxDuration, Stop).
	ops    context.Context
	logger *slog.Logger
	shards [recorderShards]recShard

	done, failed atomic.Int64 // for progress reports
	warned       sync.Map     // op -> struct{}: first failure already logged
}

func newRecorder(step time.Duration, logger *slog.Logger) *recorder {
	r := &recorder{start: time.Now(), step: step, logger: logger}
	for i := range r.shards {
		r.shards[i].ops = make(map[string]*opRec)
	}
	return r
}

type shardKey struct{}

// opContext is the context of a database call made from ctx (a thread's
// context): ctx itself, or, when the recorder has an operations context,
// ctx's values under that context's cancellation.
func (r *recorder) opContext(ctx context.Context) context.Context {
	if r.ops == nil {
		return ctx
	}
	return opCtx{Context: r.ops, values: ctx}
}

// interrupted reports whether calls made from ctx were cut short by an
// interruption rather than failing on their own.
func (r *recorder) interrupted(ctx context.Context) bool {
	if r.ops != nil {
		return r.ops.Err() != nil
	}
	return ctx.Err() != nil
}

func (r *recorder) shardFor(ctx context.Context) *recShard {
	if s, ok := ctx.Value(shardKey{}).(*recShard); ok {
		return s
	}
	return &r.shards[0]
}

// record records one database call (READ, SCAN, ...) of a thread.
func (r *recorder) record(ctx context.Context, op string, start time.Time, err error) {
	lat := time.Since(start)
	if err != nil && r.interrupted(ctx) {
		// The phase was interrupted or aborted while this call was in
		// flight: it neither succeeded nor failed on its own.
		return
	}
	s := r.shardFor(ctx)
	s.mu.Lock()
	first := s.add(op, lat, err)
	s.mu.Unlock()
	if first && r.logger != nil {
		if _, dup := r.warned.LoadOrStore(op, struct{}{}); !dup {
			r.logger.Warn("ycsb operation failed (first failure of this kind; later ones are only counted)", "op", op, "err", err)
		}
	}
}

// recordTotal records one YCSB operation (one DoInsert or DoTransaction
// call: a read-modify-write is one operation made of a READ and an UPDATE).
// It feeds TOTAL, the timeline and the progress counters.
func (r *recorder) recordTotal(ctx context.Context, start time.Time, err error) {
	now := time.Now()
	if r.interrupted(ctx) {
		// Interrupted while in flight; go-ycsb's DoInsert even reports such
		// an operation as a success.
		return
	}
	s := r.shardFor(ctx)
	s.mu.Lock()
	s.add(OpTotal, now.Sub(start), err)
	if r.step > 0 {
		i := int(now.Sub(r.start) / r.step)
		if i >= len(s.timeline) {
			s.timeline = append(s.timeline, make([]tlBucket, i+1-len(s.timeline))...)
		}
		if err != nil {
			s.timeline[i].failed++
		} else {
			s.timeline[i].ok++
		}
	}
	s.mu.Unlock()
	r.done.Add(1)
	if err != nil {
		r.failed.Add(1)
	}
}

// add records into the shard; s.mu must be held. It reports whether err is
// the op's first failure in this shard.
func (s *recShard) add(op string, lat time.Duration, err error) (first bool) {
	o := s.ops[op]
	if o == nil {
		o = &opRec{hist: newHist()}
		s.ops[op] = o
	}
	if err != nil {
		o.failed++
		if o.firstErr == nil {
			o.firstErr = err
			return true
		}
		return false
	}
	_ = o.hist.RecordValue(min(lat.Microseconds(), histMaxMicros))
	return false
}

// OpStats summarizes one operation type of one phase.
type OpStats struct {
	Op       string  `json:"op"`
	Ops      int64   `json:"ops"` // successful
	Failed   int64   `json:"failed"`
	QPS      float64 `json:"qps"`
	MeanMs   float64 `json:"mean_ms"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	P999Ms   float64 `json:"p999_ms"`
	P9999Ms  float64 `json:"p9999_ms"`
	MaxMs    float64 `json:"max_ms"`
	FirstErr string  `json:"first_error,omitempty"`
}

// snapshot merges the shards: per-op stats sorted by op name, the TOTAL
// stats over every op, and the timeline. Call it once the workers are done.
func (r *recorder) snapshot(elapsed time.Duration) (ops []OpStats, total OpStats, timeline []TimelinePoint) {
	merged := map[string]*opRec{}
	var tl []tlBucket
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		for name, o := range s.ops {
			m := merged[name]
			if m == nil {
				m = &opRec{hist: newHist()}
				merged[name] = m
			}
			m.hist.Merge(o.hist)
			m.failed += o.failed
			if m.firstErr == nil {
				m.firstErr = o.firstErr
			}
		}
		for j, b := range s.timeline {
			if j >= len(tl) {
				tl = append(tl, make([]tlBucket, j+1-len(tl))...)
			}
			tl[j].ok += b.ok
			tl[j].failed += b.failed
		}
		s.mu.Unlock()
	}
	for _, name := range sortedKeys(merged) {
		if name != OpTotal {
			ops = append(ops, opStats(name, merged[name], elapsed))
		}
	}
	all := merged[OpTotal]
	if all == nil {
		all = &opRec{hist: newHist()}
	}
	total = opStats(OpTotal, all, elapsed)
	for i, b := range tl {
		timeline = append(timeline, TimelinePoint{TMs: int64(i) * r.step.Milliseconds(), OK: b.ok, Failed: b.failed})
	}
	return ops, total, timeline
}

// totalHist merges every shard's TOTAL histogram (successful YCSB
// operations). Call it once the workers are done.
func (r *recorder) totalHist() *hdrhistogram.Histogram {
	h := newHist()
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		if o := s.ops[OpTotal]; o != nil {
			h.Merge(o.hist)
		}
		s.mu.Unlock()
	}
	return h
}

func opStats(name string, o *opRec, elapsed time.Duration) OpStats {
	h := o.hist
	st := OpStats{Op: name, Ops: h.TotalCount(), Failed: o.failed}
	if secs := elapsed.Seconds(); secs > 0 {
		st.QPS = round(float64(st.Ops)/secs, 1)
	}
	if st.Ops > 0 {
		st.MeanMs = round(h.Mean()/1000, 3)
		st.P50Ms = microsToMs(h.ValueAtQuantile(50))
		st.P99Ms = microsToMs(h.ValueAtQuantile(99))
		st.P999Ms = microsToMs(h.ValueAtQuantile(99.9))
		st.P9999Ms = microsToMs(h.ValueAtQuantile(99.99))
		st.MaxMs = microsToMs(h.Max())
	}
	if o.firstErr != nil {
		st.FirstErr = o.firstErr.Error()
	}
	return st
}

func microsToMs(us int64) float64 { return round(float64(us)/1000, 3) }

// quantileMs is h's q-th percentile (h in µs) in ms, 0 for an empty h.
func quantileMs(h *hdrhistogram.Histogram, q float64) float64 {
	if h.TotalCount() == 0 {
		return 0
	}
	return microsToMs(h.ValueAtQuantile(q))
}

// recordLatency records d in h (µs), clamped to what h holds.
func recordLatency(h *hdrhistogram.Histogram, d time.Duration) {
	_ = h.RecordValue(min(max(d.Microseconds(), 1), histMaxMicros))
}

func round(v float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
