package bench

// Writes that hold their speed as data grows: the same workloads on a
// small cluster (the baseline) and on the loaded one, side by side in one
// run of one build, and their ratios.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/cluster"
)

// ScaleRates is what one cluster did under the compared workloads.
type ScaleRates struct {
	Records   int64   `json:"records"`
	InsertsPS float64 `json:"inserts_per_s"` // the load, Threads threads
	UpdatesPS float64 `json:"updates_per_s"` // YCSB A's updates
	ReadsPS   float64 `json:"reads_per_s"`   // YCSB A's reads
	ScansPS   float64 `json:"scans_per_s"`   // 100% scans of up to 100 records
	Failed    int64   `json:"failed"`        // failed operations of the three runs
}

// ScaleCompare is the loaded cluster beside the baseline.
type ScaleCompare struct {
	Baseline ScaleRates         `json:"baseline"`
	Full     ScaleRates         `json:"full"`
	Ratios   map[string]float64 `json:"ratios"` // full ÷ baseline, by rate
	For      float64            `json:"run_seconds"`
	Err      string             `json:"error,omitempty"`
}

// The targets the ratios are held against.
var scaleRatioTargets = map[string]float64{"inserts": 0.85, "updates": 0.85, "reads": 0.9, "scans": 0.9}

var scaleRatioOrder = []string{"inserts", "updates", "reads", "scans"}

// rates is each rate, by name: the baseline's, then this run's.
func (c *ScaleCompare) rates() map[string][2]float64 {
	return map[string][2]float64{
		"inserts": {c.Baseline.InsertsPS, c.Full.InsertsPS},
		"updates": {c.Baseline.UpdatesPS, c.Full.UpdatesPS},
		"reads":   {c.Baseline.ReadsPS, c.Full.ReadsPS},
		"scans":   {c.Baseline.ScansPS, c.Full.ScansPS},
	}
}

func (c *ScaleCompare) ratios() {
	c.Ratios = map[string]float64{}
	for k, r := range c.rates() {
		if r[0] > 0 {
			c.Ratios[k] = round(r[1]/r[0], 3)
		}
	}
}

// runBaseline starts a cluster of its own as the scenario's (same flags,
// same binary), loads cfg.Baseline records with the same threads, runs
// the compared workloads, and stops it.
func runBaseline(ctx context.Context, cfg ScaleConfig, extra []string, prog *Progress) (ScaleRates, error) {
	dir := ""
	if cfg.Dir != "" {
		dir = filepath.Join(cfg.Dir, "baseline")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return ScaleRates{}, err
		}
	}
	prog.Step(fmt.Sprintf("baseline: %d records, then YCSB A and scans", cfg.Baseline), 0, 2*cfg.CompareFor+time.Minute)
	prog.Printf("scale: baseline: three stores, %d records", cfg.Baseline)
	c, err := cluster.StartProcesses(ctx, cluster.ProcessesConfig{
		Binary: cfg.Binary, Dir: dir, BalanceInterval: cfg.BalanceInterval, ExtraArgs: extra,
		ReadyTimeout: time.Minute, Logger: cfg.Logger, LogLevel: "warn",
	})
	if err != nil {
		return ScaleRates{}, fmt.Errorf("baseline cluster: %w", err)
	}
	defer c.Stop()
	db, err := ycsbdb.Open(ctx, ycsbdb.Options{Endpoints: c.Endpoints, RequestTimeout: cfg.OpTimeout, DialTimeout: 5 * time.Second})
	if err != nil {
		return ScaleRates{}, fmt.Errorf("baseline: open the ycsb binding: %w", err)
	}
	defer db.Close()
	rates := ScaleRates{Records: cfg.Baseline}
	spec := compareSpec(cfg, db, cfg.Baseline, "baseline")
	spec.Load, spec.Threads = true, cfg.Threads
	r, err := Run(ctx, spec)
	if err != nil {
		return rates, fmt.Errorf("baseline load: %w", err)
	}
	if r.Load != nil {
		rates.InsertsPS, rates.Failed = r.Load.Row.QPS, r.Load.Row.Failed
	}
	prog.Printf("scale: baseline: loaded %d records, %.0f inserts/s", cfg.Baseline, rates.InsertsPS)
	err = runCompared(ctx, cfg, db, cfg.Baseline, "baseline", &rates, prog)
	return rates, err
}

