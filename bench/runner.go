// Package bench drives hedgekv (and, for comparison, etcd) with go-ycsb's core
// workloads and writes the scenarios' reports (docs/BENCHMARKS.md).
//
// Run executes one YCSB workload against any DB registered with go-ycsb's
// registry: the hedgekv binding (package bench/ycsbdb, "hedgekv"), the etcd
// binding (package bench/etcddb, "etcdkv"), go-ycsb's own bindings, or a test
// fake. It uses go-ycsb's workload generator and client loop unchanged, and
// measures every operation itself (HDR histograms, failures, optional
// timeline) on top of go-ycsb's own measurement, whose summary it keeps.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/magiconair/properties"
	ycsbclient "github.com/pingcap/go-ycsb/pkg/client"
	"github.com/pingcap/go-ycsb/pkg/measurement"
	"github.com/pingcap/go-ycsb/pkg/prop"
	_ "github.com/pingcap/go-ycsb/pkg/workload" // registers the core workload
	"github.com/pingcap/go-ycsb/pkg/ycsb"
)

// Phase names.
const (
	PhaseLoad = "load"
	PhaseRun  = "run"
)

// Spec describes one YCSB run: an optional load phase, then an optional run
// phase, of one workload against one DB.
type Spec struct {
	// DB is a go-ycsb registered DB name ("hedgekv", "etcdkv", ...). Ignored
	// when Instance is set.
	DB string
	// Instance, if set, is used instead of creating DB from the registry; the
	// caller keeps ownership and closes it.
	Instance ycsb.DB
	// Properties are the DB's properties ("hedgekv.endpoints", ...) and any
	// go-ycsb property to override ("fieldcount", "requestdistribution",
	// ...). They override the workload's set; the fields below override them.
	Properties map[string]string

	// Workload is a..f or "scan" (see Workloads).
	Workload string
	Records  int64 // recordcount (records loaded, and the key space read)
	Ops      int64 // operationcount of the run phase
	Threads  int   // threadcount (default 16); clamped to the phase's count

	Load bool // run the load phase (insert Records records)
	Run  bool // run the transaction phase (Ops operations)

	// MaxScanLength sets maxscanlength for scans ("scan" defaults to
	// DefaultMaxScanLength, e keeps its own unless this is set).
	MaxScanLength int
	// ScanLengthDistribution is uniform, zipfian or constant (every scan
	// asks for exactly MaxScanLength records).
	ScanLengthDistribution string
	// ScanInsert makes the scan workload 95% scans and 5% inserts.
	ScanInsert bool

	// Variant and Param label the result row.
	Variant, Param string

	// MaxDuration, if > 0, ends the run phase after this long (not an error).
	// The operations in flight then complete and are counted.
	MaxDuration time.Duration
	// Stop, if not nil, ends the run phase when it is closed, as
	// MaxDuration does.
	Stop <-chan struct{}
	// TimelineStep, if > 0, adds ok/failed counts per step to the run row.
	TimelineStep time.Duration
	// ProgressInterval between progress log lines (0: 5s; < 0: none).
	ProgressInterval time.Duration
	// AbortAfterFailures ends a phase in error when this many operations
	// have failed and none has succeeded (0: 2×threads+20; < 0: never), so
	// that an unreachable cluster fails fast instead of timing out op by op.
	AbortAfterFailures int
	// QuietWorkload drops the line go-ycsb's core workload prints on
	// stdout when it is built ("Using request distribution ..."), which
	// would break a progress bar's line; see createWorkload.
	QuietWorkload bool
	// OnProgress, if set, is called about every 50ms while a phase runs
	// with the operations done and failed so far (a progress bar).
	OnProgress func(done, failed int64)
	// Logger gets progress and warnings (nil: slog.Default()).
	Logger *slog.Logger
	// Summary, if set, receives go-ycsb's own summary of each phase.
	Summary io.Writer
}

// PhaseResult is what one phase measured.
type PhaseResult struct {
	Phase   string
	Threads int
	Elapsed time.Duration
	Row     Row
	Total   OpStats
	Ops     []OpStats
	// Latency is the histogram of the phase's successful operations
	// (TOTAL), in microseconds, for CDF plots.
	Latency *hdrhistogram.Histogram
	// Summary is go-ycsb's own summary table of the phase.
	Summary string
	// Stopped: MaxDuration ended the phase before every operation ran.
	Stopped bool
	// YCSBErrors are go-ycsb's own counts of failed database calls, by
	// operation (its OP_ERROR lines: READ, INSERT, ...), to check the
	// recorder's counts against: Ops[i].Failed must equal them.
	YCSBErrors map[string]int64
}

