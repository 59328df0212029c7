package bench

// follower-lease's report: the targets each variant is held to, the
// tables, report.md, results.json and plots.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"gonum.org/v1/plot/plotter"
)

func (res *FollowerLeaseResult) find(variant, place string) *FollowerLeaseRun {
	for i := range res.Runs {
		if res.Runs[i].Variant.Name == variant && (place == "" || res.Runs[i].Place == place) {
			return &res.Runs[i]
		}
	}
	return nil
}

// flTarget is one figure the scenario is held to.
type flTarget struct {
	What, Measured, Target string
	Met                    *bool // nil: no target, reported only
}

func (cfg *FollowerLeaseConfig) targets(res *FollowerLeaseResult) []flTarget {
	var out []flTarget
	div := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	if ll, fl := res.find("leader-lease", ""), res.find("follower-lease", ""); ll != nil && fl != nil {
		r := div(fl.Row.QPS, ll.Row.QPS)
		out = append(out, flTarget{
			What:     "follower-lease ops/s ÷ leader-lease ops/s (workload C, one machine)",
			Measured: fmt.Sprintf("%.2f× (%s / %s)", r, FormatFloat(fl.Row.QPS, 0), FormatFloat(ll.Row.QPS, 0)),
			Target:   "≥ 0.9×", Met: ptr(r >= 0.9),
		})
		out = append(out, flTarget{
			What:     "follower-lease p99 ÷ leader-lease p99",
			Measured: fmt.Sprintf("%.2f× (%s / %s ms)", div(fl.Row.P99Ms, ll.Row.P99Ms), FormatFloat(fl.Row.P99Ms, 2), FormatFloat(ll.Row.P99Ms, 2)),
		})
	}
	for _, place := range []string{flPlaceLocal, cfg.wanPlace()} {
		off, on := res.find("writes-leases-off", place), res.find("writes-leases-on", place)
		if off == nil || on == nil {
			continue
		}
		out = append(out, flTarget{
			What: "write p50, leases on ÷ off (" + place + ")",
			Measured: fmt.Sprintf("%.2f× (%s / %s ms)", div(on.Row.P50Ms, off.Row.P50Ms),
				FormatFloat(on.Row.P50Ms, 2), FormatFloat(off.Row.P50Ms, 2)),
		}, flTarget{
			What: "write p99, leases on ÷ off (" + place + ")",
			Measured: fmt.Sprintf("%.2f× (%s / %s ms)", div(on.Row.P99Ms, off.Row.P99Ms),
				FormatFloat(on.Row.P99Ms, 2), FormatFloat(off.Row.P99Ms, 2)),
		})
	}
	for _, place := range []string{flPlaceLocal, cfg.wanPlace()} {
		if r := res.find("writes-dead-holder", place); r != nil {
			t := flTarget{
				What:     "longest write stall after a lease holder dies (" + place + ")",
				Measured: fmt.Sprintf("%.0f ms", float64(r.StallAfter)/float64(time.Millisecond)),
				Target:   fmt.Sprintf("≤ one lease (%v)", flDefaultLease),
				Met:      ptr(r.VictimLease && r.StallAfter <= flDefaultLease),
			}
			if !r.VictimLease {
				t.Measured += " (the victim held no lease just before: not a test of the bound)"
			}
			out = append(out, t)
		}
		if r := res.find("writes-dead-follower", place); r != nil {
			out = append(out, flTarget{
				What:     "longest write stall after a follower dies, leases off (" + place + ")",
				Measured: fmt.Sprintf("%.0f ms", float64(r.StallAfter)/float64(time.Millisecond)),
			})
		}
		if r := res.find("writes-new-leader", place); r != nil {
			out = append(out, flTarget{
				What:     "longest write stall after a leadership transfer, leases on (" + place + ")",
				Measured: fmt.Sprintf("%.0f ms", float64(r.StallAfter)/float64(time.Millisecond)),
				Target:   fmt.Sprintf("expected about the deferral, %v, plus the transfer", flDefaultDefer),
			})
		}
		if r := res.find("writes-new-leader-off", place); r != nil {
			out = append(out, flTarget{
				What:     "longest write stall after a leadership transfer, leases off (" + place + ")",
				Measured: fmt.Sprintf("%.0f ms", float64(r.StallAfter)/float64(time.Millisecond)),
			})
		}
	}
	return out
}

func flTargetsTable(ts []flTarget) string {
	if len(ts) == 0 {
		return "(no ratio: the runs it needs were not made)\n"
	}
	var cells [][]string
	for _, t := range ts {
		met := ""
		if t.Met != nil {
			met = "not met"
			if *t.Met {
				met = "**met**"
			}
		}
		target := t.Target
		if target == "" {
			target = "–"
		}
		cells = append(cells, []string{t.What, t.Measured, target, met})
	}
	return MarkdownTable([]string{"figure (same run)", "measured", "target", ""}, cells)
}

