package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
)

// hedge-tail reproduces Pegasus's backup request and Bailis's "doing
// redundant work": the store holding region 1's leader pauses now and then
// (as a compaction or a GC pause would), and reads sent to the leader are
// hedged to a follower after a fixed delay or a percentile of recent
// latency. What is measured is the far tail (p99.99) against the extra
// requests the hedges cost.
//
// Three faults; the first two with the hedge that can beat them (the
// client's design), the third to show what the budget holds back:
//   - read-pause: the `delay` fault on the leader's store with prob 1 for
//     the length of the pause, then cleared, so a read arriving during the
//     pause waits until its end. The leader's raft loop stays live, so a
//     linearizable hedge (a ReadIndex read at a follower) answers.
//   - stall-stale: the `stall` fault: the whole store freezes (reads,
//     writes, raft). A ReadIndex hedge would wait for the frozen leader
//     too, so the session allows bounded staleness and the hedge is a
//     stale read at a follower.
//   - slow-leader: the `delay` fault on the leader's store for the whole
//     session (warm-up and run) on a share of its reads: a store that stays
//     slow. More reads are late than the budget may hedge, so what is
//     measured is that the extra requests stay within the budget and the
//     median does not suffer from them.
//
// Each hedging variant runs once per budget (HedgeTailConfig.HedgeBudgets):
// by default with the client's default budget, then with no cap, side by
// side in the same run.

// HedgeTailVariant is one hedging policy of hedge-tail.
type HedgeTailVariant struct {
	Name  string
	Hedge client.Hedge
	Doc   string
}

// HedgeTailVariants are hedge-tail's variants, in run order.
var HedgeTailVariants = []HedgeTailVariant{
	{Name: "hedge-off", Hedge: client.HedgeOff, Doc: "no hedging: the baseline"},
	{Name: "hedge-10ms", Hedge: client.HedgeAfter(10 * time.Millisecond), Doc: "a backup request after a fixed 10 ms (Dean's BigTable setting)"},
	{Name: "hedge-p99", Hedge: client.HedgeAfterPercentile(0.99), Doc: "a backup request after the leader's recent p99 (Cassandra's default)"},
	{Name: "hedge-p999", Hedge: client.HedgeAfterPercentile(0.999), Doc: "a backup request after the leader's recent p99.9 (Pegasus's setting)"},
}

// Fault kinds of hedge-tail.
const (
	FaultReadPause  = "read-pause"
	FaultStallStale = "stall-stale"
	FaultSlowLeader = "slow-leader"
)

// HedgeTailFaults are the fault kinds, in run order.
var HedgeTailFaults = []string{FaultReadPause, FaultStallStale, FaultSlowLeader}

// HedgeTailConfig configures RunHedgeTail.
type HedgeTailConfig struct {
	// Quick: 3 s runs with one pause each after a 2 s warm-up, about two
	// minutes on 2 cores (the pauses then touch ~5% of reads, so the
	// extra-request figures are not the published ones). Explicit values
	// below still win.
	Quick    bool
	Variants []string // default all
	Faults   []string // default all three
	Keys     int      // keys read, uniformly (default 1,000)
	// ValueSize of each key's value (default 128 bytes).
	ValueSize int
	// Rate is the open loop's reads per second (default 2,000).
	Rate float64
	// RunDuration of each measured run (default 25s; quick 3s).
	RunDuration time.Duration
	// Warmup before each run, unmeasured, in the measured session, so that
	// the percentile hedges have a latency window and the budget has the
	// deposits of a session that has been reading (default 3s; quick 2s;
	// negative: none).
	Warmup time.Duration
	// PauseLen is how long each pause lasts (default 150ms).
	PauseLen time.Duration
	// Pauses per run, evenly spaced (default 1).
	Pauses int
	// HedgeBudgets: each hedging variant runs once per budget, in this
	// order. 0 is the client's default (client.DefaultHedgeBudget over
	// client.DefaultHedgeWindow), 1 is no cap. Default: 0, 1.
	HedgeBudgets []float64
	// SlowDelay and SlowProb of slow-leader's delay fault (default 50ms on
	// 20% of the leader's reads: four times the default budget).
	SlowDelay time.Duration
	SlowProb  float64
	// MaxStaleness of stall-stale's session (default 10s).
	MaxStaleness time.Duration
	OutDir       string // results root: writes OutDir/hedge-tail
	NoPlots      bool
	Command      string
	Progress     io.Writer
	Logger       *slog.Logger
	Out          io.Writer
}

