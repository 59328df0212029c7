package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pingcap/go-ycsb/pkg/ycsb"

	"github.com/hedgekv/hedgekv/bench/etcddb"
	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/netsim"
	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// Systems compared by peer-etcd.
const (
	SystemEtcd    = "etcd"
	SystemHedgeKV = "hedgekv"
)

// EtcdBinding values.
const (
	EtcdBindingNative = "etcdkv" // package etcddb: same record encoding and update as hedgekv's
	// github.com/pingcap/go-ycsb/db/etcd with its Scan corrected
	// (etcddb.GoYCSB); linearizable reads only.
	EtcdBindingGoYCSB = "go-ycsb"
)

// PeerVariant is one (system, read mode) pair of the peer-etcd scenario.
type PeerVariant struct {
	Name   string // results.json variant, e.g. "etcd-linearizable"
	System string
	Read   string // the read mode, as shown in the table
	// Linearizable: reads see every write acknowledged before they began.
	Linearizable bool
	// WANRead is the read mode behind a topology, as shown in the table:
	// the client sits in one zone, the leader in another.
	WANRead string
	// EtcdAPI: hedgekv's stores driven through their etcd v3 API by the
	// etcd variants' binding (etcdkv, or go-ycsb's for the linearizable
	// one with --etcd-binding go-ycsb): one generator, one client library,
	// two servers. Otherwise a hedgekv variant uses hedgekv's own client.
	EtcdAPI bool
}

// hedgeKVEtcdGroup is the group of the EtcdAPI variants: they run against
// their own hedgekv cluster (or keyspace, with HedgeKVEndpoints), loaded
// through the etcd binding.
const hedgeKVEtcdGroup = SystemHedgeKV + " (etcd API)"

// group is the set of variants that share one loaded server: etcd,
// hedgekv through its own client, hedgekv through the etcd API.
func (v PeerVariant) group() string {
	if v.EtcdAPI {
		return hedgeKVEtcdGroup
	}
	return v.System
}

// peerGroups are the groups in run order.
var peerGroups = []string{SystemEtcd, SystemHedgeKV, hedgeKVEtcdGroup}

// goYCSBOnlyLinearizable are the variants go-ycsb's etcd binding cannot
// run: it has no serializable read and sends no gRPC metadata, and the
// etcdkv binding could not read the JSON records it loads.
var goYCSBOnlyLinearizable = []string{"etcd-serializable", "hedgekv-etcd-follower", "hedgekv-etcd-serializable"}

// peerVariant is the variant named name (the zero PeerVariant if none).
func peerVariant(name string) PeerVariant {
	for _, v := range PeerVariants {
		if v.Name == name {
			return v
		}
	}
	return PeerVariant{}
}

// PeerVariants are the peer-etcd variants, in run order.
var PeerVariants = []PeerVariant{
	{Name: "etcd-linearizable", System: SystemEtcd, Read: "linearizable", Linearizable: true,
		WANRead: "linearizable, at the local member (ReadIndex to the remote leader)"},
	{Name: "etcd-serializable", System: SystemEtcd, Read: "serializable (local, may be stale)",
		WANRead: "serializable, at the local member (may be stale)"},
	{Name: "hedgekv-leader", System: SystemHedgeKV, Read: "leader (lease / ReadIndex)", Linearizable: true,
		WANRead: "leader, in the remote zone (lease)"},
	{Name: "hedgekv-follower", System: SystemHedgeKV, Read: "follower (ReadIndex)", Linearizable: true,
		WANRead: "local follower (ReadIndex to the remote leader)"},
	{Name: "hedgekv-follower-stale", System: SystemHedgeKV, Read: "follower, bounded staleness",
		WANRead: "local follower, bounded staleness"},
	// hedgekv through its etcd API, with the etcd variants' binding.
	{Name: "hedgekv-etcd-linearizable", System: SystemHedgeKV, EtcdAPI: true, Linearizable: true,
		Read:    "linearizable (the stores' default read mode: leader unless --etcd-read-mode)",
		WANRead: "linearizable, at the local store, forwarded to the remote leader (lease)"},
	{Name: "hedgekv-etcd-follower", System: SystemHedgeKV, EtcdAPI: true, Linearizable: true,
		Read:    "linearizable (read mode follower: ReadIndex)",
		WANRead: "linearizable, at the local follower (ReadIndex to the remote leader)"},
	{Name: "hedgekv-etcd-serializable", System: SystemHedgeKV, EtcdAPI: true,
		Read:    "serializable (local, may be stale)",
		WANRead: "serializable, at the local store (may be stale)"},
}

