package bench

// peer-etcd behind a simulated WAN (--topology): both systems' members one
// per zone, their client and peer traffic through netsim links; scans of
// several lengths, and the report beside the single-machine one.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/pingcap/go-ycsb/pkg/ycsb"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/netsim"
	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// setWANDefaults fills in the topology settings (before the common
// defaults, which it leaves nothing to do for Records and Threads).
func (cfg *PeerEtcdConfig) setWANDefaults() error {
	if cfg.TopologyName == "" {
		cfg.TopologyName = "custom"
	}
	if err := cfg.Topology.Validate(); err != nil {
		return err
	}
	if len(cfg.HedgeKVEndpoints) > 0 {
		return errors.New("a running hedgekv cluster (endpoints) cannot be put behind a topology; the scenario starts its own")
	}
	var err error
	if cfg.LeaderZone, cfg.ClientZone, err = pickZones(cfg.Topology, cfg.LeaderZone, cfg.ClientZone,
		"one for the leaders, one for the client and its local replica"); err != nil {
		return err
	}
	setDefault(&cfg.Records, quickOr[int64](cfg.Quick, 20000, 2000))
	setDefault(&cfg.Threads, 32)
	if len(cfg.ScanLengths) == 0 {
		cfg.ScanLengths = []int{10, 100}
	}
	if err := checkScanLengths(cfg.ScanLengths); err != nil {
		return err
	}
	setDefault(&cfg.RunDuration, quickOr(cfg.Quick, 15*time.Second, 3*time.Second))
	setDefaultIfZero(&cfg.Warmup, quickOr(cfg.Quick, time.Second, 500*time.Millisecond))
	cfg.Workloads = []string{"scan"}
	return nil
}

// firstStore is the lowest store id of zone in the topology (0: none).
func firstStore(t *netsim.Topology, zone string) uint64 {
	for _, z := range t.Zones {
		if z.Name == zone && len(z.Stores) > 0 {
			return slices.Min(z.Stores)
		}
	}
	return 0
}

// wanProgress is the progress bar of a topology run (nil: none): a load
// and a run per variant and scan length for each group of variants.
func (st *peerState) wanProgress(groups ...int) *Progress {
	steps := 0
	for _, n := range groups {
		if n > 0 {
			steps += 1 + n*len(st.cfg.ScanLengths)
		}
	}
	return newProgress(st.cfg.Progress, "peer-etcd", steps)
}

// runWAN runs the scenario behind cfg.Topology: etcd first, then hedgekv
// through its own client, then hedgekv through the etcd API (a cluster of
// its own), never two at the same time, each loaded once and read with
// every variant at every scan length.
func (st *peerState) runWAN(ctx context.Context) (*PeerEtcdResult, error) {
	cfg := st.cfg
	etcdVariants, hkVariants, hkEtcdVariants := cfg.wants(SystemEtcd), cfg.wants(SystemHedgeKV), cfg.wants(hedgeKVEtcdGroup)
	var etcdBinary string
	if len(etcdVariants) > 0 {
		var err error
		if etcdBinary, err = cluster.FindEtcd(cfg.EtcdBinary); err != nil {
			return nil, fmt.Errorf("peer-etcd: %w", err)
		}
	}
	prog := st.wanProgress(len(etcdVariants), len(hkVariants), len(hkEtcdVariants))
	defer prog.Done()

	var errs []error
	if len(etcdVariants) > 0 {
		errs = append(errs, st.wanEtcd(ctx, etcdBinary, etcdVariants, prog))
	}
	if len(hkVariants) > 0 && ctx.Err() == nil {
		errs = append(errs, st.wanHedgeKV(ctx, hkVariants, prog))
	}
	if len(hkEtcdVariants) > 0 && ctx.Err() == nil {
		errs = append(errs, st.wanHedgeKVEtcd(ctx, hkEtcdVariants, prog))
	}
	prog.Done() // before the tables are printed
	err := errors.Join(errs...)
	if len(st.res.Runs) == 0 {
		return &st.res, err
	}
	if werr := st.writeWAN(); werr != nil {
		err = errors.Join(err, werr)
	}
	return &st.res, err
}

