package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/netsim"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/readmode"
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
	defaultTopology(&cfg.Topology, &cfg.TopologyName)
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
		StatusHTTP: true, // measureReads scrapes the KV API's reads
		Logger:     quietStores(cfg.Logger),
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
	// The KV API's reads only (see wanCluster.snapAt): the etcd lessor's
	// read of its leases on the leader is none of the workload's.
	var before map[uint64]map[string]uint64
	var berr error
	phase, err := runTimed(ctx, spec, v.Name, cfg.MaxOps, cfg.Warmup, cfg.RunDuration, prog, func() {
		before, berr = scrapeKVReadsAt(ctx, c.lc.StoreIDs(), c.lc.StatusAddr)
	})
	if phase == nil {
		return nil, err
	}
	after, aerr := scrapeKVReadsAt(ctx, c.lc.StoreIDs(), c.lc.StatusAddr)
	d := readsDelta(before, after)
	d.readsErr = errors.Join(berr, aerr)
	run := &FollowerLeaseRun{Variant: v, Place: flPlaceLocal, Row: phase.Row, Latency: phase.Latency, FirstErr: phase.Total.FirstErr}
	run.Row.Param = flWorkloadC
	run.Row.ServedBy = (&wanCluster{Local: c.lc}).servedBy(d)
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
		if err == nil && info.Mode == readmode.FollowerLease {
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
			do := func() {
				mu.Lock()
				res.DidAt = time.Since(start)
				mu.Unlock()
				s.Do()
			}
			select {
			case <-t.C:
				do()
			case <-stop:
				// Woken late on a loaded machine, with both ready: the
				// timer fired first (At is within the run), so Do is
				// still owed; select picks between them at random.
				select {
				case <-t.C:
					do()
				default:
				}
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