// peerComparisons are the ratios the report quotes: hedgekv variant vs the
// etcd variant with the same guarantee.
var peerComparisons = []struct {
	hk, etcd string
	// target: issue 30's ops/s ratio for the workloads in on (0: none).
	target float64
	on     []string
}{
	{hk: "hedgekv-leader", etcd: "etcd-linearizable"},
	{hk: "hedgekv-follower", etcd: "etcd-linearizable"},
	{hk: "hedgekv-follower-stale", etcd: "etcd-serializable"},
	// One binding, two servers.
	{hk: "hedgekv-etcd-linearizable", etcd: "etcd-linearizable", target: 1.5, on: []string{"a", "c"}},
	{hk: "hedgekv-etcd-follower", etcd: "etcd-linearizable"},
	{hk: "hedgekv-etcd-serializable", etcd: "etcd-serializable", target: 1.2, on: []string{"c"}},
}

// peerLoadTarget is issue 30's inserts/s ratio of hedgekv's etcd API to
// etcd, through the same binding.
const peerLoadTarget = 1.5

// PeerEtcdConfig configures RunPeerEtcd ("hedgekv bench peer-etcd").
type PeerEtcdConfig struct {
	// Quick: small counts and a time cap per run, to finish in under a
	// minute on 2 cores. Explicit counts below still win.
	Quick     bool
	Records   int64    // default 20000 (quick 2000)
	Ops       int64    // per run; default 50000 (quick 4000)
	Threads   int      // default 32 (quick 16)
	Workloads []string // default a, c
	// Variants to run (names from PeerVariants); default all.
	Variants []string

	// EtcdBinary: path or name of etcd (default "etcd" on PATH).
	EtcdBinary string
	// EtcdBinding: "etcdkv" (default) or "go-ycsb" (go-ycsb's own binding
	// for etcd-linearizable and hedgekv-etcd-linearizable, and nothing for
	// the variants it cannot run, goYCSBOnlyLinearizable; see package
	// etcddb for why it is not the default).
	EtcdBinding string

	// HedgeKVEndpoints: run against this running cluster (e.g. the three
	// processes of scripts/cluster.sh); empty starts an in-process
	// three-store cluster on loopback ports, a fresh one for the
	// EtcdAPI variants.
	HedgeKVEndpoints []string
	// HedgeKVStatusAddrs: the status (metrics) addresses of that cluster's
	// stores, whose process_cpu_seconds_total gives the servers' CPU per
	// operation; without them only etcd's is reported.
	HedgeKVStatusAddrs []string
	Zone               string        // hedgekv client zone (default dc-a)
	MaxStaleness       time.Duration // of hedgekv-follower-stale (default 1s)

	// MaxDuration caps each run phase (quick: 5s; default none).
	MaxDuration      time.Duration
	OutDir           string // results root (default "results"): writes OutDir/peer-etcd
	ProgressInterval time.Duration
	Logger           *slog.Logger
	Out              io.Writer // go-ycsb summaries and the final tables (nil: discard)

	// Topology, if set, runs both systems behind this simulated WAN, one
	// after the other, and measures scans instead of Workloads (Ops,
	// MaxDuration, Zone and HedgeKVEndpoints do not apply): etcd with one
	// member per store of the topology in the store's zone (see
	// cluster.EtcdConfig.Topology), hedgekv with one store per store, the
	// leader of each in LeaderZone, the client in ClientZone talking to
	// its zone's member (etcd) or reading through its zone's links
	// (hedgekv). TopologyName names it in the report.
	Topology     *netsim.Topology
	TopologyName string
	// LeaderZone (default: the first zone with a store) and ClientZone
	// (default: the next zone with a store).
	LeaderZone, ClientZone string
	// ScanLengths: keys per scan, every scan exactly that many (default
	// 10, 100). Rows are ~1 KB (10 fields × 100 bytes).
	ScanLengths []int
	// RunDuration of each measured run (default 15s, quick 3s) after a
	// Warmup of the same workload (default 1s, quick 0.5s; negative:
	// none). MaxOps, if > 0, also ends a run after that many operations.
	RunDuration time.Duration
	Warmup      time.Duration
	MaxOps      int64
	NoPlots     bool
	// Command is the command line, quoted in the report.
	Command string
	// Progress receives a progress bar behind a topology (nil: none).
	Progress io.Writer
}