// wanEtcd runs the etcd variants: members behind the topology, the leader
// moved to LeaderZone's member, loaded by a client beside the leader, read
// by a client in ClientZone that knows only its zone's member.
func (st *peerState) wanEtcd(ctx context.Context, binary string, variants []PeerVariant, prog *Progress) error {
	cfg := st.cfg
	leader, local := firstStore(cfg.Topology, cfg.LeaderZone), firstStore(cfg.Topology, cfg.ClientZone)
	prog.Printf("peer-etcd: starting etcd (%s), %d members behind the %s topology", cluster.EtcdVersion(ctx, binary), len(cfg.Topology.Stores()), cfg.TopologyName)
	c, err := cluster.StartEtcd(ctx, cluster.EtcdConfig{Binary: binary, Topology: cfg.Topology, Logger: quietStores(cfg.Logger)})
	if err != nil {
		return fmt.Errorf("peer-etcd: start etcd: %w", err)
	}
	defer c.Stop()
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = c.MoveLeader(mctx, leader)
	cancel()
	if err != nil {
		return fmt.Errorf("peer-etcd: %w", err)
	}

	// The loader writes as etcd-linearizable's binding does (go-ycsb's
	// binding stores JSON).
	dbs, err := st.loadThenOpen(ctx, SystemEtcd, variants, prog,
		peerVariant("etcd-linearizable"), c.ZoneEndpoint(cfg.LeaderZone, leader), c.ZoneEndpoint(cfg.ClientZone, local))
	defer closeDBs(dbs)
	if err != nil {
		return err
	}
	defer func() {
		attributed, unattributed := c.PeerConnections()
		st.notes = append(st.notes, fmt.Sprintf("etcd: %s (%s), binding %q; members %s; default settings (fsync on, heartbeat 100 ms, election timeout 1 s); "+
			"leader moved to m%d (%s) with MoveLeader; the client's only endpoint is m%d (%s) through %s's link; "+
			"the peer routers passed on %d peer connections by their sender and %d without a sender header (probes)",
			binary, cluster.EtcdVersion(ctx, binary), cfg.EtcdBinding, etcdMembersText(c), leader, cfg.LeaderZone, local, cfg.ClientZone, cfg.ClientZone,
			attributed, unattributed))
	}()

	return st.eachWANRun(variants, prog, func(i, scan int) (*PeerRun, error) {
		var before uint64
		r, err := st.measureWAN(ctx, dbs[i], variants[i], scan, prog, func() { before = c.WANBytes() })
		if r != nil {
			r.WANBytes = c.WANBytes() - before
			r.ServedBy = fmt.Sprintf("member m%d (%s), the client's only endpoint", local, cfg.ClientZone)
			r.LeaderMoved = st.etcdLeaderCheck(ctx, c, leader)
		}
		return r, err
	})
}

func etcdMembersText(c *cluster.Etcd) string {
	var parts []string
	for _, s := range c.Stores() {
		parts = append(parts, fmt.Sprintf("m%d in %s", s, c.Zone(s)))
	}
	return strings.Join(parts, ", ")
}

// etcdLeaderCheck says whether etcd's leader is still on store's member,
// and moves it back if not.
func (st *peerState) etcdLeaderCheck(ctx context.Context, c *cluster.Etcd, store uint64) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	now, err := c.Leader(ctx)
	if err == nil && now == store {
		return ""
	}
	moved := fmt.Sprintf("etcd's leader was m%d, not m%d, after the run", now, store)
	if err != nil {
		moved = fmt.Sprintf("etcd's leader after the run is unknown (%v)", err)
	}
	if err := c.MoveLeader(ctx, store); err != nil {
		return moved + "; moving it back failed: " + err.Error()
	}
	return moved + "; moved back"
}

