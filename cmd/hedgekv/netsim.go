package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/netsim"
)

const defaultUpstream = "1=127.0.0.1:20161,2=127.0.0.1:20162,3=127.0.0.1:20163"

// netsimFlags are the netsim command's flags.
type netsimFlags struct {
	topology      string
	upstream      string
	portBase      int
	control       string
	partitionMode string
}

func newNetsimCmd(a *app) *cobra.Command {
	var f netsimFlags
	cmd := &cobra.Command{
		Use:   "netsim --topology FILE|default [--upstream 1=ADDR,2=ADDR,3=ADDR] [--port-base 21000] [--control ADDR]",
		Short: "Run the simulated WAN between zones (toxiproxy) until SIGINT or SIGTERM",
		Long: `Run the simulated WAN in the foreground: a proxy for every (zone → store)
link of the topology, with its latency, jitter and bandwidth, on
127.0.0.1:PORT_BASE+100*ZONE_INDEX+STORE_ID (zones counted from 1 in the
topology's order; dc-b reaches store 1 on 21201 by default). A process in
zone Z reaches store S through Z's proxy to S. The format of a topology file
and what a partition means are in docs/topology.md.

It serves a control API on --control ("" for none), which the subcommands
use:
  hedgekv netsim partition N [--mode blackhole|disconnect]
  hedgekv netsim heal
  hedgekv netsim status [--json]`,
		Args: netsimArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context(), a)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.topology, "topology", "", `topology file, or "default" (dc-a, dc-b, dc-c; 14 ms one way; 300 Mbit/s)`)
	fl.StringVar(&f.upstream, "upstream", defaultUpstream, "each store's own listen address, as ID=ADDR, comma-separated")
	fl.IntVar(&f.portBase, "port-base", netsim.DefaultPortBase, "zone i's proxy to store s listens on PORT_BASE+100*i+s")
	fl.StringVar(&f.partitionMode, "partition-mode", string(netsim.Blackhole), "what a partition does by default: blackhole (hold every byte) or disconnect (close and refuse connections)")
	cmd.PersistentFlags().StringVar(&f.control, "control", netsim.DefaultControlAddr, "address of the control API")
	cmd.AddCommand(newNetsimPartitionCmd(a, &f), newNetsimHealCmd(a, &f), newNetsimStatusCmd(a, &f))
	return cmd
}

// netsimArgs: the netsim command itself takes no argument; a word that is
// not a subcommand gets a message that lists them.
func netsimArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown netsim command %q (partition, heal or status; none to run the proxies)", args[0])
	}
	return nil
}

func (f *netsimFlags) run(ctx context.Context, a *app) error {
	if strings.TrimSpace(f.topology) == "" {
		return usagef(`--topology is required: a topology file or "default"`)
	}
	upstream, err := parseUpstream(f.upstream)
	if err != nil {
		return err
	}
	if f.portBase < 0 || f.portBase > 65535 {
		return usagef("--port-base %d is not a port", f.portBase)
	}
	mode, err := netsim.ParsePartitionMode(f.partitionMode)
	if err != nil {
		return usagef("--partition-mode: %v", err)
	}
	topo, err := netsim.Load(f.topology)
	if err != nil {
		return err
	}
	n, err := netsim.Start(topo, upstream, netsim.Options{PortBase: f.portBase, PartitionMode: mode})
	if err != nil {
		return err
	}
	defer n.Close()
	control := ""
	if f.control != "" {
		if control, err = n.Serve(f.control); err != nil {
			return err
		}
	}
	st := n.Status()
	fmt.Fprintf(a.stdout, "netsim: %d zones, %d stores, %d links; a partition is a %s\n",
		len(topo.Zones), len(topo.Stores()), len(st.Links), mode)
	for _, l := range st.Links {
		fmt.Fprintf(a.stdout, "%s → store %d: %s (%s)\n", l.Zone, l.Store, l.Address, l.Spec)
	}
	if control != "" {
		fmt.Fprintf(a.stdout, "control: %s\n", control)
	}
	<-ctx.Done()
	if err := n.Close(); err != nil {
		return err
	}
	return nil
}

