package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
)

// node-kill reproduces Cassandra 2.0.2's rapid read protection graph: a
// client reads steadily while the store leading the region is killed with
// SIGKILL, and we count the reads that succeed and fail in every 100 ms,
// with no protection, with hedged reads, and with hedged reads allowed to
// fall back to bounded-stale follower reads. The stores are real processes
// (`hedgekv server`), so the kill is a real kill -9: no shutdown, the
// kernel closes the sockets, and the other two stores must notice and elect.

// nodeKillRegion is the region whose leader is killed: with splits at their
// 64 MiB default, region 1 holds every key the scenario loads.
const nodeKillRegion = 1

// Election timing of the servers this scenario starts. The server has no
// flag for the election ticks, so they are raftstore.Config's default; raft
// randomizes each follower's timeout in [E, 2E) ticks.
const (
	nodeKillElectionTicks = 10
	nodeKillDefaultTick   = 50 * time.Millisecond
)

// NodeKillVariant is one read policy of node-kill.
type NodeKillVariant struct {
	Name string
	Doc  string
	// Stale: the session permits bounded-stale reads (MaxStaleness).
	Stale bool
	// Hedged: the session hedges (NodeKillConfig.Hedge).
	Hedged bool
}

// NodeKillVariants are node-kill's variants, in run order.
var NodeKillVariants = []NodeKillVariant{
	{Name: "no-protection", Doc: "leader reads, no hedging: every read waits for, or retries against, a leader"},
	{Name: "hedge-p99", Hedged: true, Doc: "leader reads hedged after the store's recent p99; linearizable, so a hedge to a follower is a ReadIndex read that needs a leader"},
	{Name: "hedge-stale", Hedged: true, Stale: true, Doc: "as hedge-p99, with a staleness bound: a hedge or retry to a follower becomes a bounded-stale read, which needs no leader"},
}

// NodeKillConfig configures RunNodeKill.
type NodeKillConfig struct {
	// Binary is the hedgekv binary whose `server` command runs the stores.
	Binary string
	// Quick: 1,000 keys, 8 threads, the kill 2s into a 5s run: well under
	// a minute on 2 cores. Explicit values below still win.
	Quick     bool
	Records   int64 // keys loaded (default 10,000; quick 1,000)
	ValueSize int   // bytes per value (default 100)
	Threads   int   // reader goroutines, each one read at a time (default 16; quick 8)
	Variants  []string
	// Warmup: unmeasured reads before each run, so that connections are up
	// and the p99 hedge delay has samples (default 2s; quick 1s; negative:
	// none).
	Warmup time.Duration
	// KillAfter: the leader's store is killed this long into the measured
	// run (default 5s; quick 2s); RunAfterKill: the run goes on this long
	// after the kill (default 10s; quick 3s).
	KillAfter    time.Duration
	RunAfterKill time.Duration
	// OpTimeout bounds every read: one not answered within it counts as
	// failed, as it would be for a user (default 1s).
	OpTimeout time.Duration
	// Step of the timeline (default 100ms).
	Step time.Duration
	// MaxStaleness of hedge-stale (default 5s: longer than an election,
	// so that the followers' data stays fresh enough until a new leader
	// advances their safe points).
	MaxStaleness time.Duration
	// Hedge of the hedged variants (default p99) and their budget (0: the
	// client's default, 5%).
	Hedge       client.Hedge
	HedgeBudget float64
	// Tick is the servers' raft tick (default 50ms); the election timeout
	// is 10 ticks.
	Tick time.Duration
	// Dir holds the stores' data and logs ("" a temporary directory,
	// removed at the end).
	Dir     string
	OutDir  string // results root: writes OutDir/node-kill
	NoPlots bool
	Command string
	// Progress (normally stderr) shows a progress line; nil: none.
	Progress io.Writer
	Logger   *slog.Logger
	Out      io.Writer
}

