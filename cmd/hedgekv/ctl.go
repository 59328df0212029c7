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
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/region"
)

func newCtlCmd(a *app) *cobra.Command {
	ctl := &cobra.Command{
		Use:   "ctl",
		Short: "Inspect and operate the cluster",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	ctl.AddCommand(newCtlStoresCmd(a), newCtlRegionsCmd(a), newCtlRegionCmd(a), newCtlStatusCmd(a), newCtlTransferLeaderCmd(a),
		newCtlSplitCmd(a), newCtlAddPeerCmd(a), newCtlRemovePeerCmd(a), newCtlRemoveStoreCmd(a), newCtlFaultCmd(a), newCtlCheckCmd(a))
	return ctl
}

// viewAgeHelp says how fresh the stores' up/down and counts are.
const viewAgeHelp = `Up or down and the leader and region counts are the asked store's cluster
view: gathered afresh when that store has seen a region's leadership change,
a down store reconnect or its address book change since, else reused for at
most a second (so a store killed a moment ago may still show up).`

func newCtlStoresCmd(a *app) *cobra.Command {
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "stores",
		Short: "List the stores: address, zone, up or down, leader and region counts, removal",
		Long:  "List the stores: address, zone, up or down, leader and region counts, removal.\n\n" + viewAgeHelp,
		Args:  exactArgs(),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				stores, err := cli.Stores(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return writeStoresJSON(a.stdout, stores)
				}
				return writeStoresTable(a.stdout, stores)
			})
		}),
	}
	out.register(cmd)
	return cmd
}

// regionsFlags are the flags ctl regions and ctl region share.
type regionsFlags struct {
	out  outputFlag
	size bool
}

func (f *regionsFlags) register(cmd *cobra.Command) {
	f.out.register(cmd)
	cmd.Flags().BoolVar(&f.size, "size", false, "count SIZE and KEYS exactly now, by each region's leader (reads the whole region: slow on big ones), instead of the leader's last count")
}

// print writes regions as --json or as the table; the table marks the
// replicas on stores that are down, so it needs the stores too.
func (f *regionsFlags) print(ctx context.Context, a *app, cli *client.Client, regions []client.RegionInfo, one bool) error {
	asJSON, err := f.out.json()
	if err != nil {
		return err
	}
	if asJSON {
		if one {
			return writeJSON(a.stdout, regionsJSON(regions)[0])
		}
		return writeRegionsJSON(a.stdout, regions)
	}
	stores, err := cli.Stores(ctx)
	if err != nil {
		return fmt.Errorf("list stores (to mark down replicas): %w", err)
	}
	var sizes map[uint64]regionSize
	if f.size {
		sizes = regionSizes(ctx, cli, regions)
	}
	return writeRegionsTable(a.stdout, regions, stores, sizes)
}

func newCtlRegionsCmd(a *app) *cobra.Command {
	var f regionsFlags
	cmd := &cobra.Command{
		Use:   "regions",
		Short: "List the regions in key order: range, epoch, leader, replicas, size, keys",
		Long: `List the regions in key order: key range, epoch, leader, replicas (learners
and replicas on down stores marked), the leader's raft term and applied
index, and the region's size (bytes of keys and values) and key count as
its leader last counted them (every --split-check-interval, 10s by
default; "-" until it has); --size counts them exactly now instead. Keys are shown in the
escaped form of docs/design.md (the key itself when it is printable UTF-8
without a backslash, else \\ and \xHH escapes) in the table; -w json
gives them as JSON strings (start_key_base64/end_key_base64 for keys that
are not UTF-8). A leader or replica on a store that is down is marked
(down).

` + viewAgeHelp,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if _, err := f.out.json(); err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				regions, err := cli.Regions(ctx)
				if err != nil {
					return err
				}
				return f.print(ctx, a, cli, regions, false)
			})
		}),
	}
	f.register(cmd)
	return cmd
}

