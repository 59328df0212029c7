package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/pingcap/go-ycsb/pkg/ycsb"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/netsim"
)

// hot-region reproduces TiDB's claim that follower read "roughly doubles"
// the read throughput of a hot region: one region holds every row, clients
// in every zone read it at once, and the links into each store are the
// bottleneck (TiDB's: the leader's machine). Reading only from the leader
// uses the three links into the leader's store; reading from followers
// uses the six links into the two followers' stores; mixed reads use all
// nine. So the links allow at most 2x (follower) and 3x (mixed) the
// leader-only throughput.

// HotVariant is one read policy of hot-region.
type HotVariant struct {
	Name string
	Read client.ReplicaPolicy
	Doc  string
}

// HotVariants are hot-region's variants, in run order.
var HotVariants = []HotVariant{
	{Name: "leader-only", Read: client.ReplicaLeader, Doc: "every client reads from the leader (lease): three links carry every read"},
	{Name: "follower", Read: client.ReplicaFollower, Doc: "every client reads from the two followers (power of two choices, ReadIndex): six links, at most 2x"},
	{Name: "mixed", Read: client.ReplicaMixed, Doc: "every client reads from any replica (power of two choices; followers by ReadIndex): nine links, at most 3x"},
}

// DefaultHotLinkMbit is the bandwidth of every link of hot-region's
// built-in topology, low enough that the links, not the two CPUs, limit
// throughput.
const DefaultHotLinkMbit = 40

// HotRegionTopology is the default topology (dc-a, dc-b, dc-c, one store
// each, 14 ms one way between zones) with every link, those inside a zone
// included, limited to mbit Mbit/s per connection and direction.
func HotRegionTopology(mbit float64) *netsim.Topology {
	t := netsim.Default()
	t.Default.BandwidthMbit = mbit
	t.Links = nil
	for _, z := range t.Zones {
		t.Links = append(t.Links, netsim.Link{Between: [2]string{z.Name, z.Name}, LinkSpec: netsim.LinkSpec{BandwidthMbit: mbit}})
	}
	return t
}

// HotRegionConfig configures RunHotRegion.
type HotRegionConfig struct {
	// Quick: 2,000 records, 4 s runs: well under a minute on 2 cores.
	// Explicit values below still win.
	Quick bool
	// Topology (default HotRegionTopology(LinkMbit)); TopologyName names
	// it in the report. Clients sit in every zone of it.
	Topology     *netsim.Topology
	TopologyName string
	LinkMbit     float64 // of the built-in topology (default DefaultHotLinkMbit)
	LeaderZone   string  // default: the first zone with a store
	Records      int64   // default 10,000 (quick 2,000)
	// ThreadsPerZone client threads in each zone (default 16).
	ThreadsPerZone int
	ScanLength     int // keys per read (default 100)
	Variants       []string
	RunDuration    time.Duration // default 15s (quick 4s)
	Warmup         time.Duration // default 1s (quick 0.5s; negative: none)
	MaxOps         int64         // if > 0, also ends a run after this many operations (tests)
	OutDir         string        // results root: writes OutDir/hot-region
	NoPlots        bool
	Command        string
	Progress       io.Writer
	Logger         *slog.Logger
	Out            io.Writer
}

