package bench

// node-kill's report: the timeline around the kill, the table, the
// targets, report.md, results.json and plots.

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/hedgekv/hedgekv/client"
)

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// nodeKillRow is a results.json row of node-kill: the common row plus
// what only this scenario has.
type nodeKillRow struct {
	Row
	OpTimeoutMs   int64   `json:"op_timeout_ms"`
	KilledStore   uint64  `json:"killed_store"`
	KillMs        int64   `json:"kill_ms"`
	NewLeader     uint64  `json:"new_leader_store"`
	ElectedMs     float64 `json:"elected_after_ms"`
	UnavailableMs float64 `json:"longest_unavailable_ms"`
	StaleReads    int64   `json:"stale_reads"`
	// ServedAfterKill: successful reads after the kill by how they were
	// served (lease, read-index, stale).
	ServedAfterKill map[string]int64 `json:"served_after_kill"`
}

func (cfg *NodeKillConfig) write(res *NodeKillResult, started time.Time) error {
	if len(res.Runs) == 0 {
		return nil
	}
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return fmt.Errorf("node-kill: %w", err)
	}
	var errs []error
	if !cfg.NoPlots {
		files, err := cfg.plots(res)
		res.Plots = files
		if err != nil {
			errs = append(errs, fmt.Errorf("node-kill: plots: %w", err))
		}
	}
	out := struct {
		Scenario string        `json:"scenario"`
		Rows     []nodeKillRow `json:"rows"`
	}{Scenario: "node-kill"}
	for _, r := range res.Runs {
		out.Rows = append(out.Rows, nodeKillRow{
			Row: r.Row, OpTimeoutMs: cfg.OpTimeout.Milliseconds(), KilledStore: r.KilledStore, KillMs: r.KillAt.Milliseconds(),
			NewLeader: r.NewLeader, ElectedMs: round(ms(r.ElectedAfter), 1), UnavailableMs: round(ms(r.LongestGap), 1),
			StaleReads: r.Modes["stale"], ServedAfterKill: r.ModesAfterKill,
		})
	}
	js, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("node-kill: encode results: %w", err))...)
	}
	table := cfg.table(res)
	if err := writeFileAtomic(filepath.Join(res.Dir, "results.json"), append(js, '\n')); err != nil {
		errs = append(errs, err)
	}
	if err := writeFileAtomic(filepath.Join(res.Dir, "report.md"), []byte(cfg.report(res, started, table))); err != nil {
		errs = append(errs, err)
	}
	fmt.Fprintf(cfg.Out, "\n%s\n", table)
	for _, t := range cfg.targets(res) {
		fmt.Fprintf(cfg.Out, "%s: %s (target %s) %s\n", t[0], t[1], t[2], t[3])
	}
	printWritten(cfg.Out, res.Dir, res.Plots)
	return errors.Join(errs...)
}

func (cfg *NodeKillConfig) table(res *NodeKillResult) string {
	var cells [][]string
	for _, r := range res.Runs {
		hedges := "–"
		if r.Variant.Hedged {
			hedges = fmt.Sprintf("%d sent, %d won (%.2f%% extra), %d denied", r.Hedge.HedgesSent, r.Hedge.HedgesWon,
				100*r.Hedge.ExtraRequestRatio(), r.Hedge.DeniedByBudget)
		}
		elected := "not seen"
		if r.NewLeader != 0 {
			elected = fmt.Sprintf("store %d after %.0f ms", r.NewLeader, ms(r.ElectedAfter))
		}
		cells = append(cells, []string{
			r.Variant.Name, strconv.FormatInt(r.Row.Ops-r.Row.Failed, 10), strconv.FormatInt(r.Row.Failed, 10), FormatFloat(r.Row.QPS, 1),
			FormatFloat(r.Row.P50Ms, 2), FormatFloat(r.Row.P99Ms, 2), FormatFloat(r.Row.P999Ms, 1), FormatFloat(r.Row.P9999Ms, 1),
			FormatFloat(r.MaxMs, 1), FormatFloat(ms(r.LongestGap), 0),
			fmt.Sprintf("store %d at %.2fs", r.KilledStore, r.KillAt.Seconds()), elected,
			modesString(r.ModesAfterKill), hedges,
		})
	}
	return MarkdownTable([]string{"variant", "ok", "failed", "ok reads/s", "p50 ms", "p99 ms", "p99.9 ms", "p99.99 ms", "max ms",
		"longest without a read, ms", "killed", "new leader", "served after the kill", "hedges"}, cells)
}