func (cfg *PeerEtcdConfig) setDefaults() error {
	if cfg.Topology != nil {
		if err := cfg.setWANDefaults(); err != nil {
			return fmt.Errorf("peer-etcd: %w", err)
		}
	}
	setDefault(&cfg.Records, quickOr[int64](cfg.Quick, 20000, 2000))
	setDefault(&cfg.Ops, quickOr[int64](cfg.Quick, 50000, 4000))
	setDefault(&cfg.Threads, quickOr(cfg.Quick, 32, 16))
	if cfg.Quick && cfg.MaxDuration <= 0 {
		cfg.MaxDuration = 5 * time.Second
	}
	if len(cfg.Workloads) == 0 {
		cfg.Workloads = []string{"a", "c"}
	}
	for _, w := range cfg.Workloads {
		if _, err := WorkloadProperties(w); err != nil {
			return fmt.Errorf("peer-etcd: %w", err)
		}
	}
	var err error
	if cfg.Variants, err = chooseVariants(cfg.Variants, PeerVariants, func(v PeerVariant) string { return v.Name }); err != nil {
		return fmt.Errorf("peer-etcd: %w", err)
	}
	switch cfg.EtcdBinding {
	case "":
		cfg.EtcdBinding = EtcdBindingNative
	case EtcdBindingNative:
	case EtcdBindingGoYCSB:
		// go-ycsb's binding stores records as JSON, has no serializable
		// reads and sends no metadata: the etcdkv variants could not read
		// what it loaded.
		cfg.Variants = slices.DeleteFunc(slices.Clone(cfg.Variants), func(v string) bool { return slices.Contains(goYCSBOnlyLinearizable, v) })
	default:
		return fmt.Errorf("peer-etcd: unknown etcd binding %q (want %s or %s)", cfg.EtcdBinding, EtcdBindingNative, EtcdBindingGoYCSB)
	}
	if cfg.Zone == "" {
		cfg.Zone = "dc-a"
	}
	if cfg.MaxStaleness <= 0 {
		cfg.MaxStaleness = time.Second
		if cfg.Topology != nil {
			cfg.MaxStaleness = 10 * time.Second // as follower-read-dc's stale-local
		}
	}
	setOutputDefaults(&cfg.OutDir, &cfg.Logger, &cfg.Out)
	return nil
}

// wants returns the chosen variants of a group (see PeerVariant.group).
func (cfg *PeerEtcdConfig) wants(group string) []PeerVariant {
	var out []PeerVariant
	for _, v := range PeerVariants {
		if v.group() == group && slices.Contains(cfg.Variants, v.Name) {
			out = append(out, v)
		}
	}
	return out
}

