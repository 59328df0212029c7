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
	"strings"
	"time"

	"github.com/pingcap/go-ycsb/pkg/ycsb"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
)

// YCSBScenario configures RunYCSBScenario ("hedgekv bench ycsb"): load once,
// then run each workload once per read variant, against a running cluster.
type YCSBScenario struct {
	// DB is the go-ycsb DB name (default "hedgekv"). For another DB, Reads
	// is ignored and the variant is the DB's name.
	DB        string
	Endpoints []string // hedgekv.endpoints (default: the local cluster)
	Zone      string   // hedgekv.zone
	// Reads are hedgekv read policies (leader, follower, mixed, closest,
	// prefer-leader); each is one variant. Default: leader.
	Reads        []string
	MaxStaleness time.Duration // hedgekv.max_staleness of every variant

	Workloads []string // a..f, scan
	Records   int64
	Ops       int64
	Threads   int
	Load      bool // load Records records first

	MaxScanLength          int
	ScanLengthDistribution string
	ScanInsert             bool
	// Properties are extra go-ycsb / DB properties.
	Properties  map[string]string
	MaxDuration time.Duration // per run phase

	OutDir string // results root: writes OutDir/ycsb/{results.json,report.md}
	// Fresh replaces results.json instead of merging this run's rows into it.
	Fresh bool

	ProgressInterval time.Duration
	Logger           *slog.Logger
	// Out receives go-ycsb's summaries and the final table (nil: discard).
	Out io.Writer
}

type ycsbVariant struct {
	name  string
	props map[string]string
}

func (cfg *YCSBScenario) variants() ([]ycsbVariant, error) {
	if cfg.DB != ycsbdb.Name {
		return []ycsbVariant{{name: cfg.DB, props: maps.Clone(cfg.Properties)}}, nil
	}
	reads := cfg.Reads
	if len(reads) == 0 {
		reads = []string{"leader"}
	}
	var out []ycsbVariant
	for _, r := range reads {
		p := maps.Clone(cfg.Properties)
		if p == nil {
			p = map[string]string{}
		}
		if len(cfg.Endpoints) > 0 {
			p[ycsbdb.PropEndpoints] = strings.Join(cfg.Endpoints, ",")
		}
		if cfg.Zone != "" {
			p[ycsbdb.PropZone] = cfg.Zone
		}
		p[ycsbdb.PropRead] = r
		name := r
		if cfg.MaxStaleness > 0 {
			p[ycsbdb.PropMaxStaleness] = cfg.MaxStaleness.String()
			name += "-stale-" + cfg.MaxStaleness.String()
		}
		out = append(out, ycsbVariant{name: name, props: p})
	}
	return out, nil
}

// ParamFor labels a workload run: the workload's letter, or for scans
// "scan-MAX" (uniform lengths up to MAX), "scan=N" (every scan N records),
// "scan-zipf-MAX", with "+insert" when 5% of operations insert.
func ParamFor(spec Spec) string {
	w := strings.ToLower(spec.Workload)
	if w != "scan" && !(w == "e" && spec.MaxScanLength > 0) {
		return w
	}
	maxLen := spec.MaxScanLength
	if maxLen <= 0 {
		maxLen = DefaultMaxScanLength
	}
	var s string
	switch strings.ToLower(spec.ScanLengthDistribution) {
	case "constant":
		s = fmt.Sprintf("%s=%d", w, maxLen)
	case "zipfian":
		s = fmt.Sprintf("%s-zipf-%d", w, maxLen)
	default:
		s = fmt.Sprintf("%s-%d", w, maxLen)
	}
	if w == "scan" && spec.ScanInsert {
		s += "+insert"
	}
	return s
}

type runRecord struct {
	variant string
	spec    Spec
	phase   *PhaseResult
	err     error
}