func (res *FollowerLeaseResult) table() string {
	var cells [][]string
	for _, r := range res.Runs {
		row := r.Row
		stall, notes := "–", r.Holders
		if row.MaxStallMs != nil && !r.Variant.Read {
			stall = FormatFloat(*row.MaxStallMs, 1)
		}
		if r.Variant.Kill {
			stall = fmt.Sprintf("%s (after the kill: %.0f)", stall, float64(r.StallAfter)/float64(time.Millisecond))
		}
		if r.Variant.Move {
			stall = fmt.Sprintf("%s (after the transfer began: %.0f)", stall, float64(r.StallAfter)/float64(time.Millisecond))
		}
		if r.Variant.Read {
			notes = row.ServedBy
		} else if notes != "" {
			notes = "lease holders before the run: " + notes
		}
		cells = append(cells, []string{row.Variant, r.Place, strconv.FormatInt(row.Ops, 10), FormatFloat(row.QPS, 0),
			FormatFloat(row.P50Ms, 2), FormatFloat(row.P99Ms, 2), FormatFloat(row.P999Ms, 2), stall,
			strconv.FormatInt(row.Failed, 10), notes})
	}
	return MarkdownTable([]string{"variant", "where", "ops", "ops/s", "p50 ms", "p99 ms", "p99.9 ms", "longest stall ms", "failed", "served by / notes"}, cells)
}

func (cfg *FollowerLeaseConfig) write(res *FollowerLeaseResult, started time.Time) error {
	if len(res.Runs) == 0 {
		return nil
	}
	var errs []error
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return fmt.Errorf("follower-lease: %w", err)
	}
	if !cfg.NoPlots {
		plots, err := cfg.plots(res)
		res.Plots = plots
		if err != nil {
			errs = append(errs, fmt.Errorf("follower-lease: plots: %w", err))
		}
	}
	table, targets := res.table(), flTargetsTable(cfg.targets(res))
	if err := WriteResults(res.Dir, Results{Scenario: "follower-lease", Rows: res.Rows}, cfg.report(res, started, table, targets)); err != nil {
		errs = append(errs, err)
	}
	fmt.Fprintf(cfg.Out, "\n%s\n%s", table, targets)
	printWritten(cfg.Out, res.Dir, res.Plots)
	return errors.Join(errs...)
}

func (cfg *FollowerLeaseConfig) plots(res *FollowerLeaseResult) ([]string, error) {
	var plots plotSet
	add := plots.add
	names := variantNames(FollowerLeaseVariants, func(v FollowerLeaseVariant) string { return v.Name })
	// Reads: throughput bars, p99 in the note.
	var labels, notes []string
	var qps []float64
	for _, r := range res.Runs {
		if r.Variant.Read {
			labels = append(labels, r.Variant.Name)
			qps = append(qps, r.Row.QPS)
			notes = append(notes, "p99 "+FormatFloat(r.Row.P99Ms, 1)+" ms")
		}
	}
	if len(labels) > 0 {
		add(barPlot(res.Dir, "reads.png", fmt.Sprintf("follower-lease: YCSB workload C, %d threads, one machine", cfg.Threads), "reads per second", labels, qps, notes))
	}
	// Writes: latency by percentile, one plot per place.
	for i, place := range []string{flPlaceLocal, cfg.wanPlace()} {
		var hists []*hdrhistogram.Histogram
		var ls []string
		for _, r := range res.Runs {
			if !r.Variant.Read && !r.Variant.Kill && !r.Variant.Move && r.Place == place {
				hists = append(hists, r.Latency)
				ls = append(ls, r.Variant.Name)
			}
		}
		if len(hists) > 0 {
			file := map[int]string{0: "writes-local.png", 1: "writes-wan.png"}[i]
			add(percentilePlot(res.Dir, file, "follower-lease: put latency by percentile, "+place, names, hists, ls))
		}
	}
	// Kills and transfers: writes completed per step.
	for _, k := range []struct {
		place, file, what string
		move              bool
	}{
		{flPlaceLocal, "kill-local.png", fmt.Sprintf("store %d killed", flVictim), false},
		{cfg.wanPlace(), "kill-wan.png", fmt.Sprintf("store %d cut off", flVictim), false},
		{flPlaceLocal, "new-leader-local.png", "leader moved to store 2", true},
		{cfg.wanPlace(), "new-leader-wan.png", "leader moved to store 2", true},
	} {
		place := k.place
		var ss []series
		for _, r := range res.Runs {
			if !(r.Variant.Kill && !k.move || r.Variant.Move && k.move) || r.Place != place || len(r.Row.Timeline) == 0 {
				continue
			}
			var xys plotter.XYs
			for _, p := range r.Row.Timeline {
				xys = append(xys, plotter.XY{X: float64(p.TMs) / 1000, Y: float64(p.OK)})
			}
			ss = append(ss, series{name: r.Variant.Name, xys: xys})
		}
		if len(ss) == 0 {
			continue
		}
		p := newPlot(fmt.Sprintf("follower-lease: puts per %v, %s at %.1f s (%s)", cfg.Step, k.what,
			cfg.RunDuration.Seconds()/3, place), "seconds into the run", fmt.Sprintf("puts per %v", cfg.Step))
		if err := addSeries(p, names, ss, false); err != nil {
			add("", err)
			continue
		}
		p.Y.Min = 0
		add(savePlot(p, res.Dir, k.file))
	}
	return plots.files, errors.Join(plots.errs...)
}

