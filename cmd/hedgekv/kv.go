package main

import (
	"bufio"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/client"
)

// readFlags are the read-policy flags get and scan share.
type readFlags struct {
	read         string
	hedge        string
	hedgeBudget  float64
	maxStaleness time.Duration
	busy         time.Duration
}

func (f *readFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.read, "read", "leader", "replica to read from: leader, follower, mixed, closest, prefer-leader or round-robin")
	cmd.Flags().StringVar(&f.hedge, "hedge", "off", "backup request to another replica after a delay: off, a duration (10ms), a latency percentile (p99, p999) or min(p99,50ms) / max(p99,5ms)")
	cmd.Flags().Float64Var(&f.hedgeBudget, "hedge-budget", client.DefaultHedgeBudget, "at most this fraction of reads may be hedged, in [0,1]")
	cmd.Flags().DurationVar(&f.maxStaleness, "max-staleness", 0, "permit reads this stale (e.g. 5s); 0 keeps reads linearizable")
	cmd.Flags().DurationVar(&f.busy, "busy-threshold", 0, "a store expecting to take longer than this refuses the read and another replica serves it (e.g. 50ms); 0: never")
}

// policy turns the flags into a client.ReadPolicy.
func (f *readFlags) policy() (client.ReadPolicy, error) {
	replica, err := client.ParseReplicaPolicy(f.read)
	if err != nil {
		return client.ReadPolicy{}, usageError{fmt.Errorf("--read: %w", err)}
	}
	if f.maxStaleness < 0 {
		return client.ReadPolicy{}, usagef("--max-staleness must not be negative, got %v", f.maxStaleness)
	}
	if f.busy < 0 {
		return client.ReadPolicy{}, usagef("--busy-threshold must not be negative, got %v", f.busy)
	}
	h, err := client.ParseHedge(f.hedge)
	if err != nil {
		return client.ReadPolicy{}, usageError{fmt.Errorf("--%w", err)}
	}
	if !(f.hedgeBudget >= 0 && f.hedgeBudget <= 1) {
		return client.ReadPolicy{}, usagef("--hedge-budget must be between 0 and 1, got %v", f.hedgeBudget)
	}
	budget := f.hedgeBudget
	if budget == 0 {
		budget = -1 // the client's way of saying "no budget"; 0 means its default
	}
	return client.ReadPolicy{Replica: replica, MaxStaleness: f.maxStaleness, Hedge: h, HedgeBudget: budget, BusyThreshold: f.busy}, nil
}

func newPutCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "put KEY VALUE",
		Short: "Write KEY=VALUE",
		Args:  exactArgs("KEY", "VALUE"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			cli, ctx, done, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if err := cli.Put(ctx, []byte(args[0]), []byte(args[1])); err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, "OK")
			return nil
		}),
	}
}

func newDeleteCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "delete KEY",
		Short: "Delete KEY (deleting a missing key succeeds)",
		Args:  exactArgs("KEY"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			cli, ctx, done, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if err := cli.Delete(ctx, []byte(args[0])); err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, "OK")
			return nil
		}),
	}
}

func newGetCmd(a *app) *cobra.Command {
	var (
		rf      readFlags
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Print the value of KEY",
		Long: "Print the value of KEY and a newline. A missing key prints \"key not found\" on stderr and exits 1.\n" +
			"-v tells on stderr which store served the read, how (lease, read-index, stale) and whether a hedge won.",
		Args: exactArgs("KEY"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			policy, err := rf.policy()
			if err != nil {
				return err
			}
			cli, ctx, done, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			v, info, err := cli.Session(policy).GetWithInfo(ctx, []byte(args[0]))
			if err != nil && !errors.Is(err, client.ErrNotFound) {
				return err
			}
			if verbose {
				fmt.Fprintln(a.stderr, servedBy(info))
				fmt.Fprintln(a.stderr, hedgeLine(info))
			}
			if errors.Is(err, client.ErrNotFound) {
				fmt.Fprintln(a.stderr, client.ErrNotFound.Error())
				return silentError{exitFailure}
			}
			_, err = fmt.Fprintf(a.stdout, "%s\n", v)
			return err
		}),
	}
	rf.register(cmd)
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "tell on stderr who served the read and how")
	return cmd
}

// servedBy is get -v's line about the read.
func servedBy(info client.ReadInfo) string {
	s := fmt.Sprintf("served by store %d via %s", info.StoreID, info.Mode)
	if info.Mode == "stale" && info.StalenessBound > 0 {
		s += fmt.Sprintf(" (at most %v stale)", info.StalenessBound)
	}
	if info.Attempts > 1 {
		s += fmt.Sprintf(" after %d attempts", info.Attempts)
	}
	return s
}

// hedgeLine is get -v's line about hedging: whether a hedge answered (the
// line before says which store did).
func hedgeLine(info client.ReadInfo) string {
	if info.HedgeWon {
		return "hedge: won"
	}
	return "hedge: no"
}

func newScanCmd(a *app) *cobra.Command {
	var (
		rf    readFlags
		limit int
	)
	cmd := &cobra.Command{
		Use:   "scan START [END]",
		Short: "Print KEY<TAB>VALUE lines for START <= KEY < END in key order",
		Long:  "Print KEY<TAB>VALUE lines for START <= KEY < END in key order. Without END the scan runs to the end of the key space.",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usagef("scan takes START and an optional END, got %d argument(s)", len(args))
			}
			return nil
		},
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if limit < 0 {
				return usagef("--limit must not be negative, got %d", limit)
			}
			policy, err := rf.policy()
			if err != nil {
				return err
			}
			var end []byte
			if len(args) == 2 {
				end = []byte(args[1])
			}
			cli, ctx, done, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			kvs, err := cli.Session(policy).Scan(ctx, []byte(args[0]), end, limit)
			if err != nil {
				return err
			}
			w := bufio.NewWriter(a.stdout)
			for _, kv := range kvs {
				fmt.Fprintf(w, "%s\t%s\n", kv.Key, kv.Value)
			}
			return w.Flush()
		}),
	}
	rf.register(cmd)
	cmd.Flags().IntVar(&limit, "limit", 0, "print at most N pairs; 0 prints all")
	return cmd
}