// RunYCSBScenario runs cfg and writes OutDir/ycsb. It returns the rows of
// this invocation. A workload whose operations all fail is recorded (and
// reported in the returned error) without stopping the others.
func RunYCSBScenario(ctx context.Context, cfg YCSBScenario) ([]Row, error) {
	if cfg.DB == "" {
		cfg.DB = ycsbdb.Name
	}
	if cfg.OutDir == "" {
		cfg.OutDir = "results"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if len(cfg.Workloads) == 0 {
		return nil, errors.New("bench ycsb: no workload")
	}
	for _, w := range cfg.Workloads {
		if _, err := WorkloadProperties(w); err != nil {
			return nil, fmt.Errorf("bench ycsb: %w", err)
		}
	}
	variants, err := cfg.variants()
	if err != nil {
		return nil, err
	}
	creator := ycsb.GetDBCreator(cfg.DB)
	if creator == nil {
		return nil, fmt.Errorf("bench ycsb: no go-ycsb DB registered as %q", cfg.DB)
	}
	started := time.Now()
	specFor := func(workload string, v ycsbVariant) Spec {
		s := Spec{
			Workload: workload, Records: cfg.Records, Ops: cfg.Ops, Threads: cfg.Threads,
			Properties: v.props, MaxScanLength: cfg.MaxScanLength, ScanLengthDistribution: cfg.ScanLengthDistribution,
			ScanInsert: cfg.ScanInsert, Variant: v.name, MaxDuration: cfg.MaxDuration,
			ProgressInterval: cfg.ProgressInterval, Logger: cfg.Logger, Summary: cfg.Out, DB: cfg.DB,
		}
		s.Param = ParamFor(s)
		return s
	}

	var (
		load    *PhaseResult
		records []runRecord
		errs    []error
	)
	for vi, v := range variants {
		spec0 := specFor(cfg.Workloads[0], v)
		props, err := BuildProperties(spec0)
		if err != nil {
			return nil, err
		}
		db, err := creator.Create(toProperties(props))
		if err != nil {
			return nil, fmt.Errorf("bench ycsb: connect %s (%s): %w", cfg.DB, v.name, err)
		}
		stop := func(err error) error {
			if cerr := db.Close(); cerr != nil {
				cfg.Logger.Warn("close ycsb DB", "err", cerr)
			}
			return err
		}
		if vi == 0 && cfg.Load {
			spec0.Instance, spec0.Load = db, true
			res, err := Run(ctx, spec0)
			if err != nil {
				return nil, stop(fmt.Errorf("bench ycsb: load: %w", err))
			}
			load = res.Load
		}
		for _, w := range cfg.Workloads {
			spec := specFor(w, v)
			spec.Instance, spec.Run = db, true
			res, err := Run(ctx, spec)
			if res != nil && res.Run != nil {
				records = append(records, runRecord{variant: v.name, spec: spec, phase: res.Run, err: err})
			}
			if err != nil {
				errs = append(errs, err)
				if !errors.Is(err, ErrAllFailed) {
					_ = stop(nil)
					return finishYCSB(cfg, started, load, records, errs)
				}
			}
		}
		_ = stop(nil)
	}
	return finishYCSB(cfg, started, load, records, errs)
}

func finishYCSB(cfg YCSBScenario, started time.Time, load *PhaseResult, records []runRecord, errs []error) ([]Row, error) {
	rows := make([]Row, 0, len(records))
	for _, r := range records {
		rows = append(rows, r.phase.Row)
	}
	dir := filepath.Join(cfg.OutDir, "ycsb")
	all := rows
	if !cfg.Fresh {
		old, err := ReadResults(filepath.Join(dir, "results.json"))
		if err != nil {
			cfg.Logger.Warn("previous results unreadable; replacing them", "err", err)
		} else if old.Scenario == "ycsb" {
			all = MergeRows(old.Rows, rows)
		}
	}
	if len(rows) > 0 {
		report := ycsbReport(cfg, started, load, records, all)
		if err := WriteResults(dir, Results{Scenario: "ycsb", Rows: all}, report); err != nil {
			errs = append(errs, err)
		} else {
			fmt.Fprintf(cfg.Out, "\n%s\nwrote %s and %s\n", RowsTable(rows),
				filepath.Join(dir, "results.json"), filepath.Join(dir, "report.md"))
		}
	}
	return rows, errors.Join(errs...)
}

func ycsbReport(cfg YCSBScenario, started time.Time, load *PhaseResult, records []runRecord, all []Row) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "# YCSB against %s\n\n", cfg.DB)
	fmt.Fprintf(&b, "Run %s on %s (%d CPUs, %s). go-ycsb v1.0.1 core workloads.\n\n",
		started.UTC().Format(time.RFC3339), host, runtime.NumCPU(), runtime.Version())
	fmt.Fprintf(&b, "- records: %d, operations per run: %d, threads: %d\n", cfg.Records, cfg.Ops, cfg.Threads)
	if cfg.DB == ycsbdb.Name {
		eps := strings.Join(cfg.Endpoints, ",")
		if eps == "" {
			eps = ycsbdb.DefaultEndpoints
		}
		fmt.Fprintf(&b, "- endpoints: %s, zone: %q\n", eps, cfg.Zone)
	}
	b.WriteString("- latencies are of successful operations; `ops` counts failed ones too; `ops/s` is successful operations per second of the run phase. ")
	b.WriteString("A read-modify-write (workload f) is one operation.\n\n")
	if load != nil {
		fmt.Fprintf(&b, "## Load\n\n%d records in %v with %d threads: %.1f inserts/s, p99 %.3f ms, %d failed.\n\n",
			load.Row.Ops, load.Elapsed.Round(time.Millisecond), load.Threads, load.Row.QPS, load.Row.P99Ms, load.Row.Failed)
	}
	b.WriteString("## This run\n\n")
	rows := make([]Row, 0, len(records))
	for _, r := range records {
		rows = append(rows, r.phase.Row)
	}
	b.WriteString(RowsTable(rows))
	for _, r := range records {
		fmt.Fprintf(&b, "\n### %s, workload %s\n\n", r.variant, r.phase.Row.Param)
		writePhaseDetail(&b, r.phase)
		fmt.Fprintf(&b, "\n<details><summary>go-ycsb summary</summary>\n\n```\n%s```\n\n</details>\n", r.phase.Summary)
	}
	b.WriteString("\n## Every row in results.json\n\n")
	b.WriteString(RowsTable(all))
	return b.String()
}
