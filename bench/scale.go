package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/pingcap/go-ycsb/pkg/prop"
	"github.com/pingcap/go-ycsb/pkg/ycsb"
	bolt "go.etcd.io/bbolt"
	"gonum.org/v1/plot/plotter"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
)

// scale: what a real data set does to a store. Load N records through the
// go-ycsb binding into three `hedgekv server` processes (so that each
// store's RSS is its own), measuring throughput and latency per interval,
// the splits and every stall; then join a fourth store and remove one of
// the first three under a light read/write load; then restart a store
// holding all the data; and report each store's memory (anonymous and
// file-backed) and disk per logical byte.

// ScaleConfig configures RunScale.
type ScaleConfig struct {
	// Binary is the hedgekv binary whose `server` command runs the stores.
	Binary string
	// Quick: 20,000 records, 16 threads, 2s intervals, regions split at
	// 4 MiB, balancing every second: under a minute on 2 cores. Explicit
	// values below still win.
	Quick bool
	// Records to load (default 2,000,000; quick 20,000).
	Records int64
	// Threads of the load (default 64; quick 16).
	Threads int
	// ValueSize is each record's value in bytes (default 1000: go-ycsb's
	// 10 fields of 100 bytes); split into 10 fields (1 below 10 bytes).
	ValueSize int
	// Interval of the per-interval figures (default 10s; quick 2s).
	Interval time.Duration
	// StallThreshold: an operation slower than this is a stall (default
	// 100ms).
	StallThreshold time.Duration
	// MoveThreads and MoveRate make the light load during the join and
	// removal (default 4 threads, 200 ops/s all together; quick 2, 100):
	// YCSB workload A, half reads, half updates, of the loaded records.
	MoveThreads int
	MoveRate    float64
	// MoveTimeout bounds the join and the removal (default 30m; quick 2m).
	MoveTimeout time.Duration
	// RemovedGrace: once no region lists a replica on the removed store,
	// how long to wait for the stores to report it removed (default 1m;
	// quick 15s) before reporting that they do not and going on.
	RemovedGrace time.Duration
	// RestartTimeout bounds the restart until /readyz (default 10m; quick 1m).
	RestartTimeout time.Duration
	// SplitMaxBytes and SplitCheckInterval are the servers' (0: the
	// server's defaults, 64 MiB and 10s; quick 4 MiB and 1s).
	SplitMaxBytes      uint64
	SplitCheckInterval time.Duration
	// BalanceInterval is the servers' (0: the server's default, 5s; quick 1s).
	BalanceInterval time.Duration
	// OpTimeout is the client's per-operation timeout (default 10s).
	OpTimeout time.Duration
	// Dir holds the stores' data and logs ("" a temporary directory,
	// removed at the end).
	Dir     string
	OutDir  string // results root: writes OutDir/scale
	NoPlots bool
	Command string
	// Progress (normally stderr) shows a progress line; nil: none.
	Progress io.Writer
	Logger   *slog.Logger
	Out      io.Writer
}

func (cfg *ScaleConfig) setDefaults() error {
	if cfg.Binary == "" {
		return errors.New("no hedgekv binary given")
	}
	setDefault(&cfg.Records, quickOr[int64](cfg.Quick, 2_000_000, 20_000))
	setDefault(&cfg.Threads, quickOr(cfg.Quick, 64, 16))
	setDefault(&cfg.ValueSize, 1000)
	setDefault(&cfg.Interval, quickOr(cfg.Quick, 10*time.Second, 2*time.Second))
	setDefault(&cfg.StallThreshold, 100*time.Millisecond)
	setDefault(&cfg.MoveThreads, quickOr(cfg.Quick, 4, 2))
	setDefault(&cfg.MoveRate, quickOr(cfg.Quick, 200.0, 100.0))
	setDefault(&cfg.MoveTimeout, quickOr(cfg.Quick, 30*time.Minute, 2*time.Minute))
	setDefault(&cfg.RemovedGrace, quickOr(cfg.Quick, time.Minute, 15*time.Second))
	setDefault(&cfg.RestartTimeout, quickOr(cfg.Quick, 10*time.Minute, time.Minute))
	if cfg.Quick {
		setDefaultIfZero(&cfg.SplitMaxBytes, 4<<20)
		setDefaultIfZero(&cfg.SplitCheckInterval, time.Second)
		setDefaultIfZero(&cfg.BalanceInterval, time.Second)
	}
	setDefault(&cfg.OpTimeout, 10*time.Second)
	setOutputDefaults(&cfg.OutDir, &cfg.Logger, &cfg.Out)
	return nil
}

// fields is the go-ycsb field count and length giving ValueSize bytes.
func (cfg *ScaleConfig) fields() (count, length int) {
	if cfg.ValueSize < 10 {
		return 1, cfg.ValueSize
	}
	return 10, cfg.ValueSize / 10
}

// ---- per-interval measurement -------------------------------------------

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

// ---- what the scenario measured -------------------------------------------

// ScalePhase is one measured YCSB phase of scale.
type ScalePhase struct {
	Name      string          `json:"name"`
	Row       Row             `json:"row"`
	Ops       []OpStats       `json:"ops"`
	Intervals []ScaleInterval `json:"intervals"`
	Stalls    int64           `json:"stalls"`
	Worst     []ScaleStall    `json:"worst_stalls"`
	// FailedByOp counts every failed call by operation (the interval
	// recorder's count; the row's is the runner's, checked against
	// go-ycsb's own), FirstErrors the first error of each.
	FailedByOp  map[string]int64  `json:"failed_by_op,omitempty"`
	FirstErrors map[string]string `json:"first_errors,omitempty"`
	YCSBErrors  map[string]int64  `json:"ycsb_errors,omitempty"`
	Elapsed     float64           `json:"elapsed_s"`
	Err         string            `json:"error,omitempty"`
}