func newCtlRegionCmd(a *app) *cobra.Command {
	var f regionsFlags
	cmd := &cobra.Command{
		Use:   "region KEY",
		Short: "Show the region holding KEY",
		Long:  "Show the region holding KEY as ctl regions shows regions (--json: one object of the ctl regions --json array).",
		Args:  exactArgs("KEY"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			key := []byte(args[0])
			if _, err := f.out.json(); err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				regions, err := cli.Regions(ctx)
				if err != nil {
					return err
				}
				i := slices.IndexFunc(regions, func(r client.RegionInfo) bool { return r.Region.Contains(key) })
				if i < 0 {
					// The stores that answered host no region holding it:
					// the one that does is on stores that did not answer.
					return fmt.Errorf("no store that answered hosts the region holding key %s", region.FormatKey(key))
				}
				return f.print(ctx, a, cli, regions[i:i+1], true)
			})
		}),
	}
	f.register(cmd)
	return cmd
}

func newCtlStatusCmd(a *app) *cobra.Command {
	var (
		replicas int
		out      outputFlag
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Say whether every region has a leader and a full replica set on up stores (exit 1 if not)",
		Long: `Say whether the cluster is healthy: every store up, and every region with
a leader on an up store and --replicas voters, all on up stores (a store
removed with ctl remove-store no longer counts). Each
problem is one line on stdout; a cluster that is not healthy exits 1.
-w json prints {"healthy", "stores", "stores_down", "regions",
"regions_bad", "problems"} instead (exit 1 all the same when not healthy).

` + viewAgeHelp,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if replicas < 1 {
				return usagef("--replicas must be at least 1, got %d", replicas)
			}
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				stores, err := cli.Stores(ctx)
				if err != nil {
					return err
				}
				regions, err := cli.Regions(ctx)
				if err != nil {
					return err
				}
				rep := clusterHealth(stores, regions, replicas)
				if asJSON {
					if err := writeJSON(a.stdout, statusJSON{
						Healthy: len(rep.problems) == 0, Stores: rep.stores, StoresDown: rep.downStores,
						Regions: len(regions), RegionsBad: rep.badRegions, Problems: append([]string{}, rep.problems...),
					}); err != nil {
						return err
					}
					if len(rep.problems) > 0 {
						return silentError{exitNotFound}
					}
					return nil
				}
				for _, p := range rep.problems {
					fmt.Fprintln(a.stdout, p)
				}
				if len(rep.problems) == 0 {
					fmt.Fprintf(a.stdout, "OK: %s up; %s, each with a leader and %d voters on up stores\n",
						plural(rep.stores, "store", "stores"), plural(len(regions), "region", "regions"), replicas)
					return nil
				}
				fmt.Fprintf(a.stderr, "hedgekv: not healthy: %d of %s down, %d of %s without a leader or a full replica set\n",
					rep.downStores, plural(rep.stores, "store", "stores"), rep.badRegions, plural(len(regions), "region", "regions"))
				return silentError{exitNotFound}
			})
		}),
	}
	cmd.Flags().IntVar(&replicas, "replicas", 3, "voters each region should have")
	out.register(cmd)
	return cmd
}

// statusJSON is ctl status -w json.
type statusJSON struct {
	Healthy    bool     `json:"healthy"`
	Stores     int      `json:"stores"`
	StoresDown int      `json:"stores_down"`
	Regions    int      `json:"regions"`
	RegionsBad int      `json:"regions_bad"`
	Problems   []string `json:"problems"`
}

// plural is "1 region", "3 regions".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// healthReport is what ctl status found.
type healthReport struct {
	problems   []string
	stores     int // the stores that count: all but those removed
	downStores int
	badRegions int
}