// parseUpstream parses "1=ADDR,2=ADDR,...".
func parseUpstream(s string) (map[uint64]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, usagef("--upstream is empty (1=ADDR,2=ADDR,3=ADDR)")
	}
	up := make(map[uint64]string)
	for _, item := range strings.Split(s, ",") {
		idStr, addr, ok := strings.Cut(strings.TrimSpace(item), "=")
		addr = strings.TrimSpace(addr)
		if !ok || addr == "" {
			return nil, usagef("--upstream: %q is not ID=ADDR", item)
		}
		id, err := strconv.ParseUint(strings.TrimSpace(idStr), 10, 64)
		if err != nil || id == 0 {
			return nil, usagef("--upstream: store id %q must be a positive integer", idStr)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, usagef("--upstream: store %d: %q is not HOST:PORT", id, addr)
		}
		if _, dup := up[id]; dup {
			return nil, usagef("--upstream: store %d listed twice", id)
		}
		up[id] = addr
	}
	return up, nil
}

// client is the control API client of a running netsim; its context is
// bounded by --timeout.
func (f *netsimFlags) client(ctx context.Context, a *app) (netsim.Control, context.Context, context.CancelFunc, error) {
	if f.control == "" {
		return netsim.Control{}, nil, nil, usagef("--control is empty")
	}
	if a.timeout <= 0 {
		return netsim.Control{}, nil, nil, usagef("--timeout must be positive, got %v", a.timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	return netsim.Control{Addr: f.control}, ctx, cancel, nil
}

func newNetsimPartitionCmd(a *app, f *netsimFlags) *cobra.Command {
	var mode string
	cmd := &cobra.Command{
		Use:   "partition STORE_ID [--mode blackhole|disconnect]",
		Short: "Cut a store off from the other stores and from clients of other zones",
		Args:  exactArgs("STORE_ID"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			store, err := parseID("STORE_ID", args[0])
			if err != nil {
				return err
			}
			var m netsim.PartitionMode
			if mode != "" {
				if m, err = netsim.ParsePartitionMode(mode); err != nil {
					return usagef("--mode: %v", err)
				}
			}
			ctl, ctx, cancel, err := f.client(cmd.Context(), a)
			if err != nil {
				return err
			}
			defer cancel()
			if err := ctl.PartitionWith(ctx, store, m); err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, "OK")
			return nil
		}),
	}
	cmd.Flags().StringVar(&mode, "mode", "", "blackhole or disconnect (default: the netsim's --partition-mode)")
	return cmd
}

func newNetsimHealCmd(a *app, f *netsimFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "heal",
		Short: "End every partition",
		Args:  exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			ctl, ctx, cancel, err := f.client(cmd.Context(), a)
			if err != nil {
				return err
			}
			defer cancel()
			if err := ctl.Heal(ctx); err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, "OK")
			return nil
		}),
	}
}

func newNetsimStatusCmd(a *app, f *netsimFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [--json]",
		Short: "Show the links, the partitions and the bytes that crossed zones",
		Args:  exactArgs(),
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			ctl, ctx, cancel, err := f.client(cmd.Context(), a)
			if err != nil {
				return err
			}
			defer cancel()
			st, err := ctl.Status(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, st)
			}
			return writeNetsimStatus(a.stdout, st)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	return cmd
}

func writeNetsimStatus(w io.Writer, st *netsim.Status) error {
	parts := "none"
	if len(st.Partitioned) > 0 {
		ids := make([]string, len(st.Partitioned))
		for i, s := range st.Partitioned {
			ids[i] = strconv.FormatUint(s, 10)
		}
		parts = "stores " + strings.Join(ids, ", ")
	}
	fmt.Fprintf(w, "partitioned: %s (default mode %s)\n", parts, st.PartitionMode)
	fmt.Fprintf(w, "WAN bytes: %d\n", st.WANBytes)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ZONE\tSTORE\tADDRESS\tUPSTREAM\tLINK\tCUT\tBYTES")
	for _, l := range st.Links {
		cut := "-"
		if l.Cut != "" {
			cut = string(l.Cut)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\n", l.Zone, l.Store, l.Address, l.Upstream, l.Spec, cut, l.Bytes)
	}
	return tw.Flush()
}
