package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/netsim"
)

// follower-read-dc reproduces TiDB 3.1's follower-read experiment (its
// scenarios 1–3): YCSB scans of 1 KB rows by a client in one data center
// while the region's leader sits in another, 28 ms round trip and ~300
// Mbit/s apart, read from the remote leader, from the local follower
// (linearizable, one ReadIndex round trip to the leader), from the local
// follower with bounded staleness (no round trip), from the local follower
// holding a follower read lease (linearizable, no round trip; on a second
// cluster started with follower leases, since leases are a setting of the
// whole cluster and change how every follower read is served), and, as
// the baseline, by a client beside the leader.

// DCVariant is one way of reading in follower-read-dc.
type DCVariant struct {
	Name string
	// BesideLeader: the client sits in the leader's zone, not the client
	// zone.
	BesideLeader bool
	Read         client.ReplicaPolicy
	Stale        bool // bounded-staleness reads (MaxStaleness)
	// What the report says of it, and the TiDB scenario it stands for
	// (0: none).
	Doc   string
	TiDB  int
	Local bool // the reads are meant to be served in the client's zone
	// FollowerLeases: the variant runs on a cluster whose stores have
	// follower read leases on. With leases on, a follower holding one
	// serves every follower read from it, bounded-staleness ones too, so
	// the other variants cannot share that cluster.
	FollowerLeases bool
}

// DCVariants are follower-read-dc's variants, in run order.
var DCVariants = []DCVariant{
	{Name: "leader-remote", Read: client.ReplicaLeader, TiDB: 1,
		Doc: "client in the follower's zone, reads from the leader in the other zone: every row crosses the WAN"},
	{Name: "follower-local", Read: client.ReplicaClosest, TiDB: 2, Local: true,
		Doc: "client reads from the follower in its own zone (closest), linearizable: one small ReadIndex round trip to the leader crosses the WAN, the rows do not"},
	{Name: "stale-local", Read: client.ReplicaClosest, Stale: true, Local: true,
		Doc: "as follower-local with bounded staleness (MaxStaleness): the follower answers from its own state, nothing crosses the WAN"},
	{Name: "same-zone", BesideLeader: true, Read: client.ReplicaLeader, TiDB: 3, Local: true,
		Doc: "client beside the leader, leader reads (lease): the baseline without any WAN"},
	{Name: "lease-local", Read: client.ReplicaClosest, Local: true, FollowerLeases: true,
		Doc: "as follower-local, linearizable, on a second cluster whose stores run with follower read leases (`--follower-leases`): the follower holding a lease answers from its own state, nothing crosses the WAN"},
}

// DefaultScanLengths are TiDB's.
var DefaultScanLengths = []int{10, 100, 200, 500, 1000, 1500}

// FollowerReadDCConfig configures RunFollowerReadDC.
type FollowerReadDCConfig struct {
	// Quick: scan lengths 10 and 100, 2,000 records, 3 s runs: under a
	// minute on 2 cores. Explicit values below still win.
	Quick bool
	// Topology is the WAN (default netsim.Default()); TopologyName names it
	// in the report.
	Topology     *netsim.Topology
	TopologyName string
	// LeaderZone holds region 1's leader (default: the first zone);
	// ClientZone the client and a follower (default: the second zone).
	LeaderZone, ClientZone string
	Records                int64 // default 20,000 (quick 2,000)
	Threads                int   // default 32
	ScanLengths            []int // default DefaultScanLengths (quick 10, 100)
	Variants               []string
	// RunDuration is each measured run's length (default 15s, quick 3s);
	// Warmup runs the same workload unmeasured first (default 1s, quick
	// 0.5s; negative: none). MaxOps, if > 0, also ends a run after that
	// many operations (tests).
	RunDuration time.Duration
	Warmup      time.Duration
	MaxOps      int64
	// MaxStaleness of stale-local (default 10s).
	MaxStaleness time.Duration
	OutDir       string // results root (default "results"): writes OutDir/follower-read-dc
	NoPlots      bool
	// Command is the command line, quoted in the report.
	Command string
	// Progress receives the progress display (normally os.Stderr; nil:
	// none).
	Progress io.Writer
	Logger   *slog.Logger
	Out      io.Writer // the final tables (nil: discard)
}