func (cfg *NodeKillConfig) setDefaults() error {
	if cfg.Binary == "" {
		return errors.New("no hedgekv binary given")
	}
	setDefault(&cfg.Records, quickOr[int64](cfg.Quick, 10000, 1000))
	setDefault(&cfg.ValueSize, 100)
	setDefault(&cfg.Threads, quickOr(cfg.Quick, 16, 8))
	var err error
	if cfg.Variants, err = chooseVariants(cfg.Variants, NodeKillVariants, func(v NodeKillVariant) string { return v.Name }); err != nil {
		return err
	}
	setDefaultIfZero(&cfg.Warmup, quickOr(cfg.Quick, 2*time.Second, time.Second))
	setDefault(&cfg.KillAfter, quickOr(cfg.Quick, 5*time.Second, 2*time.Second))
	setDefault(&cfg.RunAfterKill, quickOr(cfg.Quick, 10*time.Second, 3*time.Second))
	setDefault(&cfg.OpTimeout, time.Second)
	setDefault(&cfg.Step, 100*time.Millisecond)
	setDefault(&cfg.MaxStaleness, 5*time.Second)
	if cfg.Hedge.Off() {
		cfg.Hedge = client.HedgeAfterPercentile(0.99)
	}
	setDefault(&cfg.Tick, nodeKillDefaultTick)
	setOutputDefaults(&cfg.OutDir, &cfg.Logger, &cfg.Out)
	return nil
}

// ElectionTimeout is the stores' election timeout: raft's ElectionTick
// times the tick interval (a follower's randomized timeout lies in [E, 2E)).
func (cfg *NodeKillConfig) ElectionTimeout() time.Duration {
	tick := cfg.Tick
	if tick <= 0 {
		tick = nodeKillDefaultTick
	}
	return nodeKillElectionTicks * tick
}

func (cfg *NodeKillConfig) policy(v NodeKillVariant) client.ReadPolicy {
	p := client.ReadPolicy{Replica: client.ReplicaLeader}
	if v.Hedged {
		p.Hedge, p.HedgeBudget = cfg.Hedge, cfg.HedgeBudget
	}
	if v.Stale {
		p.MaxStaleness = cfg.MaxStaleness
	}
	return p
}

// NodeKillRun is one measured run of node-kill.
type NodeKillRun struct {
	Variant NodeKillVariant
	Row     Row
	Latency *hdrhistogram.Histogram // successful reads, µs
	Elapsed time.Duration
	// KilledStore was region 1's leader, killed KillAt into the run (pid
	// KilledPID); NewLeader claimed leadership ElectedAfter the kill (0:
	// not seen before the run ended).
	KilledStore  uint64
	KilledPID    int
	KillAt       time.Duration
	NewLeader    uint64
	ElectedAfter time.Duration
	// LongestGap is the longest time no read succeeded, starting GapStart
	// into the run (the run's start and end bound it too).
	LongestGap time.Duration
	GapStart   time.Duration
	MaxMs      float64
	// Modes and ModesAfterKill count successful reads by how they were
	// served (lease, read-index, stale): all of them, and those that ended
	// after the kill.
	Modes          map[string]int64
	ModesAfterKill map[string]int64
	Hedge          client.HedgeStats
	FirstErr       string
}

// NodeKillResult is what RunNodeKill measured.
type NodeKillResult struct {
	Runs  []NodeKillRun
	Load  time.Duration
	Dir   string
	Plots []string
	// Restarts says how each killed store came back.
	Restarts []string
	// PIDs are every server process started, restarts included; all have
	// exited when RunNodeKill returns.
	PIDs []int
}

