package bench

// etcd-wan: the etcd v3 API's two WAN targets, measured on hedgekv and on a
// real etcd behind the same simulated WAN, each system as one server
// process per zone:
//
//  1. a clientv3 linearizable Range from a zone that is not the leader's,
//     at the zone's own server, answers at local latency when hedgekv's
//     stores run follower leases (read mode follower), against etcd's
//     ReadIndex round trip; hedgekv's leader mode and its ReadIndex
//     follower read (leases off) show where the time goes;
//  2. a watch event reaches a watcher in every zone, connected to its
//     zone's server, within one WAN one-way delay plus 5 ms of the write's
//     acknowledgement (the writer sits in the leader's zone).
//
// peer-etcd's WAN mode measures scan throughput under 32 YCSB threads
// through one client zone; this scenario measures the latency of one
// small Range at a time from every zone, and watch delivery, which no YCSB
// workload has, so it is a scenario of its own rather than more variants
// of that one.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"

	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/netsim"
	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// The clusters etcd-wan starts, one after the other: etcd, hedgekv with
// follower leases off, hedgekv with them on (a per-cluster setting).
const (
	ewEtcd          = "etcd"
	ewHedgeKV       = "hedgekv"
	ewHedgeKVLeases = "hedgekv-leases"
)

// ewClusters are the clusters in run order.
var ewClusters = []string{ewEtcd, ewHedgeKV, ewHedgeKVLeases}

// EtcdWANVariant is one measurement of etcd-wan: a way to Range, or the
// watch, on one of its clusters.
type EtcdWANVariant struct {
	Name    string
	Cluster string // ewEtcd, ewHedgeKV or ewHedgeKVLeases
	// Watch: the watch measurement; otherwise a Range variant.
	Watch        bool
	Linearizable bool
	// ReadMode is the hedgekv-read-mode metadata sent ("": none, the
	// store's default, leader).
	ReadMode     string
	Serializable bool
	Doc          string
}

// EtcdWANVariants are etcd-wan's measurements, in run order.
var EtcdWANVariants = []EtcdWANVariant{
	{Name: "etcd-linearizable", Cluster: ewEtcd, Linearizable: true,
		Doc: "clientv3 Get at the zone's member: a ReadIndex from the leader, which confirms its leadership with a heartbeat round to a quorum first"},
	{Name: "etcd-serializable", Cluster: ewEtcd, Serializable: true,
		Doc: "clientv3 Get WithSerializable at the zone's member: its own state, may be stale; the local floor"},
	{Name: "watch-etcd", Cluster: ewEtcd, Watch: true,
		Doc: "etcd's watch: a watcher per zone on its zone's member"},
	{Name: "hedgekv-leader", Cluster: ewHedgeKV, Linearizable: true,
		Doc: "no read mode sent (the store's default, leader): the zone's store forwards the Range to the region's leader, which answers under its leader lease"},
	{Name: "hedgekv-follower", Cluster: ewHedgeKV, Linearizable: true, ReadMode: etcdapi.ReadFollower,
		Doc: "hedgekv-read-mode=follower, follower leases off: the zone's store asks the leader for a ReadIndex, then answers"},
	{Name: "watch-hedgekv", Cluster: ewHedgeKV, Watch: true,
		Doc: "hedgekv's etcd watch, follower leases off: a watcher per zone on its zone's store"},
	{Name: "hedgekv-follower-lease", Cluster: ewHedgeKVLeases, Linearizable: true, ReadMode: etcdapi.ReadFollower,
		Doc: "hedgekv-read-mode=follower on stores running --follower-leases: the zone's store answers under its follower lease, no round trip"},
	{Name: "watch-hedgekv-leases", Cluster: ewHedgeKVLeases, Watch: true,
		Doc: "hedgekv's etcd watch with follower leases on (a write commits only once every lease holder has it)"},
}

// The targets.
const (
	// ewReadTargetMs: a linearizable Range from a remote zone under follower
	// leases, p50.
	ewReadTargetMs = 2.0
	// ewWatchSlack: a watch event may arrive this long after one WAN
	// one-way delay past the write's acknowledgement.
	ewWatchSlack = 5 * time.Millisecond
)