// StoreMem is a store process's memory (/proc/PID/status), in bytes.
type StoreMem struct {
	Store uint64 `json:"store"`
	When  string `json:"when"`
	PID   int    `json:"pid"`
	RSS   int64  `json:"rss"`
	Anon  int64  `json:"rss_anon"`
	File  int64  `json:"rss_file"`
	Shmem int64  `json:"rss_shmem"`
	Err   string `json:"error,omitempty"`
}

// StoreDisk is a store's store.db.
type StoreDisk struct {
	Store uint64 `json:"store"`
	When  string `json:"when"`
	Bytes int64  `json:"bytes"`
	// PerLogical is Bytes over the logical bytes loaded (keys and values):
	// every store holds a replica of every region.
	PerLogical float64 `json:"per_logical_byte"`
}

// BucketStat is one top-level bbolt bucket of a stopped store's store.db.
type BucketStat struct {
	Name  string `json:"name"`
	Keys  int    `json:"keys"`
	Bytes int64  `json:"bytes_in_use"`
}

// ScaleMove is the join of a store and the removal of another.
type ScaleMove struct {
	Joined     uint64  `json:"joined"`
	Removed    uint64  `json:"removed"`
	JoinReadyS float64 `json:"join_ready_s"` // join until the new store's /readyz
	RemoveS    float64 `json:"remove_s"`     // RemoveStore until the store is reported removed
	MovedS     float64 `json:"moved_s"`      // RemoveStore until no region lists a replica on it
	TotalS     float64 `json:"total_s"`      // join until removed (until moved if never reported removed)
	Done       bool    `json:"done"`
	// MovedLogicalBytes are the logical bytes of the regions with a
	// replica on the joined store at the end; MovedFileBytes its store.db.
	MovedLogicalBytes int64          `json:"moved_logical_bytes"`
	MovedFileBytes    int64          `json:"moved_file_bytes"`
	MBPerS            float64        `json:"mb_per_s"`
	LeftTimeline      []ReplicasLeft `json:"replicas_left"`
	Err               string         `json:"error,omitempty"`
}

// ReplicasLeft: the regions with a replica on the removed store, at T
// seconds since the scenario started.
type ReplicasLeft struct {
	T    float64 `json:"t_s"`
	Left int     `json:"replicas_left"`
}

// ScaleRestart is a store stopped and started again with all its data.
type ScaleRestart struct {
	Store    uint64       `json:"store"`
	StopS    float64      `json:"stop_s"`    // SIGTERM until exited
	ReadyS   float64      `json:"ready_s"`   // start until /readyz answers 200
	SettledS float64      `json:"settled_s"` // start until every store agrees on every leader and has applied
	Buckets  []BucketStat `json:"buckets,omitempty"`
	Err      string       `json:"error,omitempty"`
}

// ScaleResult is what RunScale measured (details.json).
type ScaleResult struct {
	Records          int64        `json:"records"`
	LogicalBytes     int64        `json:"logical_bytes"`
	ValueSize        int          `json:"value_size"`
	RegionsBefore    int          `json:"regions_before"`
	RegionsAfterLoad int          `json:"regions_after_load"`
	RegionsEnd       int          `json:"regions_end"`
	ApproxBytesEnd   int64        `json:"approx_bytes_end"` // the leaders' own counts at the end
	SizeKnownEnd     int          `json:"size_known_end"`   // regions whose size the leader had counted
	Load             *ScalePhase  `json:"load"`
	Move             *ScalePhase  `json:"move"`
	MoveInfo         ScaleMove    `json:"move_info"`
	Restart          ScaleRestart `json:"restart"`
	Mem              []StoreMem   `json:"memory"`
	Disk             []StoreDisk  `json:"disk"`
	Rows             []Row        `json:"rows"`
	Dir              string       `json:"-"`
	// PIDs are every server process the scenario started.
	PIDs    []int    `json:"-"`
	Plots   []string `json:"plots"`
	Errors  []string `json:"errors"`
	started time.Time
}

// ---- the scenario ---------------------------------------------------------

// RunScale runs the scale scenario and writes OutDir/scale.
func RunScale(ctx context.Context, cfg ScaleConfig) (*ScaleResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("scale: %w", err)
	}
	res := &ScaleResult{Records: cfg.Records, ValueSize: cfg.ValueSize, started: time.Now(), Dir: filepath.Join(cfg.OutDir, "scale")}
	prog := newProgress(cfg.Progress, "scale", 3)
	defer prog.Done()

	var extra []string
	if cfg.SplitMaxBytes > 0 {
		extra = append(extra, "--split-max-bytes="+strconv.FormatUint(cfg.SplitMaxBytes, 10))
	}
	if cfg.SplitCheckInterval != 0 {
		extra = append(extra, "--split-check-interval="+cfg.SplitCheckInterval.String())
	}
	if cfg.Dir != "" {
		// --dir names where the stores go; it need not exist yet.
		if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("scale: %w", err)
		}
	}
	prog.Printf("scale: starting three `%s server` processes", cfg.Binary)
	c, err := cluster.StartProcesses(ctx, cluster.ProcessesConfig{
		Binary: cfg.Binary, Dir: cfg.Dir, BalanceInterval: cfg.BalanceInterval, ExtraArgs: extra,
		ReadyTimeout: time.Minute, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("scale: %w", err)
	}
	defer func() {
		c.Stop()
		res.PIDs = c.PIDs()
	}()

	admin, err := client.New(ctx, client.Config{Endpoints: c.Endpoints, RequestTimeout: 10 * time.Second, Logger: quietClientLogger(cfg.Logger)})
	if err != nil {
		return nil, fmt.Errorf("scale: admin client: %w", err)
	}
	defer admin.Close()
	res.RegionsBefore, _, _, _ = regionCount(ctx, admin)

	st := &scaleState{cfg: cfg, c: c, admin: admin, res: res, prog: prog}
	err = st.load(ctx)
	if err == nil {
		// Each step runs unless the scenario was interrupted.
		for _, step := range []func(context.Context){st.afterLoad, st.move, st.restart, st.final} {
			if ctx.Err() != nil {
				err = fmt.Errorf("interrupted: %w", context.Cause(ctx))
				break
			}
			step(ctx)
		}
	}
	if werr := st.write(); werr != nil {
		err = errors.Join(err, werr)
	}
	if err != nil {
		return res, fmt.Errorf("scale: %w", err)
	}
	return res, nil
}