func (cfg *FollowerReadDCConfig) setDefaults() error {
	defaultTopology(&cfg.Topology, &cfg.TopologyName)
	if err := cfg.Topology.Validate(); err != nil {
		return err
	}
	var err error
	if cfg.LeaderZone, cfg.ClientZone, err = pickZones(cfg.Topology, cfg.LeaderZone, cfg.ClientZone,
		"one for the leader, one for the client and its follower"); err != nil {
		return err
	}
	setDefault(&cfg.Records, quickOr[int64](cfg.Quick, 20000, 2000))
	setDefault(&cfg.Threads, 32)
	if len(cfg.ScanLengths) == 0 {
		cfg.ScanLengths = quickOr(cfg.Quick, DefaultScanLengths, []int{10, 100})
	}
	if err := checkScanLengths(cfg.ScanLengths); err != nil {
		return err
	}
	if cfg.Variants, err = chooseVariants(cfg.Variants, DCVariants, func(v DCVariant) string { return v.Name }); err != nil {
		return err
	}
	setDefault(&cfg.RunDuration, quickOr(cfg.Quick, 15*time.Second, 3*time.Second))
	setDefaultIfZero(&cfg.Warmup, quickOr(cfg.Quick, time.Second, 500*time.Millisecond))
	setDefault(&cfg.MaxStaleness, 10*time.Second)
	setOutputDefaults(&cfg.OutDir, &cfg.Logger, &cfg.Out)
	return nil
}

func (cfg *FollowerReadDCConfig) variants() []DCVariant {
	return pickVariants(DCVariants, cfg.Variants, func(v DCVariant) string { return v.Name })
}

// DCRun is one measured run of follower-read-dc.
type DCRun struct {
	Variant    DCVariant
	ScanLength int
	ClientZone string
	Phase      *PhaseResult
	// ServedBy says which stores served the reads and how; LocalShare is
	// the fraction served in the client's zone.
	ServedBy   string
	LocalShare float64
	// ServerP50Ms is the stores' median KV.Scan latency over the run (0:
	// unknown).
	ServerP50Ms float64
	// WANBytes crossed between zones during the run (every link, raft
	// included).
	WANBytes uint64
	// LeaderMoved is non-empty if region 1's leader was elsewhere after
	// the run.
	LeaderMoved string
}

// FollowerReadDCResult is what RunFollowerReadDC measured.
type FollowerReadDCResult struct {
	Rows  []Row
	Runs  []DCRun
	Load  *PhaseResult
	Dir   string
	Plots []string
}

// RunFollowerReadDC runs the scenario and writes
// OutDir/follower-read-dc/{results.json,report.md,*.png}. Runs measured
// before an error are written.
//
// The variants run on one cluster, loaded once, except those that need
// follower leases (lease-local): they run afterwards on a second cluster
// started with FollowerLeases, loaded the same way, its leader on the same
// store, once the first has stopped (so the two never share the CPUs).
// The runs are reported in scan-length order whichever cluster ran them.
func RunFollowerReadDC(ctx context.Context, cfg FollowerReadDCConfig) (*FollowerReadDCResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("follower-read-dc: %w", err)
	}
	started := time.Now()
	variants := cfg.variants()
	var groups [][]DCVariant // by FollowerLeases: off, then on
	for _, leases := range []bool{false, true} {
		var g []DCVariant
		for _, v := range variants {
			if v.FollowerLeases == leases {
				g = append(g, v)
			}
		}
		if len(g) > 0 {
			groups = append(groups, g)
		}
	}
	prog := newProgress(cfg.Progress, "follower-read-dc", len(groups)+len(variants)*len(cfg.ScanLengths))
	defer prog.Done()

	res := &FollowerReadDCResult{Dir: filepath.Join(cfg.OutDir, "follower-read-dc")}
	var (
		notes  []string
		errs   []error
		leader uint64
	)
	for _, g := range groups {
		lead, gerr := cfg.runGroup(ctx, g, res, &notes, prog)
		if lead != 0 {
			leader = lead
		}
		if gerr != nil {
			errs = append(errs, gerr)
			if !errors.Is(gerr, ErrAllFailed) {
				break
			}
		}
	}
	order := func(r DCRun) int { return slices.Index(cfg.ScanLengths, r.ScanLength) }
	slices.SortStableFunc(res.Runs, func(a, b DCRun) int { return order(a) - order(b) })
	res.Rows = res.Rows[:0]
	for _, r := range res.Runs {
		res.Rows = append(res.Rows, r.Phase.Row)
	}
	prog.Done() // before the tables are printed
	return res, errors.Join(append(errs, cfg.write(res, leader, started, notes))...)
}

