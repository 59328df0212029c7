package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pingcap/go-ycsb/pkg/ycsb"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/netsim"
	"github.com/hedgekv/hedgekv/raftstore"
)

// What the WAN scenarios (follower-read-dc, hot-region) share: a cluster
// behind a simulated WAN with the balancer paused and one region, 1 KB
// YCSB rows, a snapshot of the cluster's counters around every measured
// run, and the leader's placement checked after each.

// hotRegionID is the region every record lives in: splits are off.
const hotRegionID = 1

// Row size: go-ycsb's default record, 10 fields of 100 bytes, ~1 KB.
const (
	rowFieldCount  = 10
	rowFieldLength = 100
)

// rowProps are the go-ycsb properties of a ~1 KB row (1,082 bytes as
// ycsbdb encodes it: 10 names, 10 values of 100 bytes, their lengths).
func rowProps() map[string]string {
	return map[string]string{
		"fieldcount":              strconv.Itoa(rowFieldCount),
		"fieldlength":             strconv.Itoa(rowFieldLength),
		"fieldlengthdistribution": "constant",
	}
}

// wanCluster is an in-process cluster behind a simulated WAN, set up for
// a scenario that needs a region's leader in one place.
type wanCluster struct {
	*cluster.Local
	topo        *netsim.Topology
	leaderStore uint64
	statusAddrs []string
	// region is the region whose leader the scenario placed (0:
	// hotRegionID).
	region uint64
}

// placedRegion is the region whose leader leaderCheck watches.
func (c *wanCluster) placedRegion() uint64 {
	if c.region != 0 {
		return c.region
	}
	return hotRegionID
}

// regionOf is the region holding key, as some store knows it (0: none).
func (c *wanCluster) regionOf(key []byte) uint64 {
	for _, id := range c.StoreIDs() {
		for _, r := range c.Server(id).Store().Regions() {
			if r.Region.Contains(key) {
				return r.Region.ID
			}
		}
	}
	return 0
}

// startWANCluster starts the stores of topo behind it (balancer paused,
// splits off, status endpoints on) and moves region 1's leader to the
// first store of leaderZone.
func startWANCluster(ctx context.Context, topo *netsim.Topology, leaderZone string, logger *slog.Logger) (*wanCluster, error) {
	return startWANClusterWith(ctx, topo, leaderZone, logger, false)
}

// startWANClusterWith is startWANCluster with the stores' follower read
// leases on or off (a cluster-wide setting: see
// cluster.LocalConfig.FollowerLeases).
func startWANClusterWith(ctx context.Context, topo *netsim.Topology, leaderZone string, logger *slog.Logger, followerLeases bool) (*wanCluster, error) {
	var leader uint64
	for _, z := range topo.Zones {
		if z.Name == leaderZone && len(z.Stores) > 0 {
			leader = slices.Min(z.Stores)
		}
	}
	if leader == 0 {
		return nil, fmt.Errorf("zone %q holds no store of the topology", leaderZone)
	}
	lc, err := cluster.StartLocal(ctx, cluster.LocalConfig{
		Topology: topo, NoSync: true, DisableBalancing: true, DisableSplit: true, StatusHTTP: true,
		Logger: quietStores(logger), FollowerLeases: followerLeases,
	})
	if err != nil {
		return nil, err
	}
	c := &wanCluster{Local: lc, topo: topo, leaderStore: leader}
	for _, id := range lc.StoreIDs() {
		c.statusAddrs = append(c.statusAddrs, lc.StatusAddr(id))
	}
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := lc.MoveLeader(mctx, hotRegionID, leader); err != nil {
		lc.Stop()
		return nil, err
	}
	return c, nil
}

// quietStores keeps the stores to errors: their warnings (a raft stream
// going down as the cluster stops, ...) would break the progress display.
func quietStores(l *slog.Logger) *slog.Logger {
	return cluster.MinLevel(l, slog.LevelError)
}