// EtcdWANConfig configures RunEtcdWAN ("hedgekv bench etcd-wan").
type EtcdWANConfig struct {
	// Quick: short runs and few writes, for tests (explicit values win).
	Quick bool
	// Binary is the hedgekv binary whose `server` command runs the stores
	// (needed by the hedgekv variants).
	Binary string
	// EtcdBinary: path or name of etcd (default "etcd" on PATH; needed by
	// the etcd variants).
	EtcdBinary string
	// Variants to run (names from EtcdWANVariants); default all.
	Variants []string
	// Topology (default netsim.Default()) and its name in the report;
	// LeaderZone (default the first zone with a store) holds both systems'
	// leaders and the writer.
	Topology     *netsim.Topology
	TopologyName string
	LeaderZone   string
	// Threads: concurrent Range callers, one Range at a time each, in the
	// zone measured (default 1: latency, not throughput, is the target).
	Threads int
	// RunDuration of each Range run (default 10s, quick 1s) after a Warmup
	// (default 1s, quick 300ms; negative: none).
	RunDuration time.Duration
	Warmup      time.Duration
	// Writes measured by the watch runs (default 300, quick 30), one
	// started every WriteInterval (default 50ms) or when the previous is
	// acknowledged, if later.
	Writes        int
	WriteInterval time.Duration
	OutDir        string // results root (default "results"): writes OutDir/etcd-wan
	Command       string // the command line, quoted in the report
	Progress      io.Writer
	Logger        *slog.Logger
	Out           io.Writer // the final tables (nil: discard)
}

func (cfg *EtcdWANConfig) setDefaults() error {
	defaultTopology(&cfg.Topology, &cfg.TopologyName)
	if err := cfg.Topology.Validate(); err != nil {
		return err
	}
	var err error
	if cfg.LeaderZone, _, err = pickZones(cfg.Topology, cfg.LeaderZone, "", "one for the leaders, one to read from"); err != nil {
		return err
	}
	if cfg.Variants, err = chooseVariants(cfg.Variants, EtcdWANVariants, func(v EtcdWANVariant) string { return v.Name }); err != nil {
		return err
	}
	setDefault(&cfg.Threads, 1)
	setDefault(&cfg.RunDuration, quickOr(cfg.Quick, 10*time.Second, time.Second))
	setDefaultIfZero(&cfg.Warmup, quickOr(cfg.Quick, time.Second, 300*time.Millisecond))
	setDefault(&cfg.Writes, quickOr(cfg.Quick, 300, 30))
	setDefault(&cfg.WriteInterval, 50*time.Millisecond)
	setOutputDefaults(&cfg.OutDir, &cfg.Logger, &cfg.Out)
	return nil
}

// EtcdWANRead is one Range run: a variant read from one zone.
type EtcdWANRead struct {
	Variant EtcdWANVariant
	Zone    string
	// Remote: the zone is not the leader's.
	Remote   bool
	Row      Row
	ServedBy string
	FirstErr string
}

// EtcdWANWatch is what one zone's watcher saw of a watch run.
type EtcdWANWatch struct {
	Variant EtcdWANVariant
	Zone    string
	// OneWay is the topology's one-way delay from the leader's zone.
	OneWay time.Duration
	// Lags are each event's arrival minus its write's acknowledgement, in
	// ms, sorted (negative: it arrived before the writer heard back).
	Lags   []float64
	Missed int
	Row    Row
	// Late are the events past the target: the write's number (from 0,
	// the measured ones) and its lag in ms, in write order.
	Late [][2]float64
}

// EtcdWANResult is what RunEtcdWAN measured.
type EtcdWANResult struct {
	Reads   []EtcdWANRead
	Watches []EtcdWANWatch
	// PutMs are the watch runs' Put latencies at the writer, by variant:
	// p50 and p99.
	PutMs map[string][2]float64
	Rows  []Row
	Notes []string
}

// ewState is one run of the scenario.
type ewState struct {
	cfg     EtcdWANConfig
	res     EtcdWANResult
	started time.Time
	load    string // the load average when it started
	prog    *Progress
}

// RunEtcdWAN runs the scenario: each cluster behind cfg.Topology in turn
// (never two at once), its leader in LeaderZone, every Range variant of it
// read from every zone, then its watch; it writes OutDir/etcd-wan.
func RunEtcdWAN(ctx context.Context, cfg EtcdWANConfig) (*EtcdWANResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("etcd-wan: %w", err)
	}
	st := &ewState{cfg: cfg, started: time.Now(), load: loadAvg(), res: EtcdWANResult{PutMs: map[string][2]float64{}}}
	var etcdBinary string
	if len(st.variants(ewEtcd)) > 0 {
		var err error
		if etcdBinary, err = cluster.FindEtcd(cfg.EtcdBinary); err != nil {
			return nil, fmt.Errorf("etcd-wan: %w", err)
		}
	}
	if (len(st.variants(ewHedgeKV)) > 0 || len(st.variants(ewHedgeKVLeases)) > 0) && cfg.Binary == "" {
		return nil, errors.New("etcd-wan: no hedgekv binary given for the hedgekv variants")
	}
	zones := len(st.zones())
	steps := 0
	for _, c := range ewClusters {
		for _, v := range st.variants(c) {
			if v.Watch {
				steps++
			} else {
				steps += zones
			}
		}
	}
	st.prog = newProgress(cfg.Progress, "etcd-wan", steps)
	defer st.prog.Done()

	var errs []error
	for _, c := range ewClusters {
		vs := st.variants(c)
		if len(vs) == 0 || ctx.Err() != nil {
			continue
		}
		var err error
		if c == ewEtcd {
			err = st.runEtcd(ctx, etcdBinary, vs)
		} else {
			err = st.runHedgeKV(ctx, c == ewHedgeKVLeases, vs)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("etcd-wan: %s: %w", c, err))
		}
	}
	st.prog.Done()
	err := errors.Join(errs...)
	if len(st.res.Rows) == 0 {
		return &st.res, err
	}
	return &st.res, errors.Join(err, st.write())
}

