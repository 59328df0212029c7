package bench

// hedge-tail's verdicts (the cut against hedging off, the extra requests),
// its tables, report.md, results.json and plots.

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/hedgekv/hedgekv/client"
)

// hedgeTailOff is hedge-off's run under r's fault, if there is one.
func hedgeTailOff(runs []HedgeTailRun, fault string) (HedgeTailRun, bool) {
	for _, b := range runs {
		if b.Fault == fault && b.Variant.Hedge.Off() {
			return b, true
		}
	}
	return HedgeTailRun{}, false
}

// hedgeTailCut is a variant's p99.99 cut against hedge-off's under the
// same fault (0 if either is missing).
func hedgeTailCut(runs []HedgeTailRun, r HedgeTailRun) float64 {
	if b, ok := hedgeTailOff(runs, r.Fault); ok && r.Row.P9999Ms > 0 {
		return b.Row.P9999Ms / r.Row.P9999Ms
	}
	return 0
}

// hedgeTailMet: p99.99 at least 10x lower than unhedged for at most 1%
// extra requests.
func hedgeTailMet(cut, extra float64) bool { return cut >= 10 && extra <= 0.01 }

// slowLeaderMet: under slow-leader, the extra requests stay within the
// run's budget and p50 is under twice hedge-off's. ok is false when there
// is nothing to compare with.
func slowLeaderMet(runs []HedgeTailRun, r HedgeTailRun) (p50Ratio float64, met, ok bool) {
	off, found := hedgeTailOff(runs, r.Fault)
	if !found || off.Row.P50Ms <= 0 || r.Variant.Hedge.Off() {
		return 0, false, false
	}
	p50Ratio = r.Row.P50Ms / off.Row.P50Ms
	return p50Ratio, r.Stats.ExtraRequestRatio() <= budgetShare(r.Budget)+1e-9 && p50Ratio < 2, true
}

func (cfg *HedgeTailConfig) table(res *HedgeTailResult, fault string) string {
	var cells [][]string
	for _, r := range res.Runs {
		if r.Fault != fault {
			continue
		}
		row := r.Row
		cut, extra, won, denied, met := "–", "–", "–", "–", "–"
		if c := hedgeTailCut(res.Runs, r); c > 0 && !r.Variant.Hedge.Off() {
			cut = FormatFloat(c, 1) + "×"
		}
		if fault == FaultSlowLeader {
			if ratio, ok2, ok := slowLeaderMet(res.Runs, r); ok {
				met = fmt.Sprintf("no (p50 %s× off's)", FormatFloat(ratio, 2))
				if ok2 {
					met = fmt.Sprintf("**yes** (p50 %s× off's)", FormatFloat(ratio, 2))
				} else if r.Stats.ExtraRequestRatio() > budgetShare(r.Budget)+1e-9 {
					met = "no (extra > budget)"
				}
			}
		} else if c := hedgeTailCut(res.Runs, r); c > 0 && !r.Variant.Hedge.Off() {
			met = "no"
			if hedgeTailMet(c, r.Stats.ExtraRequestRatio()) {
				met = "**yes**"
			}
		}
		if row.ExtraRequestRatio != nil {
			extra = FormatFloat(100**row.ExtraRequestRatio, 2) + "%"
			won = fmt.Sprintf("%d of %d", r.Stats.HedgesWon, r.Stats.HedgesSent)
			denied = strconv.FormatUint(r.Stats.DeniedByBudget, 10)
		}
		cells = append(cells, []string{row.Variant, budgetName(r.Variant, r.Budget), strconv.FormatInt(row.Ops, 10), FormatFloat(row.QPS, 0),
			FormatFloat(row.P50Ms, 2), FormatFloat(row.P99Ms, 2), FormatFloat(row.P999Ms, 2), FormatFloat(row.P9999Ms, 2),
			cut, extra, won, denied, strconv.FormatInt(row.Failed, 10), met})
	}
	target := "≥10× for ≤1%"
	if fault == FaultSlowLeader {
		target = "extra ≤ budget, p50 < 2× off's"
	}
	return MarkdownTable([]string{"variant", "budget", "reads", "reads/s", "p50 ms", "p99 ms", "p99.9 ms", "p99.99 ms",
		"p99.99 cut vs off", "extra requests", "hedges won", "denied by budget", "failed", target}, cells)
}

