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
}

// peerComparisons are the ratios the report quotes: hedgekv variant vs the
// etcd variant with the same guarantee.
var peerComparisons = [][2]string{
	{"hedgekv-leader", "etcd-linearizable"},
	{"hedgekv-follower", "etcd-linearizable"},
	{"hedgekv-follower-stale", "etcd-serializable"},
}

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
	// for etcd-linearizable; see package etcddb for why it is not the
	// default).
	EtcdBinding string

	// HedgeKVEndpoints: run against this running cluster; empty starts an
	// in-process three-store cluster on loopback ports.
	HedgeKVEndpoints []string
	Zone             string        // hedgekv client zone (default dc-a)
	MaxStaleness     time.Duration // of hedgekv-follower-stale (default 1s)

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
		// go-ycsb's binding stores records as JSON and has no serializable
		// reads: the etcdkv variant could not read what it loaded.
		cfg.Variants = slices.DeleteFunc(slices.Clone(cfg.Variants), func(v string) bool { return v == "etcd-serializable" })
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

func (cfg *PeerEtcdConfig) wants(system string) []PeerVariant {
	var out []PeerVariant
	for _, v := range PeerVariants {
		if v.System == system && slices.Contains(cfg.Variants, v.Name) {
			out = append(out, v)
		}
	}
	return out
}

// dbFor returns the go-ycsb DB name and properties of a variant.
func (cfg *PeerEtcdConfig) dbFor(v PeerVariant, endpoints []string) (string, map[string]string) {
	eps := strings.Join(endpoints, ",")
	switch v.Name {
	case "etcd-linearizable":
		if cfg.EtcdBinding == EtcdBindingGoYCSB {
			return etcddb.GoYCSBName, map[string]string{"etcd.endpoints": eps}
		}
		return etcddb.Name, map[string]string{etcddb.PropEndpoints: eps, etcddb.PropRead: etcddb.ReadLinearizable}
	case "etcd-serializable":
		return etcddb.Name, map[string]string{etcddb.PropEndpoints: eps, etcddb.PropRead: etcddb.ReadSerializable}
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
	Rows  []Row
	Runs  []PeerRun
	Loads map[string]*PhaseResult // by system
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
	if cfg.Topology != nil {
		return st.runWAN(ctx)
	}
	etcdVariants, hkVariants := cfg.wants(SystemEtcd), cfg.wants(SystemHedgeKV)
	for _, vs := range [][]PeerVariant{etcdVariants, hkVariants} {
		if len(vs) > 0 {
			st.steps += 1 + len(vs)*len(cfg.Workloads)
		}
	}
	var etcdBinary string
	if len(etcdVariants) > 0 {
		var err error
		if etcdBinary, err = cluster.FindEtcd(cfg.EtcdBinary); err != nil {
			return nil, fmt.Errorf("peer-etcd: %w", err)
		}
		st.notes = append(st.notes, fmt.Sprintf("etcd: %s (%s), 3 members on 127.0.0.1, default settings (fsync on), binding %q",
			etcdBinary, cluster.EtcdVersion(ctx, etcdBinary), cfg.EtcdBinding))
	}

	var errs []error
	if len(etcdVariants) > 0 {
		err := st.runSystem(ctx, SystemEtcd, etcdVariants, func() ([]string, func(), error) {
			c, err := cluster.StartEtcd(ctx, cluster.EtcdConfig{Binary: etcdBinary, Logger: cfg.Logger})
			if err != nil {
				return nil, nil, err
			}
			return c.Endpoints, c.Stop, nil
		})
		errs = append(errs, err)
	}
	if len(hkVariants) > 0 && ctx.Err() == nil {
		err := st.runSystem(ctx, SystemHedgeKV, hkVariants, func() ([]string, func(), error) {
			if len(cfg.HedgeKVEndpoints) > 0 {
				st.notes = append(st.notes, fmt.Sprintf("hedgekv: the running cluster at %s", strings.Join(cfg.HedgeKVEndpoints, ",")))
				return cfg.HedgeKVEndpoints, func() {}, nil
			}
			c, err := cluster.StartLocal(ctx, cluster.LocalConfig{})
			if err != nil {
				return nil, nil, err
			}
			st.notes = append(st.notes, "hedgekv: three stores in this process on 127.0.0.1 (zones dc-a, dc-b, dc-c), fsync on, client zone "+strconv.Quote(cfg.Zone))
			return c.Endpoints, c.Stop, nil
		})
		errs = append(errs, err)
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

// runSystem starts a system, loads it once, runs every workload for every
// variant, and stops it. A run whose operations all fail is kept and the
// scenario goes on; any other error ends the system's runs.
func (st *peerState) runSystem(ctx context.Context, system string, variants []PeerVariant, start func() ([]string, func(), error)) error {
	cfg := st.cfg
	cfg.Logger.Info("peer-etcd: starting "+system, "variants", len(variants), "workloads", strings.Join(cfg.Workloads, ","))
	endpoints, stop, err := start()
	if err != nil {
		return fmt.Errorf("peer-etcd: start %s: %w", system, err)
	}
	defer stop()

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
	res, err := Run(ctx, load)
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
			res, err := Run(ctx, spec)
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
				w, r.Variant.System, r.Variant.Read, FormatFloat(row.QPS, 0),
				FormatFloat(row.P50Ms, 3), FormatFloat(row.P99Ms, 3), FormatFloat(row.P999Ms, 3),
				strconv.FormatInt(row.Ops, 10), strconv.FormatInt(row.Failed, 10),
			})
		}
	}
	return MarkdownTable([]string{"workload", "system", "reads", "ops/s", "p50 ms", "p99 ms", "p99.9 ms", "ops", "failed"}, cells)
}

