package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
)

// overloaded-replica reproduces ScyllaDB's RandomTwoChoice: one replica's
// store is slow (the `delay` fault on every read it serves, as a store
// whose read queue is that deep), and many independent clients, sharing
// nothing, read every replica in turn (round-robin, load-blind) or by power
// of two choices (p2c: each client weighs its own in-flight reads and
// latency per store and the load each store reports in its answers). With
// round-robin a third of the reads queue at the slow store whatever its
// state; p2c should steer each client away from it on its own.

// OverloadedVariant is one replica policy of overloaded-replica.
type OverloadedVariant struct {
	Name string
	Read client.ReplicaPolicy
	Doc  string
}

// OverloadedVariants are overloaded-replica's variants, in run order.
var OverloadedVariants = []OverloadedVariant{
	{Name: "round-robin", Read: client.ReplicaRoundRobin, Doc: "every replica in turn, blind to load (`ReplicaRoundRobin`; ScyllaDB's token-aware round-robin)"},
	{Name: "p2c", Read: client.ReplicaMixed, Doc: "power of two choices over all replicas (`ReplicaMixed`): of two random replicas, the one with the lower expected cost (the client's in-flight reads there × its latency EWMA, plus the wait the store last reported)"},
}

// OverloadedConfig configures RunOverloaded.
type OverloadedConfig struct {
	// Quick: 4 s runs, well under a minute on 2 cores. Explicit values
	// below still win.
	Quick    bool
	Variants []string // default both
	// Clients is the number of independent client.Client instances
	// (default 16).
	Clients   int
	Keys      int     // default 1,000
	ValueSize int     // default 128 bytes
	Rate      float64 // reads/s of all clients together, open loop (default 2,000)
	// SlowStore is the store made slow (default 3, a follower: region 1's
	// leader is on store 1).
	SlowStore uint64
	// Delay and Prob of the slow store's delay fault (default 50ms, 1).
	Delay       time.Duration
	Prob        float64
	RunDuration time.Duration // default 20s (quick 4s)
	Warmup      time.Duration // default 2s (quick 1s; negative: none), without the fault
	OutDir      string        // results root: writes OutDir/overloaded-replica
	NoPlots     bool
	Command     string
	Progress    io.Writer
	Logger      *slog.Logger
	Out         io.Writer
}

func (cfg *OverloadedConfig) setDefaults() error {
	var err error
	if cfg.Variants, err = chooseVariants(cfg.Variants, OverloadedVariants, func(v OverloadedVariant) string { return v.Name }); err != nil {
		return err
	}
	setDefault(&cfg.Clients, 16)
	setDefault(&cfg.Keys, 1000)
	setDefault(&cfg.ValueSize, 128)
	setDefault(&cfg.Rate, 2000)
	setDefaultIfZero(&cfg.SlowStore, 3)
	if cfg.SlowStore > 3 {
		return fmt.Errorf("slow store %d: the cluster has stores 1-3", cfg.SlowStore)
	}
	setDefault(&cfg.Delay, 50*time.Millisecond)
	setDefaultIfZero(&cfg.Prob, 1)
	if cfg.Prob < 0 || cfg.Prob > 1 {
		return fmt.Errorf("probability %v outside (0, 1]", cfg.Prob)
	}
	setDefault(&cfg.RunDuration, quickOr(cfg.Quick, 20*time.Second, 4*time.Second))
	setDefaultIfZero(&cfg.Warmup, quickOr(cfg.Quick, 2*time.Second, time.Second))
	setOutputDefaults(&cfg.OutDir, &cfg.Logger, &cfg.Out)
	return nil
}

// OverloadedRun is one measured run.
type OverloadedRun struct {
	Variant OverloadedVariant
	Row     Row
	Latency *hdrhistogram.Histogram
	// Share is the fraction of reads each store answered, by store id
	// (from each read's ReadInfo.StoreID).
	Share    map[uint64]float64
	MaxLag   time.Duration
	FirstErr string
}