// openZoneDB connects a YCSB client sitting in zone: it bootstraps through
// that zone's links and dials every store at its address for the zone.
func (c *wanCluster) openZoneDB(ctx context.Context, zone string, read client.ReadPolicy) (*ycsbdb.DB, error) {
	return ycsbdb.Open(ctx, ycsbdb.Options{
		Endpoints:      c.ZoneEndpoints(zone),
		Zone:           zone,
		Read:           read,
		DialTimeout:    10 * time.Second,
		RequestTimeout: 60 * time.Second,
	})
}

// leaderCheck says whether the placed region's leader (region 1's, unless
// c.region says otherwise) is still where the scenario put it, and puts it
// back if not.
func (c *wanCluster) leaderCheck(ctx context.Context) (moved string) {
	region := c.placedRegion()
	now := c.LeaderStore(region)
	if now == c.leaderStore {
		return ""
	}
	moved = fmt.Sprintf("region %d's leader was on store %d, not %d, after the run", region, now, c.leaderStore)
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.MoveLeader(mctx, region, c.leaderStore); err != nil {
		moved += "; moving it back failed: " + err.Error()
	} else {
		moved += "; moved back"
	}
	return moved
}

// clusterSnap is what the cluster had counted at one moment.
type clusterSnap struct {
	at time.Time
	// reads is what each store had served, by mode (readModes): see
	// snapAt for which reads.
	reads    map[uint64]map[string]uint64
	readsErr error // the stores whose reads could not be scraped
	wan      uint64
	hist     ServerHist
	err      error // the histogram's scrape
}

func (c *wanCluster) snap(ctx context.Context, method string) clusterSnap {
	return c.snapAt(ctx, method, c.statusAddrs)
}

// snapAt is snap with method's latency histogram summed over the status
// addresses given only.
//
// For a KV method the reads counted are the KV API's, from every store's
// hedgekv_server_reads_total, and nothing else. The stores' own counters
// (raftstore.Stats) count every read a store serves, its internal ones
// too: the etcd API's lessor, promoted when its store's peer takes the
// lead of the etcd keyspace's region (region 1 here, splits are off),
// reads its leases through the leader. On a new leader that read waits
// for the leader's first commit (with follower leases on, for a whole
// follower lease: followerLeaseDefer), as the load's writes do, so it
// can finish just after a run's first snapshot, and it was then counted
// as a workload read the leader served. For the etcd API's Range, which
// that metric leaves out, the stores' counters it is (a lessor's read
// among them).
func (c *wanCluster) snapAt(ctx context.Context, method string, statusAddrs []string) clusterSnap {
	s := clusterSnap{at: time.Now()}
	if strings.HasPrefix(method, "KV.") {
		s.reads, s.readsErr = c.scrapeKVReads(ctx)
	} else {
		s.reads = statsReads(c.Stats())
	}
	s.wan = c.Network().WANBytes()
	s.hist, s.err = scrapeCluster(ctx, statusAddrs, method)
	return s
}

// runDelta is what the cluster did during one measured run.
type runDelta struct {
	wanBytes uint64
	server   ServerHist
	// reads by store, and by store and mode
	reads  map[uint64]uint64
	byMode map[uint64]map[string]uint64
	// readsErr: some store's reads were not scraped (left out of reads).
	readsErr error
	err      error // the latency histogram's scrape
}

func (c *wanCluster) delta(before, after clusterSnap) runDelta {
	d := readsDelta(before.reads, after.reads)
	d.wanBytes = after.wan - before.wan
	d.server = after.hist.Sub(before.hist)
	d.err = after.err
	d.readsErr = errors.Join(before.readsErr, after.readsErr)
	return d
}

// readsDelta is what every store's read counts rose by, as a runDelta
// (for servedBy). A store missing from either snapshot (its scrape
// failed) is left out rather than credited with every read it ever
// served.
func readsDelta(before, after map[uint64]map[string]uint64) runDelta {
	d := runDelta{reads: map[uint64]uint64{}, byMode: map[uint64]map[string]uint64{}}
	for id, a := range after {
		b, ok := before[id]
		if !ok {
			continue
		}
		modes := map[string]uint64{}
		var n uint64
		for _, m := range readModes {
			v := a[m] - b[m]
			modes[m] = v
			n += v
		}
		d.reads[id], d.byMode[id] = n, modes
	}
	return d
}