// RunNodeKill starts three `hedgekv server` processes, loads the keys, and
// for each variant reads for KillAfter+RunAfterKill while the leader's store
// is killed KillAfter in, then restarts that store (same data directory)
// and waits until the cluster has settled before the next variant, so each
// variant starts from a full cluster with one agreed leader. It writes
// OutDir/node-kill/{results.json,report.md,*.png}.
//
// A restart, not a fresh cluster, per variant: it keeps the loaded data,
// saves a cluster start and a load per variant, and is what an operator
// does after a crash; the settle check (every store agrees on the leader
// and has applied its commit index) makes the next variant start as
// healthy as the first.
func RunNodeKill(ctx context.Context, cfg NodeKillConfig) (_ *NodeKillResult, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("node-kill: %w", err)
	}
	started := time.Now()
	variants := pickVariants(NodeKillVariants, cfg.Variants, func(v NodeKillVariant) string { return v.Name })
	prog := newProgress(cfg.Progress, "node-kill", 1+len(variants))
	defer prog.Done()

	prog.Printf("node-kill: starting three `%s server` processes", cfg.Binary)
	c, err := cluster.StartProcesses(ctx, cluster.ProcessesConfig{
		Binary: cfg.Binary, Dir: cfg.Dir, Tick: cfg.Tick,
		// Leaders stay where elections put them: no leader moves in the
		// middle of a run but the kill's.
		BalanceInterval: -time.Second,
		Logger:          cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("node-kill: %w", err)
	}
	res := &NodeKillResult{Dir: filepath.Join(cfg.OutDir, "node-kill")}
	defer func() {
		c.Stop()
		res.PIDs = c.PIDs()
	}()
	prog.Step("load", cfg.Records, 0)
	loadStart := time.Now()
	if err := cfg.load(ctx, c, prog); err != nil {
		return nil, fmt.Errorf("node-kill: %w", err)
	}
	res.Load = time.Since(loadStart)
	prog.Printf("loaded %d keys in %v", cfg.Records, res.Load.Round(time.Millisecond))

	var errs []error
	for vi, v := range variants {
		run, err := cfg.measure(ctx, c, v, prog)
		if run != nil {
			res.Runs = append(res.Runs, *run)
			prog.Printf("%-13s %8.1f reads/s  %6d failed  longest without a read %6.0f ms  (store %d killed at %.1fs, store %d led %.0f ms later)",
				v.Name, run.Row.QPS, run.Row.Failed, ms(run.LongestGap), run.KilledStore, run.KillAt.Seconds(), run.NewLeader, ms(run.ElectedAfter))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node-kill: %s: %w", v.Name, err))
			break
		}
		// The next variant starts from a full cluster; after the last
		// there is nothing to restart for.
		if vi+1 < len(variants) && run != nil && !c.Running(run.KilledStore) {
			t := time.Now()
			rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			err := c.Restart(rctx, run.KilledStore)
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("node-kill: %w", err))
				break
			}
			res.Restarts = append(res.Restarts, fmt.Sprintf("after %s: store %d restarted and the cluster settled in %v",
				v.Name, run.KilledStore, time.Since(t).Round(10*time.Millisecond)))
		}
	}
	prog.Done()
	return res, errors.Join(append(errs, cfg.write(res, started))...)
}

func nodeKillKey(i int64) []byte { return fmt.Appendf(nil, "nodekill/%08d", i) }

// nodeKillValue is key i's value: derived from i, so a read can check it.
func nodeKillValue(i int64, size int) []byte {
	v := bytes.Repeat([]byte{'a' + byte(i%26)}, size)
	copy(v, strconv.FormatInt(i, 10))
	return v
}

func (cfg *NodeKillConfig) load(ctx context.Context, c *cluster.Processes, prog *Progress) error {
	cli, err := client.New(ctx, client.Config{Endpoints: c.Endpoints})
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	defer cli.Close()
	var next, done atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range 32 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= cfg.Records || lctx.Err() != nil {
					return
				}
				if err := cli.Put(lctx, nodeKillKey(i), nodeKillValue(i, cfg.ValueSize)); err != nil {
					select {
					case errc <- fmt.Errorf("load: put key %d: %w", i, err):
					default:
					}
					cancel()
					return
				}
				prog.Update(done.Add(1), 0)
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
	}
	return ctx.Err()
}

// readerStats is one reader goroutine's record of a run.
type readerStats struct {
	hist     *hdrhistogram.Histogram
	buckets  []tlBucket
	okAt     []time.Duration // completion times of successful reads, since the run's start
	failed   int64
	modes    map[string]int64
	modesAK  map[string]int64 // after the kill
	firstErr error
}