// clusterHealth checks the stores and regions against ctl status's
// definition of healthy; each problem is one line naming the store or
// region.
func clusterHealth(stores []client.StoreInfo, regions []client.RegionInfo, replicas int) healthReport {
	var rep healthReport
	up := make(map[uint64]bool, len(stores))
	for _, s := range stores {
		up[s.ID] = s.Up
		if s.Removed {
			// Gone for good (ctl remove-store): down is what it should be.
			continue
		}
		rep.stores++
		if !s.Up {
			rep.downStores++
			rep.problems = append(rep.problems, fmt.Sprintf("store %d (%s, zone %s): down", s.ID, s.Address, orDash(s.Zone)))
		}
	}
	for _, info := range regions {
		r := info.Region
		var why []string
		switch {
		case info.LeaderStoreID == 0:
			why = append(why, "no leader")
		case !up[info.LeaderStoreID]:
			// The merge keeps the last leader anyone reported; a leader on a
			// store that is down leads nothing.
			why = append(why, fmt.Sprintf("no leader (the last one known, on store %d, is down)", info.LeaderStoreID))
		}
		voters := info.Voters()
		if len(voters) != replicas {
			why = append(why, fmt.Sprintf("%d voters, want %d", len(voters), replicas))
		}
		for _, p := range voters {
			if !up[p.StoreID] {
				why = append(why, fmt.Sprintf("voter %d on store %d, which is down", p.ID, p.StoreID))
			}
		}
		for _, p := range r.Peers {
			if p.IsLearner {
				why = append(why, fmt.Sprintf("learner %d on store %d still catching up", p.ID, p.StoreID))
			}
		}
		if len(why) == 0 || (len(voters) == replicas && onlyLearners(why)) {
			// A learner beside a full, healthy voter set is a move under
			// way, not a missing replica.
			continue
		}
		rep.badRegions++
		rep.problems = append(rep.problems, fmt.Sprintf("region %d [%s, %s): %s", r.ID,
			keyBound(r.StartKey, "-inf"), keyBound(r.EndKey, "+inf"), strings.Join(why, "; ")))
	}
	return rep
}

func onlyLearners(why []string) bool {
	for _, w := range why {
		if !strings.HasPrefix(w, "learner ") {
			return false
		}
	}
	return true
}

func newCtlTransferLeaderCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "transfer-leader REGION_ID STORE_ID",
		Short: "Move a region's leadership to its peer on STORE_ID",
		Long: `Move a region's leadership to its peer on STORE_ID and wait until it has
moved (within --timeout).

Refused at once (exit 1, the cause on stderr) when STORE_ID does not exist,
holds no voter of the region, is being removed, or is down: a leader can
only be handed to a live voter.`,
		Args: exactArgs("REGION_ID", "STORE_ID"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			regionID, err := parseID("REGION_ID", args[0])
			if err != nil {
				return err
			}
			storeID, err := parseID("STORE_ID", args[1])
			if err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				if err := cli.TransferLeader(ctx, regionID, storeID); err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, "OK")
				return nil
			})
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
			if err := checkKey(key); err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				left, right, err := cli.Split(ctx, []byte(key))
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "left:  %s\n", describeRegion(left))
				fmt.Fprintf(a.stdout, "right: %s\n", describeRegion(right))
				return nil
			})
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
		func(ctx context.Context, cli *client.Client, r region.Region, storeID uint64) (string, error) {
			if p, ok := r.PeerOnStore(storeID); ok && !p.IsLearner {
				// The balancer (or an earlier add) got there first; say so
				// rather than print an OK that claims a change.
				return fmt.Sprintf("already there: region %d has a voter (peer %d) on store %d; nothing changed", r.ID, p.ID, storeID), nil
			}
			if err := cli.AddPeer(ctx, r.ID, storeID); err != nil {
				return "", err
			}
			return fmt.Sprintf("OK: region %d has a voter on store %d", r.ID, storeID), nil
		})
}

func newCtlRemovePeerCmd(a *app) *cobra.Command {
	return newCtlMembershipCmd(a, "remove-peer", "Remove the replica of region REGION_ID on store STORE_ID",
		func(ctx context.Context, cli *client.Client, r region.Region, storeID uint64) (string, error) {
			if _, ok := r.PeerOnStore(storeID); !ok {
				return "", fmt.Errorf("region %d has no replica on store %d (its replicas: %s)", r.ID, storeID, storesOf(r))
			}
			if err := cli.RemovePeer(ctx, r.ID, storeID); err != nil {
				return "", err
			}
			return fmt.Sprintf("OK: region %d has no replica on store %d any more", r.ID, storeID), nil
		})
}