// runGroup starts a cluster for variants (which agree on FollowerLeases),
// loads it, measures every scan length of each, and stops it. It returns
// the leader's store (0 if the cluster did not start).
func (cfg *FollowerReadDCConfig) runGroup(ctx context.Context, variants []DCVariant, res *FollowerReadDCResult, notes *[]string, prog *Progress) (uint64, error) {
	leases := variants[0].FollowerLeases
	what := "follower leases off"
	if leases {
		what = "follower leases on"
	}
	prog.Printf("follower-read-dc: starting %d stores behind the %s topology, %s", len(cfg.Topology.Stores()), cfg.TopologyName, what)
	c, err := startWANClusterWith(ctx, cfg.Topology, cfg.LeaderZone, cfg.Logger, leases)
	if err != nil {
		return 0, fmt.Errorf("follower-read-dc: %s: %w", what, err)
	}
	defer c.Stop()

	// One client per variant, connected before anything is measured.
	dbs := make([]*ycsbdb.DB, len(variants))
	defer closeDBs(dbs)
	for i, v := range variants {
		read := client.ReadPolicy{Replica: v.Read}
		if v.Stale {
			read.MaxStaleness = cfg.MaxStaleness
		}
		if dbs[i], err = c.openZoneDB(ctx, cfg.clientZone(v), read); err != nil {
			return c.leaderStore, fmt.Errorf("follower-read-dc: %s: %w", v.Name, err)
		}
	}
	loader, err := c.openZoneDB(ctx, cfg.LeaderZone, client.ReadPolicy{})
	if err != nil {
		return c.leaderStore, fmt.Errorf("follower-read-dc: %w", err)
	}
	load, err := loadRows(ctx, loader, cfg.Records, max(cfg.Threads, 64), prog, cfg.Logger)
	_ = loader.Close()
	if err != nil {
		return c.leaderStore, fmt.Errorf("follower-read-dc: %s: %w", what, err)
	}
	if res.Load == nil {
		res.Load = load
	} else {
		*notes = append(*notes, fmt.Sprintf("The cluster with %s was loaded the same way: %d inserts/s, p99 %.1f ms, %d failed.",
			what, int(load.Row.QPS), load.Row.P99Ms, load.Row.Failed))
	}
	if moved := c.leaderCheck(ctx); moved != "" {
		*notes = append(*notes, "after the load ("+what+"): "+moved)
	}

	var errs []error
	for _, l := range cfg.ScanLengths {
		for i, v := range variants {
			run, err := cfg.measure(ctx, c, dbs[i], v, l, prog)
			if run != nil {
				res.Runs = append(res.Runs, *run)
				prog.Printf("%-14s scan %-5d %8.1f ops/s  p50 %8.1f ms  p99 %8.1f ms  WAN %s/read  %s",
					v.Name, l, run.Phase.Row.QPS, run.Phase.Row.P50Ms, run.Phase.Row.P99Ms,
					fmtBytes(derefOr(run.Phase.Row.WANBytesPerOp, 0)), failedNote(run.Phase.Row.Failed))
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("follower-read-dc: %s, scan %d: %w", v.Name, l, err))
				if !errors.Is(err, ErrAllFailed) {
					return c.leaderStore, errors.Join(errs...)
				}
			}
		}
	}
	return c.leaderStore, errors.Join(errs...)
}

func (cfg *FollowerReadDCConfig) clientZone(v DCVariant) string {
	if v.BesideLeader {
		return cfg.LeaderZone
	}
	return cfg.ClientZone
}

func failedNote(n int64) string {
	if n == 0 {
		return "0 failed"
	}
	return fmt.Sprintf("%d FAILED", n)
}

func derefOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// measure runs one variant at one scan length: a warm-up, then the
// measured run between two snapshots of the cluster's counters.
func (cfg *FollowerReadDCConfig) measure(ctx context.Context, c *wanCluster, db *ycsbdb.DB, v DCVariant, scanLen int, prog *Progress) (*DCRun, error) {
	param := strconv.Itoa(scanLen)
	spec := Spec{
		Instance: db, Workload: "scan", Records: cfg.Records, Threads: cfg.Threads, Run: true,
		MaxScanLength: scanLen, ScanLengthDistribution: "constant", Properties: rowProps(),
		Variant: v.Name, Param: param, ProgressInterval: -1, QuietWorkload: true, Logger: cfg.Logger,
		AbortAfterFailures: -1,
	}
	var before clusterSnap
	phase, err := runTimed(ctx, spec, fmt.Sprintf("%s scan=%d", v.Name, scanLen), cfg.MaxOps, cfg.Warmup, cfg.RunDuration, prog,
		func() { before = c.snap(ctx, "KV.Scan") })
	if phase == nil {
		return nil, err
	}
	d := c.delta(before, c.snap(ctx, "KV.Scan"))
	run := &DCRun{
		Variant: v, ScanLength: scanLen, ClientZone: cfg.clientZone(v), Phase: phase,
		ServedBy: c.servedBy(d), LocalShare: c.localShare(d, cfg.clientZone(v)), WANBytes: d.wanBytes,
		LeaderMoved: c.leaderCheck(ctx),
	}
	if p50, ok := d.serverMs(0.5); ok {
		run.ServerP50Ms = p50
	}
	d.annotate(&run.Phase.Row, run.ServedBy)
	return run, err
}