func (cfg *FollowerLeaseConfig) report(res *FollowerLeaseResult, started time.Time, table, targets string) string {
	var b strings.Builder
	writeReportHeader(&b, "follower-lease: follower read leases, what they give and what they cost", started, cfg.Command)
	b.WriteString(loadNote(res.LoadBefore))
	b.WriteString("- Every cluster: three stores in this process, balancer paused, splits off (region 1 holds every key), its leader moved to store 1; bbolt without fsync; raftstore's default timing (50 ms tick, 10-tick election), ")
	fmt.Fprintf(&b, "so a follower lease lasts at most %v (the leader lease) and a holder counts it %v less (drift margin).\n", flDefaultLease, flDefaultLease/10)
	b.WriteString("- Leases are a setting of the whole cluster (`raftstore.Config.FollowerLeases`, the server's `--follower-leases`), so each place gets a cluster with them on and one with them off, one after the other; the kill comes last on its cluster.\n")
	fmt.Fprintf(&b, "- Reads (`%s`): %d YCSB records (~1 KB), go-ycsb's workload C (100%% reads, zipfian), %d client threads, %v after a %v warm-up, on the one-machine cluster with leases on; "+
		"which store served each read and how comes from the stores' counters (`follower-lease` = `hedgekv_server_reads_total{mode=\"follower-lease\"}`).\n",
		flWorkloadC, cfg.Records, cfg.Threads, cfg.RunDuration, max(cfg.Warmup, 0))
	fmt.Fprintf(&b, "- Writes: %d goroutines each putting one key at a time (a closed loop) to uniformly chosen keys among %d, %d-byte values, from a client beside the leader, %v after a %v warm-up. ",
		cfg.WriteThreads, cfg.WriteKeys, cfg.ValueSize, cfg.RunDuration, max(cfg.Warmup, 0))
	b.WriteString("Before each leases-on write run the followers are asked for a lease read directly, to show they hold leases (`lease holders`).\n")
	if !cfg.NoWAN {
		fmt.Fprintf(&b, "- WAN (`%s`): %s; the leader and the writers in %s.\n", cfg.TopologyName, describeTopology(cfg.Topology), func() string { z, _ := cfg.Topology.ZoneOf(1); return z }())
	}
	fmt.Fprintf(&b, "- Kill rows: %v into the run store %d (a follower) dies: on one machine its in-process server is stopped (its connections close; it sends nothing first), across the WAN a blackhole partition cuts it off (nobody is told). ",
		cfg.RunDuration/3, flVictim)
	b.WriteString("`longest stall` is the longest time no put completed; `after the kill` counts from the kill to the first put completed after it, or the longest gap after it if longer. ")
	fmt.Fprintf(&b, "The timeline (puts completed per %v) is in results.json.\n", cfg.Step)
	fmt.Fprintf(&b, "- Transfer rows: %v into the run region 1's leadership is moved to store 2 (`MoveLeader`: TransferLeader until it holds); `after the transfer began` counts from the moment the move is asked for. "+
		"After the run the leader is moved back to store 1 and the next run waits %v, unmeasured. With leases on, a new leader holds its first commit back for %v (one lease, plus the drift margin, plus a tick).\n",
		cfg.RunDuration/3, 2*flDefaultDefer, flDefaultDefer)
	writeVariantList(&b, "Variants:", FollowerLeaseVariants, cfg.Variants, func(v FollowerLeaseVariant) (string, string) { return v.Name, v.Doc })
	b.WriteString("\n## Figures measured in this run\n\n")
	b.WriteString(targets)
	b.WriteString("\n## Every run\n\n")
	b.WriteString(table)
	var notes []string
	for _, r := range res.Runs {
		if r.Variant.Kill && r.Variant.Leases && !r.VictimLease {
			notes = append(notes, fmt.Sprintf("%s (%s): store %d did not serve a lease read just before the kill.", r.Variant.Name, r.Place, flVictim))
		}
		if r.Variant.Name == "follower-lease" && !strings.Contains(r.Row.ServedBy, "follower-lease") {
			notes = append(notes, "follower-lease: no read was served from a follower lease.")
		}
		if r.FirstErr != "" {
			notes = append(notes, fmt.Sprintf("%s (%s): first error: %s", r.Variant.Name, r.Place, inlineCode(r.FirstErr)))
		}
	}
	notes = append(notes, res.Notes...)
	if len(notes) > 0 {
		writeNotes(&b, notes)
	}
	writePlots(&b, res.Plots)
	return b.String()
}