// OverloadedResult is what RunOverloaded measured.
type OverloadedResult struct {
	Rows   []Row
	Runs   []OverloadedRun
	Stores []uint64
	Dir    string
	Plots  []string
	// LoadBefore is the machine's load average as the scenario started.
	LoadBefore string
}

// RunOverloaded runs the scenario and writes
// OutDir/overloaded-replica/{results.json,report.md,*.png}.
func RunOverloaded(ctx context.Context, cfg OverloadedConfig) (*OverloadedResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("overloaded-replica: %w", err)
	}
	started, load := time.Now(), loadAvg()
	variants := pickVariants(OverloadedVariants, cfg.Variants, func(v OverloadedVariant) string { return v.Name })
	prog := newProgress(cfg.Progress, "overloaded-replica", 1+len(variants))
	defer prog.Done()

	prog.Printf("overloaded-replica: starting 3 stores")
	lc, admin, err := startFaultCluster(ctx, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("overloaded-replica: %w", err)
	}
	defer lc.Stop()
	defer func() { _ = admin.Close() }()
	res := &OverloadedResult{Stores: lc.StoreIDs(), Dir: filepath.Join(cfg.OutDir, "overloaded-replica"), LoadBefore: load}
	keys, err := loadKeys(ctx, admin, "overloaded", cfg.Keys, cfg.ValueSize, prog)
	if err != nil {
		return nil, fmt.Errorf("overloaded-replica: %w", err)
	}
	var errs []error
	for _, v := range variants {
		run, err := cfg.measure(ctx, lc, admin, keys, v, prog)
		if run != nil {
			res.Runs = append(res.Runs, *run)
			res.Rows = append(res.Rows, run.Row)
			prog.Printf("%-11s p50 %6.2f ms  p95 %7.2f ms  p99 %7.2f ms  %7.0f reads/s  %s  %s", v.Name, run.Row.P50Ms,
				derefOr(run.Row.P95Ms, 0), run.Row.P99Ms, run.Row.QPS, run.Row.ServedBy, failedNote(run.Row.Failed))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("overloaded-replica: %s: %w", v.Name, err))
			if ctx.Err() != nil {
				break
			}
		}
	}
	prog.Done()
	return res, errors.Join(append(errs, cfg.write(res, started))...)
}

func (cfg *OverloadedConfig) param() string {
	return fmt.Sprintf("store %d delay=%v,prob=%g", cfg.SlowStore, cfg.Delay, cfg.Prob)
}

func (cfg *OverloadedConfig) measure(ctx context.Context, lc *cluster.Local, admin *client.Client, keys [][]byte,
	v OverloadedVariant, prog *Progress) (*OverloadedRun, error) {
	// Independent clients: each its own client.New, so each learns the
	// slow store on its own, as separate application servers would.
	clis := make([]*client.Client, 0, cfg.Clients)
	defer func() {
		for _, c := range clis {
			_ = c.Close()
		}
	}()
	sessions := make([]*client.Session, 0, cfg.Clients)
	for range cfg.Clients {
		cli, err := newRunClient(ctx, lc)
		if err != nil {
			return nil, err
		}
		clis = append(clis, cli)
		sessions = append(sessions, cli.Session(client.ReadPolicy{Replica: v.Read}))
	}
	read := func(ctx context.Context, i int64) (client.ReadInfo, error) {
		_, info, err := sessions[i%int64(len(sessions))].GetWithInfo(ctx, keys[rand.IntN(len(keys))])
		return info, err
	}
	target := int64(cfg.Rate * cfg.RunDuration.Seconds())
	prog.Step(v.Name, target, max(cfg.Warmup, 0)+cfg.RunDuration)
	prog.warmUp(v.Name, cfg.Warmup, func() {
		runOpenLoop(ctx, openLoopSpec{Rate: cfg.Rate, Duration: cfg.Warmup, Timeout: 10 * time.Second, Read: read})
	})
	// The store turns slow as the measured run starts, so what p2c pays to
	// learn it (each client on its own) is measured too.
	if err := admin.Fault(ctx, cfg.SlowStore, client.Fault{Delay: cfg.Delay, Prob: cfg.Prob}); err != nil {
		return nil, fmt.Errorf("slow store %d: %w", cfg.SlowStore, err)
	}
	r := runOpenLoop(ctx, openLoopSpec{Rate: cfg.Rate, Duration: cfg.RunDuration, Timeout: 10 * time.Second, Read: read, OnProgress: prog.Update})
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	cerr := admin.Fault(cctx, cfg.SlowStore, client.Fault{Clear: true})
	cancel()
	run := &OverloadedRun{Variant: v, Row: r.row(v.Name, cfg.param()), Latency: r.Latency, Share: r.shares(), MaxLag: r.MaxLag, FirstErr: r.FirstErr}
	run.Row.ServedBy = fmtShares(run.Share, lc.StoreIDs())
	if cerr != nil {
		return run, fmt.Errorf("clear the fault: %w", cerr)
	}
	if r.Failed > 0 {
		return run, fmt.Errorf("%d of %d reads failed; first: %s", r.Failed, r.OK+r.Failed, r.FirstErr)
	}
	return run, nil
}