// quietClientLogger keeps the client's own retries out of the progress
// line (warnings and above only).
func quietClientLogger(l *slog.Logger) *slog.Logger {
	return slog.New(levelFilter{h: l.Handler(), min: slog.LevelWarn})
}

type levelFilter struct {
	h   slog.Handler
	min slog.Level
}

func (f levelFilter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= f.min && f.h.Enabled(ctx, l)
}
func (f levelFilter) Handle(ctx context.Context, r slog.Record) error { return f.h.Handle(ctx, r) }
func (f levelFilter) WithAttrs(a []slog.Attr) slog.Handler {
	return levelFilter{h: f.h.WithAttrs(a), min: f.min}
}
func (f levelFilter) WithGroup(n string) slog.Handler {
	return levelFilter{h: f.h.WithGroup(n), min: f.min}
}

type scaleState struct {
	cfg   ScaleConfig
	c     *cluster.Processes
	admin *client.Client
	res   *ScaleResult
	prog  *Progress
	db    *scaleDB
	own   *ycsbdb.DB
	// regionSamples: (seconds since start, regions) taken every interval.
	regionMu      sync.Mutex
	regionSamples []plotter.XY
}

func (st *scaleState) errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	st.res.Errors = append(st.res.Errors, msg)
	st.prog.Printf("scale: %s", msg)
	st.cfg.Logger.Warn("scale: " + msg)
}

// spec is the YCSB spec of both phases.
func (st *scaleState) spec(variant string) Spec {
	fc, fl := st.cfg.fields()
	return Spec{
		Instance: st.db, Workload: "a", Records: st.cfg.Records, Variant: variant,
		Properties: map[string]string{
			prop.FieldCount:  strconv.Itoa(fc),
			prop.FieldLength: strconv.Itoa(fl),
		},
		ProgressInterval: -1, QuietWorkload: true, Logger: st.cfg.Logger,
		// A failing cluster is reported, not abandoned, unless nothing
		// succeeds at all.
		AbortAfterFailures: 0,
	}
}

// sampleRegions counts the regions every interval until stop is closed.
func (st *scaleState) sampleRegions(ctx context.Context, stop <-chan struct{}, wg *sync.WaitGroup) {
	wg.Go(func() {
		t := time.NewTicker(st.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case now := <-t.C:
				if n, _, _, err := regionCount(ctx, st.admin); err == nil {
					st.regionMu.Lock()
					st.regionSamples = append(st.regionSamples, plotter.XY{X: now.Sub(st.res.started).Seconds(), Y: float64(n)})
					st.regionMu.Unlock()
				}
			}
		}
	})
}

func (st *scaleState) load(ctx context.Context) error {
	cfg := st.cfg
	own, err := ycsbdb.Open(ctx, ycsbdb.Options{Endpoints: st.c.Endpoints, RequestTimeout: cfg.OpTimeout, DialTimeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("open the ycsb binding: %w", err)
	}
	st.own = own
	st.db = &scaleDB{inner: own}
	rec := newIntervalRec(st.res.started, cfg.Interval, cfg.StallThreshold)
	st.db.rec.Store(rec)

	label := fmt.Sprintf("load %d records", cfg.Records)
	st.prog.Step(label, cfg.Records, 0)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	st.sampleRegions(ctx, stop, &wg)
	// A progress line of its own every interval: records/s over the
	// interval, % done, ETA at that rate.
	var done, failed atomic.Int64
	wg.Go(func() {
		t := time.NewTicker(cfg.Interval)
		defer t.Stop()
		last, lastT := int64(0), time.Now()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				d := done.Load()
				rate := float64(d-last) / now.Sub(lastT).Seconds()
				last, lastT = d, now
				eta := "?"
				if rate > 0 {
					eta = (time.Duration(float64(cfg.Records-d)/rate) * time.Second).Round(time.Second).String()
				}
				st.prog.Printf("scale: load %5.1f%% %d/%d records, %.0f records/s, %d failed, ETA %s",
					100*float64(d)/float64(cfg.Records), d, cfg.Records, rate, failed.Load(), eta)
			}
		}
	})
	spec := st.spec("load")
	spec.Load, spec.Threads, spec.Param = true, cfg.Threads, fmt.Sprintf("%d x %d B", cfg.Records, cfg.ValueSize)
	spec.TimelineStep = cfg.Interval
	spec.OnProgress = func(d, f int64) {
		done.Store(d)
		failed.Store(f)
		st.prog.Update(d, f)
	}
	begin := time.Now()
	r, err := Run(ctx, spec)
	end := time.Now()
	close(stop)
	wg.Wait()
	st.res.LogicalBytes = rec.logicalBytes.Load()
	if r != nil && r.Load != nil {
		st.res.Load = st.phase("load", r.Load, rec, end, begin)
		st.prog.Printf("scale: loaded %d records in %v (%.0f/s), %d failed, %d stalls over %v",
			r.Load.Row.Ops-r.Load.Row.Failed, r.Load.Elapsed.Round(time.Second), r.Load.Row.QPS, r.Load.Row.Failed, rec.stalls, cfg.StallThreshold)
	}
	if err != nil {
		if st.res.Load != nil {
			st.res.Load.Err = err.Error()
		}
		return fmt.Errorf("load: %w", err)
	}
	return nil
}

