package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/bench"
)

// hedgeTailQuick is what hedge-tail --quick runs, said once for the
// command's help and its flag's (they said two things): 21 runs of the
// default variants, budgets and faults, each 3s after a 2s warm-up
// (bench.HedgeTailConfig's quick defaults).
const hedgeTailQuick = "3s runs, each after a 2s warm-up, about two minutes"

func newBenchHedgeTailCmd() *cobra.Command {
	var (
		variants, faults, budgets                    string
		keys, pauses                                 int
		rate, slowProb                               float64
		duration, warmup, pause, maxStale, slowDelay time.Duration
		sf                                           scenarioFlags
	)
	cmd := &cobra.Command{
		Use:   "hedge-tail [--quick] [--out results] [--rate 2000] [--pause 150ms --pauses 1] [--duration 25s]",
		Short: "Pegasus's backup request: p99.99 and extra requests of hedged reads while the leader pauses now and then, or stays slow",
		Long: `Start three stores in this process (loopback, faults allowed), load --keys keys
into one region led by store 1, and read them at --rate reads/s (an open loop)
from the leader, once per hedging policy (off, 10ms, p99, p999), budget and
fault:

  read-pause   the leader's KV reads are held for --pause (delay=D,prob=1, then
               clear); its raft loop stays live, so a linearizable hedge to a
               follower (ReadIndex) answers
  stall-stale  the leader's whole store stalls for --pause (stall=D); the session
               allows --max-staleness, so a stale hedge to a follower answers
  slow-leader  the leader stays slow for the whole session: --slow-delay on
               --slow-prob of its reads, more than the budget may hedge

--pauses pauses are spread over each --duration run. Each hedging policy runs
once per --hedge-budget (default: the client's default, 5% of the reads over
10 s, then 1 = no cap). Reports p50..p99.99, the extra-request ratio, hedges
won and denied per variant, beside Pegasus's, Bailis's and Dean's figures, in
OUT/hedge-tail/{results.json,report.md,*.png}. --quick: ` + hedgeTailQuick + `.`,
		Args: exactArgs(),
		RunE: benchRunE(func(cmd *cobra.Command, env *benchEnv) error {
			if keys < 0 || pauses < 0 || rate < 0 {
				return usagef("--keys, --pauses and --rate must not be negative")
			}
			var hedgeBudgets []float64
			for _, b := range splitList(budgets) {
				x, err := strconv.ParseFloat(b, 64)
				if err != nil || x < 0 || x > 1 {
					return usagef("--hedge-budget: %q is not a share of reads in [0, 1] (0: the client's default, 1: no cap)", b)
				}
				hedgeBudgets = append(hedgeBudgets, x)
			}
			if slowProb < 0 || slowProb > 1 {
				return usagef("--slow-prob must be in [0, 1]")
			}
			_, err := bench.RunHedgeTail(env.ctx, bench.HedgeTailConfig{
				Quick: sf.quick, Variants: splitList(variants), Faults: splitList(faults), Keys: keys, Rate: rate,
				RunDuration: duration, Warmup: warmup, PauseLen: pause, Pauses: pauses, HedgeBudgets: hedgeBudgets,
				SlowDelay: slowDelay, SlowProb: slowProb,
				MaxStaleness: maxStale, OutDir: sf.out, NoPlots: sf.noPlots, Command: commandLine(cmd),
				Progress: cmd.ErrOrStderr(), Logger: wanLogger(cmd), Out: cmd.OutOrStdout(),
			})
			return err
		}),
	}
	f := cmd.Flags()
	sf.register(f, "hedge-tail", hedgeTailQuick+" (explicit flags win)")
	variantsFlag(f, &variants, bench.HedgeTailVariants, func(v bench.HedgeTailVariant) string { return v.Name })
	f.StringVar(&faults, "faults", "", "comma list of faults (default both: "+strings.Join(bench.HedgeTailFaults, ",")+")")
	f.IntVar(&keys, "keys", 0, "keys to load and read (default 1000)")
	f.Float64Var(&rate, "rate", 0, "reads per second, open loop (default 2000)")
	f.DurationVar(&duration, "duration", 0, "length of each measured run (default 25s; --quick 3s)")
	f.DurationVar(&warmup, "warmup", 0, "unmeasured warm-up before each run (default 3s; --quick 2s; negative: none)")
	f.DurationVar(&pause, "pause", 0, "length of each pause of the leader's store (default 150ms)")
	f.IntVar(&pauses, "pauses", 0, "pauses per run, evenly spaced (default 1)")
	f.StringVar(&budgets, "hedge-budget", "", "comma list: each hedging variant runs once per budget, at most this share of reads over the client's 10s window; 0 is the client's default (5%), 1 no cap (default 0,1)")
	f.DurationVar(&slowDelay, "slow-delay", 0, "slow-leader: delay of the leader's slow reads (default 50ms)")
	f.Float64Var(&slowProb, "slow-prob", 0, "slow-leader: share of the leader's reads that are slow (default 0.2)")
	f.DurationVar(&maxStale, "max-staleness", 0, "staleness bound of stall-stale's session (default 10s)")
	return cmd
}