// dcLimits explains, from the run's own figures, what bounds the two
// remote-leader-vs-local-follower numbers at one scan length: the link for
// leader-remote, the ReadIndex round trip and the client's concurrency for
// follower-local.
func (cfg *FollowerReadDCConfig) dcLimits(runs []DCRun, scan, threads int) string {
	var lr, fl *DCRun
	for i := range runs {
		switch r := &runs[i]; {
		case r.ScanLength != scan:
		case r.Variant.Name == "leader-remote":
			lr = r
		case r.Variant.Name == "follower-local":
			fl = r
		}
	}
	spec := cfg.Topology.Spec(cfg.ClientZone, cfg.LeaderZone)
	rtt := 2 * spec.Latency
	var b strings.Builder
	if lr != nil && spec.BandwidthMbit > 0 && lr.Phase.Row.WANBytesPerOp != nil && *lr.Phase.Row.WANBytesPerOp > 0 {
		perScan := *lr.Phase.Row.WANBytesPerOp
		limit := spec.BandwidthMbit * 125000 / perScan
		fmt.Fprintf(&b, "- `leader-remote` is bound by the link: it carries %g Mbit/s (toxiproxy delivers 5–8%% less) and a %d-key scan moves %s across it, ",
			spec.BandwidthMbit, scan, fmtBytes(perScan))
		fmt.Fprintf(&b, "so at most %.0f scans/s; measured %.0f. Its store answered in %.1f ms at the median: the rest of its %.1f ms median is the WAN and the queue in front of the link.\n",
			limit, lr.Phase.Row.QPS, lr.ServerP50Ms, lr.Phase.Row.P50Ms)
	}
	if fl != nil && rtt > 0 && fl.ServerP50Ms > 0 {
		rttMs := float64(rtt) / float64(time.Millisecond)
		fmt.Fprintf(&b, "- `follower-local` waits at its store for a ReadIndex round trip to the leader (RTT %v): the store's median follower scan took %.1f ms, %.1f round trips. ",
			rtt, fl.ServerP50Ms, fl.ServerP50Ms/rttMs)
		b.WriteString("A follower sends one ReadIndex batch at a time (raftstore/read.go), so a read that arrives while a batch is in flight waits for it, then for its own: 1.5 round trips on average, 2 at worst, before the scan itself and the queue for a CPU. ")
		fmt.Fprintf(&b, "With %d client threads each waiting that long, %d ÷ %.1f ms caps it at %.0f scans/s (measured %.0f); even at exactly one round trip per read the cap would be %.0f/s. ",
			threads, threads, fl.ServerP50Ms, float64(threads)/fl.ServerP50Ms*1000, fl.Phase.Row.QPS, float64(threads)/rttMs*1000)
		b.WriteString("More client threads, or reads that need no round trip (`stale-local`, or `lease-local` with follower leases), lift that cap; the machine's two cores cap everything else (`same-zone`).\n")
	}
	return b.String()
}

// dcShortScanNote explains, when it happens, why `follower-local` served
// fewer short scans than `leader-remote` (the demo's quick run: 567 vs 830
// 10-key scans/s): "" otherwise.
func (cfg *FollowerReadDCConfig) dcShortScanNote(runs []DCRun) string {
	var lr, fl *DCRun
	scan := -1
	for i := range runs {
		if scan < 0 || runs[i].ScanLength < scan {
			scan = runs[i].ScanLength
		}
	}
	for i := range runs {
		switch r := &runs[i]; {
		case r.ScanLength != scan:
		case r.Variant.Name == "leader-remote":
			lr = r
		case r.Variant.Name == "follower-local":
			fl = r
		}
	}
	if lr == nil || fl == nil || fl.Phase.Row.QPS >= lr.Phase.Row.QPS {
		return ""
	}
	rtt := 2 * cfg.Topology.Spec(cfg.ClientZone, cfg.LeaderZone).Latency
	var b strings.Builder
	fmt.Fprintf(&b, "Why `follower-local` served fewer %d-key scans than `leader-remote` (%.0f vs %.0f/s): both pay one WAN round trip (%v) per scan, ",
		scan, fl.Phase.Row.QPS, lr.Phase.Row.QPS, rtt)
	b.WriteString("the leader's to carry the request and the rows, the follower's for its ReadIndex. A short scan's rows are too few to fill the link, ")
	b.WriteString("so the leader's round trips all overlap: each client thread waits about one round trip. A follower sends one ReadIndex batch at a time, ")
	b.WriteString("so a read that arrives while a batch is in flight waits for it and then for its own: 1.5 round trips on average. ")
	b.WriteString("Reading locally pays off once the rows cost the link more than that wait (100-key scans and longer), or with reads that need no round trip (`stale-local`, `lease-local`).\n")
	if lim := cfg.dcLimits(runs, scan, cfg.Threads); lim != "" {
		fmt.Fprintf(&b, "\nWhat bounds the %d-key figures, from this run's own numbers:\n\n%s", scan, lim)
	}
	return b.String()
}