// Result of Run. Load or Run is nil if that phase was not asked for.
type Result struct {
	// Properties are the go-ycsb properties of the run phase (of the load
	// phase when there was no run phase).
	Properties map[string]string
	Load, Run  *PhaseResult
}

// ErrAllFailed is wrapped by Run when a phase's operations all failed.
var ErrAllFailed = errors.New("every operation failed")

// go-ycsb's measurement package is process-global: one phase at a time.
var ycsbMu sync.Mutex

// Run executes spec's phases in order, load then run. On error the Result
// holds whatever phases completed (including a phase whose operations all
// failed).
func Run(ctx context.Context, spec Spec) (*Result, error) {
	logger := spec.Logger
	if logger == nil {
		logger = slog.Default()
	}
	if !spec.Load && !spec.Run {
		return nil, errors.New("bench: neither load nor run phase requested")
	}
	props, err := BuildProperties(spec)
	if err != nil {
		return nil, err
	}
	db := spec.Instance
	if db == nil {
		creator := ycsb.GetDBCreator(spec.DB)
		if creator == nil {
			return nil, fmt.Errorf("bench: no go-ycsb DB registered as %q", spec.DB)
		}
		if db, err = creator.Create(toProperties(props)); err != nil {
			return nil, fmt.Errorf("bench: create %s DB: %w", spec.DB, err)
		}
		defer func() {
			if cerr := db.Close(); cerr != nil {
				logger.Warn("close ycsb DB", "db", spec.DB, "err", cerr)
			}
		}()
	}

	res := &Result{Properties: props}
	if spec.Load {
		if res.Load, err = runPhase(ctx, spec, props, db, PhaseLoad, logger); err != nil {
			return res, err
		}
	}
	if spec.Run {
		if res.Run, err = runPhase(ctx, spec, props, db, PhaseRun, logger); err != nil {
			return res, err
		}
	}
	return res, nil
}

// BuildProperties returns the go-ycsb properties of spec's run phase,
// validated so that go-ycsb's workload cannot exit the process over them.
func BuildProperties(spec Spec) (map[string]string, error) {
	set, err := WorkloadProperties(spec.Workload)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	p := map[string]string{
		prop.Silence:         "true",
		prop.MeasurementType: "histogram",
		// go-ycsb prints its whole summary table every interval; the runner
		// reports progress itself, so the periodic table is off by default.
		prop.LogInterval: "86400",
		prop.ThreadCount: "16",
	}
	maps.Copy(p, set)
	name := strings.ToLower(strings.TrimSpace(spec.Workload))
	if name == "scan" {
		p[prop.MaxScanLength] = strconv.Itoa(DefaultMaxScanLength)
		if spec.ScanInsert {
			p[prop.ScanProportion], p[prop.InsertProportion] = "0.95", "0.05"
		}
	}
	maps.Copy(p, spec.Properties)
	if spec.MaxScanLength > 0 {
		p[prop.MaxScanLength] = strconv.Itoa(spec.MaxScanLength)
	}
	switch d := strings.ToLower(spec.ScanLengthDistribution); d {
	case "":
	case "uniform", "zipfian":
		p[prop.ScanLengthDistribution] = d
	case "constant":
		// go-ycsb draws only uniform or zipfian scan lengths; the measured
		// DB wrapper turns every scan into one of exactly maxscanlength.
		p[prop.ScanLengthDistribution] = "uniform"
		p[scanFixedProp] = "true"
	default:
		return nil, fmt.Errorf("bench: unknown scan length distribution %q (want uniform, zipfian or constant)", spec.ScanLengthDistribution)
	}
	if spec.Records > 0 {
		p[prop.RecordCount] = strconv.FormatInt(spec.Records, 10)
	}
	if spec.Ops > 0 {
		p[prop.OperationCount] = strconv.FormatInt(spec.Ops, 10)
	}
	if spec.Threads > 0 {
		p[prop.ThreadCount] = strconv.Itoa(spec.Threads)
	}
	if err := validateProperties(p, spec.Run); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return p, nil
}

// scanFixedProp marks a constant scan length (a bench property, not go-ycsb's).
const scanFixedProp = "bench.scanlength.constant"