// wanHedgeKV runs the hedgekv variants: three stores behind the topology
// (follower-read-dc's cluster: region 1's leader in LeaderZone, balancer
// paused, splits off), loaded by a client beside the leader, read by
// clients in ClientZone.
func (st *peerState) wanHedgeKV(ctx context.Context, variants []PeerVariant, prog *Progress) error {
	cfg := st.cfg
	prog.Printf("peer-etcd: starting %d hedgekv stores behind the %s topology", len(cfg.Topology.Stores()), cfg.TopologyName)
	c, err := startWANCluster(ctx, cfg.Topology, cfg.LeaderZone, cfg.Logger)
	if err != nil {
		return fmt.Errorf("peer-etcd: start hedgekv: %w", err)
	}
	defer c.Stop()
	dbs := make([]*ycsbdb.DB, len(variants))
	defer closeDBs(dbs)
	for i, v := range variants {
		read := client.ReadPolicy{Replica: client.ReplicaLeader}
		switch v.Name {
		case "hedgekv-follower":
			read.Replica = client.ReplicaClosest
		case "hedgekv-follower-stale", "hedgekv-etcd-serializable":
			read.Replica, read.MaxStaleness = client.ReplicaClosest, cfg.MaxStaleness
		}
		if dbs[i], err = c.openZoneDB(ctx, cfg.ClientZone, read); err != nil {
			return fmt.Errorf("peer-etcd: %s: %w", v.Name, err)
		}
	}
	loader, err := c.openZoneDB(ctx, cfg.LeaderZone, client.ReadPolicy{})
	if err != nil {
		return fmt.Errorf("peer-etcd: %w", err)
	}
	load, err := loadRows(ctx, loader, cfg.Records, max(cfg.Threads, 64), prog, cfg.Logger)
	_ = loader.Close()
	if load != nil {
		st.res.Loads[SystemHedgeKV] = load
	}
	if err != nil {
		return fmt.Errorf("peer-etcd: hedgekv: %w", err)
	}
	st.notes = append(st.notes, fmt.Sprintf("hedgekv: stores %s in this process (bbolt without fsync: only the load writes); "+
		"region %d holds every row (splits off), its leader on store %d in %s (balancer paused); the clients sit in %s and reach every store through %s's links; "+
		"hedgekv-follower-stale reads with MaxStaleness %v",
		hkStoresText(c), hotRegionID, c.leaderStore, cfg.LeaderZone, cfg.ClientZone, cfg.ClientZone, cfg.MaxStaleness))

	return st.eachWANRun(variants, prog, func(i, scan int) (*PeerRun, error) {
		var before clusterSnap
		r, err := st.measureWAN(ctx, dbs[i], variants[i], scan, prog, func() { before = c.snap(ctx, "KV.Scan") })
		if r != nil {
			d := c.delta(before, c.snap(ctx, "KV.Scan"))
			r.WANBytes, r.ServedBy = d.wanBytes, c.servedBy(d)
			r.LeaderMoved = c.leaderCheck(ctx)
			if p99, ok := d.serverMs(0.99); ok {
				r.Phase.Row.ServerP99Ms = ptr(p99)
			}
			if p50, ok := d.serverMs(0.5); ok {
				r.ServerP50Ms = p50
			}
		}
		return r, err
	})
}