func (cfg *HotRegionConfig) setDefaults() error {
	setDefault(&cfg.LinkMbit, DefaultHotLinkMbit)
	if cfg.Topology == nil {
		cfg.Topology = HotRegionTopology(cfg.LinkMbit)
		cfg.TopologyName = fmt.Sprintf("default, every link %g Mbit/s", cfg.LinkMbit)
	}
	if cfg.TopologyName == "" {
		cfg.TopologyName = "custom"
	}
	if err := cfg.Topology.Validate(); err != nil {
		return err
	}
	if cfg.LeaderZone == "" {
		for _, z := range cfg.Topology.Zones {
			if len(z.Stores) > 0 {
				cfg.LeaderZone = z.Name
				break
			}
		}
	}
	setDefault(&cfg.Records, quickOr[int64](cfg.Quick, 10000, 2000))
	setDefault(&cfg.ThreadsPerZone, 16)
	setDefault(&cfg.ScanLength, 100)
	if cfg.ScanLength > ycsbdb.MaxScanLimit {
		return fmt.Errorf("scan length %d over %d", cfg.ScanLength, ycsbdb.MaxScanLimit)
	}
	var err error
	if cfg.Variants, err = chooseVariants(cfg.Variants, HotVariants, func(v HotVariant) string { return v.Name }); err != nil {
		return err
	}
	setDefault(&cfg.RunDuration, quickOr(cfg.Quick, 15*time.Second, 4*time.Second))
	setDefaultIfZero(&cfg.Warmup, quickOr(cfg.Quick, time.Second, 500*time.Millisecond))
	setOutputDefaults(&cfg.OutDir, &cfg.Logger, &cfg.Out)
	return nil
}

// HotRun is one measured run of hot-region.
type HotRun struct {
	Variant HotVariant
	Phase   *PhaseResult
	// ZoneOps are the successful reads of each zone's clients, in zone
	// order.
	ZoneOps  []int64
	ServedBy string
	// StoreShare is the fraction of reads each store served, by store id.
	StoreShare  map[uint64]float64
	WANBytes    uint64
	LeaderMoved string
}

// HotRegionResult is what RunHotRegion measured.
type HotRegionResult struct {
	Rows  []Row
	Runs  []HotRun
	Load  *PhaseResult
	Zones []string
	Dir   string
	Plots []string
}

// zonedDB gives each YCSB thread the client of one zone (thread i: zone
// i mod zones), so that one YCSB phase (go-ycsb measures one phase at a
// time per process) drives clients in every zone at once.
type zonedDB struct {
	dbs []*ycsbdb.DB
	ok  []atomic.Int64
}

type zoneKey struct{}

func (z *zonedDB) db(ctx context.Context) (*ycsbdb.DB, int) {
	i, _ := ctx.Value(zoneKey{}).(int)
	return z.dbs[i], i
}

func (z *zonedDB) count(i int, err error) {
	if err == nil {
		z.ok[i].Add(1)
	}
}

func (z *zonedDB) Close() error { return nil }

func (z *zonedDB) InitThread(ctx context.Context, threadID, threadCount int) context.Context {
	i := threadID % len(z.dbs)
	return z.dbs[i].InitThread(context.WithValue(ctx, zoneKey{}, i), threadID, threadCount)
}

func (z *zonedDB) CleanupThread(ctx context.Context) {
	db, _ := z.db(ctx)
	db.CleanupThread(ctx)
}

func (z *zonedDB) Read(ctx context.Context, table, key string, fields []string) (map[string][]byte, error) {
	db, i := z.db(ctx)
	v, err := db.Read(ctx, table, key, fields)
	z.count(i, err)
	return v, err
}

func (z *zonedDB) Scan(ctx context.Context, table, startKey string, count int, fields []string) ([]map[string][]byte, error) {
	db, i := z.db(ctx)
	v, err := db.Scan(ctx, table, startKey, count, fields)
	z.count(i, err)
	return v, err
}

func (z *zonedDB) Update(ctx context.Context, table, key string, values map[string][]byte) error {
	db, _ := z.db(ctx)
	return db.Update(ctx, table, key, values)
}

func (z *zonedDB) Insert(ctx context.Context, table, key string, values map[string][]byte) error {
	db, _ := z.db(ctx)
	return db.Insert(ctx, table, key, values)
}

func (z *zonedDB) Delete(ctx context.Context, table, key string) error {
	db, _ := z.db(ctx)
	return db.Delete(ctx, table, key)
}

var _ ycsb.DB = (*zonedDB)(nil)