func (st *scaleState) phase(name string, pr *PhaseResult, rec *intervalRec, end, begin time.Time) *ScalePhase {
	p := &ScalePhase{
		Name: name, Row: pr.Row, Ops: pr.Ops, Intervals: rec.intervals(end), YCSBErrors: pr.YCSBErrors,
		Elapsed: round(end.Sub(begin).Seconds(), 3),
	}
	p.Row.Timeline = nil // the intervals say more
	rec.mu.Lock()
	p.Stalls, p.Worst = rec.stalls, slices.Clone(rec.worst)
	if len(rec.failed) > 0 {
		p.FailedByOp, p.FirstErrors = maps.Clone(rec.failed), maps.Clone(rec.firstErr)
	}
	rec.mu.Unlock()
	st.regionMu.Lock()
	for i := range p.Intervals {
		endT := p.Intervals[i].T + st.cfg.Interval.Seconds()
		for _, s := range st.regionSamples {
			if s.X <= endT+0.5 && s.X > p.Intervals[i].T {
				p.Intervals[i].Regions = int(s.Y)
			}
		}
	}
	st.regionMu.Unlock()
	return p
}

// afterLoad: splits, memory and disk of the three stores.
func (st *scaleState) afterLoad(ctx context.Context) {
	n, _, _, err := regionCount(ctx, st.admin)
	if err != nil {
		st.errorf("count regions after the load: %v", err)
	}
	st.res.RegionsAfterLoad = n
	st.memAndDisk("after load")
}

func (st *scaleState) memAndDisk(when string) {
	for _, id := range st.c.StoreIDs() {
		if !st.c.Running(id) {
			continue
		}
		m := readStoreMem(st.c.PID(id))
		m.Store, m.When = id, when
		st.res.Mem = append(st.res.Mem, m)
		st.disk(id, when)
	}
}

func (st *scaleState) disk(id uint64, when string) {
	fi, err := os.Stat(filepath.Join(st.c.DataDir(id), "store.db"))
	if err != nil {
		st.errorf("store %d: %v", id, err)
		return
	}
	d := StoreDisk{Store: id, When: when, Bytes: fi.Size()}
	if st.res.LogicalBytes > 0 {
		d.PerLogical = round(float64(fi.Size())/float64(st.res.LogicalBytes), 2)
	}
	st.res.Disk = append(st.res.Disk, d)
}

// move joins store 4 and removes store 1 under a light load.
func (st *scaleState) move(ctx context.Context) {
	cfg := st.cfg
	mv := &st.res.MoveInfo
	ids := st.c.StoreIDs()
	mv.Joined, mv.Removed = slices.Max(ids)+1, ids[0]
	st.prog.Step(fmt.Sprintf("join store %d, remove store %d", mv.Joined, mv.Removed), 0, cfg.MoveTimeout)

	rec := newIntervalRec(st.res.started, cfg.Interval, cfg.StallThreshold)
	st.db.rec.Store(rec)
	stopLoad := make(chan struct{})
	stopSample := make(chan struct{})
	var wg sync.WaitGroup
	st.sampleRegions(ctx, stopSample, &wg)
	spec := st.spec("move")
	spec.Run, spec.Ops, spec.Threads = true, 1<<40, cfg.MoveThreads
	spec.Param = fmt.Sprintf("join %d, remove %d; workload a, %g ops/s", mv.Joined, mv.Removed, cfg.MoveRate)
	spec.Properties[prop.Target] = strconv.FormatFloat(cfg.MoveRate, 'f', -1, 64)
	spec.Stop = stopLoad
	spec.OnProgress = st.prog.Update
	var (
		loadRes *Result
		loadErr error
	)
	begin := time.Now()
	wg.Go(func() { loadRes, loadErr = Run(ctx, spec) })

	mctx, cancel := context.WithTimeout(ctx, cfg.MoveTimeout)
	defer cancel()
	// Some load before the move, to see the difference.
	sleepCtx(mctx, min(cfg.Interval, 5*time.Second))
	err := st.doMove(mctx, mv)
	if err != nil {
		mv.Err = err.Error()
		st.errorf("move: %v", err)
	}
	// And some after.
	sleepCtx(ctx, min(cfg.Interval, 5*time.Second))
	close(stopLoad)
	close(stopSample)
	wg.Wait()
	end := time.Now()
	if loadRes != nil && loadRes.Run != nil {
		st.res.Move = st.phase("move", loadRes.Run, rec, end, begin)
	}
	if loadErr != nil {
		st.errorf("light load during the move: %v", loadErr)
		if st.res.Move != nil {
			st.res.Move.Err = loadErr.Error()
		}
	}
	st.memAndDisk("after move")
}