// wanHedgeKVEtcd runs hedgekv's EtcdAPI variants as wanEtcd runs etcd's,
// with the same binding: three stores behind the topology (as wanHedgeKV's,
// a cluster of their own), the etcd keyspace's region led from
// LeaderZone's first store, loaded by a client beside the leader, read by a
// client in ClientZone whose only endpoint is its zone's store, through
// its zone's link.
func (st *peerState) wanHedgeKVEtcd(ctx context.Context, variants []PeerVariant, prog *Progress) error {
	cfg := st.cfg
	local := firstStore(cfg.Topology, cfg.ClientZone)
	prog.Printf("peer-etcd: starting %d hedgekv stores behind the %s topology for its etcd API", len(cfg.Topology.Stores()), cfg.TopologyName)
	c, err := startWANCluster(ctx, cfg.Topology, cfg.LeaderZone, cfg.Logger)
	if err != nil {
		return fmt.Errorf("peer-etcd: start hedgekv: %w", err)
	}
	defer c.Stop()
	// Splits are off, so region 1 holds the etcd keyspace too; should it
	// not, its own region's leader goes where region 1's went.
	if id := c.regionOf([]byte(etcdapi.Prefix)); id != 0 && id != hotRegionID {
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := c.MoveLeader(mctx, id, c.leaderStore)
		cancel()
		if err != nil {
			return fmt.Errorf("peer-etcd: hedgekv: etcd keyspace's region %d: %w", id, err)
		}
		c.region = id
	}
	dbs, err := st.loadThenOpen(ctx, hedgeKVEtcdGroup, variants, prog,
		variants[0], c.Network().Addr(cfg.LeaderZone, c.leaderStore), c.Network().Addr(cfg.ClientZone, local))
	defer closeDBs(dbs)
	if err != nil {
		return err
	}
	st.notes = append(st.notes, fmt.Sprintf("hedgekv-etcd-*: another cluster as hedgekv's above, stores %s, region %d (the etcd keyspace) led from store %d in %s, "+
		"driven through its etcd API by the etcd variants' binding (%q), loaded by a client beside the leader; the client's only endpoint is store %d (%s) through %s's link, "+
		"as etcd's client has m%d; hedgekv-etcd-linearizable sends no read mode (the store's default, leader: store %d forwards each Range to the leader), "+
		"hedgekv-etcd-follower sends hedgekv-read-mode=follower; their `server p99` is store %d's etcdserverpb.KV/Range histogram",
		hkStoresText(c), c.placedRegion(), c.leaderStore, cfg.LeaderZone, cfg.EtcdBinding, local, cfg.ClientZone, cfg.ClientZone, local, local, local))

	statusAddr := []string{c.StatusAddr(local)}
	return st.eachWANRun(variants, prog, func(i, scan int) (*PeerRun, error) {
		var before clusterSnap
		r, err := st.measureWAN(ctx, dbs[i], variants[i], scan, prog, func() { before = c.snapAt(ctx, etcdRangeMethod, statusAddr) })
		if r != nil {
			d := c.delta(before, c.snapAt(ctx, etcdRangeMethod, statusAddr))
			r.WANBytes, r.ServedBy = d.wanBytes, c.servedBy(d)
			r.LeaderMoved = c.leaderCheck(ctx)
			if p99, ok := d.serverMs(0.99); ok {
				r.Phase.Row.ServerP99Ms = ptr(p99)
			}
			if p50, ok := d.serverMs(0.5); ok {
				r.ServerP50Ms = p50
			}
		}
		return r, err
	})
}

// etcdRangeMethod is how a store's request metrics name etcd's KV.Range.
const etcdRangeMethod = "etcdserverpb.KV.Range"

// loadThenOpen loads the records through a client of loadAt (writing as
// loadAs's binding does), records the load as group's, then opens one
// client of readAt per variant. The clients it returns, opened or nil,
// are the caller's to close (closeDBs), also with an error.
func (st *peerState) loadThenOpen(ctx context.Context, group string, variants []PeerVariant, prog *Progress,
	loadAs PeerVariant, loadAt, readAt string) ([]ycsb.DB, error) {
	cfg := st.cfg
	loader, err := cfg.openDB(loadAs, []string{loadAt})
	if err != nil {
		return nil, fmt.Errorf("peer-etcd: %w", err)
	}
	load, err := loadRows(ctx, loader, cfg.Records, max(cfg.Threads, 64), prog, cfg.Logger)
	_ = loader.Close()
	if load != nil {
		st.res.Loads[group] = load
	}
	if err != nil {
		return nil, fmt.Errorf("peer-etcd: %s: %w", group, err)
	}
	dbs := make([]ycsb.DB, len(variants))
	for i, v := range variants {
		if dbs[i], err = cfg.openDB(v, []string{readAt}); err != nil {
			return dbs, fmt.Errorf("peer-etcd: %w", err)
		}
	}
	return dbs, nil
}

// eachWANRun measures every variant at every scan length, in that order,
// and records each run: a run whose operations all failed is kept and the
// next goes on; any other error ends them.
func (st *peerState) eachWANRun(variants []PeerVariant, prog *Progress, measure func(i, scan int) (*PeerRun, error)) error {
	var errs []error
	for _, l := range st.cfg.ScanLengths {
		for i, v := range variants {
			r, err := measure(i, l)
			if r != nil {
				st.addWANRun(r, prog)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("peer-etcd: %s, scan %d: %w", v.Name, l, err))
				if !errors.Is(err, ErrAllFailed) {
					return errors.Join(errs...)
				}
			}
		}
	}
	return errors.Join(errs...)
}

func hkStoresText(c *wanCluster) string {
	var parts []string
	for _, id := range c.StoreIDs() {
		parts = append(parts, fmt.Sprintf("%d in %s", id, c.Zone(id)))
	}
	return strings.Join(parts, ", ")
}