func validateProperties(p map[string]string, run bool) error {
	intProp := func(key string, min int64, required bool) (int64, error) {
		s, ok := p[key]
		if !ok {
			if required {
				return 0, fmt.Errorf("%s is required", key)
			}
			return min, nil
		}
		v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", key, err)
		}
		if v < min {
			return 0, fmt.Errorf("%s must be at least %d, not %d", key, min, v)
		}
		return v, nil
	}
	records, err := intProp(prop.RecordCount, 1, true)
	if err != nil {
		return err
	}
	if run {
		if _, err := intProp(prop.OperationCount, 1, true); err != nil {
			return err
		}
	}
	if _, err := intProp(prop.ThreadCount, 1, false); err != nil {
		return err
	}
	insertStart, err := intProp(prop.InsertStart, 0, false)
	if err != nil {
		return err
	}
	if _, ok := p[prop.InsertCount]; ok {
		insertCount, err := intProp(prop.InsertCount, 1, false)
		if err != nil {
			return err
		}
		if insertStart+insertCount > records {
			return fmt.Errorf("insertstart %d + insertcount %d exceed recordcount %d", insertStart, insertCount, records)
		}
	} else if insertStart >= records {
		return fmt.Errorf("insertstart %d must be below recordcount %d", insertStart, records)
	}
	for _, k := range []string{prop.MaxScanLength, prop.FieldCount, prop.FieldLength} {
		if _, err := intProp(k, 1, false); err != nil {
			return err
		}
	}
	oneOf := func(key string, allowed ...string) error {
		if v, ok := p[key]; ok && !slices.Contains(allowed, v) {
			return fmt.Errorf("%s %q is not one of %s", key, v, strings.Join(allowed, ", "))
		}
		return nil
	}
	return errors.Join(
		oneOf(prop.Workload, "core"),
		oneOf(prop.RequestDistribution, "uniform", "sequential", "zipfian", "latest", "hotspot", "exponential"),
		oneOf(prop.ScanLengthDistribution, "uniform", "zipfian"),
		oneOf(prop.FieldLengthDistribution, "constant", "uniform", "zipfian"),
		oneOf(prop.InsertOrder, "hashed", "ordered"),
		oneOf(prop.MeasurementType, "histogram"),
		oneOf(prop.DataIntegrity, "false"),
		oneOf(prop.BatchSize, "1"), // the core workload cannot batch scans
	)
}

func toProperties(m map[string]string) *properties.Properties {
	p := properties.NewProperties()
	// Values are taken literally: no ${...} expansion.
	p.DisableExpansion = true
	for _, k := range sortedKeys(m) {
		_, _, _ = p.Set(k, m[k])
	}
	return p
}

