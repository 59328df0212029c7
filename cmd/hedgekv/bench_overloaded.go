package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/bench"
)

func newBenchOverloadedCmd() *cobra.Command {
	var (
		variants                string
		clients, keys           int
		slowStore               uint64
		rate, prob              float64
		duration, warmup, delay time.Duration
		sf                      scenarioFlags
	)
	cmd := &cobra.Command{
		Use:   "overloaded-replica [--quick] [--out results] [--clients 16] [--rate 2000] [--slow-store 3 --delay 50ms --prob 1]",
		Short: "ScyllaDB's RandomTwoChoice: p95/p99 with one slow store, round-robin vs power of two choices",
		Long: `Start three stores in this process (loopback, faults allowed), load --keys keys
into one region led by store 1, and read them at --rate reads/s (an open loop)
through --clients independent clients (each its own client.New), once with
round-robin replica choice and once with power of two choices (p2c), while
--slow-store's reads are delayed (delay=D,prob=P, the admin Fault call that
'hedgekv ctl fault' sends). Reports p50, p95, p99, throughput and the share of
reads each store served in OUT/overloaded-replica/{results.json,report.md,*.png}.
--quick runs 4s per variant, in well under a minute.`,
		Args: exactArgs(),
		RunE: benchRunE(func(cmd *cobra.Command, env *benchEnv) error {
			if clients < 0 || keys < 0 || rate < 0 {
				return usagef("--clients, --keys and --rate must not be negative")
			}
			if prob < 0 || prob > 1 {
				return usagef("--prob must be in (0, 1]")
			}
			_, err := bench.RunOverloaded(env.ctx, bench.OverloadedConfig{
				Quick: sf.quick, Variants: splitList(variants), Clients: clients, Keys: keys, Rate: rate,
				SlowStore: slowStore, Delay: delay, Prob: prob, RunDuration: duration, Warmup: warmup,
				OutDir: sf.out, NoPlots: sf.noPlots, Command: commandLine(cmd), Progress: cmd.ErrOrStderr(),
				Logger: wanLogger(cmd), Out: cmd.OutOrStdout(),
			})
			return err
		}),
	}
	f := cmd.Flags()
	sf.register(f, "overloaded-replica", "well under a minute: 4s runs, 1s warm-ups (explicit flags win)")
	variantsFlag(f, &variants, bench.OverloadedVariants, func(v bench.OverloadedVariant) string { return v.Name })
	f.IntVar(&clients, "clients", 0, "independent clients (default 16)")
	f.IntVar(&keys, "keys", 0, "keys to load and read (default 1000)")
	f.Float64Var(&rate, "rate", 0, "reads per second of all clients together, open loop (default 2000)")
	f.Uint64Var(&slowStore, "slow-store", 0, "the store made slow (default 3, a follower)")
	f.DurationVar(&delay, "delay", 0, "delay of the slow store's reads (default 50ms)")
	f.Float64Var(&prob, "prob", 0, "fraction of the slow store's reads delayed (default 1)")
	f.DurationVar(&duration, "duration", 0, "length of each measured run (default 20s; --quick 4s)")
	f.DurationVar(&warmup, "warmup", 0, "unmeasured warm-up before each run, without the fault (default 2s; --quick 1s; negative: none)")
	return cmd
}