// ratios: hedgekv / etcd throughput and p99, per workload, for variants
// with the same guarantee.
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
	var cells [][]string
	for _, w := range st.cfg.Workloads {
		for _, cmp := range peerComparisons {
			h, e := find(cmp[0], w), find(cmp[1], w)
			if h == nil || e == nil {
				continue
			}
			cells = append(cells, []string{w, cmp[0] + " vs " + cmp[1], ratio(h.QPS, e.QPS), ratio(h.P50Ms, e.P50Ms), ratio(h.P99Ms, e.P99Ms)})
		}
	}
	if len(cells) == 0 {
		return ""
	}
	return MarkdownTable([]string{"workload", "comparison", "ops/s ratio", "p50 ratio", "p99 ratio"}, cells)
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
	b.WriteString("- Both systems store a record as one value (the same length-prefixed encoding) under `usertable/KEY`; ")
	b.WriteString("an update is a linearizable read, a merge and a put in both. The two systems run one after the other on the same machine, ")
	b.WriteString("never at the same time; client and servers share its CPUs.\n")
	b.WriteString("- `serializable` etcd reads and `bounded staleness` hedgekv reads may miss recent writes; the other variants are linearizable.\n")
	b.WriteString("- Latencies are of successful operations; ops/s counts successful operations per second of the run.\n\n")
	b.WriteString("## Side by side\n\n")
	b.WriteString(table)
	if ratios != "" {
		b.WriteString("\n## Ratios (hedgekv / etcd, same guarantee, same run)\n\n")
		b.WriteString("Above 1× in ops/s means hedgekv is faster; below 1× in latency means hedgekv is faster.\n\n")
		b.WriteString(ratios)
	}
	b.WriteString("\n## Load phase\n\n")
	var loadCells [][]string
	for _, sys := range slices.Sorted(maps.Keys(st.res.Loads)) {
		l := st.res.Loads[sys]
		loadCells = append(loadCells, []string{sys, strconv.FormatInt(l.Row.Ops, 10), FormatFloat(l.Row.QPS, 0),
			FormatFloat(l.Row.P50Ms, 3), FormatFloat(l.Row.P99Ms, 3), strconv.FormatInt(l.Row.Failed, 10)})
	}
	b.WriteString(MarkdownTable([]string{"system", "inserts", "inserts/s", "p50 ms", "p99 ms", "failed"}, loadCells))
	b.WriteString("\n## Per operation\n")
	for _, r := range st.res.Runs {
		fmt.Fprintf(&b, "\n### %s, workload %s\n\n", r.Variant.Name, r.Workload)
		writePhaseDetail(&b, r.Phase)
	}
	return b.String()
}