// serverMs is the stores' own q-quantile latency over the run, in ms
// rounded to µs (false: not known, the scrape failed).
func (d runDelta) serverMs(q float64) (float64, bool) {
	ms, ok := d.server.Quantile(q)
	return round(ms, 3), ok && d.err == nil
}

// annotate fills in a measured run's row from what the cluster counted
// around it: the stores' p99, the WAN bytes per successful operation, and
// where the reads were served.
func (d runDelta) annotate(row *Row, servedBy string) {
	if p99, ok := d.serverMs(0.99); ok {
		row.ServerP99Ms = ptr(p99)
	}
	setWANBytesPerOp(row, d.wanBytes)
	row.ServedBy = servedBy
}

// setWANBytesPerOp sets row's WAN bytes per successful operation (none
// without one).
func setWANBytesPerOp(row *Row, wanBytes uint64) {
	if ok := row.Ops - row.Failed; ok > 0 {
		row.WANBytesPerOp = ptr(round(float64(wanBytes)/float64(ok), 0))
	}
}

// readModes are the ways a store serves a read, as its counters
// (raftstore.Stats) and hedgekv_server_reads_total name them.
var readModes = []string{"lease", "read-index", "stale", "follower-lease"}

// statsReads is every store's read counters, by mode.
func statsReads(stats map[uint64]raftstore.Stats) map[uint64]map[string]uint64 {
	out := make(map[uint64]map[string]uint64, len(stats))
	for id, st := range stats {
		out[id] = map[string]uint64{
			"lease":          st.ReadsLease,
			"read-index":     st.ReadsReadIndex,
			"stale":          st.ReadsStale,
			"follower-lease": st.ReadsFollowerLease,
		}
	}
	return out
}

// kvReadsMetric counts the reads a store served through the KV API, by
// mode (readModes).
const kvReadsMetric = "hedgekv_server_reads_total"

// scrapeKVReads reads every store's KV API reads by mode (a store that
// does not answer is left out, and named in err). A KV read is counted
// before its answer is sent, so a read the client saw answered is in the
// next scrape.
func (c *wanCluster) scrapeKVReads(ctx context.Context) (map[uint64]map[string]uint64, error) {
	return scrapeKVReadsAt(ctx, c.StoreIDs(), c.StatusAddr)
}

func scrapeKVReadsAt(ctx context.Context, ids []uint64, statusAddr func(uint64) string) (map[uint64]map[string]uint64, error) {
	out := map[uint64]map[string]uint64{}
	var errs []error
	for _, id := range ids {
		m, err := scrapeLabelled(ctx, statusAddr(id), 5*time.Second, kvReadsMetric, "mode")
		if err != nil {
			errs = append(errs, fmt.Errorf("store %d: %w", id, err))
			continue
		}
		modes := map[string]uint64{}
		for mode, v := range m {
			modes[mode] = uint64(v)
		}
		out[id] = modes
	}
	return out, errors.Join(errs...)
}

// servedBy describes where the run's reads were served: "store 2 (dc-b)
// 100% read-index", or a split over several stores.
func (c *wanCluster) servedBy(d runDelta) (desc string) {
	var total uint64
	for _, n := range d.reads {
		total += n
	}
	if d.readsErr != nil {
		defer func() { desc += " (without the stores not scraped: " + d.readsErr.Error() + ")" }()
	}
	if total == 0 {
		return "no reads counted"
	}
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(d.reads)) {
		n := d.reads[id]
		if n == 0 {
			continue
		}
		var modes []string
		for _, m := range readModes {
			if v := d.byMode[id][m]; v > 0 {
				modes = append(modes, fmt.Sprintf("%s %.0f%%", m, 100*float64(v)/float64(n)))
			}
		}
		parts = append(parts, fmt.Sprintf("store %d (%s) %.0f%%: %s", id, c.Zone(id), 100*float64(n)/float64(total), strings.Join(modes, ", ")))
	}
	return strings.Join(parts, "; ")
}