func (st *scaleState) doMove(ctx context.Context, mv *ScaleMove) error {
	c := st.c
	t0 := time.Now()
	st.prog.Printf("scale: joining store %d", mv.Joined)
	if err := c.Join(mv.Joined, "dc-d"); err != nil {
		return err
	}
	if err := waitReadyz(ctx, c.StatusAddr(mv.Joined)); err != nil {
		return fmt.Errorf("store %d joined but not ready: %w", mv.Joined, err)
	}
	mv.JoinReadyS = round(time.Since(t0).Seconds(), 3)
	st.prog.Printf("scale: store %d ready after %.1fs; removing store %d", mv.Joined, mv.JoinReadyS, mv.Removed)
	t1 := time.Now()
	if _, err := st.admin.RemoveStore(ctx, mv.Removed); err != nil {
		return fmt.Errorf("remove store %d: %w", mv.Removed, err)
	}
	last := -1
	var movedAt time.Time
	var stuck error
	for {
		left, removed, err := st.storeLeft(ctx, mv.Removed)
		if err == nil {
			if left != last {
				mv.LeftTimeline = append(mv.LeftTimeline, ReplicasLeft{round(time.Since(st.res.started).Seconds(), 1), left})
				st.prog.Printf("scale: store %d: replicas left: %d", mv.Removed, left)
				last = left
			}
			if left == 0 && movedAt.IsZero() {
				movedAt = time.Now()
				mv.MovedS = round(movedAt.Sub(t1).Seconds(), 3)
			}
			if left == 0 && removed {
				break
			}
			if left == 0 && time.Since(movedAt) > st.cfg.RemovedGrace {
				// No region lists a replica on the store, but the stores do
				// not report it removed: say what it still holds.
				stuck = fmt.Errorf("store %d: no region lists a replica on it since %.1fs after RemoveStore, but %s later the stores still do not report it removed (ctl remove-store --wait would wait on); it still reports %s",
					mv.Removed, mv.MovedS, st.cfg.RemovedGrace, st.ownRegions(ctx, mv.Removed))
				break
			}
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return fmt.Errorf("store %d not removed (replicas left: %d): %w", mv.Removed, last, ctx.Err())
		}
	}
	now := time.Now()
	mv.RemoveS, mv.TotalS, mv.Done = round(now.Sub(t1).Seconds(), 3), round(now.Sub(t0).Seconds(), 3), stuck == nil
	if stuck != nil {
		mv.RemoveS, mv.TotalS = 0, round(movedAt.Sub(t0).Seconds(), 3)
		mv.Err = stuck.Error()
		st.errorf("move: %v", stuck)
	}
	regions, err := st.admin.Regions(ctx)
	if err == nil {
		var known, on int
		for _, r := range regions {
			if _, ok := r.Region.PeerOnStore(mv.Joined); ok {
				on++
				if r.SizeKnown {
					known++
					mv.MovedLogicalBytes += int64(r.ApproximateBytes)
				}
			}
		}
		if known < on && len(regions) > 0 {
			// Some sizes not counted yet: the loaded bytes in proportion.
			mv.MovedLogicalBytes = st.res.LogicalBytes * int64(on) / int64(len(regions))
		}
	}
	if fi, err := os.Stat(filepath.Join(c.DataDir(mv.Joined), "store.db")); err == nil {
		mv.MovedFileBytes = fi.Size()
	}
	if mv.TotalS > 0 {
		mv.MBPerS = round(float64(mv.MovedLogicalBytes)/1e6/mv.TotalS, 2)
	}
	st.prog.Printf("scale: store %d's replicas moved %.1fs after the join (%.1f MB/s; reported removed: %t); stopping it", mv.Removed, mv.TotalS, mv.MBPerS, mv.Done)
	if err := c.StopStore(mv.Removed, 10*time.Second); err != nil {
		return err
	}
	return c.Forget(mv.Removed)
}