// targets: [what, measured, target, verdict] for the report.
func (cfg *NodeKillConfig) targets(res *NodeKillResult) [][]string {
	verdict := func(ok bool) string {
		if ok {
			return "**met**"
		}
		return "not met"
	}
	bound := cfg.ElectionTimeout() * 3 / 2
	var out [][]string
	for _, r := range res.Runs {
		if r.Variant.Stale {
			out = append(out, []string{r.Variant.Name + ": failed reads", strconv.FormatInt(r.Row.Failed, 10), "0", verdict(r.Row.Failed == 0)})
			continue
		}
		out = append(out, []string{r.Variant.Name + ": longest time without a successful read", FormatFloat(ms(r.LongestGap), 0) + " ms",
			fmt.Sprintf("≤ 1.5 × election timeout = %.0f ms", ms(bound)), verdict(r.LongestGap <= bound)})
	}
	return out
}

func (cfg *NodeKillConfig) report(res *NodeKillResult, started time.Time, table string) string {
	var b strings.Builder
	writeReportHeader(&b, "node-kill: reads while the leader's store is killed (Cassandra rapid read protection)", started, cfg.Command)
	e := cfg.ElectionTimeout()
	fmt.Fprintf(&b, "- Three stores, each a `hedgekv server` process (`%s`), on loopback ports, zones dc-a, dc-b, dc-c, balancer off so that only the kill moves a leader. ",
		filepath.Base(cfg.Binary))
	fmt.Fprintf(&b, "Raft tick %v, election timeout %d ticks = %v (each follower's randomized in [%v, %v)).\n", cfg.Tick, nodeKillElectionTicks, e, e, 2*e)
	fmt.Fprintf(&b, "- Region %d holds all %d keys (%d-byte values), loaded in %v. %d reader goroutines, each one `Get` of a uniformly chosen key at a time, checking the value it gets; ",
		nodeKillRegion, cfg.Records, cfg.ValueSize, res.Load.Round(time.Millisecond), cfg.Threads)
	fmt.Fprintf(&b, "a fresh client and a %v unmeasured warm-up per variant, then %v measured.\n", max(cfg.Warmup, 0), cfg.KillAfter+cfg.RunAfterKill)
	fmt.Fprintf(&b, "- **The kill**: %v into each run, the store that region %d's leader is on (as the stores themselves report it) gets SIGKILL: no shutdown, the kernel closes its sockets. ",
		cfg.KillAfter, nodeKillRegion)
	fmt.Fprintf(&b, "The run goes on for %v. Then the store is restarted on its data directory and the next variant waits until every store names the same leader and has applied its commit index.\n", cfg.RunAfterKill)
	fmt.Fprintf(&b, "- **A read fails** when it returns an error within the per-read timeout of **%v** (a read that takes longer is unavailable to a user, so the client gives up). ", cfg.OpTimeout)
	b.WriteString("Latencies are of successful reads. \"Longest without a read\" is the longest time in the run during which no reader completed a successful read: ")
	b.WriteString("how long the region was unavailable to these clients.\n")
	fmt.Fprintf(&b, "- Hedge: %s, budget %s; staleness bound of hedge-stale: %v.\n", cfg.Hedge, budgetString(cfg.HedgeBudget), cfg.MaxStaleness)
	for _, r := range res.Restarts {
		fmt.Fprintf(&b, "- %s.\n", r)
	}
	writeVariantList(&b, "Variants (every one reads from the leader first):", NodeKillVariants, cfg.Variants, func(v NodeKillVariant) (string, string) { return v.Name, v.Doc })
	b.WriteString("\n## Reads\n\n")
	b.WriteString(table)
	b.WriteString("\n## Targets\n\n")
	b.WriteString(MarkdownTable([]string{"what", "measured", "target", ""}, cfg.targets(res)))
	hb := 2 * cfg.Tick // the servers' heartbeat: raftstore's default 2 ticks
	fmt.Fprintf(&b, "\nA linearizable read needs a leader, so the linearizable variants cannot read from the kill until a new leader is elected: "+
		"each follower campaigns when its own election timeout, drawn in [%v, %v), runs out after the last heartbeat it got (heartbeats every %v), "+
		"so the election alone lands between about %v and %v after the kill, and the 1.5× target holds for the draws where the earlier of the two followers' timeouts is short enough. "+
		"One kill per variant is one draw; the new-leader column shows it.\n", e, 2*e, hb, e-hb, 2*e)
	b.WriteString("\nCassandra 2.0.2 with rapid read protection (speculative retry at the 99th percentile, ~1% extra requests): a killed node drops no request.\n")
	b.WriteString("\n## Around the kill (per 100 ms)\n\n")
	for _, r := range res.Runs {
		fmt.Fprintf(&b, "- `%s`: %s\n", r.Variant.Name, aroundKill(r, cfg.Step))
	}
	for _, r := range res.Runs {
		if r.FirstErr != "" {
			fmt.Fprintf(&b, "\nFirst failed read of %s: %s\n", r.Variant.Name, inlineCode(r.FirstErr))
		}
	}
	writePlots(&b, res.Plots)
	return b.String()
}