// TiDB 3.1's published figures (PingCAP, "TiDB 3.1 follower read"): UCloud
// 16-core machines in Beijing and Shanghai, 27.7–28.3 ms apart at 297
// Mbit/s, 10,000,000 YCSB rows, raw KV scans.
type tidbFigure struct {
	QPS, ServerP99Ms, ClientP99Ms float64
}

// tidbScenarios[n][scan length] is scenario n's row: 1 remote leader, 2
// local follower, 3 leader and client on one node, 4 leader, follower and
// client in one data center, the follower serving.
var tidbScenarios = map[int]map[int]tidbFigure{
	1: {10: {3110, 43, 115}, 100: {314, 450, 7888}, 200: {158, 480, 13180}, 500: {63, 500, 23630}, 1000: {31, 504, 34693}, 1500: {8, 507, 50220}},
	2: {10: {3836, 88, 126}, 100: {3087, 127, 140}, 200: {1966, 130, 323}, 500: {920, 256, 1026}, 1000: {446, 504, 2651}, 1500: {285, 980, 4525}},
	3: {10: {18865, 31, 33}, 100: {4233, 58, 267}, 200: {2321, 94, 550}, 500: {1008, 130, 1455}, 1000: {480, 330, 3228}, 1500: {298, 450, 6438}},
	4: {10: {15021, 31, 34}, 100: {3859, 62, 272}, 200: {2186, 120, 560}, 500: {947, 243, 1305}, 1000: {450, 480, 3189}, 1500: {277, 763, 5058}},
}

// dcTarget is one ratio the scenario is held to.
type dcTarget struct {
	What     string
	Scan     int
	Measured float64 // 0: not measured
	Target   float64
	TiDB     float64 // 0: TiDB has no such figure
	// AtMost: the ratio must not exceed Target (a "within" target)
	// rather than reach it.
	AtMost bool
}

func (t dcTarget) met() bool {
	if t.AtMost {
		return t.Measured > 0 && t.Measured <= t.Target
	}
	return t.Measured >= t.Target
}

// targets computes the ratios from the runs.
func dcTargets(runs []DCRun) []dcTarget {
	find := func(variant string, scan int) *Row {
		for i := range runs {
			if runs[i].Variant.Name == variant && runs[i].ScanLength == scan {
				return &runs[i].Phase.Row
			}
		}
		return nil
	}
	div := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	var out []dcTarget
	if lr, fl := find("leader-remote", 100), find("follower-local", 100); lr != nil && fl != nil {
		out = append(out,
			dcTarget{What: "follower-local ops/s ÷ leader-remote ops/s", Scan: 100, Measured: div(fl.QPS, lr.QPS), Target: 4.5, TiDB: 3087.0 / 314},
			dcTarget{What: "leader-remote client p99 ÷ follower-local client p99", Scan: 100, Measured: div(lr.P99Ms, fl.P99Ms), Target: 5, TiDB: 7888.0 / 140})
	}
	if fl, sl := find("follower-local", 10), find("stale-local", 10); fl != nil && sl != nil {
		out = append(out, dcTarget{What: "follower-local client p99 ÷ stale-local client p99", Scan: 10, Measured: div(fl.P99Ms, sl.P99Ms), Target: 10})
	}
	// Follower leases: linearizable local reads should lose the ReadIndex
	// round trip (as fast as stale-local, within 1.5x).
	if fl, ll := find("follower-local", 10), find("lease-local", 10); fl != nil && ll != nil {
		out = append(out, dcTarget{What: "follower-local client p99 ÷ lease-local client p99", Scan: 10, Measured: div(fl.P99Ms, ll.P99Ms), Target: 10})
	}
	if ll, sl := find("lease-local", 10), find("stale-local", 10); ll != nil && sl != nil {
		out = append(out, dcTarget{What: "lease-local client p99 ÷ stale-local client p99", Scan: 10, Measured: div(ll.P99Ms, sl.P99Ms), Target: 1.5, AtMost: true})
	}
	return out
}