func (cfg *HedgeTailConfig) setDefaults() error {
	var err error
	if cfg.Variants, err = chooseVariants(cfg.Variants, HedgeTailVariants, func(v HedgeTailVariant) string { return v.Name }); err != nil {
		return err
	}
	if len(cfg.Faults) == 0 {
		cfg.Faults = slices.Clone(HedgeTailFaults)
	}
	for _, f := range cfg.Faults {
		if !slices.Contains(HedgeTailFaults, f) {
			return fmt.Errorf("unknown fault %q (want %s)", f, strings.Join(HedgeTailFaults, ", "))
		}
	}
	setDefault(&cfg.Keys, 1000)
	setDefault(&cfg.ValueSize, 128)
	setDefault(&cfg.Rate, 2000)
	setDefault(&cfg.RunDuration, quickOr(cfg.Quick, 25*time.Second, 3*time.Second))
	setDefaultIfZero(&cfg.Warmup, quickOr(cfg.Quick, 3*time.Second, 2*time.Second))
	setDefault(&cfg.PauseLen, 150*time.Millisecond)
	setDefault(&cfg.Pauses, 1)
	if time.Duration(cfg.Pauses)*cfg.PauseLen >= cfg.RunDuration {
		return fmt.Errorf("%d pauses of %v do not fit in a %v run", cfg.Pauses, cfg.PauseLen, cfg.RunDuration)
	}
	if len(cfg.HedgeBudgets) == 0 {
		cfg.HedgeBudgets = []float64{0, 1}
	}
	for _, b := range cfg.HedgeBudgets {
		if b < 0 || b > 1 {
			return fmt.Errorf("hedge budget %v outside [0, 1] (0: the client's default, 1: no cap)", b)
		}
	}
	setDefault(&cfg.SlowDelay, 50*time.Millisecond)
	setDefault(&cfg.SlowProb, 0.2)
	if cfg.SlowProb > 1 {
		return fmt.Errorf("slow-leader's fault probability %v above 1", cfg.SlowProb)
	}
	setDefault(&cfg.MaxStaleness, 10*time.Second)
	setOutputDefaults(&cfg.OutDir, &cfg.Logger, &cfg.Out)
	return nil
}

// HedgeTailRun is one measured run: a variant, with a budget, under a
// fault.
type HedgeTailRun struct {
	Variant HedgeTailVariant
	// Budget is the session's HedgeBudget (0: the client's default; 1: no
	// cap); Label names the variant with it (Row.Variant).
	Budget  float64
	Label   string
	Fault   string
	Row     Row
	Latency *hdrhistogram.Histogram
	Stats   client.HedgeStats
	// PausesInjected and PausedFor: what the fault schedule did.
	PausesInjected int
	PausedFor      time.Duration
	MaxLag         time.Duration
	FirstErr       string
	LeaderMoved    string
}

// HedgeTailResult is what RunHedgeTail measured.
type HedgeTailResult struct {
	Rows        []Row
	Runs        []HedgeTailRun
	LeaderStore uint64
	Dir         string
	Plots       []string
	// LoadBefore is the machine's load average as the scenario started.
	LoadBefore string
}

// hedgeTailRegion holds every key (splits are off).
const hedgeTailRegion = 1