// dbFor returns the go-ycsb DB name and properties of a variant. The etcd
// variants and hedgekv's EtcdAPI variants get the same binding and
// properties, but for the session's hedgekv read mode.
func (cfg *PeerEtcdConfig) dbFor(v PeerVariant, endpoints []string) (string, map[string]string) {
	eps := strings.Join(endpoints, ",")
	switch v.Name {
	case "etcd-linearizable", "hedgekv-etcd-linearizable":
		if cfg.EtcdBinding == EtcdBindingGoYCSB {
			return etcddb.GoYCSBName, map[string]string{"etcd.endpoints": eps}
		}
		// No hedgekv read mode: hedgekv's stores use their default (leader,
		// unless started with --etcd-read-mode), as for go-ycsb's binding.
		return etcddb.Name, map[string]string{etcddb.PropEndpoints: eps, etcddb.PropRead: etcddb.ReadLinearizable}
	case "etcd-serializable", "hedgekv-etcd-serializable":
		return etcddb.Name, map[string]string{etcddb.PropEndpoints: eps, etcddb.PropRead: etcddb.ReadSerializable}
	case "hedgekv-etcd-follower":
		return etcddb.Name, map[string]string{etcddb.PropEndpoints: eps, etcddb.PropRead: etcddb.ReadLinearizable,
			etcddb.PropHedgeKVReadMode: etcdapi.ReadFollower}
	}
	p := map[string]string{ycsbdb.PropEndpoints: eps, ycsbdb.PropZone: cfg.Zone, ycsbdb.PropRead: "leader"}
	switch v.Name {
	case "hedgekv-follower":
		p[ycsbdb.PropRead] = "follower"
	case "hedgekv-follower-stale":
		p[ycsbdb.PropRead] = "follower"
		p[ycsbdb.PropMaxStaleness] = cfg.MaxStaleness.String()
	}
	return ycsbdb.Name, p
}

// clientOf names the go-ycsb binding a variant runs through, for the
// table.
func (cfg *PeerEtcdConfig) clientOf(v PeerVariant) string {
	switch {
	case v.System == SystemHedgeKV && !v.EtcdAPI:
		return "hedgekv's own"
	case v.Linearizable && cfg.EtcdBinding == EtcdBindingGoYCSB:
		return "etcd: go-ycsb's"
	}
	return "etcd: " + etcddb.Name
}

// openDB connects a variant's binding to endpoints.
func (cfg *PeerEtcdConfig) openDB(v PeerVariant, endpoints []string) (ycsb.DB, error) {
	name, props := cfg.dbFor(v, endpoints)
	creator := ycsb.GetDBCreator(name)
	if creator == nil {
		return nil, fmt.Errorf("no go-ycsb DB registered as %q", name)
	}
	db, err := creator.Create(toProperties(props))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", v.Name, err)
	}
	return db, nil
}

// PeerRun is one measured run of the peer-etcd scenario.
type PeerRun struct {
	Variant  PeerVariant
	Workload string
	Phase    *PhaseResult

	// Behind a topology: the scan length, the bytes that crossed between
	// zones during the run (client and replication traffic), where the
	// reads were served, and whether the leader had moved after the run.
	ScanLength  int
	WANBytes    uint64
	ServedBy    string
	LeaderMoved string
	// ServerP50Ms is hedgekv's median KV.Scan latency at the stores over
	// the run (0: unknown, and for etcd).
	ServerP50Ms float64
}

// PeerEtcdResult is what RunPeerEtcd measured.
type PeerEtcdResult struct {
	Rows []Row
	Runs []PeerRun
	// Loads by group: "etcd", "hedgekv", "hedgekv (etcd API)".
	Loads map[string]*PhaseResult
}

type peerState struct {
	cfg         PeerEtcdConfig
	started     time.Time
	res         PeerEtcdResult
	step, steps int
	notes       []string
}

