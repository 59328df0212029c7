package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/bench"
)

func newBenchEtcdWANCmd() *cobra.Command {
	var (
		variants, topology, leaderZone, bin, etcdBin, out string
		threads, writes                                   int
		quick                                             bool
		duration, warmup, interval                        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "etcd-wan [--quick] [--topology FILE|default] [--etcd PATH] [--variants ...]",
		Short: "The etcd API across the simulated WAN: Range latency from every zone and watch delivery, hedgekv beside etcd",
		Long: `Put a real etcd (--etcd, else etcd on PATH) and hedgekv's etcd v3 API behind the
same simulated WAN (--topology, default 'default': dc-a, dc-b, dc-c, 14 ms one
way), each as one server process per zone (hedgekv: 'hedgekv server', this
binary unless --bin), one system at a time, every leader in --leader-zone, and
measure through clientv3 clients whose only endpoint is their zone's server:

  Range     one Get at a time (--threads callers) from every zone: etcd
            linearizable and serializable; hedgekv in its default read mode
            (leader), in read mode follower with follower leases off
            (ReadIndex) and on (--follower-leases: the target, p50 <= 2 ms
            from a remote zone)
  watch     a watcher per zone, --writes puts from the leader's zone; each
            event's arrival minus the put's acknowledgement, per zone, against
            the zone's one-way delay plus 5 ms

Writes OUT/etcd-wan/{results.json,report.md}. The full run takes about five
minutes; --quick about one.`,
		Args: exactArgs(),
		RunE: benchRunE(func(cmd *cobra.Command, env *benchEnv) error {
			if env.endpointsSet {
				return usagef("--endpoints does not apply: etcd-wan starts both systems behind the WAN itself")
			}
			if threads < 0 || writes < 0 {
				return usagef("--threads and --writes must not be negative")
			}
			if bin == "" {
				var err error
				if bin, err = os.Executable(); err != nil {
					return fmt.Errorf("find this binary (pass --bin): %w", err)
				}
			}
			cfg := bench.EtcdWANConfig{
				Quick: quick, Binary: bin, EtcdBinary: etcdBin, Variants: splitList(variants), LeaderZone: leaderZone,
				Threads: threads, RunDuration: duration, Warmup: warmup, Writes: writes, WriteInterval: interval,
				OutDir: out, Command: commandLine(cmd), Progress: cmd.ErrOrStderr(), Logger: wanLogger(cmd), Out: cmd.OutOrStdout(),
			}
			var err error
			if cfg.Topology, cfg.TopologyName, err = loadTopology(topology); err != nil {
				return err
			}
			_, err = bench.RunEtcdWAN(env.ctx, cfg)
			return err
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&quick, "quick", false, "about a minute: 1s Range runs after 300ms warm-ups, 30 watched writes (explicit flags win)")
	f.StringVar(&out, "out", "results", "results directory (writes OUT/etcd-wan/)")
	variantsFlag(f, &variants, bench.EtcdWANVariants, func(v bench.EtcdWANVariant) string { return v.Name })
	f.StringVar(&topology, "topology", "default", "the simulated WAN: a topology file (docs/topology.md) or 'default'")
	f.StringVar(&leaderZone, "leader-zone", "", "zone of both systems' leaders and of the writer (default: the first zone)")
	f.StringVar(&bin, "bin", "", "hedgekv binary to run the stores with (default: this one)")
	f.StringVar(&etcdBin, "etcd", "", "etcd binary (default: etcd on PATH)")
	f.IntVar(&threads, "threads", 0, "Range callers per run, one Get at a time each (default 1)")
	f.DurationVar(&duration, "duration", 0, "length of each Range run (default 10s; --quick 1s)")
	f.DurationVar(&warmup, "warmup", 0, "unmeasured Ranges before each run (default 1s; --quick 300ms; negative: none)")
	f.IntVar(&writes, "writes", 0, "measured puts of each watch run (default 300; --quick 30)")
	f.DurationVar(&interval, "write-interval", 0, "a put starts this often, or when the previous is acknowledged if later (default 50ms)")
	return cmd
}
