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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"gonum.org/v1/plot/plotter"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/netsim"
	"github.com/hedgekv/hedgekv/raftstore"
)

// follower-lease measures what follower read leases (raftstore's quorum
// leases, Config.FollowerLeases) give and what they cost, each side by side
// in one run:
//
//   - Reads: YCSB workload C on one machine, the followers' lease reads
//     against the leader's lease reads, on the same cluster (leases on).
//   - Writes: the latency of puts with leases off and on, on one machine
//     and across the simulated WAN: with leases on a write commits only
//     once a quorum AND every valid lease holder has it.
//   - A dead holder: a follower holding a lease is killed (its in-process
//     server stopped) or cut off (a blackhole partition) while writes run;
//     the leader cannot commit without it until its lease runs out, so
//     the writes stall for at most one lease. With leases off the same
//     kill stalls nothing (the control).
//
// Leases are a setting of the whole cluster, so each place (one machine,
// the WAN) gets a cluster with leases on and one with them off, started
// one after the other, never at once (they would share the CPUs).

// FollowerLeaseVariant is one row kind of follower-lease.
type FollowerLeaseVariant struct {
	Name string
	// Leases: the cluster runs with follower leases on.
	Leases bool
	// Read: YCSB workload C through Replica; otherwise puts.
	Read    bool
	Replica client.ReplicaPolicy
	// Kill: a follower's store is killed (one machine) or partitioned
	// away (WAN) a third of the way into the run.
	Kill bool
	// Move: region 1's leadership moves to store 2 a third of the way
	// into the run (and back to store 1 after it, unmeasured).
	Move bool
	Doc  string
}

// FollowerLeaseVariants are follower-lease's variants, in report order.
var FollowerLeaseVariants = []FollowerLeaseVariant{
	{Name: "leader-lease", Leases: true, Read: true, Replica: client.ReplicaLeader,
		Doc: "YCSB workload C, every read from the leader (its own lease, no round trip)"},
	{Name: "follower-lease", Leases: true, Read: true, Replica: client.ReplicaFollower,
		Doc: "YCSB workload C, every read from a follower (`ReplicaFollower`), served from the follower's read lease"},
	{Name: "writes-leases-off", Doc: "puts, follower leases off: a write commits once a quorum (the leader and one follower) has it"},
	{Name: "writes-leases-on", Leases: true, Doc: "puts, follower leases on, both followers holding leases: a write commits once a quorum and every valid holder has it"},
	{Name: "writes-new-leader", Leases: true, Move: true,
		Doc: "as writes-leases-on, and a third of the way in the leadership moves to store 2 (a transfer): the new leader holds its first commit back for one follower lease plus drift and a tick, in case a grant of the old leader's is still valid"},
	{Name: "writes-new-leader-off", Move: true,
		Doc: "the control: the same transfer with leases off"},
	{Name: "writes-dead-holder", Leases: true, Kill: true,
		Doc: "as writes-leases-on, and a third of the way in a follower holding a lease dies (one machine: its in-process server is stopped; WAN: a blackhole partition cuts it off); the leader holds commits back until that lease runs out"},
	{Name: "writes-dead-follower", Kill: true,
		Doc: "the control: as writes-dead-holder with leases off; a quorum remains, so nothing should stall"},
}

// Where the write rows run (Row.Param).
const (
	flPlaceLocal = "one machine"
	flWorkloadC  = "workload c"
)

// flVictim is the follower killed by the dead-holder rows: region 1's
// leader is put on store 1, so store 3 is a follower (in dc-c on the WAN).
const flVictim = 3

// flDefaultLease is the follower lease the stores grant with raftstore's
// defaults: the leader lease, (ElectionTicks-2) ticks of 50 ms less the
// 10% drift margin. A dead holder should stall writes no longer.
const flDefaultLease = time.Duration(float64(8*50*time.Millisecond) * 0.9)

// flDefaultDefer is how long a new leader holds its first commit back
// with those defaults: one lease plus the drift margin plus a tick
// (raftstore's followerLeaseDefer).
const flDefaultDefer = flDefaultLease + flDefaultLease/10 + 50*time.Millisecond

// FollowerLeaseConfig configures RunFollowerLease.
type FollowerLeaseConfig struct {
	// Quick: 1,000 records, 2 s runs: under a minute on 2 cores. Explicit
	// values below still win.
	Quick    bool
	Variants []string // default all
	Records  int64    // workload C's records (default 10,000; quick 1,000)
	Threads  int      // workload C's client threads (default 32)
	// WriteThreads put in a closed loop, each one put at a time (default
	// 16), to keys among WriteKeys (default 1,000) of ValueSize bytes
	// (default 128).
	WriteThreads int
	WriteKeys    int
	ValueSize    int
	// RunDuration of every measured run (default 10s; quick 2s); Warmup
	// before each, unmeasured (default 1s; quick 300ms; negative: none).
	RunDuration time.Duration
	Warmup      time.Duration
	// MaxOps, if > 0, also ends a read run after that many operations
	// (tests).
	MaxOps int64
	// Topology of the WAN write rows (default netsim.Default()); NoWAN
	// skips them.
	Topology     *netsim.Topology
	TopologyName string
	NoWAN        bool
	// Step of the dead-holder rows' timelines (default 50ms).
	Step    time.Duration
	OutDir  string // results root: writes OutDir/follower-lease
	NoPlots bool
	Command string
	// Progress (normally stderr) shows a progress line; nil: none.
	Progress io.Writer
	Logger   *slog.Logger
	Out      io.Writer
}