// readLoad runs cfg.Threads readers until end (each finishes the read it
// has begun) and returns what each recorded; start is the run's time zero.
//
// killedAt, if not nil, holds when the kill happened (since start; 0:
// not yet), to tell the reads served after it.
func (cfg *NodeKillConfig) readLoad(ctx context.Context, sess *client.Session, start, end time.Time, killedAt, done, failed *atomic.Int64) []*readerStats {
	out := make([]*readerStats, cfg.Threads)
	var wg sync.WaitGroup
	for t := range cfg.Threads {
		st := &readerStats{hist: newHist(), modes: map[string]int64{}, modesAK: map[string]int64{}}
		out[t] = st
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(t), uint64(start.UnixNano())))
			for ctx.Err() == nil && time.Now().Before(end) {
				i := rng.Int64N(cfg.Records)
				began := time.Now()
				octx, cancel := context.WithTimeout(ctx, cfg.OpTimeout)
				v, info, err := sess.GetWithInfo(octx, nodeKillKey(i))
				cancel()
				now := time.Now()
				if ctx.Err() != nil {
					return // stopped: this read neither succeeded nor failed
				}
				if err == nil && !bytes.Equal(v, nodeKillValue(i, cfg.ValueSize)) {
					err = fmt.Errorf("key %d: read %d bytes that are not its value", i, len(v))
				}
				at := now.Sub(start)
				b := int(at / cfg.Step)
				if b >= len(st.buckets) {
					st.buckets = append(st.buckets, make([]tlBucket, b+1-len(st.buckets))...)
				}
				if err != nil {
					st.failed++
					st.buckets[b].failed++
					if st.firstErr == nil {
						st.firstErr = err
					}
					failed.Add(1)
				} else {
					_ = st.hist.RecordValue(min(now.Sub(began).Microseconds(), histMaxMicros))
					st.buckets[b].ok++
					st.okAt = append(st.okAt, at)
					st.modes[string(info.Mode)]++
					if killedAt != nil {
						if k := killedAt.Load(); k > 0 && int64(at) > k {
							st.modesAK[string(info.Mode)]++
						}
					}
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return out
}

// measure runs one variant: a warm-up, then the measured run with the kill.
func (cfg *NodeKillConfig) measure(ctx context.Context, c *cluster.Processes, v NodeKillVariant, prog *Progress) (*NodeKillRun, error) {
	runFor := cfg.KillAfter + cfg.RunAfterKill
	prog.Step(v.Name, 0, max(cfg.Warmup, 0)+runFor)
	// A fresh client per variant: no region cache or latency window
	// carried over from the previous variant's kill.
	cli, err := client.New(ctx, client.Config{Endpoints: c.Endpoints})
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	defer cli.Close()
	sess := cli.Session(cfg.policy(v))
	var done, failed atomic.Int64
	prog.warmUp(v.Name, cfg.Warmup, func() {
		now := time.Now()
		cfg.readLoad(ctx, sess, now, now.Add(cfg.Warmup), nil, &done, &failed)
	})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	hedgeBefore := sess.HedgeStats()
	done.Store(0)
	failed.Store(0)

	run := &NodeKillRun{Variant: v, Modes: map[string]int64{}, ModesAfterKill: map[string]int64{}}
	var killedAt atomic.Int64
	start := time.Now()
	end := start.Add(runFor)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var side sync.WaitGroup
	var killErr error
	side.Go(func() {
		// Progress, and the kill: at KillAfter, the store region 1's
		// leader is on (as the stores themselves say) gets SIGKILL; then
		// watch for the next leader.
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		killAt := start.Add(cfg.KillAfter)
		killed := false
		for {
			select {
			case <-rctx.Done():
				return
			case now := <-tick.C:
				prog.Update(done.Load(), failed.Load())
				if now.After(end) {
					return
				}
				if !killed && !now.Before(killAt) {
					killed = true
					leader := c.LeaderOf(rctx, nodeKillRegion)
					if leader == 0 {
						killErr = fmt.Errorf("region %d has no leader to kill at %v", nodeKillRegion, now.Sub(start))
						cancel()
						return
					}
					pid := c.PID(leader)
					if err := c.Kill(leader); err != nil {
						killErr = err
						cancel()
						return
					}
					run.KilledStore, run.KilledPID, run.KillAt = leader, pid, time.Since(start)
					killedAt.Store(int64(run.KillAt))
					cfg.Logger.Info("node-kill: killed the leader's store", "variant", v.Name, "store", leader, "pid", pid, "at", run.KillAt)
					prog.Printf("%s: kill -9 store %d (pid %d, region %d's leader) at %.2fs", v.Name, leader, pid, nodeKillRegion, run.KillAt.Seconds())
					tick.Reset(10 * time.Millisecond)
				}
				if killed && run.NewLeader == 0 {
					if l := c.LeaderOf(rctx, nodeKillRegion); l != 0 && l != run.KilledStore {
						run.NewLeader, run.ElectedAfter = l, time.Since(start)-run.KillAt
						tick.Reset(50 * time.Millisecond)
					}
				}
			}
		}
	})
	stats := cfg.readLoad(rctx, sess, start, end, &killedAt, &done, &failed)
	run.Elapsed = time.Since(start)
	cancel()
	side.Wait()
	if killErr != nil {
		return nil, fmt.Errorf("kill: %w", killErr)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if run.KilledStore == 0 {
		return nil, errors.New("the run ended before the kill")
	}

	// Merge the readers' records.
	run.Latency = newHist()
	var tl []tlBucket
	var okAt []time.Duration
	var firstErr error
	var failedReads int64
	for _, st := range stats {
		run.Latency.Merge(st.hist)
		failedReads += st.failed
		for m, n := range st.modes {
			run.Modes[m] += n
		}
		for m, n := range st.modesAK {
			run.ModesAfterKill[m] += n
		}
		for i, b := range st.buckets {
			if i >= len(tl) {
				tl = append(tl, make([]tlBucket, i+1-len(tl))...)
			}
			tl[i].ok += b.ok
			tl[i].failed += b.failed
		}
		okAt = append(okAt, st.okAt...)
		if firstErr == nil {
			firstErr = st.firstErr
		}
	}
	if firstErr != nil {
		run.FirstErr = firstErr.Error()
	}
	run.Row = latencyRow(v.Name, "", run.Latency, run.Latency.TotalCount(), failedReads, run.Elapsed)
	for i, b := range tl {
		run.Row.Timeline = append(run.Row.Timeline, TimelinePoint{TMs: int64(i) * cfg.Step.Milliseconds(), OK: b.ok, Failed: b.failed})
	}
	slices.Sort(okAt)
	prev := time.Duration(0)
	for _, at := range append(okAt, max(run.Elapsed, end.Sub(start))) {
		if gap := at - prev; gap > run.LongestGap {
			run.LongestGap, run.GapStart = gap, prev
		}
		prev = at
	}
	if run.Latency.TotalCount() > 0 {
		run.MaxMs = microsToMs(run.Latency.Max())
	}
	if v.Hedged {
		after := sess.HedgeStats()
		run.Hedge = client.HedgeStats{
			Primaries:      after.Primaries - hedgeBefore.Primaries,
			HedgesSent:     after.HedgesSent - hedgeBefore.HedgesSent,
			HedgesWon:      after.HedgesWon - hedgeBefore.HedgesWon,
			DeniedByBudget: after.DeniedByBudget - hedgeBefore.DeniedByBudget,
		}
		run.Row.ExtraRequestRatio = ptr(round(run.Hedge.ExtraRequestRatio(), 4))
		run.Row.HedgesWon = ptr(int64(run.Hedge.HedgesWon))
	}
	return run, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// nodeKillRow is a results.json row of node-kill: the common row plus
// what only this scenario has.
type nodeKillRow struct {
	Row
	OpTimeoutMs   int64   `json:"op_timeout_ms"`
	KilledStore   uint64  `json:"killed_store"`
	KillMs        int64   `json:"kill_ms"`
	NewLeader     uint64  `json:"new_leader_store"`
	ElectedMs     float64 `json:"elected_after_ms"`
	UnavailableMs float64 `json:"longest_unavailable_ms"`
	StaleReads    int64   `json:"stale_reads"`
	// ServedAfterKill: successful reads after the kill by how they were
	// served (lease, read-index, stale).
	ServedAfterKill map[string]int64 `json:"served_after_kill"`
}

func (cfg *NodeKillConfig) write(res *NodeKillResult, started time.Time) error {
	if len(res.Runs) == 0 {
		return nil
	}
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return fmt.Errorf("node-kill: %w", err)
	}
	var errs []error
	if !cfg.NoPlots {
		files, err := cfg.plots(res)
		res.Plots = files
		if err != nil {
			errs = append(errs, fmt.Errorf("node-kill: plots: %w", err))
		}
	}
	out := struct {
		Scenario string        `json:"scenario"`
		Rows     []nodeKillRow `json:"rows"`
	}{Scenario: "node-kill"}
	for _, r := range res.Runs {
		out.Rows = append(out.Rows, nodeKillRow{
			Row: r.Row, OpTimeoutMs: cfg.OpTimeout.Milliseconds(), KilledStore: r.KilledStore, KillMs: r.KillAt.Milliseconds(),
			NewLeader: r.NewLeader, ElectedMs: round(ms(r.ElectedAfter), 1), UnavailableMs: round(ms(r.LongestGap), 1),
			StaleReads: r.Modes["stale"], ServedAfterKill: r.ModesAfterKill,
		})
	}
	js, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("node-kill: encode results: %w", err))...)
	}
	table := cfg.table(res)
	if err := writeFileAtomic(filepath.Join(res.Dir, "results.json"), append(js, '\n')); err != nil {
		errs = append(errs, err)
	}
	if err := writeFileAtomic(filepath.Join(res.Dir, "report.md"), []byte(cfg.report(res, started, table))); err != nil {
		errs = append(errs, err)
	}
	fmt.Fprintf(cfg.Out, "\n%s\n", table)
	for _, t := range cfg.targets(res) {
		fmt.Fprintf(cfg.Out, "%s: %s (target %s) %s\n", t[0], t[1], t[2], t[3])
	}
	printWritten(cfg.Out, res.Dir, res.Plots)
	return errors.Join(errs...)
}

