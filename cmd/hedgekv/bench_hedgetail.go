package main

import (
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/bench"
)

func newBenchHedgeTailCmd() *cobra.Command {
	var (
		variants, faults                  string
		keys, pauses                      int
		rate, budget                      float64
		duration, warmup, pause, maxStale time.Duration
		sf                                scenarioFlags
	)
	cmd := &cobra.Command{
		Use:   "hedge-tail [--quick] [--out results] [--rate 2000] [--pause 150ms --pauses 1] [--duration 25s]",
		Short: "Pegasus's backup request: p99.99 and extra requests of hedged reads while the leader pauses now and then",
		Long: `Start three stores in this process (loopback, faults allowed), load --keys keys
into one region led by store 1, and read them at --rate reads/s (an open loop)
from the leader, once per hedging policy (off, 10ms, p99, p999) and fault:

  read-pause   the leader's KV reads are held for --pause (delay=D,prob=1, then
               clear); its raft loop stays live, so a linearizable hedge to a
               follower (ReadIndex) answers
  stall-stale  the leader's whole store stalls for --pause (stall=D); the session
               allows --max-staleness, so a stale hedge to a follower answers

--pauses pauses are spread over each --duration run. Reports p50..p99.99, the
extra-request ratio and hedges won per variant, beside Pegasus's, Bailis's and
Dean's figures, in OUT/hedge-tail/{results.json,report.md,*.png}. --quick runs
3s per variant, in well under a minute.`,
		Args: exactArgs(),
		RunE: benchRunE(func(cmd *cobra.Command, env *benchEnv) error {
			if keys < 0 || pauses < 0 || rate < 0 {
				return usagef("--keys, --pauses and --rate must not be negative")
			}
			if budget < 0 || budget > 1 {
				return usagef("--hedge-budget must be in (0, 1]")
			}
			_, err := bench.RunHedgeTail(env.ctx, bench.HedgeTailConfig{
				Quick: sf.quick, Variants: splitList(variants), Faults: splitList(faults), Keys: keys, Rate: rate,
				RunDuration: duration, Warmup: warmup, PauseLen: pause, Pauses: pauses, HedgeBudget: budget,
				MaxStaleness: maxStale, OutDir: sf.out, NoPlots: sf.noPlots, Command: commandLine(cmd),
				Progress: cmd.ErrOrStderr(), Logger: wanLogger(cmd), Out: cmd.OutOrStdout(),
			})
			return err
		}),
	}
	f := cmd.Flags()
	sf.register(f, "hedge-tail", "well under a minute: 3s runs, 1s warm-ups (explicit flags win)")
	variantsFlag(f, &variants, bench.HedgeTailVariants, func(v bench.HedgeTailVariant) string { return v.Name })
	f.StringVar(&faults, "faults", "", "comma list of faults (default both: "+strings.Join(bench.HedgeTailFaults, ",")+")")
	f.IntVar(&keys, "keys", 0, "keys to load and read (default 1000)")
	f.Float64Var(&rate, "rate", 0, "reads per second, open loop (default 2000)")
	f.DurationVar(&duration, "duration", 0, "length of each measured run (default 25s; --quick 3s)")
	f.DurationVar(&warmup, "warmup", 0, "unmeasured warm-up before each run (default 3s; --quick 1s; negative: none)")
	f.DurationVar(&pause, "pause", 0, "length of each pause of the leader's store (default 150ms)")
	f.IntVar(&pauses, "pauses", 0, "pauses per run, evenly spaced (default 1)")
	f.Float64Var(&budget, "hedge-budget", 0, "HedgeBudget of the hedging sessions, in (0,1] (default 1: no cap)")
	f.DurationVar(&maxStale, "max-staleness", 0, "staleness bound of stall-stale's session (default 10s)")
	return cmd
}