func (cfg *FollowerLeaseConfig) setDefaults() error {
	var err error
	if cfg.Variants, err = chooseVariants(cfg.Variants, FollowerLeaseVariants, func(v FollowerLeaseVariant) string { return v.Name }); err != nil {
		return err
	}
	setDefault(&cfg.Records, quickOr[int64](cfg.Quick, 10000, 1000))
	setDefault(&cfg.Threads, 32)
	setDefault(&cfg.WriteThreads, 16)
	setDefault(&cfg.WriteKeys, 1000)
	setDefault(&cfg.ValueSize, 128)
	setDefault(&cfg.RunDuration, quickOr(cfg.Quick, 10*time.Second, 2*time.Second))
	setDefaultIfZero(&cfg.Warmup, quickOr(cfg.Quick, time.Second, 300*time.Millisecond))
	if cfg.Topology == nil {
		cfg.Topology, cfg.TopologyName = netsim.Default(), netsim.DefaultTopology
	}
	if cfg.TopologyName == "" {
		cfg.TopologyName = "custom"
	}
	if !cfg.NoWAN {
		if err := cfg.Topology.Validate(); err != nil {
			return err
		}
		if z, ok := cfg.Topology.ZoneOf(1); !ok || !slices.Contains(cfg.Topology.Stores(), flVictim) {
			return fmt.Errorf("the topology needs stores 1 and %d (store 1 leads, store %d is the dead holder)", flVictim, flVictim)
		} else if z2, _ := cfg.Topology.ZoneOf(flVictim); z2 == z {
			return fmt.Errorf("stores 1 and %d share zone %s: the WAN rows need the holder across the WAN", flVictim, z)
		}
	}
	setDefault(&cfg.Step, 50*time.Millisecond)
	setOutputDefaults(&cfg.OutDir, &cfg.Logger, &cfg.Out)
	return nil
}

func (cfg *FollowerLeaseConfig) wanPlace() string { return "WAN " + cfg.TopologyName }

// FollowerLeaseRun is one measured run.
type FollowerLeaseRun struct {
	Variant FollowerLeaseVariant
	Place   string // flPlaceLocal or the WAN
	Row     Row
	Latency *hdrhistogram.Histogram
	// Kill and Move rows: when the follower died (the transfer started),
	// how long writes then stalled (from that moment to the first write
	// completed after it, or the longest gap after it if longer), and
	// whether the victim held a lease just before.
	KilledAt    time.Duration
	StallAfter  time.Duration
	VictimLease bool
	// Holders: the followers that served a lease read just before the
	// run (leases-on write rows), e.g. "store 2, store 3".
	Holders  string
	FirstErr string
}

// FollowerLeaseResult is what RunFollowerLease measured.
type FollowerLeaseResult struct {
	Rows  []Row
	Runs  []FollowerLeaseRun
	Dir   string
	Plots []string
	// LoadBefore is the machine's load average as the scenario started.
	LoadBefore string
	Notes      []string
}

// RunFollowerLease runs the scenario and writes
// OutDir/follower-lease/{results.json,report.md,*.png}.
func RunFollowerLease(ctx context.Context, cfg FollowerLeaseConfig) (*FollowerLeaseResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("follower-lease: %w", err)
	}
	started := time.Now()
	res := &FollowerLeaseResult{Dir: filepath.Join(cfg.OutDir, "follower-lease"), LoadBefore: loadAvg()}
	want := func(leases bool, pred func(FollowerLeaseVariant) bool) []FollowerLeaseVariant {
		var out []FollowerLeaseVariant
		for _, v := range FollowerLeaseVariants {
			if v.Leases == leases && pred(v) && slices.Contains(cfg.Variants, v.Name) {
				out = append(out, v)
			}
		}
		return out
	}
	all := func(FollowerLeaseVariant) bool { return true }
	writes := func(v FollowerLeaseVariant) bool { return !v.Read }
	// The clusters, in run order. Within one, the kill comes last: the
	// cluster is not the same after it.
	type phase struct {
		wan      bool
		leases   bool
		variants []FollowerLeaseVariant
	}
	phases := []phase{
		{false, true, want(true, all)},
		{false, false, want(false, all)},
	}
	if !cfg.NoWAN {
		phases = append(phases, phase{true, false, want(false, writes)}, phase{true, true, want(true, writes)})
	}
	steps := 0
	for _, p := range phases {
		steps += len(p.variants)
	}
	prog := newProgress(cfg.Progress, "follower-lease", steps+1)
	defer prog.Done()

	var errs []error
	loaded := false
	for _, p := range phases {
		if len(p.variants) == 0 {
			continue
		}
		needLoad := !loaded && slices.ContainsFunc(p.variants, func(v FollowerLeaseVariant) bool { return v.Read })
		err := cfg.runPhase(ctx, p.wan, p.leases, p.variants, needLoad, res, prog)
		loaded = loaded || needLoad
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	prog.Done()
	return res, errors.Join(append(errs, cfg.write(res, started))...)
}