// RunHedgeTail runs the scenario and writes
// OutDir/hedge-tail/{results.json,report.md,*.png}.
func RunHedgeTail(ctx context.Context, cfg HedgeTailConfig) (*HedgeTailResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("hedge-tail: %w", err)
	}
	started, load := time.Now(), loadAvg()
	variants := pickVariants(HedgeTailVariants, cfg.Variants, func(v HedgeTailVariant) string { return v.Name })
	faults := pickVariants(HedgeTailFaults, cfg.Faults, func(f string) string { return f })
	runs := 0
	for _, v := range variants {
		runs += len(cfg.budgetsOf(v))
	}
	prog := newProgress(cfg.Progress, "hedge-tail", 1+runs*len(faults))
	defer prog.Done()

	prog.Printf("hedge-tail: starting 3 stores")
	lc, admin, err := startFaultCluster(ctx, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("hedge-tail: %w", err)
	}
	defer lc.Stop()
	defer func() { _ = admin.Close() }()
	const leader = 1
	res := &HedgeTailResult{LeaderStore: leader, Dir: filepath.Join(cfg.OutDir, "hedge-tail"), LoadBefore: load}
	keys, err := loadKeys(ctx, admin, "hedge-tail", cfg.Keys, cfg.ValueSize, prog)
	if err != nil {
		return nil, fmt.Errorf("hedge-tail: %w", err)
	}

	var errs []error
	for _, f := range faults {
		for _, v := range variants {
			for _, budget := range cfg.budgetsOf(v) {
				run, err := cfg.measure(ctx, lc, admin, leader, keys, v, budget, f, prog)
				if run != nil {
					res.Runs = append(res.Runs, *run)
					res.Rows = append(res.Rows, run.Row)
					prog.Printf("%-18s %-11s p50 %6.2f ms  p99 %7.2f ms  p99.9 %7.2f ms  p99.99 %7.2f ms  extra %.2f%%  %s",
						run.Label, f, run.Row.P50Ms, run.Row.P99Ms, run.Row.P999Ms, run.Row.P9999Ms,
						100*run.Stats.ExtraRequestRatio(), failedNote(run.Row.Failed))
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("hedge-tail: %s under %s: %w", hedgeTailLabel(v, budget), f, err))
					if ctx.Err() != nil {
						break
					}
				}
			}
		}
	}
	prog.Done()
	return res, errors.Join(append(errs, cfg.write(res, started))...)
}

// startFaultCluster starts three in-process stores on loopback ports that
// accept faults (balancer paused, splits off), puts region 1's leader on
// store 1, and connects an admin client (loads, faults) to every store.
func startFaultCluster(ctx context.Context, logger *slog.Logger) (*cluster.Local, *client.Client, error) {
	lc, err := cluster.StartLocal(ctx, cluster.LocalConfig{
		NoSync: true, DisableBalancing: true, DisableSplit: true, AllowFaults: true,
		Logger: quietStores(logger),
	})
	if err != nil {
		return nil, nil, err
	}
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := lc.MoveLeader(mctx, hedgeTailRegion, 1); err != nil {
		lc.Stop()
		return nil, nil, err
	}
	admin, err := client.New(ctx, client.Config{Endpoints: lc.Endpoints, RequestTimeout: 10 * time.Second})
	if err != nil {
		lc.Stop()
		return nil, nil, fmt.Errorf("admin client: %w", err)
	}
	return lc, admin, nil
}

// loadKeys writes n keys of size-byte values (prefix/00000 ...) and returns
// the keys.
func loadKeys(ctx context.Context, cli *client.Client, prefix string, n, size int, prog *Progress) ([][]byte, error) {
	prog.Step(fmt.Sprintf("load %d keys", n), int64(n), 0)
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%s/%05d", prefix, i)
	}
	value := make([]byte, size)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	const workers = 16
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		done  int64
	)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				err := cli.Put(ctx, keys[i], value)
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("load %s: %w", keys[i], err)
				}
				done++
				prog.Update(done, 0)
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return keys, first
}