// overloadedRatio is p2c's p99 over round-robin's (0 if either is missing).
func overloadedRatio(runs []OverloadedRun) (p95, p99 float64) {
	var rr, pc *Row
	for i := range runs {
		switch runs[i].Variant.Name {
		case "round-robin":
			rr = &runs[i].Row
		case "p2c":
			pc = &runs[i].Row
		}
	}
	if rr == nil || pc == nil || rr.P99Ms <= 0 {
		return 0, 0
	}
	if rr.P95Ms != nil && pc.P95Ms != nil && *rr.P95Ms > 0 {
		p95 = *pc.P95Ms / *rr.P95Ms
	}
	return p95, pc.P99Ms / rr.P99Ms
}

func (cfg *OverloadedConfig) table(res *OverloadedResult) string {
	var cells [][]string
	for _, r := range res.Runs {
		row := r.Row
		cells = append(cells, []string{row.Variant, strconv.FormatInt(row.Ops, 10), FormatFloat(row.QPS, 0),
			FormatFloat(row.P50Ms, 2), FormatFloat(derefOr(row.P95Ms, 0), 2), FormatFloat(row.P99Ms, 2), FormatFloat(row.P999Ms, 2),
			fmt.Sprintf("%.1f%%", 100*r.Share[cfg.SlowStore]), row.ServedBy, strconv.FormatInt(row.Failed, 10)})
	}
	return MarkdownTable([]string{"variant", "reads", "reads/s", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms",
		fmt.Sprintf("slow store %d's share", cfg.SlowStore), "reads served by", "failed"}, cells)
}

func (cfg *OverloadedConfig) write(res *OverloadedResult, started time.Time) error {
	if len(res.Runs) == 0 {
		return nil
	}
	var errs []error
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return fmt.Errorf("overloaded-replica: %w", err)
	}
	if !cfg.NoPlots {
		var labels, notes []string
		var hists []*hdrhistogram.Histogram
		var p99 []float64
		names := variantNames(OverloadedVariants, func(v OverloadedVariant) string { return v.Name })
		for _, r := range res.Runs {
			labels = append(labels, r.Variant.Name)
			hists = append(hists, r.Latency)
			p99 = append(p99, r.Row.P99Ms)
			notes = append(notes, "p95 "+FormatFloat(derefOr(r.Row.P95Ms, 0), 1))
		}
		var plots plotSet
		plots.add(percentilePlot(res.Dir, "percentiles.png", fmt.Sprintf("overloaded-replica: latency by percentile, %d clients", cfg.Clients), names, hists, labels))
		plots.add(barPlot(res.Dir, "p99.png", fmt.Sprintf("overloaded-replica: p99 with store %d slow", cfg.SlowStore), "p99 latency (ms)", labels, p99, notes))
		res.Plots = plots.files
		errs = append(errs, plots.errs...)
	}
	table := cfg.table(res)
	if err := WriteResults(res.Dir, Results{Scenario: "overloaded-replica", Rows: res.Rows}, cfg.report(res, started, table)); err != nil {
		errs = append(errs, err)
	}
	fmt.Fprintf(cfg.Out, "\n%s", table)
	if _, r99 := overloadedRatio(res.Runs); r99 > 0 {
		fmt.Fprintf(cfg.Out, "\np2c p99 / round-robin p99: %.3f (target ≤ 0.333)\n", r99)
	}
	printWritten(cfg.Out, res.Dir, res.Plots)
	return errors.Join(errs...)
}