// RunPeerEtcd runs the same YCSB workloads against a local three-member
// etcd and against hedgekv, one system at a time, and writes
// OutDir/peer-etcd/{results.json,report.md}. Rows already measured are
// written even when a later step fails.
func RunPeerEtcd(ctx context.Context, cfg PeerEtcdConfig) (*PeerEtcdResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	st := &peerState{cfg: cfg, started: time.Now(), res: PeerEtcdResult{Loads: map[string]*PhaseResult{}}}
	if cfg.EtcdBinding == EtcdBindingGoYCSB {
		st.notes = append(st.notes, fmt.Sprintf("go-ycsb's etcd binding has no serializable read and sends no gRPC metadata, so %s do not run with it",
			strings.Join(goYCSBOnlyLinearizable, ", ")))
	}
	if cfg.Topology != nil {
		return st.runWAN(ctx)
	}
	for _, g := range peerGroups {
		if vs := cfg.wants(g); len(vs) > 0 {
			st.steps += 1 + len(vs)*len(cfg.Workloads)
		}
	}
	etcdVariants := cfg.wants(SystemEtcd)
	var etcdBinary string
	if len(etcdVariants) > 0 {
		var err error
		if etcdBinary, err = cluster.FindEtcd(cfg.EtcdBinary); err != nil {
			return nil, fmt.Errorf("peer-etcd: %w", err)
		}
		st.notes = append(st.notes, fmt.Sprintf("etcd: %s (%s), 3 members as server processes on 127.0.0.1 (this one's children), default settings (fsync on), binding %q",
			etcdBinary, cluster.EtcdVersion(ctx, etcdBinary), cfg.EtcdBinding))
	}

	var errs []error
	if len(etcdVariants) > 0 {
		err := st.runSystem(ctx, SystemEtcd, etcdVariants, func() (servers, func(), error) {
			c, err := cluster.StartEtcd(ctx, cluster.EtcdConfig{Binary: etcdBinary, Logger: cfg.Logger})
			if err != nil {
				return servers{}, nil, err
			}
			// An etcd member serves /metrics on its client URL.
			var metrics []string
			for _, ep := range c.Endpoints {
				metrics = append(metrics, strings.TrimPrefix(ep, "http://"))
			}
			return servers{endpoints: c.Endpoints, metrics: metrics}, c.Stop, nil
		})
		errs = append(errs, err)
	}
	hkNoted := false
	startHedgeKV := func(group string) (servers, func(), error) {
		if len(cfg.HedgeKVEndpoints) > 0 {
			if !hkNoted {
				st.notes = append(st.notes, fmt.Sprintf("hedgekv: the running cluster at %s, server processes started outside this one (e.g. scripts/cluster.sh's three), "+
					"as they were configured; the client is this process", strings.Join(cfg.HedgeKVEndpoints, ",")))
			}
			hkNoted = true
			return servers{endpoints: cfg.HedgeKVEndpoints, metrics: cfg.HedgeKVStatusAddrs}, func() {}, nil
		}
		// The etcd keyspace is one region by design; in its own cluster
		// no split is needed, and none may cut it (a Range of a keyspace
		// cut in two fails).
		c, err := cluster.StartLocal(ctx, cluster.LocalConfig{DisableSplit: group == hedgeKVEtcdGroup})
		if err != nil {
			return servers{}, nil, err
		}
		if !hkNoted {
			st.notes = append(st.notes, "hedgekv: three stores inside this process on 127.0.0.1 (zones dc-a, dc-b, dc-c), fsync on, client zone "+
				strconv.Quote(cfg.Zone)+"; a fresh cluster for the variants through hedgekv's own client and another for those through the etcd API. "+
				"One Go runtime with the client and no process boundary, unlike etcd's three processes: for like against like, run hedgekv as "+
				"processes (scripts/cluster.sh start) and pass their --endpoints. The etcd API's cluster does not split (the etcd keyspace is one region)")
		}
		hkNoted = true
		// In this process: the servers' CPU cannot be told from the
		// client's, so none is reported.
		return servers{endpoints: c.Endpoints}, c.Stop, nil
	}
	for _, g := range []string{SystemHedgeKV, hedgeKVEtcdGroup} {
		if vs := cfg.wants(g); len(vs) > 0 && ctx.Err() == nil {
			errs = append(errs, st.runSystem(ctx, g, vs, func() (servers, func(), error) { return startHedgeKV(g) }))
		}
	}
	if len(cfg.wants(hedgeKVEtcdGroup)) > 0 {
		st.notes = append(st.notes, "hedgekv-etcd-*: hedgekv's stores through their etcd v3 API with the etcd variants' binding and properties "+
			"(clientv3, the three stores' gRPC addresses as endpoints, requests spread over them as over etcd's members), loaded through that binding; "+
			"hedgekv-etcd-follower's binding sends the gRPC metadata hedgekv-read-mode=follower with every request, hedgekv-etcd-linearizable none "+
			"(the store's default read mode, leader unless it runs with --etcd-read-mode: a follower forwards the read to the leader)")
		if len(cfg.HedgeKVEndpoints) > 0 {
			st.notes = append(st.notes, "hedgekv-etcd-* against a running cluster: its stores split as configured, and a split that cuts the etcd keyspace "+
				"(past --split-max-bytes, 64 MiB by default, history included) makes its Ranges fail (`key outside the snapshot's range`) until the keyspace is kept one region")
		}
	}
	err := errors.Join(errs...)
	if len(st.res.Runs) == 0 {
		return &st.res, err
	}
	if werr := st.write(); werr != nil {
		err = errors.Join(err, werr)
	}
	return &st.res, err
}