// variants are the chosen variants of cluster c, in run order.
func (st *ewState) variants(c string) []EtcdWANVariant {
	var out []EtcdWANVariant
	for _, v := range pickVariants(EtcdWANVariants, st.cfg.Variants, func(v EtcdWANVariant) string { return v.Name }) {
		if v.Cluster == c {
			out = append(out, v)
		}
	}
	return out
}

// zones are the topology's zones with a store, in its order.
func (st *ewState) zones() []string {
	var out []string
	for _, z := range st.cfg.Topology.Zones {
		if len(z.Stores) > 0 {
			out = append(out, z.Name)
		}
	}
	return out
}

// ewTarget is a cluster as the measurements see it: a client of a zone's
// own server, and a check that the leader is still where it was put.
type ewTarget struct {
	// endpoint is the address a client in zone dials to reach the zone's
	// server, through the zone's link to it.
	endpoint func(zone string) string
	// servedBy describes how the reads between two marks were served.
	mark     func() any
	servedBy func(zone string, before any) string
	// wanBytes counts the bytes that crossed a link between zones so far.
	wanBytes func() uint64
	// leaderCheck says whether the leader moved during the run ("": no),
	// and puts it back.
	leaderCheck func(ctx context.Context) string
}

// runEtcd starts etcd behind the topology, its leader in LeaderZone, and
// measures vs on it.
func (st *ewState) runEtcd(ctx context.Context, binary string, vs []EtcdWANVariant) error {
	cfg := st.cfg
	leader := firstStore(cfg.Topology, cfg.LeaderZone)
	version := cluster.EtcdVersion(ctx, binary)
	st.prog.Printf("etcd-wan: starting etcd (%s), %d member processes behind the %s topology", version, len(cfg.Topology.Stores()), cfg.TopologyName)
	c, err := cluster.StartEtcd(ctx, cluster.EtcdConfig{Binary: binary, Topology: cfg.Topology, Logger: quietStores(cfg.Logger)})
	if err != nil {
		return err
	}
	defer c.Stop()
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = c.MoveLeader(mctx, leader)
	cancel()
	if err != nil {
		return err
	}
	st.res.Notes = append(st.res.Notes, fmt.Sprintf("etcd: %s (%s), members %s, one process each, default settings (fsync on, heartbeat 100 ms, election timeout 1 s), "+
		"client and peer traffic through the simulated links (peer connections routed by sender, as in peer-etcd); leader moved to m%d (%s)",
		binary, version, etcdMembersText(c), leader, cfg.LeaderZone))
	t := ewTarget{
		endpoint: func(zone string) string {
			return c.ZoneEndpoint(zone, firstStore(cfg.Topology, zone))
		},
		mark: func() any { return nil },
		servedBy: func(zone string, _ any) string {
			return fmt.Sprintf("member m%d (%s)", firstStore(cfg.Topology, zone), zone)
		},
		wanBytes: c.WANBytes,
		leaderCheck: func(ctx context.Context) string {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			now, err := c.Leader(ctx)
			if err == nil && now == leader {
				return ""
			}
			moved := fmt.Sprintf("etcd's leader was m%d, not m%d, after the run", now, leader)
			if err := c.MoveLeader(ctx, leader); err != nil {
				return moved + "; moving it back failed: " + err.Error()
			}
			return moved + "; moved back"
		},
	}
	return st.measure(ctx, t, vs)
}

