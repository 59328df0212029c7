package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/bench"
)

// newBenchRegionsCmd is "hedgekv bench regions": what many idle regions
// cost a store, with three real server processes.
func newBenchRegionsCmd() *cobra.Command {
	var (
		bin, dir, counts          string
		conc, loadRegions, thread int
		idleWait, window, loadDur time.Duration
		load                      bool
		out                       string
	)
	cmd := &cobra.Command{
		Use:   "regions [--count 10000] [--window 30s] [--load] [--out results]",
		Short: "Many idle regions per store: CPU, RSS, open files, goroutines, a restart's start-up and time to ready; writes to 100 of them",
		Long: `Start three stores as child processes ('hedgekv server', this binary unless --bin)
on free 127.0.0.1 ports, split region 1 into --count regions (bisecting, up
to --split-concurrency splits at once, each region replicated on every
store), wait until the stores report them hibernating (--idle-wait at most),
then measure each store's CPU over --window (/proc/PID/stat, % of one core),
RSS, open files (/proc/PID/fd) and goroutines (/metrics). Then stop store 1
(SIGTERM) and start it again: seconds until it serves (/healthz: its store
is open) and until /readyz. With --load, also write to --load-regions of
the regions for --load-duration from --load-threads threads, and first do
all of this with --load-regions regions in all: the ratio of the two write
rates. --count takes a list (1000,10000): one fresh cluster each. Writes
OUT/regions/{results.json,report.md,details.json}.`,
		Args: exactArgs(),
		RunE: benchRunE(func(cmd *cobra.Command, env *benchEnv) error {
			if env.endpointsSet {
				return usagef("--endpoints does not apply: regions starts stores of its own")
			}
			if conc < 0 || loadRegions < 0 || thread < 0 {
				return usagef("--split-concurrency, --load-regions and --load-threads must not be negative")
			}
			var ns []int
			for _, s := range splitList(counts) {
				n, err := strconv.Atoi(s)
				if err != nil || n <= 0 {
					return usagef("--count wants positive counts, got %q", s)
				}
				ns = append(ns, n)
			}
			if bin == "" {
				var err error
				if bin, err = os.Executable(); err != nil {
					return fmt.Errorf("find this binary (pass --bin): %w", err)
				}
			}
			_, err := bench.RunRegions(env.ctx, bench.RegionsConfig{
				Binary: bin, Counts: ns, SplitConcurrency: conc, IdleWait: idleWait, Window: window,
				Load: load, LoadRegions: loadRegions, LoadDuration: loadDur, LoadThreads: thread, Dir: dir,
				OutDir: out, Command: commandLine(cmd), Progress: cmd.ErrOrStderr(), Logger: wanLogger(cmd), Out: cmd.OutOrStdout(),
			})
			return err
		}),
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "results", "results directory (writes OUT/regions/)")
	f.StringVar(&bin, "bin", "", "hedgekv binary to run the stores with (default: this one)")
	f.StringVar(&dir, "dir", "", "directory for the stores' data and logs (default: a temporary one per count, removed at the end)")
	f.StringVar(&counts, "count", "", "region counts, one cluster each (default 10000)")
	f.IntVar(&conc, "split-concurrency", 0, "splits in flight at once (default 64)")
	f.DurationVar(&idleWait, "idle-wait", 0, "longest wait for the regions to hibernate (default 2m)")
	f.DurationVar(&window, "window", 0, "how long the idle CPU is measured (default 30s)")
	f.BoolVar(&load, "load", false, "write to --load-regions regions, and to a cluster of that many regions first as the baseline")
	f.IntVar(&loadRegions, "load-regions", 0, "regions written to (default 100)")
	f.DurationVar(&loadDur, "load-duration", 0, "how long each write phase lasts (default 20s)")
	f.IntVar(&thread, "load-threads", 0, "writer threads (default 32)")
	return cmd
}