func (cfg *FollowerReadDCConfig) write(res *FollowerReadDCResult, leader uint64, started time.Time, notes []string) error {
	if len(res.Runs) == 0 {
		return nil
	}
	var errs []error
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return err
	}
	if !cfg.NoPlots {
		plots, err := dcPlots(res.Dir, res.Runs, cfg.ScanLengths)
		res.Plots = plots
		if err != nil {
			errs = append(errs, fmt.Errorf("plots: %w", err))
		}
	}
	report := cfg.report(res, leader, started, notes)
	if err := WriteResults(res.Dir, Results{Scenario: "follower-read-dc", Rows: res.Rows}, report); err != nil {
		errs = append(errs, err)
	}
	fmt.Fprintf(cfg.Out, "\n%s\n%s", dcHeadlineTable(res.Runs, 100), dcTargetsTable(dcTargets(res.Runs), cfg.Quick))
	if note := cfg.dcShortScanNote(res.Runs); note != "" {
		fmt.Fprintf(cfg.Out, "\n%s", note)
	}
	fmt.Fprintf(cfg.Out, "\nwrote %s, %s", filepath.Join(res.Dir, "results.json"), filepath.Join(res.Dir, "report.md"))
	if len(res.Plots) > 0 {
		fmt.Fprintf(cfg.Out, " and %d plots (%s)", len(res.Plots), strings.Join(res.Plots, ", "))
	}
	fmt.Fprintln(cfg.Out)
	return errors.Join(errs...)
}

// dcHeadlineTable compares the variants at one scan length (the nearest
// measured to want) with TiDB's figures.
func dcHeadlineTable(runs []DCRun, want int) string {
	scan := nearestScan(runs, want)
	var cells [][]string
	for _, r := range runs {
		if r.ScanLength != scan {
			continue
		}
		row := r.Phase.Row
		t := tidbScenarios[r.Variant.TiDB][scan]
		tq, tc, ts := "–", "–", "–"
		if r.Variant.TiDB > 0 && t.QPS > 0 {
			tq, tc, ts = FormatFloat(t.QPS, 0), FormatFloat(t.ClientP99Ms, 0), FormatFloat(t.ServerP99Ms, 0)
		}
		cells = append(cells, []string{
			r.Variant.Name, strconv.Itoa(scan),
			FormatFloat(row.QPS, 0), tq,
			FormatFloat(row.P99Ms, 1), tc,
			fmtOptMs(row.ServerP99Ms), ts,
			fmtBytes(derefOr(row.WANBytesPerOp, 0)), strconv.FormatInt(row.Failed, 10),
		})
	}
	return MarkdownTable([]string{"variant", "scan keys", "ops/s", "TiDB ops/s", "client p99 ms", "TiDB client p99 ms",
		"server p99 ms", "TiDB server p99 ms", "WAN bytes/read", "failed"}, cells)
}

func nearestScan(runs []DCRun, want int) int {
	return nearestScanLength(runs, func(r DCRun) int { return r.ScanLength }, want)
}

// dcTargetsTable is the ratios beside their targets. The targets are for
// full runs (20,000 rows, 15 s per run, every scan length); a --quick run
// (2,000 rows, 3 s runs on a cluster that has just started) is a smoke
// run whose ratios land well below them, so it shows them without a
// verdict and says so.
func dcTargetsTable(ts []dcTarget, quick bool) string {
	if len(ts) == 0 {
		return "(no ratio: the runs it needs were not made)\n"
	}
	var cells [][]string
	for _, t := range ts {
		tidb := "–"
		if t.TiDB > 0 {
			tidb = FormatFloat(t.TiDB, 1) + "×"
		}
		met := "**met**"
		switch {
		case quick && t.met():
			met = "met (quick run)"
		case quick:
			met = "– (quick run: targets are for full runs)"
		case !t.met():
			met = "not met"
		}
		op := "≥ "
		if t.AtMost {
			op = "≤ "
		}
		cells = append(cells, []string{t.What, strconv.Itoa(t.Scan), FormatFloat(t.Measured, 2) + "×", op + FormatFloat(t.Target, 1) + "×", tidb, met})
	}
	table := MarkdownTable([]string{"ratio (same run)", "scan keys", "measured", "target", "TiDB", ""}, cells)
	if quick {
		table = "The targets apply to full runs (`bench follower-read-dc` without --quick: 20,000 rows, 15 s runs); " +
			"this --quick run (2,000 rows, 3 s runs) only shows where the ratios stand, not whether they are met.\n\n" + table
	}
	return table
}

func fmtOptMs(p *float64) string {
	if p == nil {
		return "n/a"
	}
	return FormatFloat(*p, 1)
}

// fmtBytes renders a byte count as B, KB, MB (powers of 1000).
func fmtBytes(b float64) string {
	switch {
	case b >= 1e6:
		return FormatFloat(b/1e6, 2) + " MB"
	case b >= 1e3:
		return FormatFloat(b/1e3, 1) + " KB"
	}
	return FormatFloat(b, 0) + " B"
}

