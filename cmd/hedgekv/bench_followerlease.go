package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/bench"
)

func newBenchFollowerLeaseCmd() *cobra.Command {
	var (
		variants, topology     string
		records                int64
		threads, writers, keys int
		noWAN                  bool
		duration, warmup, step time.Duration
		sf                     scenarioFlags
	)
	cmd := &cobra.Command{
		Use:   "follower-lease [--quick] [--out results] [--threads 32] [--writers 16] [--topology FILE|default] [--no-wan]",
		Short: "Follower read leases: follower vs leader lease reads (YCSB C), write latency with leases on and off, a dead lease holder",
		Long: `Start three stores in this process with follower read leases on (the servers'
--follower-leases) and again with them off, region 1's leader on store 1, and
measure, each pair side by side in one run:

  leader-lease, follower-lease   YCSB workload C (--records, --threads) read from
                                 the leader's lease and from the followers' leases
  writes-leases-off, -on         puts from --writers goroutines, one machine and
                                 across the simulated WAN (--topology; --no-wan skips)
  writes-dead-holder             a follower holding a lease dies a third of the way
                                 into the put run (its server stopped; on the WAN a
                                 blackhole partition): the longest stall, at most one
                                 lease (~360 ms with the default timing)
  writes-dead-follower           the same with leases off (the control)
  writes-new-leader(-off)        the leadership moves to store 2 a third of the way
                                 in: with leases on the new leader holds its first
                                 commit back for one lease plus drift and a tick

Writes OUT/follower-lease/{results.json,report.md,*.png}. --quick runs 2 s per
run on 1,000 records in under a minute; the full run takes about three.`,
		Args: exactArgs(),
		RunE: benchRunE(func(cmd *cobra.Command, env *benchEnv) error {
			if records < 0 || threads < 0 || writers < 0 || keys < 0 {
				return usagef("--records, --threads, --writers and --keys must not be negative")
			}
			cfg := bench.FollowerLeaseConfig{
				Quick: sf.quick, Variants: splitList(variants), Records: records, Threads: threads,
				WriteThreads: writers, WriteKeys: keys, RunDuration: duration, Warmup: warmup, Step: step,
				NoWAN: noWAN, OutDir: sf.out, NoPlots: sf.noPlots, Command: commandLine(cmd),
				Progress: cmd.ErrOrStderr(), Logger: wanLogger(cmd), Out: cmd.OutOrStdout(),
			}
			if topology != "" {
				if noWAN {
					return usagef("--topology and --no-wan contradict each other")
				}
				var err error
				if cfg.Topology, cfg.TopologyName, err = loadTopology(topology); err != nil {
					return err
				}
			}
			_, err := bench.RunFollowerLease(env.ctx, cfg)
			return err
		}),
	}
	f := cmd.Flags()
	sf.register(f, "follower-lease", "under a minute: 1000 records, 2s runs, 300ms warm-ups (explicit flags win)")
	variantsFlag(f, &variants, bench.FollowerLeaseVariants, func(v bench.FollowerLeaseVariant) string { return v.Name })
	f.Int64Var(&records, "records", 0, "workload C records (default 10000; --quick 1000)")
	f.IntVar(&threads, "threads", 0, "workload C client threads (default 32)")
	f.IntVar(&writers, "writers", 0, "put goroutines of the write rows, one put at a time each (default 16)")
	f.IntVar(&keys, "keys", 0, "keys the write rows put to (default 1000)")
	f.StringVar(&topology, "topology", "", "the WAN of the write rows: a topology file (docs/topology.md) or 'default' (the default)")
	f.BoolVar(&noWAN, "no-wan", false, "skip the write rows across the simulated WAN")
	f.DurationVar(&duration, "duration", 0, "length of each measured run (default 10s; --quick 2s)")
	f.DurationVar(&warmup, "warmup", 0, "unmeasured warm-up before each run (default 1s; --quick 300ms; negative: none)")
	f.DurationVar(&step, "step", 0, "timeline step of the kill rows (default 50ms)")
	return cmd
}