func (cfg *NodeKillConfig) table(res *NodeKillResult) string {
	var cells [][]string
	for _, r := range res.Runs {
		hedges := "–"
		if r.Variant.Hedged {
			hedges = fmt.Sprintf("%d sent, %d won (%.2f%% extra), %d denied", r.Hedge.HedgesSent, r.Hedge.HedgesWon,
				100*r.Hedge.ExtraRequestRatio(), r.Hedge.DeniedByBudget)
		}
		elected := "not seen"
		if r.NewLeader != 0 {
			elected = fmt.Sprintf("store %d after %.0f ms", r.NewLeader, ms(r.ElectedAfter))
		}
		cells = append(cells, []string{
			r.Variant.Name, strconv.FormatInt(r.Row.Ops-r.Row.Failed, 10), strconv.FormatInt(r.Row.Failed, 10), FormatFloat(r.Row.QPS, 1),
			FormatFloat(r.Row.P50Ms, 2), FormatFloat(r.Row.P99Ms, 2), FormatFloat(r.Row.P999Ms, 1), FormatFloat(r.Row.P9999Ms, 1),
			FormatFloat(r.MaxMs, 1), FormatFloat(ms(r.LongestGap), 0),
			fmt.Sprintf("store %d at %.2fs", r.KilledStore, r.KillAt.Seconds()), elected,
			modesString(r.ModesAfterKill), hedges,
		})
	}
	return MarkdownTable([]string{"variant", "ok", "failed", "ok reads/s", "p50 ms", "p99 ms", "p99.9 ms", "p99.99 ms", "max ms",
		"longest without a read, ms", "killed", "new leader", "served after the kill", "hedges"}, cells)
}