func runPhase(ctx context.Context, spec Spec, base map[string]string, db ycsb.DB, phase string, logger *slog.Logger) (*PhaseResult, error) {
	ycsbMu.Lock()
	defer ycsbMu.Unlock()

	m, target, threads := phaseProps(base, phase)
	summaryFile, err := os.CreateTemp("", "hedgekv-ycsb-summary-*.txt")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	summaryPath := summaryFile.Name()
	_ = summaryFile.Close()
	defer os.Remove(summaryPath)
	m[prop.MeasurementRawOutputFile] = summaryPath

	p := toProperties(m)
	measurement.InitMeasure(p)
	wl, err := createWorkload(p, spec.QuietWorkload)
	if err != nil {
		return nil, fmt.Errorf("bench: create workload %s: %w", spec.Workload, err)
	}
	defer wl.Close()

	// opsCtx is what the database calls run under: cancelled when ctx is
	// or when the phase is aborted. runCtx, its child, drives go-ycsb's
	// loop: cancelled as well when the phase reaches its end (MaxDuration,
	// Stop), which ends the loop but lets the calls in flight complete and
	// be counted, ok or failed, as go-ycsb counts them.
	opsCtx, cancelOps := context.WithCancelCause(ctx)
	defer cancelOps(nil)
	runCtx, cancel := context.WithCancelCause(opsCtx)
	defer cancel(nil)
	defer endRunAt(spec, phase, cancel)()

	rec := newRecorder(spec.TimelineStep, logger)
	rec.ops = opsCtx
	abortAfter := int64(spec.AbortAfterFailures)
	if abortAfter == 0 {
		abortAfter = int64(2*threads + 20)
	}
	gen := &genLock{}
	mdb := &measuredDB{inner: db, rec: rec, gen: gen}
	if m[scanFixedProp] == "true" {
		mdb.fixedScan, _ = strconv.Atoi(m[prop.MaxScanLength])
	}
	label := []any{"db", dbLabel(spec), "workload", spec.Workload, "variant", spec.Variant, "phase", phase}
	logger.Info("ycsb phase starting", append(label, "target_ops", target, "threads", threads)...)

	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	progressWG.Go(func() {
		watch(runCtx, rec, target, abortAfter, spec.ProgressInterval, spec.OnProgress, cancelOps, progressDone, logger, label)
	})

	c := ycsbclient.NewClient(p, measuredWorkload{Workload: wl, rec: rec, gen: gen}, ycsbclient.DbWrapper{DB: mdb})
	start := time.Now()
	c.Run(runCtx)
	elapsed := time.Since(start)
	close(progressDone)
	progressWG.Wait()

	measurement.Output()
	summary, err := os.ReadFile(summaryPath)
	if err != nil {
		return nil, fmt.Errorf("bench: read go-ycsb summary: %w", err)
	}
	ops, total, timeline := rec.snapshot(elapsed)
	pr := &PhaseResult{
		Phase:   phase,
		Threads: threads,
		Elapsed: elapsed,
		Total:   total,
		Ops:     ops,
		Latency: rec.totalHist(),
		Summary: string(summary),
	}
	pr.YCSBErrors = ycsbErrorCounts(pr.Summary)
	checkYCSBErrors(pr.YCSBErrors, ops, logger, label)
	pr.Row = RowFromStats(spec.Variant, spec.Param, total)
	pr.Row.Timeline = timeline
	if spec.Summary != nil {
		fmt.Fprintf(spec.Summary, "go-ycsb summary: %s, workload %s, %s phase, %s\n%s", dbLabel(spec), spec.Workload, phase, spec.Variant, summary)
	}
	logger.Info("ycsb phase done", append(label,
		"ops", pr.Row.Ops, "failed", pr.Row.Failed, "elapsed", elapsed.Round(time.Millisecond),
		"qps", pr.Row.QPS, "p50_ms", pr.Row.P50Ms, "p99_ms", pr.Row.P99Ms)...)

	switch cause := context.Cause(runCtx); {
	case ctx.Err() != nil:
		return pr, fmt.Errorf("bench: %s phase of workload %s interrupted: %w", phase, spec.Workload, context.Cause(ctx))
	case errors.Is(cause, errMaxDuration):
		pr.Stopped = true
	case cause != nil:
		return pr, fmt.Errorf("bench: %s phase of workload %s against %s: %w", phase, spec.Workload, dbLabel(spec), cause)
	}
	if total.Ops == 0 && total.Failed > 0 {
		return pr, fmt.Errorf("bench: %s phase of workload %s against %s: %w (%d); first error: %s",
			phase, spec.Workload, dbLabel(spec), ErrAllFailed, total.Failed, total.FirstErr)
	}
	return pr, nil
}

// phaseProps are the go-ycsb properties of one phase (load or run) from
// base, with the number of operations it is to make and its threads.
func phaseProps(base map[string]string, phase string) (m map[string]string, target int64, threads int) {
	m = maps.Clone(base)
	records, _ := strconv.ParseInt(m[prop.RecordCount], 10, 64)
	target = records
	if phase == PhaseLoad {
		m[prop.DoTransactions] = "false"
		if s, ok := m[prop.InsertCount]; ok {
			target, _ = strconv.ParseInt(s, 10, 64)
		} else if s, ok := m[prop.InsertStart]; ok {
			start, _ := strconv.ParseInt(s, 10, 64)
			target = records - start
		}
	} else {
		m[prop.DoTransactions] = "true"
		target, _ = strconv.ParseInt(m[prop.OperationCount], 10, 64)
	}
	// go-ycsb exits the process when a phase has fewer operations than
	// threads; give such a phase fewer threads instead.
	threads, _ = strconv.Atoi(m[prop.ThreadCount])
	if int64(threads) > target {
		threads = int(target)
		m[prop.ThreadCount] = strconv.Itoa(threads)
	}
	return m, target, threads
}

