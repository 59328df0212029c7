package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

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
		if killErr = cfg.killLeader(rctx, c, v, run, start, end, &killedAt, &done, &failed, prog); killErr != nil {
			cancel()
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

	run.merge(stats, cfg.Step, end.Sub(start))
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

// killLeader shows the run's progress and, at KillAfter, SIGKILLs the store
// region 1's leader is on (as the stores themselves say), then watches for
// the next leader, until end or ctx ends; it records the kill in run and
// killedAt.
func (cfg *NodeKillConfig) killLeader(ctx context.Context, c *cluster.Processes, v NodeKillVariant, run *NodeKillRun, start, end time.Time, killedAt, done, failed *atomic.Int64, prog *Progress) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	killAt := start.Add(cfg.KillAfter)
	killed := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			prog.Update(done.Load(), failed.Load())
			if now.After(end) {
				return nil
			}
			if !killed && !now.Before(killAt) {
				killed = true
				leader := c.LeaderOf(ctx, nodeKillRegion)
				if leader == 0 {
					return fmt.Errorf("region %d has no leader to kill at %v", nodeKillRegion, now.Sub(start))
				}
				pid := c.PID(leader)
				if err := c.Kill(leader); err != nil {
					return err
				}
				run.KilledStore, run.KilledPID, run.KillAt = leader, pid, time.Since(start)
				killedAt.Store(int64(run.KillAt))
				cfg.Logger.Info("node-kill: killed the leader's store", "variant", v.Name, "store", leader, "pid", pid, "at", run.KillAt)
				prog.Printf("%s: kill -9 store %d (pid %d, region %d's leader) at %.2fs", v.Name, leader, pid, nodeKillRegion, run.KillAt.Seconds())
				tick.Reset(10 * time.Millisecond)
			}
			if killed && run.NewLeader == 0 {
				if l := c.LeaderOf(ctx, nodeKillRegion); l != 0 && l != run.KilledStore {
					run.NewLeader, run.ElectedAfter = l, time.Since(start)-run.KillAt
					tick.Reset(50 * time.Millisecond)
				}
			}
		}
	}
}

// merge adds up the readers' records into run: latency, modes, the
// timeline in steps, and the longest gap between successful reads in the
// run (at least runFor long).
func (run *NodeKillRun) merge(stats []*readerStats, step, runFor time.Duration) {
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
	run.Row = latencyRow(run.Variant.Name, "", run.Latency, run.Latency.TotalCount(), failedReads, run.Elapsed)
	for i, b := range tl {
		run.Row.Timeline = append(run.Row.Timeline, TimelinePoint{TMs: int64(i) * step.Milliseconds(), OK: b.ok, Failed: b.failed})
	}
	slices.Sort(okAt)
	prev := time.Duration(0)
	for _, at := range append(okAt, max(run.Elapsed, runFor)) {
		if gap := at - prev; gap > run.LongestGap {
			run.LongestGap, run.GapStart = gap, prev
		}
		prev = at
	}
	if run.Latency.TotalCount() > 0 {
		run.MaxMs = microsToMs(run.Latency.Max())
	}
}