func (cfg *OverloadedConfig) report(res *OverloadedResult, started time.Time, table string) string {
	var b strings.Builder
	writeReportHeader(&b, "overloaded-replica: one slow store, round-robin vs power of two choices", started, cfg.Command)
	b.WriteString(loadNote(res.LoadBefore))
	fmt.Fprintf(&b, "- Three stores in this process on loopback ports (no simulated WAN), balancer paused, splits off: region %d holds all %d keys (%d-byte values), its leader on store 1.\n",
		hedgeTailRegion, cfg.Keys, cfg.ValueSize)
	fmt.Fprintf(&b, "- **The overloaded store**: store %d gets `delay=%v,prob=%g` (what `hedgekv ctl fault %d delay=%v,prob=%g` sends) as each measured run starts, and `clear` after it: ",
		cfg.SlowStore, cfg.Delay, cfg.Prob, cfg.SlowStore, cfg.Delay, cfg.Prob)
	b.WriteString("each read it serves waits that long first, as behind a deep read queue. Its raft loop is untouched.\n")
	fmt.Fprintf(&b, "- **%d independent clients**: each its own `client.New` (own connections, region cache, latency and load estimates, round-robin turn), sharing nothing. ", cfg.Clients)
	fmt.Fprintf(&b, "Together they send %.0f reads/s of uniformly chosen keys, an open loop (read i by client i mod %d, each in its own goroutine, whatever earlier reads do), every read linearizable "+
		"(the leader by lease, a follower by ReadIndex). Latency is measured from each read's start.\n", cfg.Rate, cfg.Clients)
	fmt.Fprintf(&b, "- Each run: fresh clients, a %v warm-up without the fault (connections, region cache), then %v measured with it: what p2c pays to learn the slow store is in the figures.\n",
		max(cfg.Warmup, 0), cfg.RunDuration)
	b.WriteString("- The share of reads each store served is counted from every answer's `ReadInfo.StoreID`.\n")
	b.WriteString("- No read is hedged (the sessions' `Hedge` is off), so the hedge budget plays no part here: what steers reads away from the slow store is the replica choice alone.\n")
	writeVariantList(&b, "Variants:", OverloadedVariants, cfg.Variants, func(v OverloadedVariant) (string, string) { return v.Name, v.Doc })
	b.WriteString("\n## Results\n\n")
	b.WriteString(table)
	if r95, r99 := overloadedRatio(res.Runs); r99 > 0 {
		met := "**met**"
		if r99 > 1.0/3 {
			met = "not met"
		}
		b.WriteString("\n")
		b.WriteString(MarkdownTable([]string{"ratio (same run)", "measured", "target", "ScyllaDB", ""}, [][]string{
			{"p2c p99 ÷ round-robin p99", FormatFloat(r99, 3), "≤ 1/3", "p95/p99 near 300 ms under round-robin with one shard overloaded, much lower with power of two choices", met},
			{"p2c p95 ÷ round-robin p95", FormatFloat(r95, 3), "", "", ""},
		}))
	}
	var notes []string
	var lag time.Duration
	for _, r := range res.Runs {
		lag = max(lag, r.MaxLag)
		if r.FirstErr != "" {
			notes = append(notes, fmt.Sprintf("%s: first error: %s", r.Variant.Name, inlineCode(r.FirstErr)))
		}
	}
	notes = append(notes, fmt.Sprintf("The sender fell at most %v behind its schedule in any run.", lag.Round(100*time.Microsecond)))
	writeNotes(&b, notes)
	writePlots(&b, res.Plots)
	return b.String()
}