// localShare is the fraction of the run's reads served by stores of zone.
func (c *wanCluster) localShare(d runDelta, zone string) float64 {
	var total, local uint64
	for id, n := range d.reads {
		total += n
		if c.Zone(id) == zone {
			local += n
		}
	}
	if total == 0 {
		return 0
	}
	return float64(local) / float64(total)
}

// ptr returns a pointer to v (for the optional Row fields).
func ptr[T any](v T) *T { return &v }

// describeTopology is a one-line summary of the WAN for a report.
func describeTopology(t *netsim.Topology) string {
	var zones []string
	for _, z := range t.Zones {
		ids := make([]string, 0, len(z.Stores))
		for _, s := range z.Stores {
			ids = append(ids, strconv.FormatUint(s, 10))
		}
		zones = append(zones, fmt.Sprintf("%s (store %s)", z.Name, strings.Join(ids, ", ")))
	}
	s := strings.Join(zones, ", ") + "; between zones: " + t.Default.String()
	for _, l := range t.Links {
		s += fmt.Sprintf("; %s–%s: %s", l.Between[0], l.Between[1], l.LinkSpec.String())
	}
	return s
}

// loadRows inserts records ~1 KB rows through db (a client beside the
// leader: the load is not what is measured), with threads threads.
func loadRows(ctx context.Context, db ycsb.DB, records int64, threads int, prog *Progress, logger *slog.Logger) (*PhaseResult, error) {
	prog.Step(fmt.Sprintf("load %d rows", records), records, 0)
	res, err := Run(ctx, Spec{
		Instance: db, Workload: "scan", Records: records, Threads: threads, Load: true,
		Properties: rowProps(), Variant: "load", ProgressInterval: -1, QuietWorkload: true, OnProgress: prog.Update, Logger: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	if res.Load.Row.Failed > 0 {
		return res.Load, fmt.Errorf("load: %d of %d inserts failed; first error: %s", res.Load.Row.Failed, records, res.Load.Total.FirstErr)
	}
	return res.Load, nil
}

// checkScanLengths checks the scan lengths of a WAN scenario: from 1 to
// ycsbdb.MaxScanLimit keys.
func checkScanLengths(lengths []int) error {
	for _, l := range lengths {
		if l < 1 || l > ycsbdb.MaxScanLimit {
			return fmt.Errorf("scan length %d out of 1..%d", l, ycsbdb.MaxScanLimit)
		}
	}
	return nil
}

// nearestScanLength is the scan length of runs nearest want (the first
// run's of two as near; -1 without a run).
func nearestScanLength[R any](runs []R, scanLength func(R) int, want int) int {
	best := -1
	for _, r := range runs {
		if l := scanLength(r); best < 0 || absInt(l-want) < absInt(best-want) {
			best = l
		}
	}
	return best
}

func absInt(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// pickZones checks a scenario's leader and client zones against topo,
// defaulting the leader to the first zone with stores and the client to the
// next: both must be distinct zones holding stores. roles says what the two
// zones are for, in the error when the topology has too few.
func pickZones(topo *netsim.Topology, leader, client, roles string) (string, string, error) {
	var withStores []string
	for _, z := range topo.Zones {
		if len(z.Stores) > 0 {
			withStores = append(withStores, z.Name)
		}
	}
	if len(withStores) < 2 {
		return "", "", errors.New("the topology needs two zones with stores: " + roles)
	}
	if leader == "" {
		leader = withStores[0]
	}
	if client == "" {
		for _, z := range withStores {
			if z != leader {
				client = z
				break
			}
		}
	}
	if !slices.Contains(withStores, leader) || !slices.Contains(withStores, client) || leader == client {
		return "", "", fmt.Errorf("leader zone %q and client zone %q must be two different zones with stores (%s)",
			leader, client, strings.Join(withStores, ", "))
	}
	return leader, client, nil
}

// defaultTopology fills in a scenario's topology: the default one when none
// is given, and the name "custom" for one given without a name.
func defaultTopology(top **netsim.Topology, name *string) {
	if *top == nil {
		*top, *name = netsim.Default(), netsim.DefaultTopology
	}
	if *name == "" {
		*name = "custom"
	}
}