// runHedgeKV starts hedgekv's stores as processes behind the topology
// (follower leases on or off), the etcd keyspace's region led from
// LeaderZone, and measures vs on it.
func (st *ewState) runHedgeKV(ctx context.Context, leases bool, vs []EtcdWANVariant) error {
	cfg := st.cfg
	leader := firstStore(cfg.Topology, cfg.LeaderZone)
	args := []string{}
	what := "follower leases off"
	if leases {
		args, what = append(args, "--follower-leases"), "follower leases on"
	}
	st.prog.Printf("etcd-wan: starting %d `hedgekv server` processes behind the %s topology, %s", len(cfg.Topology.Stores()), cfg.TopologyName, what)
	c, err := cluster.StartProcesses(ctx, cluster.ProcessesConfig{
		Binary: cfg.Binary, Topology: cfg.Topology, BalanceInterval: -time.Second, ExtraArgs: args,
		LogLevel: "error", Logger: quietStores(cfg.Logger),
	})
	if err != nil {
		return err
	}
	defer c.Stop()
	region, err := placeEtcdKeyspace(ctx, c, leader, func(ctx context.Context) error {
		cli, err := ewClient(c.ZoneEndpoint(cfg.LeaderZone, leader))
		if err != nil {
			return err
		}
		defer cli.Close()
		_, err = cli.Put(ctx, ewReadKey, ewReadValue)
		return err
	})
	if err != nil {
		return err
	}
	st.res.Notes = append(st.res.Notes, fmt.Sprintf("%s: `%s server` processes, stores %s, %s, otherwise default settings (fsync on, tick 50 ms, etcd read mode leader), "+
		"the balancer off (--balance-interval -1s); every store dials its peers and is dialled by clients through the simulated links (--peers, --advertise-zone-addrs), as `scripts/cluster.sh start --topology` runs them; "+
		"the etcd keyspace's region %d led from store %d (%s)",
		ewClusterName(leases), cfg.Binary, hkProcStoresText(c), what, region, leader, cfg.LeaderZone))
	statusAddrs := map[uint64]string{}
	for _, id := range c.StoreIDs() {
		statusAddrs[id] = c.StatusAddr(id)
	}
	t := ewTarget{
		endpoint: func(zone string) string {
			return c.ZoneEndpoint(zone, firstStore(cfg.Topology, zone))
		},
		mark: func() any { return scrapeReadIndexRounds(ctx, statusAddrs) },
		servedBy: func(zone string, before any) string {
			after := scrapeReadIndexRounds(ctx, statusAddrs)
			return readIndexServedBy(firstStore(cfg.Topology, zone), zone, before.(map[uint64]float64), after, c.Zone)
		},
		wanBytes: func() uint64 { return c.Network().WANBytes() },
		leaderCheck: func(ctx context.Context) string {
			now := c.LeaderOf(ctx, region)
			if now == leader {
				return ""
			}
			moved := fmt.Sprintf("region %d's leader was on store %d, not %d, after the run", region, now, leader)
			mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := c.MoveLeader(mctx, region, leader); err != nil {
				return moved + "; moving it back failed: " + err.Error()
			}
			return moved + "; moved back"
		},
	}
	return st.measure(ctx, t, vs)
}

func ewClusterName(leases bool) string {
	if leases {
		return "hedgekv, follower leases on"
	}
	return "hedgekv, follower leases off"
}

func hkProcStoresText(c *cluster.Processes) string {
	var parts []string
	for _, id := range c.StoreIDs() {
		parts = append(parts, fmt.Sprintf("%d in %s", id, c.Zone(id)))
	}
	return strings.Join(parts, ", ")
}

// placeEtcdKeyspace makes the etcd keyspace's region led from store: the
// first write through the etcd API (firstWrite) splits the keyspace off
// region 1 into a region of its own (server/etcdapi KeepRegion, run by the
// store that applies it), which is waited for; then its leader, and region
// 1's, are moved to store. It returns the keyspace's region.
func placeEtcdKeyspace(ctx context.Context, c *cluster.Processes, store uint64, firstWrite func(context.Context) error) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.MoveLeader(ctx, 1, store); err != nil {
		return 0, err
	}
	if err := firstWrite(ctx); err != nil {
		return 0, fmt.Errorf("first etcd write: %w", err)
	}
	var region uint64
	for region <= 1 {
		// While a store applies the split, its region 1 already ends
		// before the keyspace and the new region may not be listed yet:
		// no store holds the key for a moment (seen on a loaded machine),
		// so an error is looked at again, as region 1 is.
		var err error
		if region, err = c.RegionOf(ctx, []byte(etcdapi.Prefix)); err == nil && region > 1 {
			break
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("the etcd keyspace was not split off region 1 (last look: region %d, %v): %w", region, err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := c.MoveLeader(ctx, region, store); err != nil {
		return 0, err
	}
	_, err := c.WaitSettled(ctx, region)
	return region, err
}

// The key every Range reads, and the watch runs' key.
const (
	ewReadKey  = "etcd-wan/read"
	ewWatchKey = "etcd-wan/watch"
)

// ewReadValue is 100 bytes, one field of a YCSB row.
var ewReadValue = strings.Repeat("v", 100)

// ewClient is a clientv3 client whose only endpoint is endpoint.
func ewClient(endpoint string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
	})
}

// measure writes the read key (through the leader's zone), then runs each
// Range variant from every zone, and the watch.
func (st *ewState) measure(ctx context.Context, t ewTarget, vs []EtcdWANVariant) error {
	cfg := st.cfg
	w, err := ewClient(t.endpoint(cfg.LeaderZone))
	if err != nil {
		return err
	}
	defer w.Close()
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = w.Put(pctx, ewReadKey, ewReadValue)
	cancel()
	if err != nil {
		return fmt.Errorf("write the read key: %w", err)
	}
	var errs []error
	for _, v := range vs {
		if ctx.Err() != nil {
			break
		}
		if v.Watch {
			if err := st.measureWatch(ctx, t, v, w); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", v.Name, err))
			}
			continue
		}
		for _, z := range st.zones() {
			if err := st.measureReads(ctx, t, v, z); err != nil {
				errs = append(errs, fmt.Errorf("%s from %s: %w", v.Name, z, err))
			}
		}
	}
	return errors.Join(errs...)
}