// newRunClient connects a fresh client: each run starts with empty latency
// windows and load estimates, so no run inherits another's.
func newRunClient(ctx context.Context, lc *cluster.Local) (*client.Client, error) {
	cli, err := client.New(ctx, client.Config{Endpoints: lc.Endpoints, RequestTimeout: 10 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	// Dial every store and learn the region before anything is timed.
	warm := cli.Session(client.ReadPolicy{Replica: client.ReplicaRoundRobin})
	for i := range 6 {
		if _, err := warm.Get(ctx, []byte("hedge-tail/warm-"+strconv.Itoa(i))); err != nil && !errors.Is(err, client.ErrNotFound) {
			_ = cli.Close()
			return nil, fmt.Errorf("warm-up read: %w", err)
		}
	}
	return cli, nil
}

// budgetsOf is the budgets v runs with: one run for hedge-off, one per
// budget for the others.
func (cfg *HedgeTailConfig) budgetsOf(v HedgeTailVariant) []float64 {
	if v.Hedge.Off() {
		return []float64{0}
	}
	return cfg.HedgeBudgets
}

// hedgeTailLabel names a variant with its budget: hedge-p999 with the
// client's default, hedge-p999-nocap with no cap, hedge-p999-budget2% with
// another.
func hedgeTailLabel(v HedgeTailVariant, budget float64) string {
	switch {
	case v.Hedge.Off() || budget == 0:
		return v.Name
	case budget >= 1:
		return v.Name + "-nocap"
	}
	return v.Name + "-budget" + strconv.FormatFloat(100*budget, 'g', -1, 64) + "%"
}

// budgetName is how a table names a run's budget.
func budgetName(v HedgeTailVariant, budget float64) string {
	switch {
	case v.Hedge.Off():
		return "–"
	case budget == 0:
		return fmt.Sprintf("%g%% / %v (default)", 100*client.DefaultHedgeBudget, client.DefaultHedgeWindow)
	case budget >= 1:
		return "no cap"
	}
	return fmt.Sprintf("%g%% / %v", 100*budget, client.DefaultHedgeWindow)
}

// budgetShare is the share a run's budget allows (1 for no cap).
func budgetShare(budget float64) float64 {
	if budget == 0 {
		return client.DefaultHedgeBudget
	}
	return budget
}

// labels is every run's label in run order (the plots' colours).
func (cfg *HedgeTailConfig) labels() []string {
	var out []string
	for _, v := range pickVariants(HedgeTailVariants, cfg.Variants, func(v HedgeTailVariant) string { return v.Name }) {
		for _, b := range cfg.budgetsOf(v) {
			out = append(out, hedgeTailLabel(v, b))
		}
	}
	return out
}

func (cfg *HedgeTailConfig) policy(v HedgeTailVariant, budget float64, fault string) client.ReadPolicy {
	p := client.ReadPolicy{Replica: client.ReplicaLeader, Hedge: v.Hedge, HedgeBudget: budget}
	if fault == FaultStallStale {
		p.MaxStaleness = cfg.MaxStaleness
	}
	return p
}

func (cfg *HedgeTailConfig) measure(ctx context.Context, lc *cluster.Local, admin *client.Client, leader uint64, keys [][]byte,
	v HedgeTailVariant, budget float64, fault string, prog *Progress) (*HedgeTailRun, error) {
	cli, err := newRunClient(ctx, lc)
	if err != nil {
		return nil, err
	}
	defer func() { _ = cli.Close() }()
	name := hedgeTailLabel(v, budget)
	label := name + " " + fault
	target := int64(cfg.Rate * cfg.RunDuration.Seconds())
	prog.Step(label, target, max(cfg.Warmup, 0)+cfg.RunDuration)
	read := func(s *client.Session) func(context.Context, int64) (client.ReadInfo, error) {
		return func(ctx context.Context, _ int64) (client.ReadInfo, error) {
			_, info, err := s.GetWithInfo(ctx, keys[rand.IntN(len(keys))])
			return info, err
		}
	}
	// One session for the warm-up and the run, as a user's long-lived
	// session: the client's latency windows are warm and the budget holds
	// what the warm-up's reads deposited; the run's counters are the
	// difference.
	sess := cli.Session(cfg.policy(v, budget, fault))
	if fault == FaultSlowLeader {
		// Slow for the session's whole life, warm-up included.
		if err := admin.Fault(ctx, leader, client.Fault{Delay: cfg.SlowDelay, Prob: cfg.SlowProb}); err != nil {
			return nil, fmt.Errorf("slow the leader: %w", err)
		}
	}
	prog.warmUp(label, cfg.Warmup, func() {
		runOpenLoop(ctx, openLoopSpec{Rate: cfg.Rate, Duration: cfg.Warmup, Timeout: 10 * time.Second, Read: read(sess)})
	})
	// The run's hedge counters; under slow-leader the session's whole
	// life's, since the store is slow for all of it (what the warm-up's
	// reads deposited may be spent in the run, and the budget's promise is
	// a share of the reads that deposited).
	var before client.HedgeStats
	if fault != FaultSlowLeader {
		before = sess.HedgeStats()
	}
	var (
		fwg  sync.WaitGroup
		ferr error
		n    int
	)
	fctx, fcancel := context.WithCancel(ctx)
	if fault != FaultSlowLeader {
		sched := pauseSchedule{store: leader, fault: fault, length: cfg.PauseLen, count: cfg.Pauses, within: cfg.RunDuration}
		fwg.Go(func() { n, ferr = sched.run(fctx, admin) })
	}
	r := runOpenLoop(ctx, openLoopSpec{Rate: cfg.Rate, Duration: cfg.RunDuration, Timeout: 10 * time.Second, Read: read(sess), OnProgress: prog.Update})
	fcancel()
	fwg.Wait()
	// Whatever happened, leave no fault behind for the next run.
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	cerr := admin.Fault(cctx, leader, client.Fault{Clear: true})
	ccancel()
	after := sess.HedgeStats()
	st := client.HedgeStats{
		Primaries:      after.Primaries - before.Primaries,
		HedgesSent:     after.HedgesSent - before.HedgesSent,
		HedgesWon:      after.HedgesWon - before.HedgesWon,
		DeniedByBudget: after.DeniedByBudget - before.DeniedByBudget,
	}
	run := &HedgeTailRun{
		Variant: v, Budget: budget, Label: name, Fault: fault, Row: r.row(name, fault), Latency: r.Latency, Stats: st,
		PausesInjected: n, PausedFor: time.Duration(n) * cfg.PauseLen, MaxLag: r.MaxLag, FirstErr: r.FirstErr,
	}
	run.Row.P95Ms = nil // not this scenario's figure
	if !v.Hedge.Off() {
		run.Row.ExtraRequestRatio = ptr(round(st.ExtraRequestRatio(), 5))
		run.Row.HedgesWon = ptr(int64(st.HedgesWon))
	}
	if now := lc.LeaderStore(hedgeTailRegion); now != leader {
		run.LeaderMoved = fmt.Sprintf("region %d's leader was on store %d, not %d, after the run", hedgeTailRegion, now, leader)
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := lc.MoveLeader(mctx, hedgeTailRegion, leader); err != nil {
			run.LeaderMoved += "; moving it back failed: " + err.Error()
		} else {
			run.LeaderMoved += "; moved back"
		}
		cancel()
	}
	if ferr != nil && ctx.Err() == nil {
		return run, fmt.Errorf("fault schedule: %w", ferr)
	}
	if cerr != nil {
		return run, fmt.Errorf("clear faults: %w", cerr)
	}
	if r.Failed > 0 {
		return run, fmt.Errorf("%d of %d reads failed; first: %s", r.Failed, r.OK+r.Failed, r.FirstErr)
	}
	return run, nil
}

// pauseSchedule injects count pauses of length into a store, evenly spaced
// over a run of within: pause k starts at (k+½)·within/count, so no pause
// touches the run's first or last moments.
type pauseSchedule struct {
	store  uint64
	fault  string
	length time.Duration
	count  int
	within time.Duration
}

// run injects the pauses through the admin Fault call, as `hedgekv ctl
// fault` does, and returns how many it injected.
func (s pauseSchedule) run(ctx context.Context, admin *client.Client) (int, error) {
	start := time.Now()
	every := s.within / time.Duration(s.count)
	n := 0
	for k := range s.count {
		at := start.Add(every/2 + time.Duration(k)*every)
		if err := sleepUntil(ctx, at); err != nil {
			return n, nil
		}
		switch s.fault {
		case FaultReadPause:
			// Every read arriving in the pause is held until the clear
			// ends it (the delay is the pause's length, so none is held
			// longer even if the clear is late).
			if err := admin.Fault(ctx, s.store, client.Fault{Delay: s.length, Prob: 1}); err != nil {
				return n, err
			}
			end := time.Now().Add(s.length)
			_ = sleepUntil(ctx, end)
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			err := admin.Fault(cctx, s.store, client.Fault{Clear: true})
			cancel()
			if err != nil {
				return n, err
			}
		case FaultStallStale:
			if err := admin.Fault(ctx, s.store, client.Fault{Stall: s.length}); err != nil {
				return n, err
			}
		}
		n++
	}
	return n, nil
}

// loadAvg is the machine's 1, 5 and 15 minute load averages ("" where
// /proc/loadavg does not exist).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], ", ")
}

// loadNote is a report line on how busy the machine was: the stores, the
// client and whatever else runs here share its CPUs, and a busy machine
// shows in the far tail.
func loadNote(before string) string {
	after := loadAvg()
	if before == "" || after == "" {
		return ""
	}
	return fmt.Sprintf("- Load average (1, 5, 15 min) of this machine before the run: %s; after: %s. The stores, the client and anything else running here share its %d CPUs; "+
		"a busy machine stalls reads on every store at once, and that shows in the far tail.\n", before, after, runtime.NumCPU())
}

func sleepUntil(ctx context.Context, at time.Time) error {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
