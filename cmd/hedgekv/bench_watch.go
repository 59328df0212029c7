package main

import (
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/bench"
)

// newBenchWatchCmd is "hedgekv bench watch": many etcd watchers on one
// store while a writer changes their keys at a fixed rate.
func newBenchWatchCmd() *cobra.Command {
	var (
		watchers, status     string
		clients, streams     int
		inFlight, watchStore int
		rate                 float64
		duration, drain      time.Duration
		quick                bool
		out                  string
	)
	cmd := &cobra.Command{
		Use:   "watch [--quick] [--watchers 10000] [--rate 1000] [--duration 10s] [--endpoints A,B,C --status-addrs S1,S2,S3]",
		Short: "etcd watch fan-out: N watchers on one store, a writer at R writes/s; delivery, latency, server CPU and RSS",
		Long: `Start three stores in this process (or use a running cluster: --endpoints, with
--status-addrs for the stores' CPU and RSS), create --watchers etcd watchers on
one store over clientv3 (--clients gRPC connections, --streams watch streams
each), half on a key each, a quarter on a 10-key prefix and a quarter on 10 hot
keys, then put --rate writes/s of those keys for --duration. Reports events
expected vs delivered (every acknowledged write to every watcher of its key,
once, in revision order), the delivery latency from a write's acknowledgement
to the event's arrival (p50/p99/max), and the watched store's CPU and peak RSS.
--watchers takes a list (1000,10000): one run each. Writes
OUT/watch/{results.json,report.md}; fails if an event is missing or duplicated.`,
		Args: exactArgs(),
		RunE: benchRunE(func(cmd *cobra.Command, env *benchEnv) error {
			if clients < 0 || streams < 0 || inFlight < 0 || rate < 0 {
				return usagef("--clients, --streams, --in-flight and --rate must not be negative")
			}
			var ns []int
			for _, s := range splitList(watchers) {
				n, err := strconv.Atoi(s)
				if err != nil || n <= 0 {
					return usagef("--watchers wants positive counts, got %q", s)
				}
				ns = append(ns, n)
			}
			cfg := bench.WatchConfig{
				Quick: quick, Watchers: ns, Clients: clients, Streams: streams, Rate: rate, Duration: duration,
				InFlight: inFlight, Drain: drain, StatusAddrs: splitList(status), WatchStore: watchStore,
				OutDir: out, Command: commandLine(cmd), Progress: cmd.ErrOrStderr(), Logger: wanLogger(cmd), Out: cmd.OutOrStdout(),
			}
			if env.endpointsSet {
				cfg.Endpoints = env.endpoints
			} else if len(cfg.StatusAddrs) > 0 {
				return usagef("--status-addrs applies with --endpoints only")
			}
			_, err := bench.RunWatch(env.ctx, cfg)
			return err
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&quick, "quick", false, "1,000 watchers, 3s of writes (explicit flags win)")
	f.StringVar(&out, "out", "results", "results directory (writes OUT/watch/)")
	f.StringVar(&watchers, "watchers", "", "watcher counts, one run each (default 10000)")
	f.IntVar(&clients, "clients", 0, "clientv3 clients (gRPC connections) the watchers use (default 50)")
	f.IntVar(&streams, "streams", 0, "watch streams per client (default 4)")
	f.Float64Var(&rate, "rate", 0, "writes per second (default 1000)")
	f.DurationVar(&duration, "duration", 0, "how long the writer writes (default 10s; --quick 3s)")
	f.IntVar(&inFlight, "in-flight", 0, "writes outstanding at most (default 128)")
	f.DurationVar(&drain, "drain", 0, "wait after the last write for the events still due (default 30s)")
	f.StringVar(&status, "status-addrs", "", "the running cluster's status addresses, in --endpoints order (CPU and RSS from /metrics)")
	f.IntVar(&watchStore, "watch-store", 0, "index in --endpoints of the store the watchers call")
	return cmd
}