// runCompared runs YCSB A, then scans, each for cfg.CompareFor, against
// db holding records records, into rates.
func runCompared(ctx context.Context, cfg ScaleConfig, db *ycsbdb.DB, records int64, variant string, rates *ScaleRates, prog *Progress) error {
	a := compareSpec(cfg, db, records, variant)
	a.Run, a.Workload, a.Threads = true, "a", cfg.Threads
	r, err := Run(ctx, a)
	if err != nil {
		return fmt.Errorf("%s: workload a: %w", variant, err)
	}
	if r.Run != nil {
		for _, op := range r.Run.Ops {
			switch op.Op {
			case "UPDATE":
				rates.UpdatesPS = op.QPS
			case "READ":
				rates.ReadsPS = op.QPS
			}
		}
		rates.Failed += r.Run.Row.Failed
	}
	scan := compareSpec(cfg, db, records, variant)
	scan.Run, scan.Workload, scan.Threads = true, "scan", cfg.Threads
	scan.MaxScanLength = DefaultMaxScanLength
	r, err = Run(ctx, scan)
	if err != nil {
		return fmt.Errorf("%s: scans: %w", variant, err)
	}
	if r.Run != nil {
		rates.ScansPS = r.Run.Row.QPS
		rates.Failed += r.Run.Row.Failed
	}
	prog.Printf("scale: %s: %.0f updates/s and %.0f reads/s (YCSB A), %.0f scans/s", variant, rates.UpdatesPS, rates.ReadsPS, rates.ScansPS)
	return nil
}

// compareSpec is the spec of a compared run: the scenario's record shape,
// bounded by cfg.CompareFor rather than by a count of operations.
func compareSpec(cfg ScaleConfig, db *ycsbdb.DB, records int64, variant string) Spec {
	fc, fl := cfg.fields()
	return Spec{
		Instance: db, Workload: "a", Records: records, Variant: variant,
		Ops:         1 << 40,
		MaxDuration: cfg.CompareFor,
		Properties: map[string]string{
			"fieldcount":  fmt.Sprint(fc),
			"fieldlength": fmt.Sprint(fl),
		},
		ProgressInterval: -1, QuietWorkload: true, Logger: cfg.Logger,
	}
}

// compareFull runs the compared workloads on the loaded cluster.
func (st *scaleState) compareFull(ctx context.Context) {
	cmp := st.res.Compare
	if cmp == nil || cmp.Err != "" {
		return
	}
	cmp.Full.Records = st.cfg.Records
	if st.res.Load != nil {
		cmp.Full.InsertsPS = st.res.Load.Row.QPS
	}
	st.prog.SetLabel(fmt.Sprintf("YCSB A and scans on %d records, beside the baseline's", st.cfg.Records))
	if err := runCompared(ctx, st.cfg, st.own, st.cfg.Records, "full", &cmp.Full, st.prog); err != nil {
		cmp.Err = err.Error()
		st.errorf("compare with the baseline: %v", err)
		return
	}
	cmp.ratios()
	st.prog.Printf("scale: %s", cmp.line())
}

// line is the ratios on one line.
func (c *ScaleCompare) line() string {
	var parts []string
	for _, k := range scaleRatioOrder {
		if r, ok := c.Ratios[k]; ok {
			mark := "met"
			if r < scaleRatioTargets[k] {
				mark = "NOT met"
			}
			parts = append(parts, fmt.Sprintf("%s %.2fx (target %.2f: %s)", k, r, scaleRatioTargets[k], mark))
		}
	}
	return fmt.Sprintf("%d records beside %d: %s", c.Full.Records, c.Baseline.Records, strings.Join(parts, ", "))
}

// writeCompare is the comparison's section of the report.
func (c *ScaleCompare) write(b *strings.Builder, threads int) {
	b.WriteString("\n## Beside a small data set\n\n")
	fmt.Fprintf(b, "The same build, flags and %d threads on a cluster of its own holding %d records (loaded first, then YCSB A and 100%% scans of up to %d records, each for %.0f s), then on this one after its load. Rates are operations per second; the ratio is this cluster's ÷ the baseline's.\n\n",
		threads, c.Baseline.Records, DefaultMaxScanLength, c.For)
	if c.Err != "" {
		fmt.Fprintf(b, "Error: %s\n\n", inlineCode(c.Err))
	}
	b.WriteString("| rate | baseline | this run | ratio | target |\n| --- | --- | --- | --- | --- |\n")
	rows := c.rates()
	for _, k := range scaleRatioOrder {
		ratio := "-"
		if r, ok := c.Ratios[k]; ok {
			ratio = fmt.Sprintf("%.2f×", r)
		}
		fmt.Fprintf(b, "| %s | %.0f | %.0f | %s | ≥ %.2f× |\n", k, rows[k][0], rows[k][1], ratio, scaleRatioTargets[k])
	}
	fmt.Fprintf(b, "\nFailed operations: %d in the baseline, %d here.\n", c.Baseline.Failed, c.Full.Failed)
}