func (cfg *HedgeTailConfig) write(res *HedgeTailResult, started time.Time) error {
	if len(res.Runs) == 0 {
		return nil
	}
	var errs []error
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return fmt.Errorf("hedge-tail: %w", err)
	}
	if !cfg.NoPlots {
		names := cfg.labels()
		var plots plotSet
		for _, f := range HedgeTailFaults {
			var hists []*hdrhistogram.Histogram
			var labels, notes []string
			var p9999 []float64
			for _, r := range res.Runs {
				if r.Fault == f {
					hists = append(hists, r.Latency)
					labels = append(labels, r.Label)
					p9999 = append(p9999, r.Row.P9999Ms)
					note := ""
					if r.Row.ExtraRequestRatio != nil {
						note = FormatFloat(100**r.Row.ExtraRequestRatio, 2) + "% extra"
					}
					notes = append(notes, note)
				}
			}
			if len(hists) == 0 {
				continue
			}
			plots.add(percentilePlot(res.Dir, "percentiles-"+f+".png", "hedge-tail: latency by percentile, "+f, names, hists, labels))
			plots.add(barPlot(res.Dir, "p9999-"+f+".png", "hedge-tail: p99.99 by hedging policy, "+f, "p99.99 latency (ms)", labels, p9999, notes))
		}
		res.Plots = plots.files
		errs = append(errs, plots.errs...)
	}
	report := cfg.report(res, started)
	if err := WriteResults(res.Dir, Results{Scenario: "hedge-tail", Rows: res.Rows}, report); err != nil {
		errs = append(errs, err)
	}
	for _, f := range HedgeTailFaults {
		if slices.Contains(cfg.Faults, f) {
			fmt.Fprintf(cfg.Out, "\n%s (%s):\n\n%s", f, faultDoc(f, cfg), cfg.table(res, f))
		}
	}
	printWritten(cfg.Out, res.Dir, res.Plots)
	return errors.Join(errs...)
}

func faultDoc(fault string, cfg *HedgeTailConfig) string {
	switch fault {
	case FaultReadPause:
		return fmt.Sprintf("`delay=%v,prob=1` on the leader's store for %v, then `clear`: its KV reads wait out the pause, its raft loop stays live; hedges are linearizable ReadIndex reads at a follower", cfg.PauseLen, cfg.PauseLen)
	case FaultSlowLeader:
		return fmt.Sprintf("`delay=%v,prob=%g` on the leader's store for the session's whole life (warm-up and run): %g%% of its reads wait %v, %g× the default budget; hedges are linearizable ReadIndex reads at a follower",
			cfg.SlowDelay, cfg.SlowProb, 100*cfg.SlowProb, cfg.SlowDelay, round(cfg.SlowProb/client.DefaultHedgeBudget, 2))
	}
	return fmt.Sprintf("`stall=%v` on the leader's store: reads, writes and raft all freeze; the session allows %v of staleness, so hedges are stale reads at a follower", cfg.PauseLen, cfg.MaxStaleness)
}