// RunHotRegion runs the scenario and writes
// OutDir/hot-region/{results.json,report.md,*.png}.
func RunHotRegion(ctx context.Context, cfg HotRegionConfig) (*HotRegionResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("hot-region: %w", err)
	}
	started := time.Now()
	variants := pickVariants(HotVariants, cfg.Variants, func(v HotVariant) string { return v.Name })
	zones := cfg.Topology.ZoneNames()
	prog := newProgress(cfg.Progress, "hot-region", 1+len(variants))
	defer prog.Done()

	prog.Printf("hot-region: starting %d stores behind %s", len(cfg.Topology.Stores()), cfg.TopologyName)
	c, err := startWANCluster(ctx, cfg.Topology, cfg.LeaderZone, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("hot-region: %w", err)
	}
	defer c.Stop()

	res := &HotRegionResult{Zones: zones, Dir: filepath.Join(cfg.OutDir, "hot-region")}
	zdbs := make([]*zonedDB, len(variants))
	defer func() {
		for _, z := range zdbs {
			if z == nil {
				continue
			}
			closeDBs(z.dbs)
		}
	}()
	for i, v := range variants {
		z := &zonedDB{ok: make([]atomic.Int64, len(zones))}
		zdbs[i] = z
		for _, zone := range zones {
			db, err := c.openZoneDB(ctx, zone, client.ReadPolicy{Replica: v.Read})
			if err != nil {
				return nil, fmt.Errorf("hot-region: %s client in %s: %w", v.Name, zone, err)
			}
			z.dbs = append(z.dbs, db)
		}
	}
	loader, err := c.openZoneDB(ctx, cfg.LeaderZone, client.ReadPolicy{})
	if err != nil {
		return nil, fmt.Errorf("hot-region: %w", err)
	}
	res.Load, err = loadRows(ctx, loader, cfg.Records, 64, prog, cfg.Logger)
	_ = loader.Close()
	if err != nil {
		return nil, fmt.Errorf("hot-region: %w", err)
	}
	var notes []string
	if moved := c.leaderCheck(ctx); moved != "" {
		notes = append(notes, "after the load: "+moved)
	}

	threads := cfg.ThreadsPerZone * len(zones)
	var errs []error
	for i, v := range variants {
		run, err := cfg.measure(ctx, c, zdbs[i], v, threads, prog)
		if run != nil {
			res.Runs = append(res.Runs, *run)
			res.Rows = append(res.Rows, run.Phase.Row)
			prog.Printf("%-12s %8.1f reads/s  p50 %8.1f ms  p99 %8.1f ms  %s", v.Name, run.Phase.Row.QPS,
				run.Phase.Row.P50Ms, run.Phase.Row.P99Ms, failedNote(run.Phase.Row.Failed))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("hot-region: %s: %w", v.Name, err))
			if !errors.Is(err, ErrAllFailed) {
				break
			}
		}
	}
	prog.Done() // before the tables are printed
	return res, errors.Join(append(errs, cfg.write(res, c, started, threads, notes))...)
}

func (cfg *HotRegionConfig) measure(ctx context.Context, c *wanCluster, z *zonedDB, v HotVariant, threads int, prog *Progress) (*HotRun, error) {
	spec := Spec{
		Instance: z, Workload: "scan", Records: cfg.Records, Threads: threads, Run: true,
		MaxScanLength: cfg.ScanLength, ScanLengthDistribution: "constant", Properties: rowProps(),
		Variant: v.Name, Param: "scan=" + strconv.Itoa(cfg.ScanLength), ProgressInterval: -1, QuietWorkload: true, Logger: cfg.Logger,
		AbortAfterFailures: -1,
	}
	var before clusterSnap
	phase, err := runTimed(ctx, spec, v.Name, cfg.MaxOps, cfg.Warmup, cfg.RunDuration, prog, func() {
		for i := range z.ok {
			z.ok[i].Store(0)
		}
		before = c.snap(ctx, "KV.Scan")
	})
	if phase == nil {
		return nil, err
	}
	d := c.delta(before, c.snap(ctx, "KV.Scan"))
	run := &HotRun{Variant: v, Phase: phase, ServedBy: c.servedBy(d), WANBytes: d.wanBytes,
		StoreShare: map[uint64]float64{}, LeaderMoved: c.leaderCheck(ctx)}
	for i := range z.ok {
		run.ZoneOps = append(run.ZoneOps, z.ok[i].Load())
	}
	var total uint64
	for _, n := range d.reads {
		total += n
	}
	for id, n := range d.reads {
		if total > 0 {
			run.StoreShare[id] = float64(n) / float64(total)
		}
	}
	d.annotate(&run.Phase.Row, run.ServedBy)
	return run, err
}

