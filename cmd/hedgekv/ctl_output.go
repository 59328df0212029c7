package main

// What hedgekv ctl prints: the JSON and the tables of stores and regions,
// a fixed contract: scripts parse them.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/region"
)

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
	// {"id","store_id"} shape; Down (the table's "(down)") only for
	// replicas on a store that is down.
	IsLearner bool `json:"is_learner,omitempty"`
	Down      bool `json:"down,omitempty"`
}

// regionCoreJSON is a region's own description: id, range, epoch and
// replicas (ctl split -w json prints two). A boundary that is UTF-8 is a
// JSON string under start_key or end_key ("" for the open end); one that
// is not is base64 under start_key_base64 or end_key_base64 instead
// (jsonBytes, as get/scan -w json do).
type regionCoreJSON struct {
	ID             uint64     `json:"id"`
	StartKey       *string    `json:"start_key,omitempty"`
	StartKeyBase64 *string    `json:"start_key_base64,omitempty"`
	EndKey         *string    `json:"end_key,omitempty"`
	EndKeyBase64   *string    `json:"end_key_base64,omitempty"`
	Epoch          epochJSON  `json:"epoch"`
	Peers          []peerJSON `json:"peers"`
}

// regionJSON is a region of ctl regions -w json: everything its table
// row shows, so that the JSON is a superset of the table.
type regionJSON struct {
	regionCoreJSON
	LeaderStoreID uint64 `json:"leader_store_id"`
	// LeaderDown (only when true): the leader is on a store that is down.
	LeaderDown bool `json:"leader_down,omitempty"`
	// Term and AppliedIndex are the leader's raft term and applied index.
	Term         uint64 `json:"term"`
	AppliedIndex uint64 `json:"applied_index"`
	// ApproximateKeys and ApproximateSize (bytes of keys and values), as
	// the leader last counted them, appear only when it has.
	ApproximateKeys *uint64 `json:"approximate_keys,omitempty"`
	ApproximateSize *uint64 `json:"approximate_size,omitempty"`
	// Keys and Size are --size's counts, made now; SizeError says why
	// there are none (the leader did not answer).
	Keys      *uint64 `json:"keys,omitempty"`
	Size      *uint64 `json:"size,omitempty"`
	SizeError string  `json:"size_error,omitempty"`
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

// newRegionCoreJSON describes r; a key that is not UTF-8 goes in base64
// (encoding/json would turn its bytes into U+FFFD, making different keys
// print the same). down marks the replicas on stores that are down.
func newRegionCoreJSON(r region.Region, down map[uint64]bool) regionCoreJSON {
	rj := regionCoreJSON{
		ID:    r.ID,
		Epoch: epochJSON{ConfVer: r.Epoch.ConfVer, Version: r.Epoch.Version},
		Peers: make([]peerJSON, 0, len(r.Peers)),
	}
	rj.StartKey, rj.StartKeyBase64 = jsonBytes(r.StartKey)
	rj.EndKey, rj.EndKeyBase64 = jsonBytes(r.EndKey)
	for _, p := range r.Peers {
		rj.Peers = append(rj.Peers, peerJSON{ID: p.ID, StoreID: p.StoreID, IsLearner: p.IsLearner, Down: down[p.StoreID]})
	}
	return rj
}

// regionsJSON is ctl regions -w json: the table's rows, with down marking
// the stores that are down and sizes the --size counts (nil without).
func regionsJSON(regions []client.RegionInfo, down map[uint64]bool, sizes map[uint64]regionSize) []regionJSON {
	out := make([]regionJSON, 0, len(regions))
	for _, info := range regions {
		rj := regionJSON{
			regionCoreJSON: newRegionCoreJSON(info.Region, down),
			LeaderStoreID:  info.LeaderStoreID,
			LeaderDown:     info.LeaderStoreID != 0 && down[info.LeaderStoreID],
			Term:           info.Term,
			AppliedIndex:   info.AppliedIndex,
		}
		if info.SizeKnown {
			keys, size := info.ApproximateKeys, info.ApproximateBytes
			rj.ApproximateKeys, rj.ApproximateSize = &keys, &size
		}
		switch sz, ok := sizes[info.Region.ID]; {
		case sizes != nil && ok && sz.err == nil:
			rj.Keys, rj.Size = &sz.keys, &sz.bytes
		case sizes != nil && ok:
			rj.SizeError = describe(sz.err)
		case sizes != nil:
			rj.SizeError = "not counted"
		}
		out = append(out, rj)
	}
	return out
}

// downStores maps each store that is down to true.
func downStores(stores []client.StoreInfo) map[uint64]bool {
	down := make(map[uint64]bool, len(stores))
	for _, s := range stores {
		down[s.ID] = !s.Up
	}
	return down
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
	down := downStores(stores)
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