// ownRegions describes the regions a store says it hosts (its /status).
func (st *scaleState) ownRegions(ctx context.Context, store uint64) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+st.c.StatusAddr(store)+"/status", nil)
	if err != nil {
		return "(its /status: " + err.Error() + ")"
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "(its /status: " + err.Error() + ")"
	}
	defer resp.Body.Close()
	var status struct {
		Regions []struct {
			Region struct {
				ID    string `json:"id"`
				Epoch struct {
					ConfVer string `json:"conf_ver"`
				} `json:"epoch"`
				Peers []struct {
					StoreID string `json:"store_id"`
				} `json:"peers"`
			} `json:"region"`
			LeaderStoreID string `json:"leader_store_id"`
		} `json:"regions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&status); err != nil {
		return "(its /status: " + err.Error() + ")"
	}
	var parts []string
	for _, r := range status.Regions {
		var stores []string
		for _, p := range r.Region.Peers {
			stores = append(stores, p.StoreID)
		}
		parts = append(parts, fmt.Sprintf("region %s (conf_ver %s, peers on stores %s, leader %s)", r.Region.ID, r.Region.Epoch.ConfVer, strings.Join(stores, ","), r.LeaderStoreID))
	}
	return fmt.Sprintf("%d regions in its /status: %s", len(parts), strings.Join(parts, "; "))
}

// storeLeft counts the regions with a replica on store, and whether the
// stores report it removed.
func (st *scaleState) storeLeft(ctx context.Context, store uint64) (int, bool, error) {
	regions, err := st.admin.Regions(ctx)
	if err != nil {
		return 0, false, err
	}
	left := 0
	for _, r := range regions {
		if _, ok := r.Region.PeerOnStore(store); ok {
			left++
		}
	}
	if left > 0 {
		return left, false, nil
	}
	stores, err := st.admin.Stores(ctx)
	if err != nil {
		return 0, false, err
	}
	i := slices.IndexFunc(stores, func(s client.StoreInfo) bool { return s.ID == store })
	return 0, i >= 0 && stores[i].Removed, nil
}

// restart stops a store holding every region and starts it again.
func (st *scaleState) restart(ctx context.Context) {
	cfg := st.cfg
	c := st.c
	ids := c.StoreIDs()
	rs := &st.res.Restart
	rs.Store = ids[0]
	st.prog.Step(fmt.Sprintf("restart store %d", rs.Store), 0, cfg.RestartTimeout)
	m := readStoreMem(c.PID(rs.Store))
	m.Store, m.When = rs.Store, "before restart"
	st.res.Mem = append(st.res.Mem, m)
	t0 := time.Now()
	if err := c.StopStore(rs.Store, 30*time.Second); err != nil {
		rs.Err = err.Error()
		st.errorf("stop store %d: %v", rs.Store, err)
		return
	}
	rs.StopS = round(time.Since(t0).Seconds(), 3)
	var err error
	if rs.Buckets, err = boltBuckets(filepath.Join(c.DataDir(rs.Store), "store.db")); err != nil {
		st.errorf("read store %d's store.db while it is stopped: %v", rs.Store, err)
	}
	st.prog.Printf("scale: store %d stopped in %.1fs; starting it again", rs.Store, rs.StopS)
	rctx, cancel := context.WithTimeout(ctx, cfg.RestartTimeout)
	defer cancel()
	t1 := time.Now()
	var wg sync.WaitGroup
	var settleErr error
	wg.Go(func() {
		settleErr = c.Restart(rctx, rs.Store)
		if settleErr == nil {
			rs.SettledS = round(time.Since(t1).Seconds(), 3)
		}
	})
	if err := waitReadyz(rctx, c.StatusAddr(rs.Store)); err != nil {
		rs.Err = err.Error()
		st.errorf("restart store %d: %v", rs.Store, err)
	} else {
		rs.ReadyS = round(time.Since(t1).Seconds(), 3)
		st.prog.Printf("scale: store %d ready %.2fs after its start", rs.Store, rs.ReadyS)
	}
	wg.Wait()
	if settleErr != nil {
		st.errorf("restart store %d: %v", rs.Store, settleErr)
	}
	st.memAndDisk("after restart")
}

func (st *scaleState) final(ctx context.Context) {
	regions, err := st.admin.Regions(ctx)
	if err != nil {
		st.errorf("count regions at the end: %v", err)
		return
	}
	st.res.RegionsEnd = len(regions)
	for _, r := range regions {
		if r.SizeKnown {
			st.res.SizeKnownEnd++
			st.res.ApproxBytesEnd += int64(r.ApproximateBytes)
		}
	}
}

// ---- helpers ----------------------------------------------------------------

// regionCount counts the cluster's regions, those whose size the leader
// has counted, and the bytes they hold.
func regionCount(ctx context.Context, cli *client.Client) (n, known int, bytes int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	regions, err := cli.Regions(ctx)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("regions: %w", err)
	}
	for _, r := range regions {
		if r.SizeKnown {
			known++
			bytes += int64(r.ApproximateBytes)
		}
	}
	return len(regions), known, bytes, nil
}

// sleepCtx sleeps d, or less if ctx ends (then false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitReadyz polls http://addr/readyz until it answers 200.
func waitReadyz(ctx context.Context, addr string) error {
	hc := &http.Client{Timeout: time.Second}
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("readyz: %w", err)
		}
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		if !sleepCtx(ctx, 20*time.Millisecond) {
			return fmt.Errorf("%s/readyz never answered 200 (last: %s): %w", addr, last, ctx.Err())
		}
	}
}

// readStoreMem reads a process's resident memory from /proc/PID/status
// (Linux): RssAnon (heap, stacks), RssFile (mapped files: bbolt's mmap of
// store.db, the binary), RssShmem.
func readStoreMem(pid int) StoreMem {
	m := StoreMem{PID: pid}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		m.Err = err.Error()
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) != 2 || fs[1] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(fs[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			m.RSS = n << 10
		case "RssAnon":
			m.Anon = n << 10
		case "RssFile":
			m.File = n << 10
		case "RssShmem":
			m.Shmem = n << 10
		}
	}
	if err := sc.Err(); err != nil {
		m.Err = err.Error()
	}
	return m
}

// boltBuckets opens a stopped store's store.db read-only and sizes each
// top-level bucket (keys, and bytes of the pages in use).
func boltBuckets(path string) ([]BucketStat, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	var out []BucketStat
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			s := b.Stats()
			out = append(out, BucketStat{Name: string(name), Keys: s.KeyN, Bytes: int64(s.BranchInuse + s.LeafInuse)})
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}

// ---- report -----------------------------------------------------------------

func (st *scaleState) write() error {
	res, cfg := st.res, st.cfg
	if st.own != nil {
		_ = st.own.Close()
	}
	if res.Load != nil {
		res.Rows = append(res.Rows, res.Load.Row)
	}
	if res.Move != nil {
		res.Rows = append(res.Rows, res.Move.Row)
	}
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	if !cfg.NoPlots {
		var ps plotSet
		ps.add(st.throughputPlot())
		ps.add(st.latencyPlot())
		res.Plots = ps.files
		for _, e := range ps.errs {
			res.Errors = append(res.Errors, "plot: "+e.Error())
		}
	}
	details, err := json.MarshalIndent(res, "", "  ")
	if err == nil {
		err = writeFileAtomic(filepath.Join(res.Dir, "details.json"), append(details, '\n'))
	}
	report := st.report()
	if werr := WriteResults(res.Dir, Results{Scenario: "scale", Rows: res.Rows}, report); werr != nil {
		return errors.Join(err, werr)
	}
	fmt.Fprint(cfg.Out, st.summary())
	printWritten(cfg.Out, res.Dir, res.Plots)
	return err
}

func mb(b int64) string { return FormatFloat(float64(b)/1e6, 1) + " MB" }

func (st *scaleState) summary() string {
	res := st.res
	var b strings.Builder
	b.WriteString("\nscale\n")
	b.WriteString(RowsTable(res.Rows))
	fmt.Fprintf(&b, "regions: %d before, %d after the load, %d at the end\n", res.RegionsBefore, res.RegionsAfterLoad, res.RegionsEnd)
	mv := res.MoveInfo
	fmt.Fprintf(&b, "move: store %d ready %.1fs after its join; store %d's replicas moved %.1fs after RemoveStore, reported removed: %t (%.1fs in all, %.2f MB/s)\n",
		mv.Joined, mv.JoinReadyS, mv.Removed, mv.MovedS, mv.Done, mv.TotalS, mv.MBPerS)
	fmt.Fprintf(&b, "restart: store %d ready %.2fs after its start\n", res.Restart.Store, res.Restart.ReadyS)
	for _, e := range res.Errors {
		fmt.Fprintf(&b, "ERROR: %s\n", e)
	}
	return b.String()
}

func (st *scaleState) report() string {
	res, cfg := st.res, st.cfg
	var b strings.Builder
	writeReportHeader(&b, "scale: a real data set", res.started, cfg.Command)
	fc, fl := cfg.fields()
	fmt.Fprintf(&b, "Three `hedgekv server` processes (%s), loaded with %d records of %d bytes (go-ycsb, %d fields of %d bytes, hashed keys) by %d threads through the hedgekv go-ycsb binding; intervals of %v; an operation over %v is a stall. ",
		filepath.Base(cfg.Binary), cfg.Records, cfg.ValueSize, fc, fl, cfg.Threads, cfg.Interval, cfg.StallThreshold)
	fmt.Fprintf(&b, "Servers: split at %s, split check every %s, balance every %s. Logical data: %s (keys and encoded values of the inserts that succeeded).\n",
		orDefault(cfg.SplitMaxBytes > 0, mb(int64(cfg.SplitMaxBytes)), "64 MiB (default)"),
		orDefault(cfg.SplitCheckInterval != 0, cfg.SplitCheckInterval.String(), "10s (default)"),
		orDefault(cfg.BalanceInterval != 0, cfg.BalanceInterval.String(), "5s (default)"), mb(res.LogicalBytes))
	if cfg.Quick {
		b.WriteString("\n**--quick run**: a small data set with small regions, to check the scenario end to end; its figures say little about a store at scale.\n")
	}

	b.WriteString("\n## Summary\n\n")
	b.WriteString(RowsTable(res.Rows))
	b.WriteString("\n`failed` counts every operation that returned an error (go-ycsb's `*_ERROR` lines); latencies are of the successful ones.\n")
	if len(res.Errors) > 0 {
		b.WriteString("\n## Errors\n\n")
		for _, e := range res.Errors {
			fmt.Fprintf(&b, "- %s\n", inlineCode(e))
		}
	}

	b.WriteString("\n## Load\n\n")
	st.writePhase(&b, res.Load)
	fmt.Fprintf(&b, "\n### Splits\n\nRegions: **%d** before the load, **%d** right after it (%d splits), %d at the end of the scenario.\n",
		res.RegionsBefore, res.RegionsAfterLoad, res.RegionsAfterLoad-res.RegionsBefore, res.RegionsEnd)

	b.WriteString("\n## Join and remove under load\n\n")
	mv := res.MoveInfo
	fmt.Fprintf(&b, "Store %d joined (`server --join`); once its `/readyz` answered, store %d was removed (`Admin.RemoveStore`, what `ctl remove-store` sends) and the stores' balancers moved its replicas; done when no region had a replica on it and the stores reported it removed (`ctl remove-store --wait`). Meanwhile %d threads ran YCSB workload A (half reads, half updates) at %g ops/s.\n\n",
		mv.Joined, mv.Removed, cfg.MoveThreads, cfg.MoveRate)
	rows := [][]string{
		{"join until ready", fmt.Sprintf("%.1f s", mv.JoinReadyS)},
		{"remove until no region lists a replica on the store", fmt.Sprintf("%.1f s", mv.MovedS)},
		{"remove until the stores report it removed", orDefault(mv.Done, fmt.Sprintf("%.1f s", mv.RemoveS), "**never** (see Errors)")},
		{"join until removed (until moved if never reported removed)", fmt.Sprintf("%.1f s", mv.TotalS)},
		{"reported removed", strconv.FormatBool(mv.Done)},
		{"logical bytes on the new store", mb(mv.MovedLogicalBytes)},
		{"its store.db", mb(mv.MovedFileBytes)},
		{"MB/s (logical, join until removed)", FormatFloat(mv.MBPerS, 2)},
	}
	if res.Move != nil {
		rows = append(rows,
			[]string{"foreground p99 during the move", fmt.Sprintf("%.2f ms", res.Move.Row.P99Ms)},
			[]string{"foreground failed", strconv.FormatInt(res.Move.Row.Failed, 10)})
	}
	if mv.Err != "" {
		rows = append(rows, []string{"error", inlineCode(mv.Err)})
	}
	b.WriteString(MarkdownTable([]string{"what", "measured"}, rows))
	if len(mv.LeftTimeline) > 0 {
		b.WriteString("\nReplicas left on the removed store: ")
		var parts []string
		for _, p := range mv.LeftTimeline {
			parts = append(parts, fmt.Sprintf("%d at %.1fs", p.Left, p.T))
		}
		b.WriteString(strings.Join(parts, ", ") + ".\n")
	}
	b.WriteString("\n### The foreground load during the move\n\n")
	st.writePhase(&b, res.Move)

	b.WriteString("\n## Restart with all the data\n\n")
	rs := res.Restart
	fmt.Fprintf(&b, "Store %d (a replica of every region) stopped with SIGTERM (%.2f s to exit), then started again with the same flags and data: **%.2f s** until its `/readyz` answered 200; %.2f s until every store agreed on every region's leader and had applied its commit index.\n",
		rs.Store, rs.StopS, rs.ReadyS, rs.SettledS)
	if rs.Err != "" {
		fmt.Fprintf(&b, "\nError: %s\n", inlineCode(rs.Err))
	}

	b.WriteString("\n## Memory\n\n")
	var mrows [][]string
	for _, m := range res.Mem {
		if m.Err != "" {
			mrows = append(mrows, []string{strconv.FormatUint(m.Store, 10), m.When, "n/a", "", "", inlineCode(m.Err)})
			continue
		}
		mrows = append(mrows, []string{strconv.FormatUint(m.Store, 10), m.When, mb(m.RSS), mb(m.Anon), mb(m.File), mb(m.Shmem)})
	}
	b.WriteString(MarkdownTable([]string{"store", "when", "RSS", "anonymous (RssAnon)", "file-backed (RssFile)", "shmem"}, mrows))
	b.WriteString("\nFrom `/proc/PID/status`. Anonymous is the Go heap and stacks; file-backed is mostly bbolt's mmap of `store.db` (pages the kernel may drop and read again) and the binary.\n")

	b.WriteString("\n## Disk\n\n")
	var drows [][]string
	for _, d := range res.Disk {
		drows = append(drows, []string{strconv.FormatUint(d.Store, 10), d.When, mb(d.Bytes), FormatFloat(d.PerLogical, 2)})
	}
	b.WriteString(MarkdownTable([]string{"store", "when", "store.db", "bytes per logical byte"}, drows))
	fmt.Fprintf(&b, "\nLogical bytes: %s loaded (keys and encoded values); the leaders' own counts at the end: %s over %d of %d regions. Every store holds a replica of every region, so a store's file over the logical bytes is its space amplification (bbolt's free pages, the raft log, the dedup table, page fill).\n",
		mb(res.LogicalBytes), mb(res.ApproxBytesEnd), res.SizeKnownEnd, res.RegionsEnd)

	b.WriteString("\n### Raft log after compaction\n\n")
	b.WriteString("The status endpoint (`/status`, `/metrics`) does not expose the raft log's size. It was read from the stopped store's `store.db` (bbolt, read-only) before the restart, bucket by bucket:\n\n")
	var brows [][]string
	for _, bk := range rs.Buckets {
		brows = append(brows, []string{bk.Name, strconv.Itoa(bk.Keys), mb(bk.Bytes)})
	}
	if len(brows) == 0 {
		b.WriteString("(not read: see Errors)\n")
	} else {
		b.WriteString(MarkdownTable([]string{"bucket", "keys", "bytes in use"}, brows))
	}

	writePlots(&b, res.Plots)
	return b.String()
}

func orDefault(set bool, v, def string) string {
	if set {
		return v
	}
	return def
}

func (st *scaleState) writePhase(b *strings.Builder, p *ScalePhase) {
	if p == nil {
		b.WriteString("(did not run)\n")
		return
	}
	fmt.Fprintf(b, "%.1f s; %d operations, %d failed, %.1f ops/s; p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms.\n\n",
		p.Elapsed, p.Row.Ops, p.Row.Failed, p.Row.QPS, p.Row.P50Ms, p.Row.P99Ms, p.Row.P999Ms)
	b.WriteString(OpsTable(p.Ops))
	if len(p.YCSBErrors) > 0 {
		var parts []string
		for _, k := range sortedKeys(p.YCSBErrors) {
			parts = append(parts, fmt.Sprintf("%s_ERROR %d", k, p.YCSBErrors[k]))
		}
		fmt.Fprintf(b, "\ngo-ycsb's own error counts: %s.\n", strings.Join(parts, ", "))
	}
	for _, k := range sortedKeys(p.FirstErrors) {
		fmt.Fprintf(b, "\nFirst %s error: %s\n", k, inlineCode(p.FirstErrors[k]))
	}
	fmt.Fprintf(b, "\n#### Per interval (%v)\n\n", st.cfg.Interval)
	var rows [][]string
	for _, iv := range p.Intervals {
		reg := ""
		if iv.Regions > 0 {
			reg = strconv.Itoa(iv.Regions)
		}
		rows = append(rows, []string{FormatFloat(iv.T, 0), strconv.FormatInt(iv.OK, 10), strconv.FormatInt(iv.Failed, 10), FormatFloat(iv.QPS, 0),
			FormatFloat(iv.P50Ms, 2), FormatFloat(iv.P99Ms, 2), FormatFloat(iv.P999Ms, 2), FormatFloat(iv.MaxMs, 1), strconv.FormatInt(iv.Stalls, 10), reg})
	}
	b.WriteString(MarkdownTable([]string{"t s", "ok", "failed", "ops/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "stalls", "regions"}, rows))
	fmt.Fprintf(b, "\n#### Stalls (over %v)\n\n%d operations took longer than %v", st.cfg.StallThreshold, p.Stalls, st.cfg.StallThreshold)
	if len(p.Worst) == 0 {
		b.WriteString(".\n")
		return
	}
	fmt.Fprintf(b, "; the %d slowest:\n\n", len(p.Worst))
	var srows [][]string
	for _, s := range p.Worst {
		srows = append(srows, []string{s.At.UTC().Format("15:04:05.000"), FormatFloat(s.T, 1), s.Op, s.Key, FormatFloat(s.Ms, 1), s.Err})
	}
	b.WriteString(MarkdownTable([]string{"at (UTC)", "t s", "op", "key", "ms", "error"}, srows))
}

// ---- plots ------------------------------------------------------------------

var scaleSeries = []string{"load", "move", "load p99", "load p99.9", "load max", "move p99", "move p99.9", "move max"}

func (st *scaleState) throughputPlot() (string, error) {
	p := newPlot("scale: throughput per interval", "seconds since start", "ops/s")
	var ss []series
	for _, ph := range []*ScalePhase{st.res.Load, st.res.Move} {
		if ph == nil || len(ph.Intervals) == 0 {
			continue
		}
		var xys plotter.XYs
		for _, iv := range ph.Intervals {
			xys = append(xys, plotter.XY{X: iv.T, Y: iv.QPS})
		}
		ss = append(ss, series{name: ph.Name, xys: xys})
	}
	if len(ss) == 0 {
		return "", nil
	}
	if err := addSeries(p, scaleSeries, ss, true); err != nil {
		return "", err
	}
	return savePlot(p, st.res.Dir, "throughput.png")
}

func (st *scaleState) latencyPlot() (string, error) {
	p := newPlot("scale: latency per interval (successful operations)", "seconds since start", "ms (log)")
	var ss []series
	lo, hi := 1e9, 0.0
	for _, ph := range []*ScalePhase{st.res.Load, st.res.Move} {
		if ph == nil {
			continue
		}
		var p99, p999, pmax plotter.XYs
		for _, iv := range ph.Intervals {
			if iv.OK == 0 {
				continue
			}
			p99 = append(p99, plotter.XY{X: iv.T, Y: max(iv.P99Ms, 0.001)})
			p999 = append(p999, plotter.XY{X: iv.T, Y: max(iv.P999Ms, 0.001)})
			pmax = append(pmax, plotter.XY{X: iv.T, Y: max(iv.MaxMs, 0.001)})
			lo, hi = min(lo, iv.P99Ms), max(hi, iv.MaxMs)
		}
		if len(p99) > 0 {
			ss = append(ss, series{name: ph.Name + " p99", xys: p99}, series{name: ph.Name + " p99.9", xys: p999}, series{name: ph.Name + " max", xys: pmax})
		}
	}
	if len(ss) == 0 {
		return "", nil
	}
	logAxis(&p.Y, lo, hi)
	if err := addSeries(p, scaleSeries, ss, true); err != nil {
		return "", err
	}
	return savePlot(p, st.res.Dir, "latency.png")
}
