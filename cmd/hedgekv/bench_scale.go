package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/bench"
)

// newBenchScaleCmd is "hedgekv bench scale": what a real data set does to
// a store, with three real server processes.
func newBenchScaleCmd() *cobra.Command {
	var (
		bin, dir                              string
		records                               int64
		threads, valueSize, moveThreads       int
		moveRate                              float64
		interval, stall, moveTimeout, restart time.Duration
		splitCheck, balance, opTimeout        time.Duration
		splitBytes                            uint64
		baseline                              int64
		compareFor, mergeWait                 time.Duration
		deleteAll                             bool
		sf                                    scenarioFlags
	)
	cmd := &cobra.Command{
		Use:   "scale [--quick] [--records 2000000] [--threads 64] [--value-size 1000] [--interval 10s] [--out results]",
		Short: "Load millions of records into three server processes: throughput, tail latency, splits, stalls, a join and a removal, a restart, memory and disk",
		Long: `Start three stores as child processes ('hedgekv server', this binary unless --bin)
on free 127.0.0.1 ports, and load --records records of --value-size bytes
(go-ycsb's default record: 10 fields) from --threads threads through the
hedgekv go-ycsb binding, with a progress line (records/s, % done, ETA).
Reports throughput, p99, p99.9 and max per --interval, the regions before
and after (splits), every operation slower than --stall (the slowest with
their times) and every failed operation. Then, under a light load (YCSB A,
--move-threads at --move-rate ops/s), joins a fourth store and removes
store 1 (what 'ctl remove-store --wait' does): time, MB/s and foreground
p99. Then stops a store holding every region and starts it again: time to
/readyz. Memory per store (RssAnon and RssFile from /proc/PID/status) and
store.db bytes per logical byte throughout. Writes
OUT/scale/{results.json,report.md,details.json,*.png}. The default load is
about 2 GB per store and takes a long time; --quick (20,000 records, small
regions) runs in about a minute. Every process started is stopped at the
end, on an error and on ctrl-C too.

With --baseline N, a cluster of its own holding N records runs first
(loaded with the same threads, then YCSB A and 100% scans, each for
--compare-for), and the same workloads run on the loaded cluster after its
load: the report and the last lines set inserts/s, updates/s, reads/s and
scans/s side by side with their ratios (targets: writes 0.85x, reads and
scans 0.9x of the baseline's).

With --delete-all, last, every record is deleted and the scenario waits up
to --merge-wait for the region count to fall back to its count before the
load plus one, then compares every region's replicas again; the servers run
with merges on (regions of at most 20 MiB, or a third of the split size,
and 200,000 keys: TiKV's defaults).`,
		Args: exactArgs(),
		RunE: benchRunE(func(cmd *cobra.Command, env *benchEnv) error {
			if env.endpointsSet {
				return usagef("--endpoints does not apply: scale starts stores of its own")
			}
			if records < 0 || threads < 0 || valueSize < 0 || moveThreads < 0 || moveRate < 0 || baseline < 0 || compareFor < 0 || mergeWait < 0 {
				return usagef("--records, --threads, --value-size, --move-threads, --move-rate, --baseline, --compare-for and --merge-wait must not be negative")
			}
			if bin == "" {
				var err error
				if bin, err = os.Executable(); err != nil {
					return fmt.Errorf("find this binary (pass --bin): %w", err)
				}
			}
			_, err := bench.RunScale(env.ctx, bench.ScaleConfig{
				Binary: bin, Quick: sf.quick, Records: records, Threads: threads, ValueSize: valueSize,
				Interval: interval, StallThreshold: stall, MoveThreads: moveThreads, MoveRate: moveRate,
				MoveTimeout: moveTimeout, RestartTimeout: restart, SplitMaxBytes: splitBytes,
				SplitCheckInterval: splitCheck, BalanceInterval: balance, OpTimeout: opTimeout, Dir: dir,
				Baseline: baseline, CompareFor: compareFor, DeleteAll: deleteAll, MergeWait: mergeWait,
				OutDir: sf.out, NoPlots: sf.noPlots, Command: commandLine(cmd), Progress: cmd.ErrOrStderr(),
				Logger: wanLogger(cmd), Out: cmd.OutOrStdout(),
			})
			return err
		}),
	}
	f := cmd.Flags()
	sf.register(f, "scale", "about a minute: 20,000 records, 16 threads, 2s intervals, regions split at 4 MiB, balancing every 1s (explicit flags win)")
	f.StringVar(&bin, "bin", "", "hedgekv binary to run the stores with (default: this one)")
	f.StringVar(&dir, "dir", "", "directory for the stores' data and logs (default: a temporary one, removed at the end)")
	f.Int64Var(&records, "records", 0, "records to load (default 2000000; --quick 20000)")
	f.IntVar(&threads, "threads", 0, "load threads (default 64; --quick 16)")
	f.IntVar(&valueSize, "value-size", 0, "bytes per record, in 10 fields (default 1000)")
	f.DurationVar(&interval, "interval", 0, "length of the intervals reported (default 10s; --quick 2s)")
	f.DurationVar(&stall, "stall", 0, "an operation slower than this is a stall (default 100ms)")
	f.IntVar(&moveThreads, "move-threads", 0, "threads of the light load during the join and removal (default 4; --quick 2)")
	f.Float64Var(&moveRate, "move-rate", 0, "ops/s of that load, all threads together (default 200; --quick 100)")
	f.DurationVar(&moveTimeout, "move-timeout", 0, "bound on the join and the removal (default 30m; --quick 2m)")
	f.DurationVar(&restart, "restart-timeout", 0, "bound on the restart until /readyz (default 10m; --quick 1m)")
	f.Uint64Var(&splitBytes, "split-max-bytes", 0, "the servers' --split-max-bytes (default: theirs, 64 MiB; --quick 4 MiB)")
	f.DurationVar(&splitCheck, "split-check-interval", 0, "the servers' --split-check-interval (default: theirs, 10s; --quick 1s)")
	f.DurationVar(&balance, "balance-interval", 0, "the servers' --balance-interval (default: theirs, 5s; --quick 1s)")
	f.DurationVar(&opTimeout, "op-timeout", 0, "the client's timeout per operation (default 10s)")
	f.Int64Var(&baseline, "baseline", 0, "first measure a cluster holding this many records, and print the loaded one's rates beside it (e.g. 20000; 0: none)")
	f.DurationVar(&compareFor, "compare-for", 0, "how long each compared workload runs (default 1m; --quick 10s)")
	f.BoolVar(&deleteAll, "delete-all", false, "at the end, delete every record and wait for the regions to merge back (the servers merge regions under 20 MiB and 200,000 keys)")
	f.DurationVar(&mergeWait, "merge-wait", 0, "with --delete-all, how long to wait for the merges after the last delete (default 10m; --quick 1m)")
	return cmd
}