// runSystem starts a group's system, loads it once through the first
// variant's binding, runs every workload for every variant, and stops it.
// A run whose operations all fail is kept and the scenario goes on; any
// other error ends the group's runs.
func (st *peerState) runSystem(ctx context.Context, system string, variants []PeerVariant, start func() (servers, func(), error)) error {
	cfg := st.cfg
	cfg.Logger.Info("peer-etcd: starting "+system, "variants", len(variants), "workloads", strings.Join(cfg.Workloads, ","))
	srv, stop, err := start()
	if err != nil {
		return fmt.Errorf("peer-etcd: start %s: %w", system, err)
	}
	defer stop()
	endpoints := srv.endpoints
	run := func(spec Spec) (*Result, error) {
		before := srv.cpu(ctx, cfg.Logger)
		res, err := Run(ctx, spec)
		if res != nil {
			srv.chargeCPU(ctx, cfg.Logger, before, res)
		}
		return res, err
	}

	// One DB per variant, created once: the connection set-up stays out of
	// the measured phases.
	dbs := make([]ycsb.DB, len(variants))
	defer closeDBs(dbs)
	specFor := func(i int, workload string) (Spec, error) {
		name, props := cfg.dbFor(variants[i], endpoints)
		s := Spec{
			DB: name, Properties: props, Workload: workload, Records: cfg.Records, Ops: cfg.Ops, Threads: cfg.Threads,
			Variant: variants[i].Name, Param: workload, MaxDuration: cfg.MaxDuration,
			ProgressInterval: cfg.ProgressInterval, Logger: cfg.Logger, Summary: cfg.Out,
		}
		if dbs[i] == nil {
			p, err := BuildProperties(s)
			if err != nil {
				return s, err
			}
			creator := ycsb.GetDBCreator(name)
			if creator == nil {
				return s, fmt.Errorf("no go-ycsb DB registered as %q", name)
			}
			if dbs[i], err = creator.Create(toProperties(p)); err != nil {
				return s, fmt.Errorf("connect %s: %w", variants[i].Name, err)
			}
		}
		s.Instance = dbs[i]
		return s, nil
	}

	st.progress(fmt.Sprintf("%s: load %d records", system, cfg.Records))
	load, err := specFor(0, cfg.Workloads[0])
	if err != nil {
		return fmt.Errorf("peer-etcd: %s: %w", system, err)
	}
	load.Load, load.MaxDuration = true, 0
	res, err := run(load)
	if err != nil {
		return fmt.Errorf("peer-etcd: load %s: %w", system, err)
	}
	st.res.Loads[system] = res.Load

	var errs []error
	for _, w := range cfg.Workloads {
		for i, v := range variants {
			st.progress(fmt.Sprintf("%s, workload %s", v.Name, w))
			spec, err := specFor(i, w)
			if err != nil {
				return errors.Join(append(errs, fmt.Errorf("peer-etcd: %w", err))...)
			}
			spec.Run = true
			res, err := run(spec)
			if res != nil && res.Run != nil {
				st.res.Runs = append(st.res.Runs, PeerRun{Variant: v, Workload: w, Phase: res.Run})
				st.res.Rows = append(st.res.Rows, res.Run.Row)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("peer-etcd: %s, workload %s: %w", v.Name, w, err))
				if !errors.Is(err, ErrAllFailed) {
					return errors.Join(errs...)
				}
			}
		}
	}
	return errors.Join(errs...)
}

func (st *peerState) progress(what string) {
	st.step++
	st.cfg.Logger.Info(fmt.Sprintf("peer-etcd [%d/%d] %s", st.step, st.steps, what), "elapsed", time.Since(st.started).Round(time.Second))
}