// hotRatio is the best of follower and mixed over leader-only, and which.
func hotRatio(runs []HotRun) (ratio float64, best string) {
	var base float64
	for _, r := range runs {
		if r.Variant.Name == "leader-only" {
			base = r.Phase.Row.QPS
		}
	}
	if base <= 0 {
		return 0, ""
	}
	for _, r := range runs {
		if r.Variant.Name != "leader-only" && r.Phase.Row.QPS/base > ratio {
			ratio, best = r.Phase.Row.QPS/base, r.Variant.Name
		}
	}
	return ratio, best
}

func (cfg *HotRegionConfig) table(res *HotRegionResult) string {
	var base float64
	for _, r := range res.Runs {
		if r.Variant.Name == "leader-only" {
			base = r.Phase.Row.QPS
		}
	}
	var cells [][]string
	for _, r := range res.Runs {
		row := r.Phase.Row
		ratio := "–"
		if base > 0 {
			ratio = FormatFloat(row.QPS/base, 2) + "×"
		}
		var perZone []string
		secs := r.Phase.Elapsed.Seconds()
		for i, n := range r.ZoneOps {
			perZone = append(perZone, fmt.Sprintf("%s %.0f", res.Zones[i], float64(n)/secs))
		}
		mbps := row.QPS * float64(cfg.ScanLength) * 1082 / 1e6
		cells = append(cells, []string{r.Variant.Name, FormatFloat(row.QPS, 1), ratio, FormatFloat(mbps, 1),
			strings.Join(perZone, ", "), FormatFloat(row.P50Ms, 1), FormatFloat(row.P99Ms, 1), fmtOptMs(row.ServerP99Ms),
			strconv.FormatInt(row.Failed, 10)})
	}
	return MarkdownTable([]string{"variant", "reads/s (all zones)", "vs leader-only", "MB/s of rows", "reads/s by client zone",
		"p50 ms", "p99 ms", "server p99 ms", "failed"}, cells)
}

func (cfg *HotRegionConfig) write(res *HotRegionResult, c *wanCluster, started time.Time, threads int, notes []string) error {
	if len(res.Runs) == 0 {
		return nil
	}
	var errs []error
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return err
	}
	if !cfg.NoPlots {
		var labels, notes []string
		var qps []float64
		var hists []*hdrhistogram.Histogram
		base := 0.0
		for _, r := range res.Runs {
			if r.Variant.Name == "leader-only" {
				base = r.Phase.Row.QPS
			}
		}
		for _, r := range res.Runs {
			labels = append(labels, r.Variant.Name)
			qps = append(qps, r.Phase.Row.QPS)
			hists = append(hists, r.Phase.Latency)
			note := ""
			if base > 0 {
				note = FormatFloat(r.Phase.Row.QPS/base, 2) + "×"
			}
			notes = append(notes, note)
		}
		names := variantNames(HotVariants, func(v HotVariant) string { return v.Name })
		var plots plotSet
		plots.add(barPlot(res.Dir, "hot-region-throughput.png",
			fmt.Sprintf("hot-region: reads/s of one region, clients in %d zones", len(res.Zones)), "reads per second", labels, qps, notes))
		plots.add(cdfPlot(res.Dir, "hot-region-cdf.png", "hot-region: latency CDF", names, hists, labels))
		res.Plots = plots.files
		errs = append(errs, plots.errs...)
	}
	table := cfg.table(res)
	ratio, best := hotRatio(res.Runs)
	if err := WriteResults(res.Dir, Results{Scenario: "hot-region", Rows: res.Rows}, cfg.report(res, c, started, threads, table, notes)); err != nil {
		errs = append(errs, err)
	}
	fmt.Fprintf(cfg.Out, "\n%s", table)
	if best != "" {
		fmt.Fprintf(cfg.Out, "\nbest of follower/mixed vs leader-only: %s %.2f× (target ≥ 2.5×, TiDB ~2×)\n", best, ratio)
	}
	printWritten(cfg.Out, res.Dir, res.Plots)
	return errors.Join(errs...)
}