// endRunAt ends a run phase (cancel with errMaxDuration) after
// spec.MaxDuration or when spec.Stop closes; the func it returns releases
// what it started.
func endRunAt(spec Spec, phase string, cancel context.CancelCauseFunc) (release func()) {
	var releases []func()
	if phase == PhaseRun && spec.MaxDuration > 0 {
		stopTimer := time.AfterFunc(spec.MaxDuration, func() { cancel(errMaxDuration) })
		releases = append(releases, func() { stopTimer.Stop() })
	}
	if phase == PhaseRun && spec.Stop != nil {
		stopped := make(chan struct{})
		releases = append(releases, func() { close(stopped) })
		go func() {
			select {
			case <-spec.Stop:
				cancel(errMaxDuration)
			case <-stopped:
			}
		}()
	}
	return func() {
		for _, r := range slices.Backward(releases) {
			r()
		}
	}
}

// checkYCSBErrors warns of failures go-ycsb counted (errs, per operation)
// that the recorder did not (ops).
func checkYCSBErrors(errs map[string]int64, ops []OpStats, logger *slog.Logger, label []any) {
	for op, n := range errs {
		i := slices.IndexFunc(ops, func(o OpStats) bool { return o.Op == op })
		if i < 0 || ops[i].Failed != n {
			// Only an interruption (a call cut short, not counted here) may
			// explain it; anything else is a bug in the recorder.
			var mine int64
			if i >= 0 {
				mine = ops[i].Failed
			}
			logger.Warn("go-ycsb counted failures the recorder did not", append(label, "op", op, "ycsb_errors", n, "recorded", mine)...)
		}
	}
}

var errMaxDuration = errors.New("maximum duration reached")

// ycsbErrorLine is a line of go-ycsb's summary counting failed calls:
// "READ_ERROR - Takes(s): 0.3, Count: 4, ...".
var ycsbErrorLine = regexp.MustCompile(`(?m)^([A-Z_]+)_ERROR\s+-.*?\bCount: (\d+)`)

// ycsbErrorCounts reads go-ycsb's counts of failed calls by operation
// from its summary.
func ycsbErrorCounts(summary string) map[string]int64 {
	var out map[string]int64
	for _, m := range ycsbErrorLine.FindAllStringSubmatch(summary, -1) {
		n, err := strconv.ParseInt(m[2], 10, 64)
		if err != nil {
			continue
		}
		if out == nil {
			out = map[string]int64{}
		}
		out[m[1]] += n
	}
	return out
}

// createWorkload builds go-ycsb's core workload. go-ycsb prints one line
// on os.Stdout while doing so; with quiet, os.Stdout points at the null
// device for that call only. The caller holds ycsbMu, so no other phase
// builds a workload meanwhile; nothing else in a benchmark process writes
// to os.Stdout itself (reports go to the writer the caller gives).
func createWorkload(p *properties.Properties, quiet bool) (ycsb.Workload, error) {
	if !quiet {
		return ycsb.GetWorkloadCreator("core").Create(p)
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return ycsb.GetWorkloadCreator("core").Create(p)
	}
	defer null.Close()
	saved := os.Stdout
	os.Stdout = null
	defer func() { os.Stdout = saved }()
	return ycsb.GetWorkloadCreator("core").Create(p)
}

func dbLabel(spec Spec) string {
	if spec.Instance != nil && spec.DB == "" {
		return fmt.Sprintf("%T", spec.Instance)
	}
	return spec.DB
}

// watch logs progress every interval and aborts the phase when abortAfter
// operations failed without a single success.
func watch(ctx context.Context, rec *recorder, target, abortAfter int64, interval time.Duration, onProgress func(done, failed int64),
	cancel context.CancelCauseFunc, done <-chan struct{}, logger *slog.Logger, label []any) {
	if interval == 0 {
		interval = 5 * time.Second
	}
	var progress <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		progress = t.C
	}
	check := time.NewTicker(50 * time.Millisecond)
	defer check.Stop()
	lastDone, lastT := int64(0), time.Now()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-check.C:
			failed := rec.failed.Load()
			if onProgress != nil {
				onProgress(rec.done.Load(), failed)
			}
			if abortAfter > 0 && failed >= abortAfter && rec.done.Load() == failed {
				cancel(fmt.Errorf("%w: aborted after %d failures without a success", ErrAllFailed, failed))
				return
			}
		case now := <-progress:
			d, failed := rec.done.Load(), rec.failed.Load()
			rate := float64(d-lastDone) / now.Sub(lastT).Seconds()
			lastDone, lastT = d, now
			pct := 0.0
			if target > 0 {
				pct = 100 * float64(d) / float64(target)
			}
			logger.Info("ycsb progress", append(slices.Clone(label),
				"done", d, "target", target, "pct", round(pct, 1), "ops_per_s", round(rate, 1), "failed", failed)...)
		}
	}
}