// targets: [what, measured, target, verdict] for the report.
func (cfg *NodeKillConfig) targets(res *NodeKillResult) [][]string {
	verdict := func(ok bool) string {
		if ok {
			return "**met**"
		}
		return "not met"
	}
	bound := cfg.ElectionTimeout() * 3 / 2
	var out [][]string
	for _, r := range res.Runs {
		if r.Variant.Stale {
			out = append(out, []string{r.Variant.Name + ": failed reads", strconv.FormatInt(r.Row.Failed, 10), "0", verdict(r.Row.Failed == 0)})
			continue
		}
		out = append(out, []string{r.Variant.Name + ": longest time without a successful read", FormatFloat(ms(r.LongestGap), 0) + " ms",
			fmt.Sprintf("≤ 1.5 × election timeout = %.0f ms", ms(bound)), verdict(r.LongestGap <= bound)})
	}
	return out
}

func (cfg *NodeKillConfig) report(res *NodeKillResult, started time.Time, table string) string {
	var b strings.Builder
	writeReportHeader(&b, "node-kill: reads while the leader's store is killed (Cassandra rapid read protection)", started, cfg.Command)
	e := cfg.ElectionTimeout()
	fmt.Fprintf(&b, "- Three stores, each a `hedgekv server` process (`%s`), on loopback ports, zones dc-a, dc-b, dc-c, balancer off so that only the kill moves a leader. ",
		filepath.Base(cfg.Binary))
	fmt.Fprintf(&b, "Raft tick %v, election timeout %d ticks = %v (each follower's randomized in [%v, %v)).\n", cfg.Tick, nodeKillElectionTicks, e, e, 2*e)
	fmt.Fprintf(&b, "- Region %d holds all %d keys (%d-byte values), loaded in %v. %d reader goroutines, each one `Get` of a uniformly chosen key at a time, checking the value it gets; ",
		nodeKillRegion, cfg.Records, cfg.ValueSize, res.Load.Round(time.Millisecond), cfg.Threads)
	fmt.Fprintf(&b, "a fresh client and a %v unmeasured warm-up per variant, then %v measured.\n", max(cfg.Warmup, 0), cfg.KillAfter+cfg.RunAfterKill)
	fmt.Fprintf(&b, "- **The kill**: %v into each run, the store that region %d's leader is on (as the stores themselves report it) gets SIGKILL: no shutdown, the kernel closes its sockets. ",
		cfg.KillAfter, nodeKillRegion)
	fmt.Fprintf(&b, "The run goes on for %v. Then the store is restarted on its data directory and the next variant waits until every store names the same leader and has applied its commit index.\n", cfg.RunAfterKill)
	fmt.Fprintf(&b, "- **A read fails** when it returns an error within the per-read timeout of **%v** (a read that takes longer is unavailable to a user, so the client gives up). ", cfg.OpTimeout)
	b.WriteString("Latencies are of successful reads. \"Longest without a read\" is the longest time in the run during which no reader completed a successful read: ")
	b.WriteString("how long the region was unavailable to these clients.\n")
	fmt.Fprintf(&b, "- Hedge: %s, budget %s; staleness bound of hedge-stale: %v.\n", cfg.Hedge, budgetString(cfg.HedgeBudget), cfg.MaxStaleness)
	for _, r := range res.Restarts {
		fmt.Fprintf(&b, "- %s.\n", r)
	}
	writeVariantList(&b, "Variants (every one reads from the leader first):", NodeKillVariants, cfg.Variants, func(v NodeKillVariant) (string, string) { return v.Name, v.Doc })
	b.WriteString("\n## Reads\n\n")
	b.WriteString(table)
	b.WriteString("\n## Targets\n\n")
	b.WriteString(MarkdownTable([]string{"what", "measured", "target", ""}, cfg.targets(res)))
	hb := 2 * cfg.Tick // the servers' heartbeat: raftstore's default 2 ticks
	fmt.Fprintf(&b, "\nA linearizable read needs a leader, so the linearizable variants cannot read from the kill until a new leader is elected: "+
		"each follower campaigns when its own election timeout, drawn in [%v, %v), runs out after the last heartbeat it got (heartbeats every %v), "+
		"so the election alone lands between about %v and %v after the kill, and the 1.5× target holds for the draws where the earlier of the two followers' timeouts is short enough. "+
		"One kill per variant is one draw; the new-leader column shows it.\n", e, 2*e, hb, e-hb, 2*e)
	b.WriteString("\nCassandra 2.0.2 with rapid read protection (speculative retry at the 99th percentile, ~1% extra requests): a killed node drops no request.\n")
	b.WriteString("\n## Around the kill (per 100 ms)\n\n")
	for _, r := range res.Runs {
		fmt.Fprintf(&b, "- `%s`: %s\n", r.Variant.Name, aroundKill(r, cfg.Step))
	}
	for _, r := range res.Runs {
		if r.FirstErr != "" {
			fmt.Fprintf(&b, "\nFirst failed read of %s: %s\n", r.Variant.Name, inlineCode(r.FirstErr))
		}
	}
	writePlots(&b, res.Plots)
	return b.String()
}

