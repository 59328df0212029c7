package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/bench"
	"github.com/hedgekv/hedgekv/client"
)

// newBenchNodeKillCmd is "hedgekv bench node-kill": Cassandra's rapid read
// protection graph, with three real server processes and a real kill -9.
func newBenchNodeKillCmd() *cobra.Command {
	var (
		bin, variants, hedge, dir             string
		records                               int64
		threads                               int
		warmup, killAfter, afterKill, timeout time.Duration
		maxStale, tick                        time.Duration
		budget                                float64
		sf                                    scenarioFlags
	)
	cmd := &cobra.Command{
		Use:   "node-kill [--quick] [--out results] [--threads 16] [--kill-after 5s --after-kill 10s] [--op-timeout 1s]",
		Short: "Cassandra rapid read protection: reads while the leader's store is killed with kill -9",
		Long: `Start three stores as child processes ('hedgekv server', this binary unless --bin)
on free 127.0.0.1 ports, load --records keys, and for each variant read them
from --threads goroutines for --kill-after plus --after-kill, sending the store
that leads region 1 SIGKILL --kill-after into the run. Reads that fail (an
error, or no answer within --op-timeout) and reads that succeed are counted per
100 ms. After each variant the killed store is restarted on its data and the
cluster left to settle. Variants: no-protection (leader reads), hedge-p99
(hedged, linearizable) and hedge-stale (hedged, with a --max-staleness bound
that lets a hedge or retry read a follower without a leader). Writes
OUT/node-kill/{results.json,report.md,*.png}. Every process started is stopped
at the end, on an error and on ctrl-C too.`,
		Args: exactArgs(),
		RunE: benchRunE(func(cmd *cobra.Command, env *benchEnv) error {
			if env.endpointsSet {
				return usagef("--endpoints does not apply: node-kill starts and kills stores of its own")
			}
			if records < 0 || threads < 0 {
				return usagef("--records and --threads must not be negative")
			}
			h, err := client.ParseHedge(hedge)
			if err != nil {
				return usageError{fmt.Errorf("--hedge: %w", err)}
			}
			if h.Off() {
				return usagef("--hedge off leaves nothing to compare: give a delay or a percentile")
			}
			if bin == "" {
				if bin, err = os.Executable(); err != nil {
					return fmt.Errorf("find this binary (pass --bin): %w", err)
				}
			}
			cfg := bench.NodeKillConfig{
				Binary: bin, Quick: sf.quick, Records: records, Threads: threads, Variants: splitList(variants),
				Warmup: warmup, KillAfter: killAfter, RunAfterKill: afterKill, OpTimeout: timeout,
				MaxStaleness: maxStale, Hedge: h, HedgeBudget: budget, Tick: tick, Dir: dir,
				OutDir: sf.out, NoPlots: sf.noPlots, Command: commandLine(cmd),
				Progress: cmd.ErrOrStderr(), Logger: wanLogger(cmd), Out: cmd.OutOrStdout(),
			}
			_, err = bench.RunNodeKill(env.ctx, cfg)
			return err
		}),
	}
	f := cmd.Flags()
	sf.register(f, "node-kill", "under a minute: 1000 keys, 8 threads, 1s warm-up, the kill 2s into a 5s run (explicit flags win)")
	f.StringVar(&bin, "bin", "", "hedgekv binary to run the stores with (default: this one)")
	f.Int64Var(&records, "records", 0, "keys to load (default 10000; --quick 1000)")
	f.IntVar(&threads, "threads", 0, "reader goroutines, one read each at a time (default 16; --quick 8)")
	variantsFlag(f, &variants, bench.NodeKillVariants, func(v bench.NodeKillVariant) string { return v.Name })
	f.DurationVar(&warmup, "warmup", 0, "unmeasured reads before each run (default 2s; --quick 1s; negative: none)")
	f.DurationVar(&killAfter, "kill-after", 0, "kill the leader's store this long into each run (default 5s; --quick 2s)")
	f.DurationVar(&afterKill, "after-kill", 0, "keep reading this long after the kill (default 10s; --quick 3s)")
	f.DurationVar(&timeout, "op-timeout", time.Second, "a read not answered within this fails")
	f.DurationVar(&maxStale, "max-staleness", 5*time.Second, "staleness bound of hedge-stale")
	f.StringVar(&hedge, "hedge", "p99", "hedge policy of the hedged variants: p99, p999, 10ms, min(p99,50ms), ...")
	f.Float64Var(&budget, "hedge-budget", 0, "hedges at most this fraction of reads (0: the client's default, 0.05)")
	f.DurationVar(&tick, "tick", 0, "the stores' raft tick (default 50ms; the election timeout is 10 ticks)")
	f.StringVar(&dir, "dir", "", "directory for the stores' data and logs, kept (default: a temporary one, removed)")
	return cmd
}