func (cfg *HotRegionConfig) report(res *HotRegionResult, c *wanCluster, started time.Time, threads int, table string, notes []string) string {
	var b strings.Builder
	writeReportHeader(&b, "hot-region: read throughput of one hot region, leader-only vs follower vs mixed", started, cfg.Command)
	fmt.Fprintf(&b, "- WAN (`%s`): %s.\n", cfg.TopologyName, describeTopology(cfg.Topology))
	b.WriteString("- **The links are the bottleneck on purpose**: a link's bandwidth is per connection and direction, and each client holds one connection per store, ")
	b.WriteString("so a store can send a zone's clients at most one link's worth. Every link, those inside a zone too, is limited so that the links, ")
	b.WriteString("not this machine's two CPUs (which every store, proxy and client share), limit throughput, as the leader's machine did in TiDB's test.\n")
	fmt.Fprintf(&b, "- Region %d holds all %d rows (~1 KB each; splits off), its leader on store %d in %s, balancer paused. ",
		hotRegionID, cfg.Records, c.leaderStore, cfg.LeaderZone)
	fmt.Fprintf(&b, "Clients in every zone (%s) read at once: %d threads per zone, %d in all, each read a scan of %d rows from a uniformly chosen key; ",
		strings.Join(res.Zones, ", "), cfg.ThreadsPerZone, threads, cfg.ScanLength)
	fmt.Fprintf(&b, "each run %v after a %v warm-up. Every read is linearizable.\n", cfg.RunDuration, max(cfg.Warmup, 0))
	b.WriteString("- `MB/s of rows` is reads/s × rows × 1,082 bytes (a row as stored).\n")
	for _, n := range notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	writeVariantList(&b, "Variants:", HotVariants, cfg.Variants, func(v HotVariant) (string, string) { return v.Name, v.Doc })
	b.WriteString("\n## Throughput\n\n")
	b.WriteString(table)
	if ratio, best := hotRatio(res.Runs); best != "" {
		met := "**met**"
		if ratio < 2.5 {
			met = "not met"
		}
		b.WriteString("\n")
		b.WriteString(MarkdownTable([]string{"ratio (same run)", "measured", "target", "TiDB", ""},
			[][]string{{"best of follower / mixed ÷ leader-only reads/s (" + best + ")", FormatFloat(ratio, 2) + "×", "≥ 2.5×", "~2× (\"roughly doubles\")", met}}))
	}
	b.WriteString("\n## Where the reads were served\n\n")
	var cells [][]string
	var moved []string
	for _, r := range res.Runs {
		var shares []string
		for _, id := range c.StoreIDs() {
			shares = append(shares, fmt.Sprintf("%d: %.0f%%", id, 100*r.StoreShare[id]))
		}
		cells = append(cells, []string{r.Variant.Name, strings.Join(shares, ", "), r.ServedBy})
		if r.LeaderMoved != "" {
			moved = append(moved, r.Variant.Name+": "+r.LeaderMoved)
		}
	}
	b.WriteString(MarkdownTable([]string{"variant", "share by store", "served by"}, cells))
	if len(moved) == 0 {
		fmt.Fprintf(&b, "\nRegion %d's leader was on store %d after every run.\n", hotRegionID, c.leaderStore)
	} else {
		b.WriteString("\n**The leader moved:**\n\n")
		for _, m := range moved {
			fmt.Fprintf(&b, "- %s\n", m)
		}
	}
	for _, r := range res.Runs {
		for _, o := range r.Phase.Ops {
			if o.FirstErr != "" {
				fmt.Fprintf(&b, "\nFirst %s error of %s: %s\n", o.Op, r.Variant.Name, inlineCode(o.FirstErr))
			}
		}
	}
	writePlots(&b, res.Plots)
	return b.String()
}