// flCluster is one of the scenario's clusters: on one machine (lc only)
// or behind the WAN (wc too).
type flCluster struct {
	lc     *cluster.Local
	wc     *wanCluster
	leases bool
	place  string
	zone   string // the writers' zone: the leader's ("" on one machine)
}

func (c *flCluster) endpoints() []string {
	if c.wc != nil {
		return c.wc.ZoneEndpoints(c.zone)
	}
	return slices.Clone(c.lc.Endpoints)
}

func (cfg *FollowerLeaseConfig) startCluster(ctx context.Context, wan, leases bool) (*flCluster, error) {
	c := &flCluster{leases: leases, place: flPlaceLocal}
	if wan {
		c.place = cfg.wanPlace()
		c.zone, _ = cfg.Topology.ZoneOf(1)
		wc, err := startWANClusterWith(ctx, cfg.Topology, c.zone, cfg.Logger, leases)
		if err != nil {
			return nil, err
		}
		c.wc, c.lc = wc, wc.Local
		if wc.leaderStore != 1 {
			wc.Stop()
			return nil, fmt.Errorf("the leader went to store %d, not store 1 (the first store of %s)", wc.leaderStore, c.zone)
		}
		return c, nil
	}
	lc, err := cluster.StartLocal(ctx, cluster.LocalConfig{
		NoSync: true, DisableBalancing: true, DisableSplit: true, FollowerLeases: leases,
		Logger: quietStores(cfg.Logger),
	})
	if err != nil {
		return nil, err
	}
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := lc.MoveLeader(mctx, hotRegionID, 1); err != nil {
		lc.Stop()
		return nil, err
	}
	c.lc = lc
	return c, nil
}

// runPhase starts one cluster, runs variants on it and stops it.
func (cfg *FollowerLeaseConfig) runPhase(ctx context.Context, wan, leases bool, variants []FollowerLeaseVariant, load bool,
	res *FollowerLeaseResult, prog *Progress) error {
	state := map[bool]string{false: "off", true: "on"}[leases]
	where := flPlaceLocal
	if wan {
		where = cfg.wanPlace()
	}
	prog.Printf("follower-lease: starting 3 stores (%s), follower leases %s", where, state)
	c, err := cfg.startCluster(ctx, wan, leases)
	if err != nil {
		return fmt.Errorf("follower-lease: %s, leases %s: %w", where, state, err)
	}
	defer c.lc.Stop()
	cli, err := client.New(ctx, client.Config{Endpoints: c.endpoints(), Zone: c.zone, RequestTimeout: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("follower-lease: client: %w", err)
	}
	defer func() { _ = cli.Close() }()
	if load {
		if err := cfg.loadC(ctx, c, prog); err != nil {
			return err
		}
	}
	keys, err := loadKeys(ctx, cli, "fl", cfg.WriteKeys, cfg.ValueSize, nil)
	if err != nil {
		return fmt.Errorf("follower-lease: %w", err)
	}
	var errs []error
	for _, v := range variants {
		var run *FollowerLeaseRun
		if v.Read {
			run, err = cfg.measureReads(ctx, c, v, prog)
		} else {
			run, err = cfg.measureWrites(ctx, c, cli, keys, v, prog)
		}
		if run != nil {
			res.Runs = append(res.Runs, *run)
			res.Rows = append(res.Rows, run.Row)
			line := fmt.Sprintf("%-20s %-12s %8.0f ops/s  p50 %7.2f ms  p99 %7.2f ms", v.Name, run.Place, run.Row.QPS, run.Row.P50Ms, run.Row.P99Ms)
			if run.Row.MaxStallMs != nil {
				line += fmt.Sprintf("  longest stall %.0f ms", *run.Row.MaxStallMs)
			}
			prog.Printf("%s  %s", line, failedNote(run.Row.Failed))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("follower-lease: %s (%s): %w", v.Name, where, err))
			if ctx.Err() != nil {
				break
			}
		}
	}
	return errors.Join(errs...)
}