// measureReads runs cfg.Threads callers of one Range at a time from zone,
// at the zone's server, for a warm-up and then RunDuration.
func (st *ewState) measureReads(ctx context.Context, t ewTarget, v EtcdWANVariant, zone string) error {
	cfg := st.cfg
	cli, err := ewClient(t.endpoint(zone))
	if err != nil {
		return err
	}
	defer cli.Close()
	rctx := ctx
	if v.ReadMode != "" {
		rctx = metadata.AppendToOutgoingContext(ctx, etcdapi.MetadataReadMode, v.ReadMode)
	}
	var opts []clientv3.OpOption
	if v.Serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	label := fmt.Sprintf("%s from %s", v.Name, zone)
	st.prog.Step(label, 0, max(cfg.Warmup, 0)+cfg.RunDuration)
	st.prog.warmUp(label, cfg.Warmup, func() { _ = ewReadLoop(rctx, cli, cfg.Threads, cfg.Warmup, opts, nil) })
	before, wanBefore := t.mark(), t.wanBytes()
	r := ewReadLoop(rctx, cli, cfg.Threads, cfg.RunDuration, opts, st.prog.Update)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	row := latencyRow(v.Name, "zone="+zone, r.hist, r.ok, r.failed, r.elapsed)
	setWANBytesPerOp(&row, t.wanBytes()-wanBefore)
	row.ServedBy = t.servedBy(zone, before)
	read := EtcdWANRead{Variant: v, Zone: zone, Remote: zone != cfg.LeaderZone, Row: row, ServedBy: row.ServedBy, FirstErr: r.firstErr}
	if moved := t.leaderCheck(ctx); moved != "" {
		st.res.Notes = append(st.res.Notes, fmt.Sprintf("**%s from %s: %s**", v.Name, zone, moved))
	}
	st.res.Reads = append(st.res.Reads, read)
	st.res.Rows = append(st.res.Rows, row)
	st.prog.Printf("%-24s from %-5s p50 %7.2f ms  p99 %7.2f ms  %7.1f ops/s  %s", v.Name, zone, row.P50Ms, row.P99Ms, row.QPS, failedNote(row.Failed))
	if r.ok == 0 {
		return fmt.Errorf("%w: first error: %s", ErrAllFailed, r.firstErr)
	}
	return nil
}

// ewReads is what a read loop measured.
type ewReads struct {
	hist       *hdrhistogram.Histogram // µs
	ok, failed int64
	elapsed    time.Duration
	firstErr   string
}

