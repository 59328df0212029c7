package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
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
		newCtlSplitCmd(a), newCtlMergeCmd(a), newCtlAddPeerCmd(a), newCtlRemovePeerCmd(a), newCtlRemoveStoreCmd(a), newCtlFaultCmd(a), newCtlCheckCmd(a))
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
				stores, err := cli.StoresFresh(ctx)
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

// print writes regions as --json or as the table, the same facts either
// way: both mark the replicas (and leaders) on stores that are down, so
// they need the stores too.
func (f *regionsFlags) print(ctx context.Context, a *app, cli *client.Client, regions []client.RegionInfo, one bool) error {
	asJSON, err := f.out.json()
	if err != nil {
		return err
	}
	stores, err := cli.StoresFresh(ctx)
	if err != nil && !asJSON {
		return fmt.Errorf("list stores (to mark down replicas): %w", err)
	}
	// The JSON goes without down marks rather than not at all: scripts
	// (cluster.sh's wait for leaders) read it while stores come and go,
	// as they did before it carried the marks.
	var sizes map[uint64]regionSize
	if f.size {
		sizes = regionSizes(ctx, cli, regions)
	}
	if asJSON {
		rj := regionsJSON(regions, downStores(stores), sizes)
		if one {
			return writeJSON(a.stdout, rj[0])
		}
		return writeJSON(a.stdout, rj)
	}
	return writeRegionsTable(a.stdout, regions, stores, sizes)
}

func newCtlRegionsCmd(a *app) *cobra.Command {
	var f regionsFlags
	var limit int
	var startKey string
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
(down). --limit N lists a page of at most N regions from the one holding
--start-key (each store reads only its page: for clusters of thousands of
regions) and, if more follow, says on stderr where the next page starts.

` + viewAgeHelp,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if _, err := f.out.json(); err != nil {
				return err
			}
			if limit < 0 {
				return usagef("--limit must not be negative")
			}
			if limit == 0 && startKey != "" {
				return usagef("--start-key applies with --limit only")
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				if limit == 0 {
					regions, err := cli.Regions(ctx)
					if err != nil {
						return err
					}
					return f.print(ctx, a, cli, regions, false)
				}
				regions, next, err := cli.RegionsPage(ctx, []byte(startKey), limit)
				if err != nil {
					return err
				}
				if err := f.print(ctx, a, cli, regions, false); err != nil {
					return err
				}
				if next != nil {
					fmt.Fprintf(a.stderr, "more regions: the next page starts at --start-key %s\n", region.FormatKey(next))
				}
				return nil
			})
		}),
	}
	f.register(cmd)
	cmd.Flags().IntVar(&limit, "limit", 0, "list at most this many regions, a page from --start-key (0: every region)")
	cmd.Flags().StringVar(&startKey, "start-key", "", "with --limit: the page starts at the region holding this key")
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
				// A page of one: the stores read the region holding key alone.
				regions, _, err := cli.RegionsPage(ctx, key, 1)
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
				stores, err := cli.StoresFresh(ctx)
				if err != nil {
					return err
				}
				regions, err := cli.Regions(ctx)
				if err != nil {
					return err
				}
				if !cmd.Flags().Changed("replicas") {
					// A cluster of fewer stores than the default (server
					// --dev's one) cannot hold three voters per region.
					replicas = min(replicas, max(countKept(stores), 1))
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
	cmd.Flags().IntVar(&replicas, "replicas", 3, "voters each region should have (by default at most one per store not removed)")
	out.register(cmd)
	return cmd
}

// countKept counts the stores not removed (ctl remove-store).
func countKept(stores []client.StoreInfo) int {
	n := 0
	for _, s := range stores {
		if !s.Removed {
			n++
		}
	}
	return n
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

Refused at once (exit 4, the cause on stderr) when STORE_ID does not exist,
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
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "split KEY",
		Short: "Split the region holding KEY at KEY",
		Long: `Split the region holding KEY at KEY and print the two halves: "left:" the
region that keeps its id and now ends at KEY, "right:" the new region from
KEY on. -w json prints {"left": R, "right": R} instead, each R as the
region part of a ctl regions -w json entry (id, start_key, end_key, epoch,
peers).`,
		Args: exactArgs("KEY"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if err := checkKey(key); err != nil {
				return err
			}
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				left, right, err := cli.Split(ctx, []byte(key))
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(a.stdout, splitJSON{Left: newRegionCoreJSON(left, nil), Right: newRegionCoreJSON(right, nil)})
				}
				fmt.Fprintf(a.stdout, "left:  %s\n", describeRegion(left))
				fmt.Fprintf(a.stdout, "right: %s\n", describeRegion(right))
				return nil
			})
		}),
	}
	out.register(cmd)
	return cmd
}

func newCtlMergeCmd(a *app) *cobra.Command {
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "merge REGION_ID",
		Short: "Merge region REGION_ID with its right neighbour",
		Long: `Merge region REGION_ID with the region after it: REGION_ID absorbs its right
neighbour, keeps its id and now spans both ranges; the neighbour is gone.
The two must have replicas on the same stores (move replicas first with
add-peer and remove-peer; a refusal says which stores differ). Prints
"merged: R"; -w json prints {"merged": R}, R as the region part of a ctl
regions -w json entry (id, start_key, end_key, epoch, peers). A merge
that cannot finish is rolled back, and the neighbour serves again.`,
		Args: exactArgs("REGION_ID"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			id, err := parseID("REGION_ID", args[0])
			if err != nil {
				return err
			}
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				merged, err := cli.Merge(ctx, id)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(a.stdout, mergeJSON{Merged: newRegionCoreJSON(merged, nil)})
				}
				fmt.Fprintf(a.stdout, "merged: %s\n", describeRegion(merged))
				return nil
			})
		}),
	}
	out.register(cmd)
	return cmd
}

// mergeJSON is ctl merge -w json.
type mergeJSON struct {
	Merged regionCoreJSON `json:"merged"`
}

// splitJSON is ctl split -w json.
type splitJSON struct {
	Left  regionCoreJSON `json:"left"`
	Right regionCoreJSON `json:"right"`
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
				stores, err := cli.StoresFresh(ctx)
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
				stores, err := cli.StoresFresh(ctx)
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