// modesString renders read counts by mode, most first.
func modesString(m map[string]int64) string {
	modes := sortedKeys(m)
	slices.SortStableFunc(modes, func(a, b string) int { return cmp.Compare(m[b], m[a]) })
	var parts []string
	for _, k := range modes {
		name := k
		if name == "" {
			name = "unknown"
		}
		parts = append(parts, fmt.Sprintf("%s %d", name, m[k]))
	}
	if len(parts) == 0 {
		return "–"
	}
	return strings.Join(parts, ", ")
}

func budgetString(b float64) string {
	switch {
	case b == 0:
		return fmt.Sprintf("%g%% of the reads over %v, per store (the client's default)", 100*client.DefaultHedgeBudget, client.DefaultHedgeWindow)
	case b < 0:
		return "none"
	case b >= 1:
		return "no cap"
	}
	return fmt.Sprintf("%g%% of the reads over %v, per store", 100*b, client.DefaultHedgeWindow)
}

// aroundKill renders ok/failed of the buckets from 300 ms before the kill
// to 1.5 s after it.
func aroundKill(r NodeKillRun, step time.Duration) string {
	var parts []string
	for _, p := range r.Row.Timeline {
		t := time.Duration(p.TMs) * time.Millisecond
		if t+step <= r.KillAt-300*time.Millisecond || t > r.KillAt+1500*time.Millisecond {
			continue
		}
		s := fmt.Sprintf("%.1fs %d", t.Seconds(), p.OK)
		if p.Failed > 0 {
			s += fmt.Sprintf("/**%d failed**", p.Failed)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// plots draws Cassandra's graph: successful reads per second and failed
// reads per 100 ms over time, per variant, the kill marked.
func (cfg *NodeKillConfig) plots(res *NodeKillResult) ([]string, error) {
	names := variantNames(NodeKillVariants, func(v NodeKillVariant) string { return v.Name })
	runFor := (cfg.KillAfter + cfg.RunAfterKill).Seconds()
	perSec := float64(time.Second) / float64(cfg.Step)
	var files []string
	var errs []error
	for _, m := range []struct {
		file, title, label string
		get                func(TimelinePoint) float64
	}{
		{"node-kill-throughput.png", "node-kill: successful reads while the leader's store is killed", "successful reads per second (per 100 ms)",
			func(p TimelinePoint) float64 { return float64(p.OK) * perSec }},
		{"node-kill-failed.png", fmt.Sprintf("node-kill: failed reads (error or > %v) per 100 ms", cfg.OpTimeout), "failed reads per 100 ms",
			func(p TimelinePoint) float64 { return float64(p.Failed) }},
	} {
		p := newPlot(m.title, "time since the run began (s)", m.label)
		var ss []series
		top := 0.0
		for _, r := range res.Runs {
			var xys plotter.XYs
			for _, pt := range r.Row.Timeline {
				x := float64(pt.TMs)/1000 + cfg.Step.Seconds()/2
				if x > runFor {
					break // the last bucket is partial
				}
				y := m.get(pt)
				top = max(top, y)
				xys = append(xys, plotter.XY{X: x, Y: y})
			}
			if len(xys) > 0 {
				ss = append(ss, series{name: r.Variant.Name, xys: xys})
			}
		}
		if len(ss) == 0 {
			continue
		}
		if top == 0 {
			top = 1
		}
		if err := addSeries(p, names, ss, false); err != nil {
			errs = append(errs, err)
			continue
		}
		// The kill: one dashed vertical line per variant, in its colour
		// (the kills land within a few ms of each other).
		for _, r := range res.Runs {
			k := r.KillAt.Seconds()
			l, err := plotter.NewLine(plotter.XYs{{X: k, Y: 0}, {X: k, Y: top * 1.1}})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			i := max(0, slices.Index(names, r.Variant.Name))
			l.Color = plotColors[i%len(plotColors)]
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			p.Add(l)
		}
		black := color.RGBA{A: 0xff}
		lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: res.Runs[0].KillAt.Seconds(), Y: top * 1.1}}, Labels: []string{" kill -9 leader"}})
		if err == nil {
			lbl.TextStyle[0].Color = black
			p.Add(lbl)
		}
		p.X.Min, p.X.Max = 0, runFor
		p.Y.Min, p.Y.Max = 0, top*1.2
		p.Legend.Left, p.Legend.Top = false, false
		p.Legend.XOffs, p.Legend.YOffs = -vg.Points(12), vg.Points(12)
		f, err := savePlot(p, res.Dir, m.file)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		files = append(files, f)
	}
	return files, errors.Join(errs...)
}