// measureWAN runs one variant at one scan length: an unmeasured warm-up,
// then mark (a snapshot of the system's counters), then the measured run.
// The caller fills in what the counters say.
func (st *peerState) measureWAN(ctx context.Context, db ycsb.DB, v PeerVariant, scanLen int, prog *Progress, mark func()) (*PeerRun, error) {
	cfg := st.cfg
	spec := Spec{
		Instance: db, Workload: "scan", Records: cfg.Records, Threads: cfg.Threads, Run: true,
		MaxScanLength: scanLen, ScanLengthDistribution: "constant", Properties: rowProps(),
		Variant: v.Name, Param: strconv.Itoa(scanLen), ProgressInterval: -1, QuietWorkload: true, Logger: cfg.Logger,
		AbortAfterFailures: -1,
	}
	phase, err := runTimed(ctx, spec, fmt.Sprintf("%s scan=%d", v.Name, scanLen), cfg.MaxOps, cfg.Warmup, cfg.RunDuration, prog, mark)
	if phase == nil {
		return nil, err
	}
	return &PeerRun{Variant: v, Workload: "scan", Phase: phase, ScanLength: scanLen}, err
}

// addWANRun records a run: its row gets the WAN bytes per successful read
// and where the reads were served.
func (st *peerState) addWANRun(r *PeerRun, prog *Progress) {
	row := &r.Phase.Row
	setWANBytesPerOp(row, r.WANBytes)
	row.ServedBy = r.ServedBy
	st.res.Runs = append(st.res.Runs, *r)
	st.res.Rows = append(st.res.Rows, *row)
	prog.Printf("%-22s scan %-5d %8.1f ops/s  p50 %8.1f ms  p99 %8.1f ms  WAN %s/read  %s",
		r.Variant.Name, r.ScanLength, row.QPS, row.P50Ms, row.P99Ms, fmtBytes(derefOr(row.WANBytesPerOp, 0)), failedNote(row.Failed))
}

// wanComparisons are the ratios a topology run reports: the target
// first (hedgekv's linearizable follower read against etcd's serializable
// one), then each hedgekv read against etcd's read of the same guarantee.
var wanComparisons = []struct {
	hk, etcd, why string
	target        float64 // on ops/s at 100 keys; 0: none
}{
	{"hedgekv-follower", "etcd-serializable", "hedgekv's linearizable follower read against etcd's local (not linearizable) read", 1},
	{"hedgekv-follower", "etcd-linearizable", "both linearizable, both served in the client's zone after a round trip to the leader", 0},
	{"hedgekv-follower-stale", "etcd-serializable", "both local and possibly stale", 0},
	// One binding, two servers.
	{"hedgekv-etcd-linearizable", "etcd-linearizable", "both linearizable through the same etcd binding: hedgekv's local store forwards the Range to the remote leader, etcd's local member asks it for a ReadIndex", 0},
	{"hedgekv-etcd-follower", "etcd-linearizable", "both linearizable through the same etcd binding, both served in the client's zone after a round trip to the leader", 0},
	{"hedgekv-etcd-serializable", "etcd-serializable", "both serializable through the same etcd binding: local and possibly stale", 0},
}

func (st *peerState) findWAN(variant string, scan int) *Row {
	for i := range st.res.Runs {
		if r := &st.res.Runs[i]; r.Variant.Name == variant && r.ScanLength == scan {
			return &r.Phase.Row
		}
	}
	return nil
}