func (st *peerState) write() error {
	cfg := st.cfg
	dir := filepath.Join(cfg.OutDir, "peer-etcd")
	table := st.sideBySide()
	ratios := st.ratios()
	report := st.report(table, ratios)
	if err := WriteResults(dir, Results{Scenario: "peer-etcd", Rows: st.res.Rows}, report); err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "\n%s", table)
	if ratios != "" {
		fmt.Fprintf(cfg.Out, "\n%s", ratios)
	}
	fmt.Fprintf(cfg.Out, "\nwrote %s and %s\n", filepath.Join(dir, "results.json"), filepath.Join(dir, "report.md"))
	return nil
}

func (st *peerState) sideBySide() string {
	var cells [][]string
	for _, w := range st.cfg.Workloads {
		for _, r := range st.res.Runs {
			if r.Workload != w {
				continue
			}
			row := r.Phase.Row
			cells = append(cells, []string{
				w, r.Variant.System, st.cfg.clientOf(r.Variant), r.Variant.Read, FormatFloat(row.QPS, 0),
				FormatFloat(row.P50Ms, 3), FormatFloat(row.P99Ms, 3), FormatFloat(row.P999Ms, 3),
				strconv.FormatInt(row.Ops, 10), strconv.FormatInt(row.Failed, 10),
				cpuCell(row.ServerCPUMsPerOp), cpuCell(row.ClientCPUMsPerOp),
			})
		}
	}
	return MarkdownTable([]string{"workload", "system", "binding", "reads", "ops/s", "p50 ms", "p99 ms", "p99.9 ms", "ops", "failed",
		"server CPU ms/op", "client CPU ms/op"}, cells)
}

// ratios: hedgekv / etcd throughput and latencies, per workload, for
// variants with the same guarantee, and the inserts of the load through the
// same binding; against issue 30's targets where it sets one.
func (st *peerState) ratios() string {
	find := func(variant, w string) *Row {
		for _, r := range st.res.Runs {
			if r.Variant.Name == variant && r.Workload == w {
				return &r.Phase.Row
			}
		}
		return nil
	}
	ratio := func(a, b float64) string {
		if b == 0 {
			return "n/a"
		}
		return FormatFloat(a/b, 2) + "×"
	}
	target := func(t, h, e float64) string {
		if t <= 0 {
			return "–"
		}
		met := "not met"
		if e > 0 && h/e >= t {
			met = "**met**"
		}
		return fmt.Sprintf("ops/s ≥ %s×: %s", FormatFloat(t, 1), met)
	}
	var cells [][]string
	if h, e := st.res.Loads[hedgeKVEtcdGroup], st.res.Loads[SystemEtcd]; h != nil && e != nil {
		cells = append(cells, []string{"load", hedgeKVEtcdGroup + " vs etcd, inserts", ratio(h.Row.QPS, e.Row.QPS),
			ratio(h.Row.P50Ms, e.Row.P50Ms), ratio(h.Row.P99Ms, e.Row.P99Ms),
			cpuRatio(h.Row.ServerCPUMsPerOp, e.Row.ServerCPUMsPerOp), target(peerLoadTarget, h.Row.QPS, e.Row.QPS)})
	}
	for _, w := range st.cfg.Workloads {
		for _, cmp := range peerComparisons {
			h, e := find(cmp.hk, w), find(cmp.etcd, w)
			if h == nil || e == nil {
				continue
			}
			t := 0.0
			if slices.Contains(cmp.on, w) {
				t = cmp.target
			}
			cells = append(cells, []string{w, cmp.hk + " vs " + cmp.etcd, ratio(h.QPS, e.QPS), ratio(h.P50Ms, e.P50Ms), ratio(h.P99Ms, e.P99Ms),
				cpuRatio(h.ServerCPUMsPerOp, e.ServerCPUMsPerOp), target(t, h.QPS, e.QPS)})
		}
	}
	if len(cells) == 0 {
		return ""
	}
	return MarkdownTable([]string{"workload", "comparison", "ops/s ratio", "p50 ratio", "p99 ratio", "server CPU/op ratio", "target (issue 30)"}, cells)
}