func newCtlRemoveStoreCmd(a *app) *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:   "remove-store STORE_ID",
		Short: "Remove a store from the cluster: its replicas and leaderships move to the other stores",
		Long: `Remove a store from the cluster. Every store records it as being removed,
and the stores' balancers move its replicas and leaderships to the other
stores (a replica is added elsewhere before the store's is removed) and put
none on it; ctl stores shows it "removing", then "removed" once no region
has a replica on it: it may then be stopped and its data deleted. Its id is
not reused: a store that joins later needs another --id.

Refused when fewer stores than a full replica set (server --max-replicas,
3 by default) would be left up. With --wait the command waits (within
--timeout) until the store is removed, printing how many replicas are
left.`,
		Args: exactArgs("STORE_ID"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			storeID, err := parseID("STORE_ID", args[0])
			if err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				already, err := cli.RemoveStore(ctx, storeID)
				if err != nil {
					return err
				}
				if already {
					fmt.Fprintf(a.stdout, "store %d was already being removed\n", storeID)
				} else {
					fmt.Fprintf(a.stdout, "OK: store %d is being removed; its replicas move to the other stores\n", storeID)
				}
				if !wait {
					fmt.Fprintf(a.stdout, "ctl stores shows it removed when none is left (or run this with --wait)\n")
					return nil
				}
				return waitStoreRemoved(ctx, a.stdout, cli, storeID)
			})
		}),
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait (within --timeout) until no region has a replica on the store")
	return cmd
}