func (cfg *FollowerReadDCConfig) report(res *FollowerReadDCResult, leader uint64, started time.Time, notes []string) string {
	var b strings.Builder
	writeReportHeader(&b, "follower-read-dc: follower read across data centers (TiDB 3.1, scenarios 1–3)", started, cfg.Command)
	fmt.Fprintf(&b, "- WAN (`%s`): %s. Every store and client reaches every store through its own zone's link (toxiproxy, in this process).\n",
		cfg.TopologyName, describeTopology(cfg.Topology))
	fmt.Fprintf(&b, "- Region %d holds every row (splits off) and its leader is on store %d in %s; the balancer is paused. The client sits in %s (`same-zone`: in %s).\n",
		hotRegionID, leader, cfg.LeaderZone, cfg.ClientZone, cfg.LeaderZone)
	fmt.Fprintf(&b, "- %d YCSB rows of %d fields × %d bytes (~1 KB), loaded by a client beside the leader (%d inserts/s, p99 %.1f ms, %d failed); ",
		cfg.Records, rowFieldCount, rowFieldLength, int(res.Load.Row.QPS), res.Load.Row.P99Ms, res.Load.Row.Failed)
	fmt.Fprintf(&b, "then go-ycsb's scan workload, every scan exactly N rows from a uniformly chosen key, %d client threads, ", cfg.Threads)
	fmt.Fprintf(&b, "each run %v after a %v warm-up.\n", cfg.RunDuration, max(cfg.Warmup, 0))
	b.WriteString("- Stores, WAN proxies and the client share this machine's CPUs, in one process; bbolt commits without fsync (the load is not measured).\n")
	b.WriteString("- `ops/s` counts successful scans per second; latencies are of successful scans, measured in the client (HDR histogram). ")
	b.WriteString("`server p99` is the stores' own `KV.Scan` latency histogram (Prometheus, buckets √2 apart from 50 µs, interpolated: within ±41%). ")
	b.WriteString("`WAN bytes/read` is every byte that crossed a link between zones during the run (client traffic and raft, both directions) over successful scans.\n")
	fmt.Fprintf(&b, "- `stale-local` reads with MaxStaleness %v.\n", cfg.MaxStaleness)
	if slices.ContainsFunc(cfg.variants(), func(v DCVariant) bool { return v.FollowerLeases }) {
		b.WriteString("- `lease-local` runs on a second cluster, started with follower read leases on (`raftstore.Config.FollowerLeases`, default lease length) after the first has stopped, ")
		b.WriteString("loaded the same way with its leader on the same store. Leases are a setting of the whole cluster and a follower holding one serves every follower read from it, ")
		b.WriteString("bounded-staleness ones too, so the other variants cannot share that cluster. The stores' `follower-lease` read counter says which reads the lease served.\n")
	}
	for _, n := range notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	b.WriteString("\nVariants:\n\n")
	for _, v := range cfg.variants() {
		tidb := ""
		if v.TiDB > 0 {
			tidb = fmt.Sprintf(" (TiDB scenario %d)", v.TiDB)
		}
		fmt.Fprintf(&b, "- `%s`%s: %s.\n", v.Name, tidb, v.Doc)
	}

	b.WriteString("\n## Ratios measured in this run\n\n")
	b.WriteString(dcTargetsTable(dcTargets(res.Runs), cfg.Quick))
	if scan := nearestScan(res.Runs, 100); scan >= 0 {
		if lim := cfg.dcLimits(res.Runs, scan, cfg.Threads); lim != "" {
			fmt.Fprintf(&b, "\nWhat bounds the %d-key figures, from this run's own numbers:\n\n%s", scan, lim)
		}
	}
	if note := cfg.dcShortScanNote(res.Runs); note != "" {
		fmt.Fprintf(&b, "\n%s", note)
	}
	if scan := nearestScan(res.Runs, 100); scan >= 0 {
		fmt.Fprintf(&b, "\n## %d-key scans beside TiDB's figures\n\n", scan)
		b.WriteString("TiDB: scenario 1 for `leader-remote`, 2 for `follower-local`, 3 for `same-zone`; TiDB had no bounded-staleness read.\n\n")
		b.WriteString(dcHeadlineTable(res.Runs, 100))
	}

	b.WriteString("\n## Every scan length\n\n")
	b.WriteString(cfg.scanTable(res))

	b.WriteString("\n## TiDB's published figures beside ours, every scan length\n\n")
	b.WriteString("ops/s and client p99 ms; TiDB first, then this run.\n\n")
	b.WriteString(cfg.tidbTable(res))

	b.WriteString("\n## Where the reads were served\n\n")
	b.WriteString("From the stores' counts of the KV API's reads by mode (`hedgekv_server_reads_total`: lease, read-index, stale, follower-lease) over each run; ")
	b.WriteString("a scan of one region is one read, and the stores' own reads (the etcd API's lessor reading its leases on a new leader) are not counted.\n\n")
	writeServedWhere(&b, res, leader)

	writePlots(&b, res.Plots)
	return b.String()
}