func (cfg *HedgeTailConfig) report(res *HedgeTailResult, started time.Time) string {
	var b strings.Builder
	writeReportHeader(&b, "hedge-tail: hedged reads against a leader that pauses now and then, or stays slow", started, cfg.Command)
	b.WriteString(loadNote(res.LoadBefore))
	hit := float64(cfg.Pauses) * cfg.PauseLen.Seconds() / cfg.RunDuration.Seconds()
	fmt.Fprintf(&b, "- Three stores in this process on loopback ports (no simulated WAN), balancer paused, splits off: region %d holds all %d keys (%d-byte values), its leader on store %d.\n",
		hedgeTailRegion, cfg.Keys, cfg.ValueSize, res.LeaderStore)
	fmt.Fprintf(&b, "- **Open loop**: %.0f reads/s of uniformly chosen keys, each read started on schedule in its own goroutine whatever the earlier ones do, "+
		"so a pause delays every read that arrives during it, as it would for a server's many independent callers. (A closed loop, go-ycsb's threads, "+
		"would stop sending while the store is paused, and a pause would touch one read per thread.) Latency is measured from each read's start.\n", cfg.Rate)
	fmt.Fprintf(&b, "- Each run: a fresh client and one session, a %v warm-up in that session (the percentile hedges' latency window fills, and the budget holds what a session reading for a while would), then %v measured; "+
		"the hedge counters are the run's.\n", max(cfg.Warmup, 0), cfg.RunDuration)
	b.WriteString("- Every read's primary goes to the leader (`ReplicaLeader`); a hedge goes to a follower. ")
	fmt.Fprintf(&b, "Each hedging variant runs once per budget, side by side: %s. ", budgetList(cfg.HedgeBudgets))
	fmt.Fprintf(&b, "The client's default budget is %g%% of the reads over a %v window, with a floor of %g hedge a second: each read deposits %g of a token, expiring after %v, in its store's account, and each hedge spends one, "+
		"so a pause of up to %v is hedged in full from what the seconds before it deposited, and a store that stays slow gets %g%% of its reads hedged.\n",
		100*client.DefaultHedgeBudget, client.DefaultHedgeWindow, client.DefaultHedgeMinPerSecond, client.DefaultHedgeBudget, client.DefaultHedgeWindow,
		time.Duration(client.DefaultHedgeBudget*float64(client.DefaultHedgeWindow)), 100*client.DefaultHedgeBudget)
	b.WriteString("\n## The pause schedule\n\n")
	fmt.Fprintf(&b, "%d pause(s) of %v per %v run, at (k+½)·%v/%d, injected on the leader's store through the admin Fault call (what `hedgekv ctl fault` sends). ",
		cfg.Pauses, cfg.PauseLen, cfg.RunDuration, cfg.RunDuration, cfg.Pauses)
	fmt.Fprintf(&b, "The pauses cover %.2f%% of the run, so about %.2f%% of reads arrive during one: ", 100*hit, 100*hit)
	b.WriteString("well over the 0.01% that p99.99 looks at (so p99.99 sees them: unhedged, it is close to the pause's length), and well under 1%, so that a hedge ")
	b.WriteString("delay near the normal tail can cost under 1% extra requests (each read caught in a pause is hedged once; p99.9 hedging adds ~0.1% from the normal tail, p99 hedging ~1%).\n\n")
	b.WriteString("Which fault each figure is measured under:\n\n")
	for _, f := range HedgeTailFaults {
		if slices.Contains(cfg.Faults, f) {
			fmt.Fprintf(&b, "- `%s`: %s.\n", f, faultDoc(f, cfg))
		}
	}
	writeVariantList(&b, "Variants:", HedgeTailVariants, cfg.Variants, func(v HedgeTailVariant) (string, string) { return v.Name, v.Doc })
	for _, f := range HedgeTailFaults {
		if !slices.Contains(cfg.Faults, f) {
			continue
		}
		fmt.Fprintf(&b, "\n## %s\n\n%s.\n\n", f, faultDoc(f, cfg))
		b.WriteString(cfg.table(res, f))
		if f == FaultSlowLeader {
			b.WriteString("\nMore reads are late than the budget may hedge. The target: extra requests at or under the run's budget, and p50 under twice hedge-off's under the same fault. " +
				"The hedge counters (extra requests, hedges won, denied) here cover the session's whole life, warm-up included, as the store is slow for all of it; the latencies cover the measured run. " +
				"A percentile delay adapts to a store that stays slow (its p99 or p99.9 becomes the injected delay), so it stops hedging by itself; a fixed delay keeps asking, and the budget is what holds it.\n")
		}
	}
	b.WriteString("\n## Against the target and the seeds\n\n")
	b.WriteString("Target: p99.99 at least 10× lower than unhedged for at most 1% extra requests, with the default budget. Each ratio below is from one run of this scenario (same cluster, same schedule).\n\n")
	var cells [][]string
	for _, r := range res.Runs {
		if r.Variant.Hedge.Off() || r.Fault == FaultSlowLeader {
			continue
		}
		c := hedgeTailCut(res.Runs, r)
		met := "no"
		if hedgeTailMet(c, r.Stats.ExtraRequestRatio()) {
			met = "**met**"
		}
		cells = append(cells, []string{"hedgekv " + r.Label + ", " + r.Fault + " (" + map[string]string{FaultReadPause: "delay fault", FaultStallStale: "stall fault, stale hedges"}[r.Fault] + "), budget " + budgetName(r.Variant, r.Budget),
			"p99.99 " + FormatFloat(r.Row.P9999Ms, 1) + " ms vs " + FormatFloat(r.Row.P9999Ms*c, 1) + " ms unhedged", FormatFloat(c, 1) + "×",
			FormatFloat(100*r.Stats.ExtraRequestRatio(), 2) + "%", met})
	}
	cells = append(cells,
		[]string{"Pegasus, backup delay = p99.9 (138 ms), read p99.99", "988,671 µs → 153,599 µs", "6.4×", "~0.1%", "(seed)"},
		[]string{"Bailis (Yammer Riak model), second request after 8 ms, p99.9", "170 ms → 11.0 ms", "15×", "4.2%", "(seed)"},
		[]string{"Dean (BigTable), backup after 10 ms, p99.9", "994 ms → 50 ms", "~20×", "5%", "(seed)"})
	b.WriteString(MarkdownTable([]string{"", "tail", "cut", "extra requests", "target (≥10× for ≤1%)"}, cells))
	if cfg.Quick {
		b.WriteString("\nThis was a `--quick` run: one pause in a 3 s run covers ~5% of it, so the extra-request figures are far above a full run's, " +
			"and the budget's window holds only the warm-up's and the run's first 1.5 s of deposits when the pause comes.\n")
	}
	var notes []string
	for _, r := range res.Runs {
		if r.LeaderMoved != "" {
			notes = append(notes, r.Label+" "+r.Fault+": "+r.LeaderMoved)
		}
		if r.Fault != FaultSlowLeader && r.PausesInjected != cfg.Pauses {
			notes = append(notes, fmt.Sprintf("%s %s: %d of %d pauses injected", r.Label, r.Fault, r.PausesInjected, cfg.Pauses))
		}
		if r.FirstErr != "" {
			notes = append(notes, fmt.Sprintf("%s %s: first error: %s", r.Label, r.Fault, inlineCode(r.FirstErr)))
		}
	}
	var lag time.Duration
	for _, r := range res.Runs {
		lag = max(lag, r.MaxLag)
	}
	notes = append(notes, fmt.Sprintf("The sender fell at most %v behind its schedule in any run.", lag.Round(100*time.Microsecond)))
	writeNotes(&b, notes)
	writePlots(&b, res.Plots)
	return b.String()
}

// budgetList describes the budgets the hedging variants run with.
func budgetList(budgets []float64) string {
	var parts []string
	for _, x := range budgets {
		switch {
		case x == 0:
			parts = append(parts, "the client's default (no suffix)")
		case x >= 1:
			parts = append(parts, "no cap (`-nocap`)")
		default:
			parts = append(parts, fmt.Sprintf("%g%% (`-budget%g%%`)", 100*x, 100*x))
		}
	}
	return strings.Join(parts, ", then ")
}