// loadC loads workload C's records through the leader.
func (cfg *FollowerLeaseConfig) loadC(ctx context.Context, c *flCluster, prog *Progress) error {
	db, err := ycsbdb.Open(ctx, ycsbdb.Options{Endpoints: c.endpoints(), Zone: c.zone, DialTimeout: 10 * time.Second, RequestTimeout: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("follower-lease: %w", err)
	}
	defer func() { _ = db.Close() }()
	prog.Step(fmt.Sprintf("load %d records", cfg.Records), cfg.Records, 0)
	r, err := Run(ctx, Spec{
		Instance: db, Workload: "c", Records: cfg.Records, Threads: max(cfg.Threads, 32), Load: true,
		Variant: "load", ProgressInterval: -1, QuietWorkload: true, OnProgress: prog.Update, Logger: cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("follower-lease: load: %w", err)
	}
	if r.Load.Row.Failed > 0 {
		return fmt.Errorf("follower-lease: load: %d of %d inserts failed; first: %s", r.Load.Row.Failed, cfg.Records, r.Load.Total.FirstErr)
	}
	return nil
}

func (cfg *FollowerLeaseConfig) measureReads(ctx context.Context, c *flCluster, v FollowerLeaseVariant, prog *Progress) (*FollowerLeaseRun, error) {
	db, err := ycsbdb.Open(ctx, ycsbdb.Options{
		Endpoints: c.endpoints(), Zone: c.zone, Read: client.ReadPolicy{Replica: v.Replica},
		DialTimeout: 10 * time.Second, RequestTimeout: 30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = db.Close() }()
	spec := Spec{
		Instance: db, Workload: "c", Records: cfg.Records, Threads: cfg.Threads, Run: true,
		Variant: v.Name, Param: flWorkloadC, ProgressInterval: -1, QuietWorkload: true, Logger: cfg.Logger,
		AbortAfterFailures: -1,
	}
	var before map[uint64]raftstore.Stats
	phase, err := runTimed(ctx, spec, v.Name, cfg.MaxOps, cfg.Warmup, cfg.RunDuration, prog, func() { before = c.lc.Stats() })
	if phase == nil {
		return nil, err
	}
	after := c.lc.Stats()
	run := &FollowerLeaseRun{Variant: v, Place: flPlaceLocal, Row: phase.Row, Latency: phase.Latency, FirstErr: phase.Total.FirstErr}
	run.Row.Param = flWorkloadC
	run.Row.ServedBy = (&wanCluster{Local: c.lc}).servedBy(statsDelta(before, after))
	if err == nil && run.Row.Failed > 0 {
		err = fmt.Errorf("%d of %d reads failed; first: %s", run.Row.Failed, run.Row.Ops, run.FirstErr)
	}
	return run, err
}

// leaseHolders returns the followers of region 1 that serve a lease read
// now (each asked directly, a few tries: a renewal may be in flight).
func leaseHolders(ctx context.Context, lc *cluster.Local) []uint64 {
	var out []uint64
	for _, id := range lc.StoreIDs() {
		if id == lc.LeaderStore(hotRegionID) {
			continue
		}
		if holdsLease(ctx, lc, id) {
			out = append(out, id)
		}
	}
	return out
}

func holdsLease(ctx context.Context, lc *cluster.Local, store uint64) bool {
	srv := lc.Server(store)
	if srv == nil {
		return false
	}
	for range 20 {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, _, info, err := srv.Store().Get(rctx, raftstore.ReadOptions{RegionID: hotRegionID, ReplicaRead: true}, []byte("fl/00000"))
		cancel()
		if err == nil && info.Mode == raftstore.ReadModeFollowerLease {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func fmtStores(ids []uint64) string {
	if len(ids) == 0 {
		return "none"
	}
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = "store " + strconv.FormatUint(id, 10)
	}
	return strings.Join(parts, ", ")
}

func (cfg *FollowerLeaseConfig) measureWrites(ctx context.Context, c *flCluster, cli *client.Client, keys [][]byte,
	v FollowerLeaseVariant, prog *Progress) (*FollowerLeaseRun, error) {
	value := make([]byte, cfg.ValueSize)
	for i := range value {
		value[i] = byte('A' + i%26)
	}
	label := v.Name + " " + c.place
	prog.Step(label, 0, max(cfg.Warmup, 0)+cfg.RunDuration)
	prog.warmUp(label, cfg.Warmup, func() {
		runWrites(ctx, writeSpec{Client: cli, Keys: keys, Value: value, Threads: cfg.WriteThreads, Duration: cfg.Warmup})
	})
	run := &FollowerLeaseRun{Variant: v, Place: c.place}
	if c.leases {
		run.Holders = fmtStores(leaseHolders(ctx, c.lc))
	}
	spec := writeSpec{Client: cli, Keys: keys, Value: value, Threads: cfg.WriteThreads, Duration: cfg.RunDuration, Step: cfg.Step, OnProgress: prog.Update}
	var killErr error
	if v.Move {
		spec.At = cfg.RunDuration / 3
		spec.Do = func() {
			mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			killErr = c.lc.MoveLeader(mctx, hotRegionID, 2)
		}
	}
	if v.Kill {
		spec.At = cfg.RunDuration / 3
		spec.Do = func() {
			// Just before: does the victim hold a lease? (It asks for a
			// renewal every tick once half of it is gone, so it should.)
			if c.leases {
				run.VictimLease = holdsLease(ctx, c.lc, flVictim)
			}
			if c.wc != nil {
				killErr = c.wc.Network().Partition(flVictim)
				return
			}
			// Stop waits for the server's drain; the store is gone from
			// raft's view at once (its transport closes), which is the
			// moment that counts, so the stop runs on its own.
			go c.lc.Server(flVictim).Stop()
		}
	}
	r := runWrites(ctx, spec)
	run.Row, run.Latency, run.FirstErr = r.row(v.Name, c.place), r.Latency, r.FirstErr
	run.Row.MaxStallMs = ptr(round(float64(r.MaxStall)/float64(time.Millisecond), 1))
	if v.Kill || v.Move {
		run.KilledAt, run.StallAfter = r.DidAt, r.StallAfter
		run.Row.Timeline = r.Timeline
	}
	if v.Move {
		// Back where the other rows expect it, unmeasured, and past the
		// new leader's deferral before the next run starts.
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := c.lc.MoveLeader(mctx, hotRegionID, 1)
		cancel()
		if err != nil && killErr == nil {
			killErr = err
		}
		if err := sleepUntil(ctx, time.Now().Add(2*flDefaultDefer)); err != nil && killErr == nil {
			killErr = err
		}
		if killErr != nil {
			return run, fmt.Errorf("move the leader: %w", killErr)
		}
	}
	if v.Kill && c.wc != nil {
		if err := c.wc.Network().Heal(); err != nil && killErr == nil {
			killErr = err
		}
	}
	if killErr != nil {
		return run, fmt.Errorf("cut store %d off: %w", flVictim, killErr)
	}
	if r.Failed > 0 {
		return run, fmt.Errorf("%d of %d writes failed; first: %s", r.Failed, r.OK+r.Failed, r.FirstErr)
	}
	return run, nil
}

// writeSpec is one closed-loop write run.
type writeSpec struct {
	Client   *client.Client
	Keys     [][]byte
	Value    []byte
	Threads  int
	Duration time.Duration
	// Step > 0 keeps a timeline of completions per step.
	Step time.Duration
	// Do, if set, runs once At into the run (the kill).
	At time.Duration
	Do func()
	// OnProgress gets the writes done and failed so far.
	OnProgress func(done, failed int64)
}

// writeResult is what a write run measured.
type writeResult struct {
	Latency    *hdrhistogram.Histogram // µs, successful writes
	OK, Failed int64
	Elapsed    time.Duration
	FirstErr   string
	// MaxStall is the longest time no write completed (from the start, or
	// from one completion to the next); StallAfter the longest such time
	// from Do on (Do's moment to the first completion after it counts).
	MaxStall, StallAfter time.Duration
	DidAt                time.Duration
	Timeline             []TimelinePoint
}

func (r *writeResult) row(variant, param string) Row {
	return latencyRow(variant, param, r.Latency, r.OK, r.Failed, r.Elapsed)
}

// runWrites puts random keys from s.Threads goroutines, each one put at a
// time, for s.Duration. A write cut short by ctx counts as neither ok nor
// failed.
func runWrites(ctx context.Context, s writeSpec) *writeResult {
	res := &writeResult{Latency: newHist()}
	var (
		mu         sync.Mutex
		done       []time.Duration // completion offsets of successful writes
		failedAt   []time.Duration
		ok, failed atomic.Int64
		wg         sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(s.Duration)
	for range max(s.Threads, 1) {
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				k := s.Keys[rand.IntN(len(s.Keys))]
				begin := time.Now()
				err := s.Client.Put(ctx, k, s.Value)
				at := time.Since(start)
				if err != nil && ctx.Err() != nil {
					return
				}
				mu.Lock()
				if err != nil {
					failed.Add(1)
					failedAt = append(failedAt, at)
					if res.FirstErr == "" {
						res.FirstErr = err.Error()
					}
				} else {
					ok.Add(1)
					recordLatency(res.Latency, time.Since(begin))
					done = append(done, at)
				}
				mu.Unlock()
			}
		})
	}
	stop := make(chan struct{})
	var side sync.WaitGroup
	if s.Do != nil {
		side.Go(func() {
			t := time.NewTimer(s.At)
			defer t.Stop()
			select {
			case <-t.C:
				mu.Lock()
				res.DidAt = time.Since(start)
				mu.Unlock()
				s.Do()
			case <-stop:
			}
		})
	}
	reportProgress(&side, stop, &ok, &failed, s.OnProgress)
	wg.Wait()
	res.Elapsed = time.Since(start)
	close(stop)
	side.Wait()
	res.OK, res.Failed = ok.Load(), failed.Load()

	slices.Sort(done)
	prev := time.Duration(0)
	for _, at := range done {
		res.MaxStall = max(res.MaxStall, at-prev)
		if s.Do != nil && res.DidAt > 0 && at > res.DidAt {
			res.StallAfter = max(res.StallAfter, at-max(prev, res.DidAt))
		}
		prev = at
	}
	if s.Step > 0 {
		n := int(res.Elapsed/s.Step) + 1
		res.Timeline = make([]TimelinePoint, n)
		for i := range res.Timeline {
			res.Timeline[i].TMs = (time.Duration(i) * s.Step).Milliseconds()
		}
		for _, at := range done {
			res.Timeline[min(int(at/s.Step), n-1)].OK++
		}
		for _, at := range failedAt {
			res.Timeline[min(int(at/s.Step), n-1)].Failed++
		}
	}
	return res
}

// ---- report -----------------------------------------------------------------

func (res *FollowerLeaseResult) find(variant, place string) *FollowerLeaseRun {
	for i := range res.Runs {
		if res.Runs[i].Variant.Name == variant && (place == "" || res.Runs[i].Place == place) {
			return &res.Runs[i]
		}
	}
	return nil
}

// flTarget is one figure the scenario is held to.
type flTarget struct {
	What, Measured, Target string
	Met                    *bool // nil: no target, reported only
}

func (cfg *FollowerLeaseConfig) targets(res *FollowerLeaseResult) []flTarget {
	var out []flTarget
	div := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	if ll, fl := res.find("leader-lease", ""), res.find("follower-lease", ""); ll != nil && fl != nil {
		r := div(fl.Row.QPS, ll.Row.QPS)
		out = append(out, flTarget{
			What:     "follower-lease ops/s ÷ leader-lease ops/s (workload C, one machine)",
			Measured: fmt.Sprintf("%.2f× (%s / %s)", r, FormatFloat(fl.Row.QPS, 0), FormatFloat(ll.Row.QPS, 0)),
			Target:   "≥ 0.9×", Met: ptr(r >= 0.9),
		})
		out = append(out, flTarget{
			What:     "follower-lease p99 ÷ leader-lease p99",
			Measured: fmt.Sprintf("%.2f× (%s / %s ms)", div(fl.Row.P99Ms, ll.Row.P99Ms), FormatFloat(fl.Row.P99Ms, 2), FormatFloat(ll.Row.P99Ms, 2)),
		})
	}
	for _, place := range []string{flPlaceLocal, cfg.wanPlace()} {
		off, on := res.find("writes-leases-off", place), res.find("writes-leases-on", place)
		if off == nil || on == nil {
			continue
		}
		out = append(out, flTarget{
			What: "write p50, leases on ÷ off (" + place + ")",
			Measured: fmt.Sprintf("%.2f× (%s / %s ms)", div(on.Row.P50Ms, off.Row.P50Ms),
				FormatFloat(on.Row.P50Ms, 2), FormatFloat(off.Row.P50Ms, 2)),
		}, flTarget{
			What: "write p99, leases on ÷ off (" + place + ")",
			Measured: fmt.Sprintf("%.2f× (%s / %s ms)", div(on.Row.P99Ms, off.Row.P99Ms),
				FormatFloat(on.Row.P99Ms, 2), FormatFloat(off.Row.P99Ms, 2)),
		})
	}
	for _, place := range []string{flPlaceLocal, cfg.wanPlace()} {
		if r := res.find("writes-dead-holder", place); r != nil {
			t := flTarget{
				What:     "longest write stall after a lease holder dies (" + place + ")",
				Measured: fmt.Sprintf("%.0f ms", float64(r.StallAfter)/float64(time.Millisecond)),
				Target:   fmt.Sprintf("≤ one lease (%v)", flDefaultLease),
				Met:      ptr(r.VictimLease && r.StallAfter <= flDefaultLease),
			}
			if !r.VictimLease {
				t.Measured += " (the victim held no lease just before: not a test of the bound)"
			}
			out = append(out, t)
		}
		if r := res.find("writes-dead-follower", place); r != nil {
			out = append(out, flTarget{
				What:     "longest write stall after a follower dies, leases off (" + place + ")",
				Measured: fmt.Sprintf("%.0f ms", float64(r.StallAfter)/float64(time.Millisecond)),
			})
		}
		if r := res.find("writes-new-leader", place); r != nil {
			out = append(out, flTarget{
				What:     "longest write stall after a leadership transfer, leases on (" + place + ")",
				Measured: fmt.Sprintf("%.0f ms", float64(r.StallAfter)/float64(time.Millisecond)),
				Target:   fmt.Sprintf("expected about the deferral, %v, plus the transfer", flDefaultDefer),
			})
		}
		if r := res.find("writes-new-leader-off", place); r != nil {
			out = append(out, flTarget{
				What:     "longest write stall after a leadership transfer, leases off (" + place + ")",
				Measured: fmt.Sprintf("%.0f ms", float64(r.StallAfter)/float64(time.Millisecond)),
			})
		}
	}
	return out
}

func flTargetsTable(ts []flTarget) string {
	if len(ts) == 0 {
		return "(no ratio: the runs it needs were not made)\n"
	}
	var cells [][]string
	for _, t := range ts {
		met := ""
		if t.Met != nil {
			met = "not met"
			if *t.Met {
				met = "**met**"
			}
		}
		target := t.Target
		if target == "" {
			target = "–"
		}
		cells = append(cells, []string{t.What, t.Measured, target, met})
	}
	return MarkdownTable([]string{"figure (same run)", "measured", "target", ""}, cells)
}

func (res *FollowerLeaseResult) table() string {
	var cells [][]string
	for _, r := range res.Runs {
		row := r.Row
		stall, notes := "–", r.Holders
		if row.MaxStallMs != nil && !r.Variant.Read {
			stall = FormatFloat(*row.MaxStallMs, 1)
		}
		if r.Variant.Kill {
			stall = fmt.Sprintf("%s (after the kill: %.0f)", stall, float64(r.StallAfter)/float64(time.Millisecond))
		}
		if r.Variant.Move {
			stall = fmt.Sprintf("%s (after the transfer began: %.0f)", stall, float64(r.StallAfter)/float64(time.Millisecond))
		}
		if r.Variant.Read {
			notes = row.ServedBy
		} else if notes != "" {
			notes = "lease holders before the run: " + notes
		}
		cells = append(cells, []string{row.Variant, r.Place, strconv.FormatInt(row.Ops, 10), FormatFloat(row.QPS, 0),
			FormatFloat(row.P50Ms, 2), FormatFloat(row.P99Ms, 2), FormatFloat(row.P999Ms, 2), stall,
			strconv.FormatInt(row.Failed, 10), notes})
	}
	return MarkdownTable([]string{"variant", "where", "ops", "ops/s", "p50 ms", "p99 ms", "p99.9 ms", "longest stall ms", "failed", "served by / notes"}, cells)
}

func (cfg *FollowerLeaseConfig) write(res *FollowerLeaseResult, started time.Time) error {
	if len(res.Runs) == 0 {
		return nil
	}
	var errs []error
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return fmt.Errorf("follower-lease: %w", err)
	}
	if !cfg.NoPlots {
		plots, err := cfg.plots(res)
		res.Plots = plots
		if err != nil {
			errs = append(errs, fmt.Errorf("follower-lease: plots: %w", err))
		}
	}
	table, targets := res.table(), flTargetsTable(cfg.targets(res))
	if err := WriteResults(res.Dir, Results{Scenario: "follower-lease", Rows: res.Rows}, cfg.report(res, started, table, targets)); err != nil {
		errs = append(errs, err)
	}
	fmt.Fprintf(cfg.Out, "\n%s\n%s", table, targets)
	printWritten(cfg.Out, res.Dir, res.Plots)
	return errors.Join(errs...)
}

func (cfg *FollowerLeaseConfig) plots(res *FollowerLeaseResult) ([]string, error) {
	var plots plotSet
	add := plots.add
	names := variantNames(FollowerLeaseVariants, func(v FollowerLeaseVariant) string { return v.Name })
	// Reads: throughput bars, p99 in the note.
	var labels, notes []string
	var qps []float64
	for _, r := range res.Runs {
		if r.Variant.Read {
			labels = append(labels, r.Variant.Name)
			qps = append(qps, r.Row.QPS)
			notes = append(notes, "p99 "+FormatFloat(r.Row.P99Ms, 1)+" ms")
		}
	}
	if len(labels) > 0 {
		add(barPlot(res.Dir, "reads.png", fmt.Sprintf("follower-lease: YCSB workload C, %d threads, one machine", cfg.Threads), "reads per second", labels, qps, notes))
	}
	// Writes: latency by percentile, one plot per place.
	for i, place := range []string{flPlaceLocal, cfg.wanPlace()} {
		var hists []*hdrhistogram.Histogram
		var ls []string
		for _, r := range res.Runs {
			if !r.Variant.Read && !r.Variant.Kill && !r.Variant.Move && r.Place == place {
				hists = append(hists, r.Latency)
				ls = append(ls, r.Variant.Name)
			}
		}
		if len(hists) > 0 {
			file := map[int]string{0: "writes-local.png", 1: "writes-wan.png"}[i]
			add(percentilePlot(res.Dir, file, "follower-lease: put latency by percentile, "+place, names, hists, ls))
		}
	}
	// Kills and transfers: writes completed per step.
	for _, k := range []struct {
		place, file, what string
		move              bool
	}{
		{flPlaceLocal, "kill-local.png", fmt.Sprintf("store %d killed", flVictim), false},
		{cfg.wanPlace(), "kill-wan.png", fmt.Sprintf("store %d cut off", flVictim), false},
		{flPlaceLocal, "new-leader-local.png", "leader moved to store 2", true},
		{cfg.wanPlace(), "new-leader-wan.png", "leader moved to store 2", true},
	} {
		place := k.place
		var ss []series
		for _, r := range res.Runs {
			if !(r.Variant.Kill && !k.move || r.Variant.Move && k.move) || r.Place != place || len(r.Row.Timeline) == 0 {
				continue
			}
			var xys plotter.XYs
			for _, p := range r.Row.Timeline {
				xys = append(xys, plotter.XY{X: float64(p.TMs) / 1000, Y: float64(p.OK)})
			}
			ss = append(ss, series{name: r.Variant.Name, xys: xys})
		}
		if len(ss) == 0 {
			continue
		}
		p := newPlot(fmt.Sprintf("follower-lease: puts per %v, %s at %.1f s (%s)", cfg.Step, k.what,
			cfg.RunDuration.Seconds()/3, place), "seconds into the run", fmt.Sprintf("puts per %v", cfg.Step))
		if err := addSeries(p, names, ss, false); err != nil {
			add("", err)
			continue
		}
		p.Y.Min = 0
		add(savePlot(p, res.Dir, k.file))
	}
	return plots.files, errors.Join(plots.errs...)
}

func (cfg *FollowerLeaseConfig) report(res *FollowerLeaseResult, started time.Time, table, targets string) string {
	var b strings.Builder
	writeReportHeader(&b, "follower-lease: follower read leases, what they give and what they cost", started, cfg.Command)
	b.WriteString(loadNote(res.LoadBefore))
	b.WriteString("- Every cluster: three stores in this process, balancer paused, splits off (region 1 holds every key), its leader moved to store 1; bbolt without fsync; raftstore's default timing (50 ms tick, 10-tick election), ")
	fmt.Fprintf(&b, "so a follower lease lasts at most %v (the leader lease) and a holder counts it %v less (drift margin).\n", flDefaultLease, flDefaultLease/10)
	b.WriteString("- Leases are a setting of the whole cluster (`raftstore.Config.FollowerLeases`, the server's `--follower-leases`), so each place gets a cluster with them on and one with them off, one after the other; the kill comes last on its cluster.\n")
	fmt.Fprintf(&b, "- Reads (`%s`): %d YCSB records (~1 KB), go-ycsb's workload C (100%% reads, zipfian), %d client threads, %v after a %v warm-up, on the one-machine cluster with leases on; "+
		"which store served each read and how comes from the stores' counters (`follower-lease` = `hedgekv_server_reads_total{mode=\"follower-lease\"}`).\n",
		flWorkloadC, cfg.Records, cfg.Threads, cfg.RunDuration, max(cfg.Warmup, 0))
	fmt.Fprintf(&b, "- Writes: %d goroutines each putting one key at a time (a closed loop) to uniformly chosen keys among %d, %d-byte values, from a client beside the leader, %v after a %v warm-up. ",
		cfg.WriteThreads, cfg.WriteKeys, cfg.ValueSize, cfg.RunDuration, max(cfg.Warmup, 0))
	b.WriteString("Before each leases-on write run the followers are asked for a lease read directly, to show they hold leases (`lease holders`).\n")
	if !cfg.NoWAN {
		fmt.Fprintf(&b, "- WAN (`%s`): %s; the leader and the writers in %s.\n", cfg.TopologyName, describeTopology(cfg.Topology), func() string { z, _ := cfg.Topology.ZoneOf(1); return z }())
	}
	fmt.Fprintf(&b, "- Kill rows: %v into the run store %d (a follower) dies: on one machine its in-process server is stopped (its connections close; it sends nothing first), across the WAN a blackhole partition cuts it off (nobody is told). ",
		cfg.RunDuration/3, flVictim)
	b.WriteString("`longest stall` is the longest time no put completed; `after the kill` counts from the kill to the first put completed after it, or the longest gap after it if longer. ")
	fmt.Fprintf(&b, "The timeline (puts completed per %v) is in results.json.\n", cfg.Step)
	fmt.Fprintf(&b, "- Transfer rows: %v into the run region 1's leadership is moved to store 2 (`MoveLeader`: TransferLeader until it holds); `after the transfer began` counts from the moment the move is asked for. "+
		"After the run the leader is moved back to store 1 and the next run waits %v, unmeasured. With leases on, a new leader holds its first commit back for %v (one lease, plus the drift margin, plus a tick).\n",
		cfg.RunDuration/3, 2*flDefaultDefer, flDefaultDefer)
	writeVariantList(&b, "Variants:", FollowerLeaseVariants, cfg.Variants, func(v FollowerLeaseVariant) (string, string) { return v.Name, v.Doc })
	b.WriteString("\n## Figures measured in this run\n\n")
	b.WriteString(targets)
	b.WriteString("\n## Every run\n\n")
	b.WriteString(table)
	var notes []string
	for _, r := range res.Runs {
		if r.Variant.Kill && r.Variant.Leases && !r.VictimLease {
			notes = append(notes, fmt.Sprintf("%s (%s): store %d did not serve a lease read just before the kill.", r.Variant.Name, r.Place, flVictim))
		}
		if r.Variant.Name == "follower-lease" && !strings.Contains(r.Row.ServedBy, "follower-lease") {
			notes = append(notes, "follower-lease: no read was served from a follower lease.")
		}
		if r.FirstErr != "" {
			notes = append(notes, fmt.Sprintf("%s (%s): first error: %s", r.Variant.Name, r.Place, inlineCode(r.FirstErr)))
		}
	}
	notes = append(notes, res.Notes...)
	if len(notes) > 0 {
		writeNotes(&b, notes)
	}
	writePlots(&b, res.Plots)
	return b.String()
}