// modesString renders read counts by mode, most first.
func modesString(m map[string]int64) string {
	modes := sortedKeys(m)
	slices.SortStableFunc(modes, func(a, b string) int { return cmp.Compare(m[b], m[a]) })
	var parts []string
	for _, k := range modes {
		name := k
		if name == "" {
			name = "unknown"
		}
		parts = append(parts, fmt.Sprintf("%s %d", name, m[k]))
	}
	if len(parts) == 0 {
		return "–"
	}
	return strings.Join(parts, ", ")
}

func budgetString(b float64) string {
	switch {
	case b == 0:
		return fmt.Sprintf("%g%% of the reads over %v, per store (the client's default)", 100*client.DefaultHedgeBudget, client.DefaultHedgeWindow)
	case b < 0:
		return "none"
	case b >= 1:
		return "no cap"
	}
	return fmt.Sprintf("%g%% of the reads over %v, per store", 100*b, client.DefaultHedgeWindow)
}

// aroundKill renders ok/failed of the buckets from 300 ms before the kill
// to 1.5 s after it.
func aroundKill(r NodeKillRun, step time.Duration) string {
	var parts []string
	for _, p := range r.Row.Timeline {
		t := time.Duration(p.TMs) * time.Millisecond
		if t+step <= r.KillAt-300*time.Millisecond || t > r.KillAt+1500*time.Millisecond {
			continue
		}
		s := fmt.Sprintf("%.1fs %d", t.Seconds(), p.OK)
		if p.Failed > 0 {
			s += fmt.Sprintf("/**%d failed**", p.Failed)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// plots draws Cassandra's graph: successful reads per second and failed
// reads per 100 ms over time, per variant, the kill marked.
func (cfg *NodeKillConfig) plots(res *NodeKillResult) ([]string, error) {
	names := variantNames(NodeKillVariants, func(v NodeKillVariant) string { return v.Name })
	runFor := (cfg.KillAfter + cfg.RunAfterKill).Seconds()
	perSec := float64(time.Second) / float64(cfg.Step)
	var files []string
	var errs []error
	for _, m := range []struct {
		file, title, label string
		get                func(TimelinePoint) float64
	}{
		{"node-kill-throughput.png", "node-kill: successful reads while the leader's store is killed", "successful reads per second (per 100 ms)",
			func(p TimelinePoint) float64 { return float64(p.OK) * perSec }},
		{"node-kill-failed.png", fmt.Sprintf("node-kill: failed reads (error or > %v) per 100 ms", cfg.OpTimeout), "failed reads per 100 ms",
			func(p TimelinePoint) float64 { return float64(p.Failed) }},
	} {
		p := newPlot(m.title, "time since the run began (s)", m.label)
		var ss []series
		top := 0.0
		for _, r := range res.Runs {
			var xys plotter.XYs
			for _, pt := range r.Row.Timeline {
				x := float64(pt.TMs)/1000 + cfg.Step.Seconds()/2
				if x > runFor {
					break // the last bucket is partial
				}
				y := m.get(pt)
				top = max(top, y)
				xys = append(xys, plotter.XY{X: x, Y: y})
			}
			if len(xys) > 0 {
				ss = append(ss, series{name: r.Variant.Name, xys: xys})
			}
		}
		if len(ss) == 0 {
			continue
		}
		if top == 0 {
			top = 1
		}
		if err := addSeries(p, names, ss, false); err != nil {
			errs = append(errs, err)
			continue
		}
		// The kill: one dashed vertical line per variant, in its colour
		// (the kills land within a few ms of each other).
		for _, r := range res.Runs {
			k := r.KillAt.Seconds()
			l, err := plotter.NewLine(plotter.XYs{{X: k, Y: 0}, {X: k, Y: top * 1.1}})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			i := max(0, slices.Index(names, r.Variant.Name))
			l.Color = plotColors[i%len(plotColors)]
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			p.Add(l)
		}
		black := color.RGBA{A: 0xff}
		lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: res.Runs[0].KillAt.Seconds(), Y: top * 1.1}}, Labels: []string{" kill -9 leader"}})
		if err == nil {
			lbl.TextStyle[0].Color = black
			p.Add(lbl)
		}
		p.X.Min, p.X.Max = 0, runFor
		p.Y.Min, p.Y.Max = 0, top*1.2
		p.Legend.Left, p.Legend.Top = false, false
		p.Legend.XOffs, p.Legend.YOffs = -vg.Points(12), vg.Points(12)
		f, err := savePlot(p, res.Dir, m.file)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		files = append(files, f)
	}
	return files, errors.Join(errs...)
}