// scanTable is the report's table of every variant at every scan length.
func (cfg *FollowerReadDCConfig) scanTable(res *FollowerReadDCResult) string {
	var cells [][]string
	for _, l := range cfg.ScanLengths {
		for _, r := range res.Runs {
			if r.ScanLength != l {
				continue
			}
			row := r.Phase.Row
			cells = append(cells, []string{
				r.Variant.Name, strconv.Itoa(l), strconv.FormatInt(row.Ops, 10), FormatFloat(row.QPS, 1),
				FormatFloat(row.P50Ms, 1), FormatFloat(row.P99Ms, 1), FormatFloat(row.P999Ms, 1), fmtOptMs(row.ServerP99Ms),
				fmtBytes(derefOr(row.WANBytesPerOp, 0)), strconv.FormatInt(row.Failed, 10),
			})
		}
	}
	return MarkdownTable([]string{"variant", "scan keys", "ops", "ops/s", "p50 ms", "p99 ms", "p99.9 ms", "server p99 ms", "WAN bytes/read", "failed"}, cells)
}

// tidbTable is the report's table of TiDB's published figures beside
// this run's, at every scan length.
func (cfg *FollowerReadDCConfig) tidbTable(res *FollowerReadDCResult) string {
	var cells [][]string
	for _, l := range cfg.ScanLengths {
		line := []string{strconv.Itoa(l)}
		for _, pair := range []struct {
			variant string
			tidb    int
		}{{"leader-remote", 1}, {"follower-local", 2}, {"same-zone", 3}} {
			t, ok := tidbScenarios[pair.tidb][l]
			var r *Row
			for i := range res.Runs {
				if res.Runs[i].Variant.Name == pair.variant && res.Runs[i].ScanLength == l {
					r = &res.Runs[i].Phase.Row
				}
			}
			tq, tp, q, p := "–", "–", "–", "–"
			if ok {
				tq, tp = FormatFloat(t.QPS, 0), FormatFloat(t.ClientP99Ms, 0)
			}
			if r != nil {
				q, p = FormatFloat(r.QPS, 0), FormatFloat(r.P99Ms, 1)
			}
			line = append(line, tq+" / "+q, tp+" / "+p)
		}
		cells = append(cells, line)
	}
	return MarkdownTable([]string{"scan keys", "remote leader ops/s (S1 / ours)", "p99 ms", "local follower ops/s (S2 / ours)", "p99 ms",
		"same zone ops/s (S3 / ours)", "p99 ms"}, cells)
}

// writeServedWhere writes where the reads were served (the client's zone
// or not, by which path), whether the leader moved, and the first errors.
func writeServedWhere(b *strings.Builder, res *FollowerReadDCResult, leader uint64) {
	var cells [][]string
	var moved []string
	for _, r := range res.Runs {
		cells = append(cells, []string{r.Variant.Name, strconv.Itoa(r.ScanLength), r.ClientZone,
			FormatFloat(100*r.LocalShare, 1) + "%", r.ServedBy})
		if r.LeaderMoved != "" {
			moved = append(moved, fmt.Sprintf("%s, scan %d: %s", r.Variant.Name, r.ScanLength, r.LeaderMoved))
		}
	}
	b.WriteString(MarkdownTable([]string{"variant", "scan keys", "client zone", "served in the client's zone", "served by"}, cells))
	if len(moved) == 0 {
		fmt.Fprintf(b, "\nRegion %d's leader was on store %d after every run.\n", hotRegionID, leader)
	} else {
		b.WriteString("\n**The leader moved:**\n\n")
		for _, m := range moved {
			fmt.Fprintf(b, "- %s\n", m)
		}
	}
	for _, r := range res.Runs {
		if r.Variant.Local && r.LocalShare < 0.99 {
			fmt.Fprintf(b, "\n**%s at scan %d was meant to be served in %s, but only %.1f%% of its reads were.**\n",
				r.Variant.Name, r.ScanLength, r.ClientZone, 100*r.LocalShare)
		}
	}
	for _, r := range res.Runs {
		for _, o := range r.Phase.Ops {
			if o.FirstErr != "" {
				fmt.Fprintf(b, "\nFirst %s error of %s at scan %d: %s\n", o.Op, r.Variant.Name, r.ScanLength, inlineCode(o.FirstErr))
			}
		}
	}
}
