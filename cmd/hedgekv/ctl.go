package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/server/pb"
)

func newCtlCmd(a *app) *cobra.Command {
	ctl := &cobra.Command{
		Use:   "ctl",
		Short: "Inspect and operate the cluster",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	ctl.AddCommand(newCtlStoresCmd(a), newCtlRegionsCmd(a), newCtlTransferLeaderCmd(a),
		newCtlSplitCmd(a), newCtlAddPeerCmd(a), newCtlRemovePeerCmd(a), newCtlFaultCmd(a), newCtlCheckCmd(a))
	return ctl
}

func newCtlStoresCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stores",
		Short: "List the stores",
		Args:  exactArgs(),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			cli, ctx, done, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			stores, err := cli.Stores(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return writeStoresJSON(a.stdout, stores)
			}
			return writeStoresTable(a.stdout, stores)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func newCtlRegionsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "regions",
		Short: "List the regions in key order, with their leaders",
		Args:  exactArgs(),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			cli, ctx, done, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			regions, err := cli.Regions(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return writeRegionsJSON(a.stdout, regions)
			}
			return writeRegionsTable(a.stdout, regions)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func newCtlTransferLeaderCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "transfer-leader REGION_ID STORE_ID",
		Short: "Move a region's leadership to its peer on STORE_ID",
		Args:  exactArgs("REGION_ID", "STORE_ID"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			regionID, err := parseID("REGION_ID", args[0])
			if err != nil {
				return err
			}
			storeID, err := parseID("STORE_ID", args[1])
			if err != nil {
				return err
			}
			cli, ctx, done, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if err := cli.TransferLeader(ctx, regionID, storeID); err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, "OK")
			return nil
		}),
	}
}

func newCtlSplitCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "split KEY",
		Short: "Split the region holding KEY at KEY",
		Args:  exactArgs("KEY"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if key == "" {
				return usagef("KEY must not be empty")
			}
			cli, ctx, done, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			left, right, err := cli.Split(ctx, []byte(key))
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "left:  %s\n", describeRegion(left))
			fmt.Fprintf(a.stdout, "right: %s\n", describeRegion(right))
			return nil
		}),
	}
}

// describeRegion renders a region on one line for ctl split:
// `region 1 [-inf, "m") epoch 1/2 peers 1@1,2@2,3@3`.
func describeRegion(r region.Region) string {
	peers := make([]string, 0, len(r.Peers))
	for _, p := range r.Peers {
		peers = append(peers, peerString(p.ID, p.StoreID, p.IsLearner))
	}
	return fmt.Sprintf("region %d [%s, %s) epoch %d/%d peers %s", r.ID, keyBound(r.StartKey, "-inf"), keyBound(r.EndKey, "+inf"),
		r.Epoch.ConfVer, r.Epoch.Version, orDash(strings.Join(peers, ",")))
}

func newCtlAddPeerCmd(a *app) *cobra.Command {
	return newCtlMembershipCmd(a, "add-peer", "Add a replica of region REGION_ID on store STORE_ID (learner, caught up, then voter)",
		func(ctx context.Context, cli *client.Client, regionID, storeID uint64) error {
			return cli.AddPeer(ctx, regionID, storeID)
		})
}

func newCtlRemovePeerCmd(a *app) *cobra.Command {
	return newCtlMembershipCmd(a, "remove-peer", "Remove the replica of region REGION_ID on store STORE_ID",
		func(ctx context.Context, cli *client.Client, regionID, storeID uint64) error {
			return cli.RemovePeer(ctx, regionID, storeID)
		})
}

// newCtlMembershipCmd builds `ctl NAME REGION_ID STORE_ID`, which prints OK.
func newCtlMembershipCmd(a *app, name, short string, do func(ctx context.Context, cli *client.Client, regionID, storeID uint64) error) *cobra.Command {
	return &cobra.Command{
		Use:   name + " REGION_ID STORE_ID",
		Short: short,
		Args:  exactArgs("REGION_ID", "STORE_ID"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			regionID, err := parseID("REGION_ID", args[0])
			if err != nil {
				return err
			}
			storeID, err := parseID("STORE_ID", args[1])
			if err != nil {
				return err
			}
			cli, ctx, done, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if err := do(ctx, cli, regionID, storeID); err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, "OK")
			return nil
		}),
	}
}

func newCtlFaultCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "fault STORE_ID (delay=D[,prob=P] | stall=D | clear)",
		Short: "Inject a fault into a store started with --allow-faults",
		Long: `Inject a fault into a store started with --allow-faults.

delay=D,prob=P delays that fraction of the store's reads by D (prob
defaults to 1); stall=D makes the whole store stop answering (reads,
writes, admin calls, raft) for D, as a GC pause does; clear ends both.
Parts can be combined, e.g. clear,delay=50ms,prob=0.1. Faults live in the
store's process only: a restart clears them.`,
		Args: exactArgs("STORE_ID", "SPEC"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			storeID, err := parseID("STORE_ID", args[0])
			if err != nil {
				return err
			}
			f, err := parseFault(args[1])
			if err != nil {
				return err
			}
			cli, ctx, done, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if err := cli.Fault(ctx, storeID, f); err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, "OK")
			return nil
		}),
	}
}

// parseFault parses ctl fault's SPEC: comma-separated delay=D, prob=P,
// stall=D and clear. Anything malformed is a usage error.
func parseFault(spec string) (client.Fault, error) {
	var (
		f       client.Fault
		hasProb bool
	)
	if strings.TrimSpace(spec) == "" {
		return f, usagef("fault SPEC is empty: want delay=D[,prob=P], stall=D or clear")
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		key, val, hasVal := strings.Cut(part, "=")
		if seen[key] {
			return f, usagef("fault: %q given twice", key)
		}
		seen[key] = true
		switch key {
		case "clear":
			if hasVal {
				return f, usagef("fault: clear takes no value, got %q", part)
			}
			f.Clear = true
		case "delay", "stall":
			d, err := time.ParseDuration(val)
			if !hasVal || err != nil || d <= 0 {
				return f, usagef("fault: %s wants a positive duration such as 200ms, got %q", key, val)
			}
			if key == "delay" {
				f.Delay = d
			} else {
				f.Stall = d
			}
		case "prob":
			p, err := strconv.ParseFloat(val, 64)
			if !hasVal || err != nil || math.IsNaN(p) || p <= 0 || p > 1 {
				return f, usagef("fault: prob wants a number in (0, 1], got %q", val)
			}
			f.Prob, hasProb = p, true
		default:
			return f, usagef("fault: unknown part %q: want delay=D, prob=P, stall=D or clear", part)
		}
	}
	if hasProb && f.Delay == 0 {
		return f, usagef("fault: prob needs a delay")
	}
	if f.Delay > 0 && !hasProb {
		f.Prob = 1
	}
	return f, nil
}

// parseID parses a positive id argument; anything else is a usage error.
func parseID(name, s string) (uint64, error) {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v == 0 {
		return 0, usagef("%s must be a positive integer, got %q", name, s)
	}
	return v, nil
}

// ---- output formats (a fixed contract: scripts parse them) ----------------------

type storeJSON struct {
	ID          uint64 `json:"id"`
	Address     string `json:"address"`
	Zone        string `json:"zone"`
	Up          bool   `json:"up"`
	LeaderCount uint64 `json:"leader_count"`
	RegionCount uint64 `json:"region_count"`
	// ZoneAddresses (zone -> address, from --advertise-zone-addrs) is
	// added to the contract's fields only for stores that advertise any.
	ZoneAddresses map[string]string `json:"zone_addresses,omitempty"`
}

type epochJSON struct {
	ConfVer uint64 `json:"conf_ver"`
	Version uint64 `json:"version"`
}

type peerJSON struct {
	ID      uint64 `json:"id"`
	StoreID uint64 `json:"store_id"`
	// IsLearner appears only for learners, so voters keep the contract's
	// {"id","store_id"} shape.
	IsLearner bool `json:"is_learner,omitempty"`
}