// ewReadLoop runs threads callers of Get(ewReadKey) for d; onProgress, if
// not nil, hears the counts every 100ms.
func ewReadLoop(ctx context.Context, cli *clientv3.Client, threads int, d time.Duration, opts []clientv3.OpOption, onProgress func(done, failed int64)) ewReads {
	var (
		mu       sync.Mutex
		hist     = hdrhistogram.New(1, 60_000_000, 3)
		ok, fail atomic.Int64
		firstErr string
		wg       sync.WaitGroup
	)
	stop := make(chan struct{})
	var pwg sync.WaitGroup
	reportProgress(&pwg, stop, &ok, &fail, onProgress)
	start := time.Now()
	end := start.Add(d)
	for range threads {
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				t0 := time.Now()
				octx, cancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err := cli.Get(octx, ewReadKey, opts...)
				cancel()
				us := time.Since(t0).Microseconds()
				if err == nil && len(resp.Kvs) != 1 {
					err = fmt.Errorf("read %q: %d keys, want 1", ewReadKey, len(resp.Kvs))
				}
				mu.Lock()
				if err != nil {
					fail.Add(1)
					if firstErr == "" {
						firstErr = err.Error()
					}
				} else {
					ok.Add(1)
					_ = hist.RecordValue(max(us, 1))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	pwg.Wait()
	return ewReads{hist: hist, ok: ok.Load(), failed: fail.Load(), elapsed: elapsed, firstErr: firstErr}
}

// ewWatchWarmup writes are made and watched before the measured ones: the
// first events pay for connections and, on hedgekv, a hibernating region
// waking.
const ewWatchWarmup = 5

// measureWatch puts cfg.Writes values to ewWatchKey from the leader's zone
// through w, one at a time, while a watcher in every zone, on its zone's
// server, watches the key; each event's lag is its arrival at the
// watcher minus the Put's acknowledgement at the writer (same process,
// same monotonic clock).
func (st *ewState) measureWatch(ctx context.Context, t ewTarget, v EtcdWANVariant, w *clientv3.Client) error {
	cfg := st.cfg
	zones := st.zones()
	n := ewWatchWarmup + cfg.Writes
	st.prog.Step(fmt.Sprintf("%s, %d writes", v.Name, cfg.Writes), int64(cfg.Writes), 0)
	wctx, cancelWatch := context.WithCancel(ctx)
	defer cancelWatch()
	arrivals := make([][]time.Time, len(zones))
	got := make([]atomic.Int64, len(zones))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancelWatch()
	for i, z := range zones {
		cli, err := ewClient(t.endpoint(z))
		if err != nil {
			return err
		}
		defer cli.Close()
		wch := cli.Watch(wctx, ewWatchKey, clientv3.WithCreatedNotify())
		select {
		case resp, ok := <-wch:
			if !ok || !resp.Created {
				return fmt.Errorf("watch from %s: not created (%v)", z, resp.Err())
			}
		case <-time.After(30 * time.Second):
			return fmt.Errorf("watch from %s: not created after 30s", z)
		}
		arrivals[i] = make([]time.Time, n)
		wg.Go(func() {
			for resp := range wch {
				now := time.Now()
				for _, ev := range resp.Events {
					seq, err := strconv.Atoi(string(ev.Kv.Value))
					if err != nil || seq < 0 || seq >= n || !arrivals[i][seq].IsZero() {
						continue
					}
					arrivals[i][seq] = now
					got[i].Add(1)
				}
			}
		})
	}

	acks := make([]time.Time, n)
	putHist := hdrhistogram.New(1, 60_000_000, 3)
	tick := time.NewTicker(cfg.WriteInterval)
	defer tick.Stop()
	var putErr error
	for seq := range n {
		t0 := time.Now()
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := w.Put(pctx, ewWatchKey, strconv.Itoa(seq))
		cancel()
		acks[seq] = time.Now()
		if err != nil {
			putErr = fmt.Errorf("put %d: %w", seq, err)
			break
		}
		if seq >= ewWatchWarmup {
			_ = putHist.RecordValue(max(acks[seq].Sub(t0).Microseconds(), 1))
			st.prog.Update(int64(seq-ewWatchWarmup+1), 0)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	if putErr != nil {
		return putErr
	}
	// The last events, after the last write's acknowledgement.
	deadline := time.Now().Add(5 * time.Second)
	for i := range zones {
		for got[i].Load() < int64(n) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	cancelWatch()
	wg.Wait()

	st.res.PutMs[v.Name] = [2]float64{quantileMs(putHist, 50), quantileMs(putHist, 99)}
	for i, z := range zones {
		ww := EtcdWANWatch{Variant: v, Zone: z, OneWay: cfg.Topology.Spec(cfg.LeaderZone, z).Latency}
		for seq := ewWatchWarmup; seq < n; seq++ {
			if arrivals[i][seq].IsZero() {
				ww.Missed++
				continue
			}
			lag := float64(arrivals[i][seq].Sub(acks[seq])) / float64(time.Millisecond)
			ww.Lags = append(ww.Lags, lag)
			if arrivals[i][seq].Sub(acks[seq]) > ww.OneWay+ewWatchSlack {
				ww.Late = append(ww.Late, [2]float64{float64(seq - ewWatchWarmup), round(lag, 2)})
			}
		}
		slices.Sort(ww.Lags)
		ww.Row = Row{Variant: v.Name, Param: "zone=" + z, Ops: int64(cfg.Writes), Failed: int64(ww.Missed),
			P50Ms: round(lagQuantile(ww.Lags, 0.5), 3), P99Ms: round(lagQuantile(ww.Lags, 0.99), 3),
			P999Ms: round(lagQuantile(ww.Lags, 0.999), 3), P9999Ms: round(lagQuantile(ww.Lags, 0.9999), 3)}
		st.res.Watches = append(st.res.Watches, ww)
		st.res.Rows = append(st.res.Rows, ww.Row)
		st.prog.Printf("%-24s in %-5s lag p50 %7.2f ms  p99 %7.2f ms  (one way %v)  %s", v.Name, z, ww.Row.P50Ms, ww.Row.P99Ms, ww.OneWay, failedNote(ww.Row.Failed))
	}
	if moved := t.leaderCheck(ctx); moved != "" {
		st.res.Notes = append(st.res.Notes, fmt.Sprintf("**%s: %s**", v.Name, moved))
	}
	return nil
}

// lateTogether counts, for each watch run with late events, the writes
// late in every remote zone at once among those late in any.
func (st *ewState) lateTogether() string {
	var b strings.Builder
	for _, v := range EtcdWANVariants {
		remote, any, byZone := 0, map[float64]int{}, 0
		for _, w := range st.res.Watches {
			if w.Variant.Name != v.Name || w.Zone == st.cfg.LeaderZone {
				continue
			}
			remote++
			for _, l := range w.Late {
				any[l[0]]++
			}
			byZone += len(w.Late)
		}
		if byZone == 0 {
			continue
		}
		together := 0
		for _, n := range any {
			if n == remote {
				together++
			}
		}
		fmt.Fprintf(&b, "- %s: %d of the %d writes late in a remote zone were late in all %d\n", v.Name, together, len(any), remote)
	}
	return b.String()
}

// lagQuantile is the q-quantile of sorted (nearest rank; 0 when empty).
func lagQuantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)) + 0.5)
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

// ---- where hedgekv served the reads ---------------------------------------

// readIndexRoundsMetric counts a store's ReadIndex batches (a leader's
// heartbeat round, a follower's request to its leader): the etcd API's
// Ranges are not in hedgekv_server_reads_total, which counts the KV API's.
const readIndexRoundsMetric = "hedgekv_store_read_index_rtt_seconds_count"

// scrapeReadIndexRounds reads every store's ReadIndex batch count (a store
// that does not answer is left out).
func scrapeReadIndexRounds(ctx context.Context, statusAddrs map[uint64]string) map[uint64]float64 {
	out := map[uint64]float64{}
	for id, addr := range statusAddrs {
		if m, err := scrapeMetrics(ctx, addr, 5*time.Second, readIndexRoundsMetric); err == nil {
			out[id] = m[readIndexRoundsMetric]
		}
	}
	return out
}

// readIndexServedBy names the store a zone's client called and the
// ReadIndex batches every store issued between two scrapes.
func readIndexServedBy(store uint64, zone string, before, after map[uint64]float64, zoneOf func(uint64) string) string {
	var rounds []string
	for _, id := range slices.Sorted(maps.Keys(after)) {
		if d := after[id] - before[id]; d > 0 {
			rounds = append(rounds, fmt.Sprintf("store %d (%s) %.0f", id, zoneOf(id), d))
		}
	}
	if len(rounds) == 0 {
		rounds = []string{"none"}
	}
	return fmt.Sprintf("store %d (%s); ReadIndex batches: %s", store, zone, strings.Join(rounds, ", "))
}

// ---- results ---------------------------------------------------------------

func (st *ewState) write() error {
	cfg := st.cfg
	dir := filepath.Join(cfg.OutDir, "etcd-wan")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	reads, watches := st.readTable(), st.watchTable()
	if err := WriteResults(dir, Results{Scenario: "etcd-wan", Rows: st.res.Rows}, st.report(reads, watches)); err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "\n%s\n%s\nwrote %s and %s\n", reads, watches, filepath.Join(dir, "results.json"), filepath.Join(dir, "report.md"))
	return nil
}

// readTable is every Range run, target verdicts on the follower-lease
// rows from remote zones.
func (st *ewState) readTable() string {
	var cells [][]string
	for _, r := range st.res.Reads {
		target := "–"
		if r.Variant.Name == "hedgekv-follower-lease" && r.Remote {
			target = fmt.Sprintf("p50 ≤ %s ms: %s", FormatFloat(ewReadTargetMs, 0), metText(r.Row.Failed == 0 && r.Row.P50Ms <= ewReadTargetMs))
		}
		where, rtts := "leader's zone", "–"
		if r.Remote {
			where = "remote"
			if rtt := 2 * st.cfg.Topology.Spec(r.Zone, st.cfg.LeaderZone).Latency; rtt > 0 {
				rtts = FormatFloat(r.Row.P50Ms/(float64(rtt)/float64(time.Millisecond)), 2)
			}
		}
		cells = append(cells, []string{r.Variant.Name, r.Zone + " (" + where + ")", FormatFloat(r.Row.P50Ms, 2), rtts, FormatFloat(r.Row.P99Ms, 2),
			FormatFloat(r.Row.P999Ms, 2), FormatFloat(r.Row.QPS, 0), strconv.FormatInt(r.Row.Ops, 10), strconv.FormatInt(r.Row.Failed, 10),
			fmtBytes(derefOr(r.Row.WANBytesPerOp, 0)), r.ServedBy, target})
	}
	return MarkdownTable([]string{"variant", "client zone", "p50 ms", "p50 ÷ RTT", "p99 ms", "p99.9 ms", "ops/s", "ops", "failed", "WAN bytes/read", "served by", "target"}, cells)
}

// watchTable is every zone's lag of every watch run against its target.
func (st *ewState) watchTable() string {
	var cells [][]string
	for _, w := range st.res.Watches {
		limit := w.OneWay + ewWatchSlack
		limitMs := float64(limit) / float64(time.Millisecond)
		verdict := fmt.Sprintf("p50 %s, p99 %s", metText(w.Missed == 0 && w.Row.P50Ms <= limitMs), metText(w.Missed == 0 && w.Row.P99Ms <= limitMs))
		put := st.res.PutMs[w.Variant.Name]
		cells = append(cells, []string{w.Variant.Name, w.Zone, w.OneWay.String(), FormatFloat(limitMs, 0),
			FormatFloat(w.Row.P50Ms, 2), FormatFloat(w.Row.P99Ms, 2), FormatFloat(lagQuantile(w.Lags, 1), 2),
			strconv.Itoa(len(w.Lags)), strconv.Itoa(w.Missed), fmt.Sprintf("%s / %s", FormatFloat(put[0], 1), FormatFloat(put[1], 1)), verdict})
	}
	return MarkdownTable([]string{"watch", "watcher zone", "one way", "target ms", "lag p50 ms", "lag p99 ms", "lag max ms", "events", "missed", "put p50 / p99 ms", "target"}, cells)
}

func metText(met bool) string {
	if met {
		return "**met**"
	}
	return "not met"
}

func (st *ewState) report(reads, watches string) string {
	cfg := st.cfg
	var b strings.Builder
	writeReportHeader(&b, "etcd-wan: the etcd API's WAN targets, hedgekv and etcd behind the same simulated WAN", st.started, cfg.Command)
	fmt.Fprintf(&b, "- WAN (`%s`): %s. Each system runs behind it as one server process per zone, one system at a time; the links (in this process), the servers and the clients share this machine's CPUs.\n",
		cfg.TopologyName, describeTopology(cfg.Topology))
	fmt.Fprintf(&b, "- Every leader, and the writer of the watch runs, is in %s. Every client is a clientv3 whose only endpoint is its zone's server, reached through its zone's link.\n", cfg.LeaderZone)
	fmt.Fprintf(&b, "- Range runs: %d caller(s), one Get of one key (%d-byte value) at a time, from each zone in turn, %v after a %v warm-up; latencies in the client.\n",
		cfg.Threads, len(ewReadValue), cfg.RunDuration, max(cfg.Warmup, 0))
	fmt.Fprintf(&b, "- Watch runs: a watcher per zone on one key; the writer puts %d values (after %d unmeasured), one every %v or when the previous is acknowledged. "+
		"An event's lag is its arrival at the watcher minus the Put's acknowledgement at the writer, one process and one monotonic clock; "+
		"the acknowledgement comes after the commit (the leader applies, then answers across no WAN), so the lag from the commit itself is larger by that much. "+
		"The target is the topology's one-way delay from %s plus %v.\n",
		cfg.Writes, ewWatchWarmup, cfg.WriteInterval, cfg.LeaderZone, ewWatchSlack)
	b.WriteString(loadNote(st.load))
	for _, n := range st.res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	writeVariantList(&b, "## Variants", EtcdWANVariants, cfg.Variants, func(v EtcdWANVariant) (string, string) { return v.Name, v.Doc })
	b.WriteString("\n## Range from each zone\n\n")
	b.WriteString("`p50 ÷ RTT` is the median over the round trip between the client's zone and the leader's: about 1 for a read that crosses the WAN once (hedgekv's forward to the leader, its ReadIndex), 2 for etcd's linearizable read (a ReadIndex the leader answers after a heartbeat round), about 0 for one served in the zone. " +
		"`WAN bytes/read` is every byte that crossed a link between zones during the run (client, raft and lease traffic) over the reads. `served by` names the server the client called; for hedgekv, the ReadIndex batches each store issued during the run (the leader's heartbeat rounds, a follower's requests to its leader).\n\n")
	b.WriteString(reads)
	b.WriteString("\n## Watch: event arrival minus the write's acknowledgement\n\n")
	b.WriteString(watches)
	var late []string
	for _, w := range st.res.Watches {
		if len(w.Late) == 0 {
			continue
		}
		var evs []string
		for _, l := range w.Late[:min(len(w.Late), 20)] {
			evs = append(evs, fmt.Sprintf("#%.0f %s ms", l[0], FormatFloat(l[1], 1)))
		}
		if len(w.Late) > 20 {
			evs = append(evs, fmt.Sprintf("and %d more", len(w.Late)-20))
		}
		late = append(late, fmt.Sprintf("- %s in %s: %s\n", w.Variant.Name, w.Zone, strings.Join(evs, ", ")))
	}
	if len(late) > 0 {
		b.WriteString("\nEvents past the target (the measured write's number from 0, its lag):\n\n")
		b.WriteString(strings.Join(late, ""))
		b.WriteString("\nA write late in every remote zone at once was held up after its acknowledgement and before either follower served it: " +
			"on the leader's side of the WAN or by this machine's CPUs, not by one follower's path.\n\n")
		b.WriteString(st.lateTogether())
	}
	for _, r := range st.res.Reads {
		if r.FirstErr != "" {
			fmt.Fprintf(&b, "\nFirst error of %s from %s: %s\n", r.Variant.Name, r.Zone, inlineCode(r.FirstErr))
		}
	}
	return b.String()
}