func (st *peerState) wanRatios() string {
	ratio := func(a, b float64) string {
		if b <= 0 {
			return "n/a"
		}
		return FormatFloat(a/b, 2) + "×"
	}
	var cells [][]string
	for _, l := range st.cfg.ScanLengths {
		for _, cmp := range wanComparisons {
			h, e := st.findWAN(cmp.hk, l), st.findWAN(cmp.etcd, l)
			if h == nil || e == nil {
				continue
			}
			target := "–"
			if cmp.target > 0 && l == 100 {
				met := "not met"
				if e.QPS > 0 && h.QPS/e.QPS >= cmp.target {
					met = "**met**"
				}
				target = fmt.Sprintf("ops/s ≥ %s×: %s", FormatFloat(cmp.target, 1), met)
			}
			cells = append(cells, []string{strconv.Itoa(l), cmp.hk + " vs " + cmp.etcd,
				fmt.Sprintf("%s (%s / %s)", ratio(h.QPS, e.QPS), FormatFloat(h.QPS, 0), FormatFloat(e.QPS, 0)),
				fmt.Sprintf("%s (%s / %s ms)", ratio(h.P99Ms, e.P99Ms), FormatFloat(h.P99Ms, 1), FormatFloat(e.P99Ms, 1)),
				target})
		}
	}
	if len(cells) == 0 {
		return ""
	}
	return MarkdownTable([]string{"scan keys", "hedgekv vs etcd", "ops/s ratio", "p99 ratio", "target"}, cells)
}

func (st *peerState) wanTable() string {
	var cells [][]string
	for _, l := range st.cfg.ScanLengths {
		for _, r := range st.res.Runs {
			if r.ScanLength != l {
				continue
			}
			row := r.Phase.Row
			lin := "no"
			if r.Variant.Linearizable {
				lin = "yes"
			}
			cells = append(cells, []string{strconv.Itoa(l), r.Variant.Name, r.Variant.WANRead, lin,
				FormatFloat(row.QPS, 0), FormatFloat(row.P50Ms, 1), FormatFloat(row.P99Ms, 1), FormatFloat(row.P999Ms, 1),
				fmtOptMs(row.ServerP99Ms), fmtBytes(derefOr(row.WANBytesPerOp, 0)), strconv.FormatInt(row.Ops, 10), strconv.FormatInt(row.Failed, 10)})
		}
	}
	return MarkdownTable([]string{"scan keys", "variant", "reads", "linearizable", "ops/s", "p50 ms", "p99 ms", "p99.9 ms",
		"server p99 ms", "WAN bytes/read", "ops", "failed"}, cells)
}