// waitStoreRemoved polls the regions until none has a replica on storeID
// and the stores report it removed, saying how many are left whenever
// that changes.
func waitStoreRemoved(ctx context.Context, out io.Writer, cli *client.Client, storeID uint64) error {
	last := -1
	for {
		regions, err := cli.Regions(ctx)
		if err == nil {
			left := 0
			for _, r := range regions {
				if _, ok := r.Region.PeerOnStore(storeID); ok {
					left++
				}
			}
			if left != last {
				fmt.Fprintf(out, "store %d: replicas left: %d\n", storeID, left)
				last = left
			}
			if left == 0 {
				stores, err := cli.Stores(ctx)
				if err == nil {
					if i := slices.IndexFunc(stores, func(s client.StoreInfo) bool { return s.ID == storeID }); i >= 0 && stores[i].Removed {
						fmt.Fprintf(out, "OK: store %d is removed: it may be stopped and its data deleted\n", storeID)
						return nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("store %d not removed yet (replicas left: %d when --timeout ran out): %w", storeID, last, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// storesOf lists the stores a region's replicas are on: "stores 1, 2, 3".
func storesOf(r region.Region) string {
	ids := make([]string, 0, len(r.Peers))
	for _, p := range r.Peers {
		ids = append(ids, strconv.FormatUint(p.StoreID, 10))
	}
	if len(ids) == 0 {
		return "none"
	}
	return "stores " + strings.Join(ids, ", ")
}

// newCtlMembershipCmd builds `ctl NAME REGION_ID STORE_ID`. It first looks
// the store and the region up, so that a store that does not exist, or a
// change with nothing to do, is said rather than answered with a bare OK,
// then runs do, which returns the line to print.
func newCtlMembershipCmd(a *app, name, short string, do func(ctx context.Context, cli *client.Client, r region.Region, storeID uint64) (string, error)) *cobra.Command {
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
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				stores, err := cli.Stores(ctx)
				if err != nil {
					return err
				}
				if !slices.ContainsFunc(stores, func(s client.StoreInfo) bool { return s.ID == storeID }) {
					return fmt.Errorf("%s: store %d does not exist (ctl stores lists them)", name, storeID)
				}
				regions, err := cli.Regions(ctx)
				if err != nil {
					return err
				}
				i := slices.IndexFunc(regions, func(r client.RegionInfo) bool { return r.Region.ID == regionID })
				if i < 0 {
					return fmt.Errorf("%s: region %d does not exist on any store that answered (ctl regions lists them)", name, regionID)
				}
				line, err := do(ctx, cli, regions[i].Region, storeID)
				if err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, line)
				return nil
			})
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
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				if err := cli.Fault(ctx, storeID, f); err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, "OK")
				return nil
			})
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
	// Removing and Removed (ctl remove-store) appear only when set.
	Removing bool `json:"removing,omitempty"`
	Removed  bool `json:"removed,omitempty"`
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

// regionJSON: a boundary that is UTF-8 is a JSON string under start_key
// or end_key ("" for the open end); one that is not is base64 under
// start_key_base64 or end_key_base64 instead (jsonBytes, as get/scan -w
// json do).
type regionJSON struct {
	ID             uint64     `json:"id"`
	StartKey       *string    `json:"start_key,omitempty"`
	StartKeyBase64 *string    `json:"start_key_base64,omitempty"`
	EndKey         *string    `json:"end_key,omitempty"`
	EndKeyBase64   *string    `json:"end_key_base64,omitempty"`
	Epoch          epochJSON  `json:"epoch"`
	Peers          []peerJSON `json:"peers"`
	LeaderStoreID  uint64     `json:"leader_store_id"`
	// ApproximateKeys and ApproximateSize (bytes of keys and values), as
	// the leader last counted them, appear only when it has.
	ApproximateKeys *uint64 `json:"approximate_keys,omitempty"`
	ApproximateSize *uint64 `json:"approximate_size,omitempty"`
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

func writeStoresJSON(w io.Writer, stores []client.StoreInfo) error {
	out := make([]storeJSON, 0, len(stores))
	for _, s := range stores {
		out = append(out, storeJSON{
			ID: s.ID, Address: s.Address, Zone: s.Zone, Up: s.Up,
			LeaderCount: s.LeaderCount, RegionCount: s.RegionCount,
			ZoneAddresses: s.ZoneAddresses,
			Removing:      s.Removing, Removed: s.Removed,
		})
	}
	return writeJSON(w, out)
}

// regionsJSON is the contract's shape; a key that is not UTF-8 goes in
// base64 (encoding/json would turn its bytes into U+FFFD, making different
// keys print the same).
func regionsJSON(regions []client.RegionInfo) []regionJSON {
	out := make([]regionJSON, 0, len(regions))
	for _, info := range regions {
		r := info.Region
		rj := regionJSON{
			ID:            r.ID,
			Epoch:         epochJSON{ConfVer: r.Epoch.ConfVer, Version: r.Epoch.Version},
			Peers:         make([]peerJSON, 0, len(r.Peers)),
			LeaderStoreID: info.LeaderStoreID,
		}
		rj.StartKey, rj.StartKeyBase64 = jsonBytes(r.StartKey)
		rj.EndKey, rj.EndKeyBase64 = jsonBytes(r.EndKey)
		for _, p := range r.Peers {
			rj.Peers = append(rj.Peers, peerJSON{ID: p.ID, StoreID: p.StoreID, IsLearner: p.IsLearner})
		}
		if info.SizeKnown {
			keys, size := info.ApproximateKeys, info.ApproximateBytes
			rj.ApproximateKeys, rj.ApproximateSize = &keys, &size
		}
		out = append(out, rj)
	}
	return out
}

func writeRegionsJSON(w io.Writer, regions []client.RegionInfo) error {
	return writeJSON(w, regionsJSON(regions))
}

// writeStoresTable prints the stores; a ZONE ADDRESSES column (each
// store's ZONE=ADDRESS list, see --advertise-zone-addrs) is added when any
// store advertises zone addresses.
func writeStoresTable(w io.Writer, stores []client.StoreInfo) error {
	zoned := slices.ContainsFunc(stores, func(s client.StoreInfo) bool { return len(s.ZoneAddresses) > 0 })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "ID\tADDRESS\tZONE\tUP\tLEADERS\tREGIONS"
	if zoned {
		header += "\tZONE ADDRESSES"
	}
	fmt.Fprintln(tw, header)
	for _, s := range stores {
		up := "down"
		if s.Up {
			up = "up"
		}
		// A store on its way out says so beside up/down: "up, removing",
		// "down, removed".
		switch {
		case s.Removed:
			up += ", removed"
		case s.Removing:
			up += ", removing"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d", s.ID, s.Address, orDash(s.Zone), up, s.LeaderCount, s.RegionCount)
		if zoned {
			fmt.Fprintf(tw, "\t%s", orDash(zoneAddrsString(s.ZoneAddresses)))
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

// regionSize is a region's size as its leader counted it (RegionDigest);
// err is set when it could not be had.
type regionSize struct {
	bytes, keys uint64
	err         error
}

// regionSizes asks each region's leader (or, without one, its first
// replica) for its key count and size, in parallel. Counting reads the
// whole region, hence ctl regions --size is opt-in: the table shows the
// leaders' last counts otherwise.
func regionSizes(ctx context.Context, cli *client.Client, regions []client.RegionInfo) map[uint64]regionSize {
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = make(map[uint64]regionSize, len(regions))
	)
	for _, info := range regions {
		store := info.LeaderStoreID
		if store == 0 && len(info.Region.Peers) > 0 {
			store = info.Region.Peers[0].StoreID
		}
		wg.Go(func() {
			var rs regionSize
			d, err := cli.RegionDigest(ctx, store, info.Region.ID)
			if err != nil {
				rs.err = err
			} else {
				rs.bytes, rs.keys = d.GetBytes(), d.GetKeys()
			}
			mu.Lock()
			out[info.Region.ID] = rs
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// writeRegionsTable prints the regions, one a line: key range, epoch,
// leader, replicas (learners and those on down stores marked), the
// leader's term and applied index, SIZE and KEYS: counted now when sizes
// is given (ctl regions --size; "?" where the leader did not answer), else
// the leader's last count ("-" until it has counted).
func writeRegionsTable(w io.Writer, regions []client.RegionInfo, stores []client.StoreInfo, sizes map[uint64]regionSize) error {
	down := map[uint64]bool{}
	for _, s := range stores {
		down[s.ID] = !s.Up
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTART\tEND\tEPOCH\tLEADER\tREPLICAS (peer@store)\tTERM\tAPPLIED\tSIZE\tKEYS")
	for _, info := range regions {
		r := info.Region
		peers := make([]string, 0, len(r.Peers))
		for _, p := range r.Peers {
			ps := peerString(p.ID, p.StoreID, p.IsLearner)
			if down[p.StoreID] {
				ps += "(down)"
			}
			peers = append(peers, ps)
		}
		leader := "-"
		if id := info.LeaderStoreID; id != 0 {
			leader = "store " + strconv.FormatUint(id, 10)
			if down[id] {
				// The last leader anyone reported, on a store that is down
				// (an idle region elects no other until it is used).
				leader += "(down)"
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d/%d\t%s\t%s\t%d\t%d", r.ID, keyBound(r.StartKey, "-inf"), keyBound(r.EndKey, "+inf"),
			r.Epoch.ConfVer, r.Epoch.Version, leader, orDash(strings.Join(peers, ",")), info.Term, info.AppliedIndex)
		switch sz, ok := sizes[r.ID]; {
		case sizes != nil && ok && sz.err == nil:
			fmt.Fprintf(tw, "\t%s\t%d", humanBytes(sz.bytes), sz.keys)
		case sizes != nil:
			fmt.Fprint(tw, "\t?\t?")
		case info.SizeKnown:
			fmt.Fprintf(tw, "\t%s\t%d", humanBytes(info.ApproximateBytes), info.ApproximateKeys)
		default:
			fmt.Fprint(tw, "\t-\t-")
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// humanBytes renders a size as 512B, 3.2KiB, 64.0MiB.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// keyBound shows a region boundary in region.FormatKey's escaped form;
// the empty key is the open end.
func keyBound(key []byte, open string) string {
	if len(key) == 0 {
		return open
	}
	return region.FormatKey(key)
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