func (st *peerState) report(table, ratios string) string {
	cfg := st.cfg
	var b strings.Builder
	host, _ := os.Hostname()
	b.WriteString("# peer-etcd: hedgekv and etcd under the same YCSB workloads\n\n")
	fmt.Fprintf(&b, "Run %s on %s (%d CPUs, %s), in %v. go-ycsb v1.0.1 core workloads %s; %d records, %d operations per run, %d client threads",
		st.started.UTC().Format(time.RFC3339), host, runtime.NumCPU(), runtime.Version(), time.Since(st.started).Round(time.Second),
		strings.Join(cfg.Workloads, ", "), cfg.Records, cfg.Ops, cfg.Threads)
	if cfg.MaxDuration > 0 {
		fmt.Fprintf(&b, ", each run capped at %v", cfg.MaxDuration)
	}
	b.WriteString(".\n\n")
	for _, n := range st.notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	if cfg.EtcdBinding == EtcdBindingGoYCSB {
		b.WriteString("- go-ycsb's etcd binding (etcd-linearizable, hedgekv-etcd-linearizable) stores a record as JSON under `usertable:KEY` and an update overwrites it; ")
		b.WriteString("the other bindings store it as one value (the same length-prefixed encoding) under `usertable/KEY`, and an update is a linearizable read, a merge and a put. ")
	} else {
		b.WriteString("- Both systems store a record as one value (the same length-prefixed encoding) under `usertable/KEY`; ")
		b.WriteString("an update is a linearizable read, a merge and a put in both. ")
	}
	b.WriteString("The two systems run one after the other on the same machine, never at the same time; client and servers share its CPUs.\n")
	b.WriteString("- `binding` is the go-ycsb binding a row ran through: the `etcd:` ones are the same code, client library (clientv3) and properties whichever server they drive.\n")
	b.WriteString("- `serializable` etcd reads and `bounded staleness` hedgekv reads may miss recent writes; the other variants are linearizable.\n")
	b.WriteString("- Latencies are of successful operations; ops/s counts successful operations per second of the run.\n")
	b.WriteString("- `server CPU ms/op` is the CPU time (user and system) of all three members together per successful operation, from their own `process_cpu_seconds_total`; " +
		"`client CPU ms/op` is this process's (go-ycsb and the client library). On a machine whose CPUs the client and servers share, ops/s depend on what the client leaves the servers; " +
		"CPU per operation is each system's own cost. Shown only where the servers are processes of their own (etcd's; hedgekv's with --endpoints and --status-addrs).\n\n")
	b.WriteString("## Side by side\n\n")
	b.WriteString(table)
	if ratios != "" {
		b.WriteString("\n## Ratios (hedgekv / etcd, same guarantee, same run)\n\n")
		b.WriteString("Above 1× in ops/s means hedgekv is faster; below 1× in latency means hedgekv is faster. ")
		b.WriteString("Issue 30 sets its targets for hedgekv's etcd API against etcd 3.7 through go-ycsb's binding (the serializable one through etcdkv, go-ycsb's having none); the etcd version and binding of this run are above.\n\n")
		b.WriteString(ratios)
	}
	b.WriteString("\n## Load phase\n\n")
	var loadCells [][]string
	for _, sys := range slices.Sorted(maps.Keys(st.res.Loads)) {
		l := st.res.Loads[sys]
		loadCells = append(loadCells, []string{sys, strconv.FormatInt(l.Row.Ops, 10), FormatFloat(l.Row.QPS, 0),
			FormatFloat(l.Row.P50Ms, 3), FormatFloat(l.Row.P99Ms, 3), strconv.FormatInt(l.Row.Failed, 10),
			cpuCell(l.Row.ServerCPUMsPerOp), cpuCell(l.Row.ClientCPUMsPerOp)})
	}
	b.WriteString(MarkdownTable([]string{"system", "inserts", "inserts/s", "p50 ms", "p99 ms", "failed", "server CPU ms/op", "client CPU ms/op"}, loadCells))
	b.WriteString("\n## Per operation\n")
	for _, r := range st.res.Runs {
		fmt.Fprintf(&b, "\n### %s, workload %s\n\n", r.Variant.Name, r.Workload)
		writePhaseDetail(&b, r.Phase)
	}
	return b.String()
}