func (st *peerState) writeWAN() error {
	cfg := st.cfg
	dir := filepath.Join(cfg.OutDir, "peer-etcd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var errs []error
	var plots []string
	if !cfg.NoPlots {
		names := variantNames(PeerVariants, func(v PeerVariant) string { return v.Name })
		for _, l := range cfg.ScanLengths {
			var hists []*hdrhistogram.Histogram
			var labels []string
			for _, r := range st.res.Runs {
				if r.ScanLength == l {
					hists = append(hists, r.Phase.Latency)
					labels = append(labels, r.Variant.Name)
				}
			}
			f, err := cdfPlot(dir, fmt.Sprintf("cdf-scan-%d.png", l), fmt.Sprintf("peer-etcd across the WAN: latency CDF, %d-key scans", l), names, hists, labels)
			if err != nil {
				errs = append(errs, fmt.Errorf("plots: %w", err))
			} else if f != "" {
				plots = append(plots, f)
			}
		}
	}
	table, ratios := st.wanTable(), st.wanRatios()
	if err := WriteResults(dir, Results{Scenario: "peer-etcd", Rows: st.res.Rows}, st.wanReport(table, ratios, plots)); err != nil {
		errs = append(errs, err)
	}
	fmt.Fprintf(cfg.Out, "\n%s", table)
	if ratios != "" {
		fmt.Fprintf(cfg.Out, "\n%s", ratios)
	}
	fmt.Fprintf(cfg.Out, "\nwrote %s and %s", filepath.Join(dir, "results.json"), filepath.Join(dir, "report.md"))
	if len(plots) > 0 {
		fmt.Fprintf(cfg.Out, " and %d plots (%s)", len(plots), strings.Join(plots, ", "))
	}
	fmt.Fprintln(cfg.Out)
	return errors.Join(errs...)
}

func (st *peerState) wanReport(table, ratios string, plots []string) string {
	cfg := st.cfg
	var b strings.Builder
	writeReportHeader(&b, "peer-etcd across the simulated WAN: hedgekv and etcd, scans from a client away from the leader", st.started, cfg.Command)
	fmt.Fprintf(&b, "- WAN (`%s`): %s. Both systems run behind it, one after the other, never at the same time; servers, proxies and the client share this machine's CPUs.\n",
		cfg.TopologyName, describeTopology(cfg.Topology))
	fmt.Fprintf(&b, "- Each system's leader is in %s; the client sits in %s. %d rows of %d fields × %d bytes (~1 KB, the same encoding in both unless the binding is go-ycsb's), loaded by a client beside the leader; ",
		cfg.LeaderZone, cfg.ClientZone, cfg.Records, rowFieldCount, rowFieldLength)
	fmt.Fprintf(&b, "then go-ycsb's scan workload, every scan exactly N rows from a uniformly chosen key, %d client threads, each run %v after a %v warm-up.\n",
		cfg.Threads, cfg.RunDuration, max(cfg.Warmup, 0))
	b.WriteString("- etcd's members advertise one peer URL each, the same for every member, so that URL is a router in this process: it reads the sender from the `X-PeerURLs` header of the first request on each connection (etcd's raft streams and pipelines carry it) and passes the connection through the simulated link from the sender's zone to the member, as hedgekv's stores dial each other through their zone's links. A connection without that header (etcd's RTT and version probes, never raft messages once the streams are up) goes through the link from another member's zone: exact when every zone pair has the same link, as in the default topology.\n")
	for _, n := range st.notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	b.WriteString("- `ops/s` counts successful scans per second; latencies are of successful scans, measured in the client. `WAN bytes/read` is every byte that crossed a link between zones during the run (client traffic and replication, both directions) over successful scans. `server p99` is hedgekv's own `KV.Scan` histogram, for the hedgekv-etcd variants the client's store's `etcdserverpb.KV/Range` one (etcd's is not collected).\n")
	b.WriteString("- `serializable` etcd reads and `bounded staleness` hedgekv reads may miss recent writes; the other variants are linearizable. etcd serves a linearizable read at a follower after a ReadIndex round trip to the leader, as hedgekv's follower read does, but etcd's leader also confirms its leadership with a heartbeat round to a quorum first (no leader lease for reads).\n\n")
	b.WriteString("## Side by side\n\n")
	b.WriteString(table)
	if ratios != "" {
		b.WriteString("\n## Ratios (hedgekv ÷ etcd, same run)\n\n")
		b.WriteString("Above 1× in ops/s means hedgekv is faster; below 1× in p99 means hedgekv is faster.\n\n")
		b.WriteString(ratios)
	}
	if lim := st.wanLimits(100); lim != "" {
		fmt.Fprintf(&b, "\nWhat bounds the %d-key figures, from this run's own numbers:\n\n%s", st.nearestWANScan(100), lim)
	}
	b.WriteString("\n## Where the reads were served\n\n")
	var cells [][]string
	var moved []string
	for _, r := range st.res.Runs {
		cells = append(cells, []string{r.Variant.Name, strconv.Itoa(r.ScanLength), r.ServedBy})
		if r.LeaderMoved != "" {
			moved = append(moved, fmt.Sprintf("%s, scan %d: %s", r.Variant.Name, r.ScanLength, r.LeaderMoved))
		}
	}
	b.WriteString(MarkdownTable([]string{"variant", "scan keys", "served by"}, cells))
	if len(moved) == 0 {
		b.WriteString("\nBoth leaders were where they were put after every run.\n")
	} else {
		b.WriteString("\n**A leader moved:**\n\n")
		for _, m := range moved {
			fmt.Fprintf(&b, "- %s\n", m)
		}
	}
	b.WriteString("\n## Load phase\n\n")
	var loadCells [][]string
	for _, sys := range slices.Sorted(maps.Keys(st.res.Loads)) {
		l := st.res.Loads[sys]
		loadCells = append(loadCells, []string{sys, strconv.FormatInt(l.Row.Ops, 10), FormatFloat(l.Row.QPS, 0),
			FormatFloat(l.Row.P50Ms, 1), FormatFloat(l.Row.P99Ms, 1), strconv.FormatInt(l.Row.Failed, 10)})
	}
	b.WriteString(MarkdownTable([]string{"system", "inserts", "inserts/s", "p50 ms", "p99 ms", "failed"}, loadCells))
	for _, r := range st.res.Runs {
		for _, o := range r.Phase.Ops {
			if o.FirstErr != "" {
				fmt.Fprintf(&b, "\nFirst %s error of %s at scan %d: %s\n", o.Op, r.Variant.Name, r.ScanLength, inlineCode(o.FirstErr))
			}
		}
	}
	writePlots(&b, plots)
	return b.String()
}

func (st *peerState) nearestWANScan(want int) int {
	return nearestScanLength(st.res.Runs, func(r PeerRun) int { return r.ScanLength }, want)
}

// wanLimits explains, from the run's own figures, what bounds the
// linearizable reads at the scan length nearest want: each waits for a
// round trip to the remote leader, and the client's threads wait with it.
func (st *peerState) wanLimits(want int) string {
	scan := st.nearestWANScan(want)
	if scan < 0 {
		return ""
	}
	cfg := st.cfg
	rtt := 2 * cfg.Topology.Spec(cfg.ClientZone, cfg.LeaderZone).Latency
	if rtt <= 0 {
		return ""
	}
	rttMs := float64(rtt) / float64(time.Millisecond)
	var b strings.Builder
	for _, r := range st.res.Runs {
		row := r.Phase.Row
		if r.ScanLength != scan || row.QPS <= 0 || row.P50Ms <= 0 {
			continue
		}
		limit := float64(cfg.Threads) / row.P50Ms * 1000
		switch r.Variant.Name {
		case "hedgekv-follower", "hedgekv-etcd-follower":
			fmt.Fprintf(&b, "- `%s` waits at its store for a ReadIndex round trip to the leader (RTT %v): the store's median scan took %s ms (%s round trips), the client's %s ms. ",
				r.Variant.Name, rtt, FormatFloat(r.ServerP50Ms, 1), FormatFloat(r.ServerP50Ms/rttMs, 1), FormatFloat(row.P50Ms, 1))
			fmt.Fprintf(&b, "%d client threads each waiting that long allow %d ÷ %s ms = %s scans/s (measured %s); even at exactly one round trip per read they would allow %s/s.\n",
				cfg.Threads, cfg.Threads, FormatFloat(row.P50Ms, 1), FormatFloat(limit, 0), FormatFloat(row.QPS, 0), FormatFloat(float64(cfg.Threads)/rttMs*1000, 0))
		case "etcd-linearizable":
			fmt.Fprintf(&b, "- `etcd-linearizable` waits at the local member for a ReadIndex, which etcd's leader answers only after a heartbeat round to a quorum: two round trips (%v) each. A member keeps one ReadIndex in flight; a read that arrives meanwhile waits for it, then for its own, so up to four round trips, and client threads released together by one ReadIndex all arrive during the next. Its median was %s ms (%s round trips)",
				2*rtt, FormatFloat(row.P50Ms, 1), FormatFloat(row.P50Ms/rttMs, 1))
			if ser := st.findWAN("etcd-serializable", scan); ser != nil {
				fmt.Fprintf(&b, ", the scan itself and its queue included (`etcd-serializable`, the same scan without the round trips, had a median of %s ms)", FormatFloat(ser.P50Ms, 1))
			}
			fmt.Fprintf(&b, "; %d threads ÷ %s ms = %s scans/s (measured %s).\n", cfg.Threads, FormatFloat(row.P50Ms, 1), FormatFloat(limit, 0), FormatFloat(row.QPS, 0))
		case "etcd-serializable":
			fmt.Fprintf(&b, "- `etcd-serializable` never leaves %s (%s of WAN per read): its median of %s ms is the scan and the queue for this machine's CPUs, not the network. "+
				"etcd 3.4 collects the revision of every key from a range's start to its end (here the end of the table) before it applies the limit (it reports the range's total count), so each scan also walks the index entries of every row after its start key, half of the table's %d on average, whatever its length.\n",
				cfg.ClientZone, fmtBytes(derefOr(row.WANBytesPerOp, 0)), FormatFloat(row.P50Ms, 1), cfg.Records)
		case "hedgekv-follower-stale", "hedgekv-etcd-serializable":
			fmt.Fprintf(&b, "- `%s` never leaves %s (%s of WAN per read): its median of %s ms is the scan and the queue for this machine's CPUs, not the network.\n",
				r.Variant.Name, cfg.ClientZone, fmtBytes(derefOr(row.WANBytesPerOp, 0)), FormatFloat(row.P50Ms, 1))
		}
	}
	return b.String()
}