type regionJSON struct {
	ID            uint64     `json:"id"`
	StartKey      string     `json:"start_key"`
	EndKey        string     `json:"end_key"`
	Epoch         epochJSON  `json:"epoch"`
	Peers         []peerJSON `json:"peers"`
	LeaderStoreID uint64     `json:"leader_store_id"`
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

func writeStoresJSON(w io.Writer, stores []*pb.Store) error {
	out := make([]storeJSON, 0, len(stores))
	for _, s := range stores {
		out = append(out, storeJSON{
			ID: s.GetId(), Address: s.GetAddress(), Zone: s.GetZone(), Up: s.GetUp(),
			LeaderCount: s.GetLeaderCount(), RegionCount: s.GetRegionCount(),
			ZoneAddresses: s.GetZoneAddresses(),
		})
	}
	return writeJSON(w, out)
}

func regionsJSON(regions []*pb.RegionInfo) []regionJSON {
	out := make([]regionJSON, 0, len(regions))
	for _, info := range regions {
		r := info.GetRegion()
		rj := regionJSON{
			ID:            r.GetId(),
			StartKey:      string(r.GetStartKey()),
			EndKey:        string(r.GetEndKey()),
			Epoch:         epochJSON{ConfVer: r.GetEpoch().GetConfVer(), Version: r.GetEpoch().GetVersion()},
			Peers:         make([]peerJSON, 0, len(r.GetPeers())),
			LeaderStoreID: info.GetLeaderStoreId(),
		}
		for _, p := range r.GetPeers() {
			rj.Peers = append(rj.Peers, peerJSON{ID: p.GetId(), StoreID: p.GetStoreId(), IsLearner: p.GetIsLearner()})
		}
		out = append(out, rj)
	}
	return out
}

func writeRegionsJSON(w io.Writer, regions []*pb.RegionInfo) error {
	return writeJSON(w, regionsJSON(regions))
}

// writeStoresTable prints the stores; a ZONE ADDRESSES column (each
// store's ZONE=ADDRESS list, see --advertise-zone-addrs) is added when any
// store advertises zone addresses.
func writeStoresTable(w io.Writer, stores []*pb.Store) error {
	zoned := slices.ContainsFunc(stores, func(s *pb.Store) bool { return len(s.GetZoneAddresses()) > 0 })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if zoned {
		fmt.Fprintln(tw, "ID\tADDRESS\tZONE\tUP\tLEADERS\tREGIONS\tZONE ADDRESSES")
	} else {
		fmt.Fprintln(tw, "ID\tADDRESS\tZONE\tUP\tLEADERS\tREGIONS")
	}
	for _, s := range stores {
		up := "down"
		if s.GetUp() {
			up = "up"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d", s.GetId(), s.GetAddress(), orDash(s.GetZone()), up, s.GetLeaderCount(), s.GetRegionCount())
		if zoned {
			fmt.Fprintf(tw, "\t%s", orDash(zoneAddrsString(s.GetZoneAddresses())))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// zoneAddrsString renders zone addresses as ZONE=ADDRESS,... in zone
// order, the way --advertise-zone-addrs takes them.
func zoneAddrsString(za map[string]string) string {
	parts := make([]string, 0, len(za))
	for _, z := range slices.Sorted(maps.Keys(za)) {
		parts = append(parts, z+"="+za[z])
	}
	return strings.Join(parts, ",")
}

func writeRegionsTable(w io.Writer, regions []*pb.RegionInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTART\tEND\tEPOCH\tPEERS (id@store)\tLEADER")
	for _, info := range regions {
		r := info.GetRegion()
		start, end := keyBound(r.GetStartKey(), "-inf"), keyBound(r.GetEndKey(), "+inf")
		peers := make([]string, 0, len(r.GetPeers()))
		for _, p := range r.GetPeers() {
			peers = append(peers, peerString(p.GetId(), p.GetStoreId(), p.GetIsLearner()))
		}
		leader := "-"
		if id := info.GetLeaderStoreId(); id != 0 {
			leader = "store " + strconv.FormatUint(id, 10)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d/%d\t%s\t%s\n", r.GetId(), start, end,
			r.GetEpoch().GetConfVer(), r.GetEpoch().GetVersion(), strings.Join(peers, ","), leader)
	}
	return tw.Flush()
}

// keyBound quotes a region boundary; the empty key is the open end.
func keyBound(key []byte, open string) string {
	if len(key) == 0 {
		return open
	}
	return strconv.Quote(string(key))
}

// peerString is `id@store`, with a "(learner)" mark for learners.
func peerString(id, storeID uint64, learner bool) string {
	s := fmt.Sprintf("%d@%d", id, storeID)
	if learner {
		s += "(learner)"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
