package bench

import (
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

	"github.com/pingcap/go-ycsb/pkg/prop"
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
	// Baseline, if > 0, first runs a cluster of its own holding this many
	// records (loaded, then YCSB A and scans, each for CompareFor), and
	// after the load the same workloads here: the report sets the rates
	// side by side, with their ratios (scale_compare.go).
	Baseline   int64
	CompareFor time.Duration // default 60s; quick 10s
	// DeleteAll: at the end, delete every record and wait up to MergeWait
	// (default 10m; quick 1m) for the regions to merge back, then compare
	// the replicas again; the servers merge regions of at most 20 MiB (a
	// third of the split size, if less) and 200,000 keys (scale_delete.go).
	DeleteAll bool
	MergeWait time.Duration
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
	setDefault(&cfg.CompareFor, quickOr(cfg.Quick, time.Minute, 10*time.Second))
	setDefault(&cfg.MergeWait, quickOr(cfg.Quick, 10*time.Minute, time.Minute))
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
	// Splits are the automatic splits during the phase, each with the
	// slowest call around it; SplitBaselineP99Ms is the p99 of the calls
	// away from every split (of all of them if SplitBaselineAll: too few
	// were away); SplitWindows sets them beside control windows.
	Splits             []ScaleSplit `json:"splits,omitempty"`
	SplitBaselineP99Ms float64      `json:"split_baseline_p99_ms,omitempty"`
	SplitBaselineAll   bool         `json:"split_baseline_all,omitempty"`
	SplitWindows       SplitWindows `json:"split_windows"`
	Elapsed            float64      `json:"elapsed_s"`
	Err                string       `json:"error,omitempty"`
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
	Records          int64         `json:"records"`
	LogicalBytes     int64         `json:"logical_bytes"`
	ValueSize        int           `json:"value_size"`
	RegionsBefore    int           `json:"regions_before"`
	RegionsAfterLoad int           `json:"regions_after_load"`
	RegionsEnd       int           `json:"regions_end"`
	ApproxBytesEnd   int64         `json:"approx_bytes_end"` // the leaders' own counts at the end
	SizeKnownEnd     int           `json:"size_known_end"`   // regions whose size the leader had counted
	Load             *ScalePhase   `json:"load"`
	Move             *ScalePhase   `json:"move"`
	MoveInfo         ScaleMove     `json:"move_info"`
	Restart          ScaleRestart  `json:"restart"`
	Check            ScaleCheck    `json:"check"`
	Compare          *ScaleCompare `json:"compare,omitempty"`
	Delete           *ScaleDelete  `json:"delete,omitempty"`
	Mem              []StoreMem    `json:"memory"`
	Disk             []StoreDisk   `json:"disk"`
	Rows             []Row         `json:"rows"`
	Dir              string        `json:"-"`
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
	steps := 3
	if cfg.Baseline > 0 {
		steps++
	}
	if cfg.DeleteAll {
		steps++
	}
	prog := newProgress(cfg.Progress, "scale", steps)
	defer prog.Done()

	var extra []string
	if cfg.SplitMaxBytes > 0 {
		extra = append(extra, "--split-max-bytes="+strconv.FormatUint(cfg.SplitMaxBytes, 10))
	}
	if cfg.SplitCheckInterval != 0 {
		extra = append(extra, "--split-check-interval="+cfg.SplitCheckInterval.String())
	}
	if cfg.DeleteAll {
		extra = append(extra, "--merge-max-bytes="+strconv.FormatUint(cfg.mergeMaxBytes(), 10), "--merge-max-keys="+strconv.Itoa(deleteMergeMaxKeys))
		if cfg.Quick {
			extra = append(extra, "--merge-check-interval=1s", "--merge-after-split=5s")
		}
	}
	if cfg.Dir != "" {
		// --dir names where the stores go; it need not exist yet.
		if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("scale: %w", err)
		}
	}
	if cfg.Baseline > 0 {
		// First, while nothing else runs: the two clusters are measured
		// one after the other on the same machine, never at once.
		res.Compare = &ScaleCompare{For: cfg.CompareFor.Seconds()}
		base, err := runBaseline(ctx, cfg, extra, prog)
		res.Compare.Baseline = base
		if err != nil {
			res.Compare.Err = err.Error()
			res.Errors = append(res.Errors, "baseline: "+err.Error())
		}
	}
	prog.Printf("scale: starting three `%s server` processes", cfg.Binary)
	c, err := cluster.StartProcesses(ctx, cluster.ProcessesConfig{
		Binary: cfg.Binary, Dir: cfg.Dir, BalanceInterval: cfg.BalanceInterval, ExtraArgs: extra,
		ReadyTimeout: time.Minute, Logger: cfg.Logger,
		// Info: the splits' times come from the stores' logs.
		LogLevel: "info",
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
		for _, step := range []func(context.Context){st.afterLoad, st.compareFull, st.move, st.restart, st.final, st.checkReplicas, st.deleteAll} {
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
	rec.keepSpans = true
	st.db.rec.Store(rec)

	label := fmt.Sprintf("load %d records", cfg.Records)
	st.prog.Step(label, cfg.Records, 0)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	st.sampleRegions(ctx, stop, &wg)
	// A progress line of its own every interval: records/s over the
	// interval, % done, and the load's ETA, the one the progress bar shows
	// (Progress.StepLeft: at the load's average rate so far), so the two
	// lines never disagree.
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
				if left, ok := st.prog.StepLeft(); ok {
					eta = left.Round(time.Second).String()
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
		st.splitsDuring(st.res.Load, rec, begin, end)
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
	rec.keepSpans = true
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
