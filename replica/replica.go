// Package replica compares the replicas of a region. Apply is
// deterministic, so two replicas of a region that have applied the same
// log index must hold the same data, metadata and applied term. A Digest
// summarizes one replica's state at one applied index (a store reads it in
// one transaction, in which the apply wrote the data and the applied index
// together, so the two always agree). Digests taken on different stores at
// different moments are comparable as soon as their applied indexes are
// equal: nothing else is needed for a "quiet moment". Compare compares
// them; once they differ, Diff over two dumps taken at one applied index
// names the first differing key; Poll drives a whole check.
//
// The package holds the comparison only, so that the check of a running
// cluster (replicacheck, ctl check) links neither the store nor the server.
package replica

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hedgekv/hedgekv/region"
)

// ErrNotComparable: the digests given to Compare are not of one region, or
// hold two of one store.
var ErrNotComparable = errors.New("digests not comparable")

// KV is one key-value pair of a region dump.
type KV struct {
	Key, Value []byte
}

// Digest is one replica's state of a region at one applied index.
type Digest struct {
	StoreID      uint64
	PeerID       uint64        // this store's peer in Region
	Region       region.Region // the metadata persisted with AppliedIndex
	AppliedIndex uint64
	AppliedTerm  uint64
	Keys         uint64 // key-value pairs in the region's range
	Bytes        uint64 // their total key and value length
	Hash         [sha256.Size]byte
	DedupRecords uint64            // live dedup records of the region
	DedupHash    [sha256.Size]byte // over those, in (key, id) order
}

func (d Digest) String() string {
	return fmt.Sprintf("store %d: region %d applied %d/%d epoch %d/%d range [%q,%q) peers %s: %d keys, %d bytes, sha256 %s, %d dedup records %s",
		d.StoreID, d.Region.ID, d.AppliedIndex, d.AppliedTerm, d.Region.Epoch.ConfVer, d.Region.Epoch.Version,
		d.Region.StartKey, d.Region.EndKey, peersString(d.Region.Peers), d.Keys, d.Bytes, d.shortHash(),
		d.DedupRecords, hex.EncodeToString(d.DedupHash[:8]))
}

func (d Digest) shortHash() string { return hex.EncodeToString(d.Hash[:8]) }

// NotAtSameIndexError: the digests are of different applied indexes, so
// they cannot be compared (yet). Retry once the replicas catch up.
type NotAtSameIndexError struct {
	RegionID uint64
	Applied  map[uint64]uint64 // store ID -> applied index
}

func (e *NotAtSameIndexError) Error() string {
	ids := sortedKeys(e.Applied)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("store %d at %d", id, e.Applied[id])
	}
	return fmt.Sprintf("region %d: replicas not at the same applied index (%s)", e.RegionID, strings.Join(parts, ", "))
}

// MismatchError: replicas of a region at the same applied index
// disagree.
type MismatchError struct {
	RegionID     uint64
	AppliedIndex uint64
	Stores       []uint64 // every store compared, ascending
	// Groups partitions Stores by state, largest group first (ties: by
	// lowest store ID).
	Groups [][]uint64
	// What differs between Groups[0] and Groups[1]: "applied term",
	// "region metadata" or "data".
	What    string
	Digests []Digest // as compared, by store ID
	// Diff names the first differing key; set by a caller that dumped two
	// disagreeing replicas (see Diff). DiffNote says why not, if
	// that was tried and failed.
	Diff     *KeyDifference
	DiffNote string
}

func (e *MismatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "region %d: replicas disagree at applied index %d: %s differs:", e.RegionID, e.AppliedIndex, e.What)
	for i, g := range e.Groups {
		if i > 0 {
			b.WriteString(" vs")
		}
		d, _ := e.digest(g[0])
		fmt.Fprintf(&b, " stores %v (term %d, epoch %d/%d, range [%q,%q), peers %s, %d keys, sha256 %s)",
			g, d.AppliedTerm, d.Region.Epoch.ConfVer, d.Region.Epoch.Version, d.Region.StartKey, d.Region.EndKey,
			peersString(d.Region.Peers), d.Keys, d.shortHash())
	}
	if e.Diff != nil {
		b.WriteString("; ")
		b.WriteString(e.Diff.String())
	} else if e.DiffNote != "" {
		b.WriteString("; ")
		b.WriteString(e.DiffNote)
	}
	return b.String()
}

func (e *MismatchError) digest(storeID uint64) (Digest, bool) {
	for _, d := range e.Digests {
		if d.StoreID == storeID {
			return d, true
		}
	}
	return Digest{}, false
}

// KeyDifference is the first key on which two replicas' dumps, taken at
// one applied index, differ.
type KeyDifference struct {
	AppliedIndex   uint64
	Key            []byte
	StoreA, StoreB uint64
	FoundA, FoundB bool
	ValueA, ValueB []byte
}

func (d *KeyDifference) String() string {
	side := func(store uint64, found bool, v []byte) string {
		if !found {
			return fmt.Sprintf("store %d has no such key", store)
		}
		return fmt.Sprintf("store %d has %q", store, v)
	}
	return fmt.Sprintf("first differing key %q (dumps at applied index %d): %s, %s",
		d.Key, d.AppliedIndex, side(d.StoreA, d.FoundA, d.ValueA), side(d.StoreB, d.FoundB, d.ValueB))
}

// Compare compares the digests of one region taken on several
// stores. It returns nil if they agree, *NotAtSameIndexError if they are
// not at one applied index (not comparable yet), and *MismatchError
// if they are and disagree. Fewer than two digests always agree.
func Compare(ds []Digest) error {
	if len(ds) == 0 {
		return nil
	}
	ds = slices.Clone(ds)
	sort.Slice(ds, func(i, j int) bool { return ds[i].StoreID < ds[j].StoreID })
	rid := ds[0].Region.ID
	applied := map[uint64]uint64{}
	same := true
	for _, d := range ds {
		if d.Region.ID != rid {
			return fmt.Errorf("compare replicas: digests of regions %d and %d: %w", rid, d.Region.ID, ErrNotComparable)
		}
		if _, dup := applied[d.StoreID]; dup {
			return fmt.Errorf("compare replicas: two digests of store %d: %w", d.StoreID, ErrNotComparable)
		}
		applied[d.StoreID] = d.AppliedIndex
		same = same && d.AppliedIndex == ds[0].AppliedIndex
	}
	if !same {
		return &NotAtSameIndexError{RegionID: rid, Applied: applied}
	}
	// Group by state; groups keep the order of their first store.
	var groups [][]uint64
	var reps []Digest
	for _, d := range ds {
		placed := false
		for i, r := range reps {
			if differs(r, d) == "" {
				groups[i] = append(groups[i], d.StoreID)
				placed = true
				break
			}
		}
		if !placed {
			groups = append(groups, []uint64{d.StoreID})
			reps = append(reps, d)
		}
	}
	if len(groups) == 1 {
		return nil
	}
	idx := make([]int, len(groups))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool { return len(groups[idx[i]]) > len(groups[idx[j]]) })
	e := &MismatchError{RegionID: rid, AppliedIndex: ds[0].AppliedIndex, Digests: ds}
	for _, i := range idx {
		e.Groups = append(e.Groups, groups[i])
	}
	for _, d := range ds {
		e.Stores = append(e.Stores, d.StoreID)
	}
	e.What = differs(reps[idx[0]], reps[idx[1]])
	return e
}

// differs says what differs between two digests at one applied index, ""
// if nothing does.
func differs(a, b Digest) string {
	switch {
	case a.AppliedTerm != b.AppliedTerm:
		return "applied term"
	case !sameMeta(a.Region, b.Region):
		return "region metadata"
	case a.Keys != b.Keys || a.Bytes != b.Bytes || a.Hash != b.Hash:
		return "data"
	case a.DedupRecords != b.DedupRecords || a.DedupHash != b.DedupHash:
		return "dedup table"
	}
	return ""
}

// sameMeta compares epoch, range and the set of peers (in any order).
func sameMeta(a, b region.Region) bool {
	if a.ID != b.ID || a.Epoch != b.Epoch || !bytes.Equal(a.StartKey, b.StartKey) || !bytes.Equal(a.EndKey, b.EndKey) || len(a.Peers) != len(b.Peers) {
		return false
	}
	pa, pb := sortedPeers(a.Peers), sortedPeers(b.Peers)
	for i := range pa {
		if pa[i] != pb[i] {
			return false
		}
	}
	return true
}

func sortedPeers(ps []region.Peer) []region.Peer {
	ps = slices.Clone(ps)
	sort.Slice(ps, func(i, j int) bool { return ps[i].ID < ps[j].ID })
	return ps
}

func peersString(ps []region.Peer) string {
	parts := make([]string, 0, len(ps))
	for _, p := range sortedPeers(ps) {
		s := fmt.Sprintf("%d@%d", p.ID, p.StoreID)
		if p.IsLearner {
			s += "(learner)"
		}
		parts = append(parts, s)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// FirstDifference returns the first key, in key order, that a and b (each
// sorted by key, as a store's region dump returns them) disagree on: present in one
// only, or with different values. ok is false if they are equal.
func FirstDifference(a, b []KV) (key []byte, ok bool) {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch c := bytes.Compare(a[i].Key, b[j].Key); {
		case c < 0:
			return a[i].Key, true
		case c > 0:
			return b[j].Key, true
		case !bytes.Equal(a[i].Value, b[j].Value):
			return a[i].Key, true
		}
		i++
		j++
	}
	switch {
	case i < len(a):
		return a[i].Key, true
	case j < len(b):
		return b[j].Key, true
	}
	return nil, false
}

// Diff describes the first difference between two dumps of a
// region taken at one applied index; ok is false if they are equal.
func Diff(applied uint64, storeA uint64, a []KV, storeB uint64, b []KV) (d KeyDifference, ok bool) {
	key, ok := FirstDifference(a, b)
	if !ok {
		return KeyDifference{}, false
	}
	d = KeyDifference{AppliedIndex: applied, Key: key, StoreA: storeA, StoreB: storeB}
	d.ValueA, d.FoundA = lookupKV(a, key)
	d.ValueB, d.FoundB = lookupKV(b, key)
	return d, true
}

func lookupKV(kvs []KV, key []byte) ([]byte, bool) {
	i := sort.Search(len(kvs), func(i int) bool { return bytes.Compare(kvs[i].Key, key) >= 0 })
	if i < len(kvs) && bytes.Equal(kvs[i].Key, key) {
		return kvs[i].Value, true
	}
	return nil, false
}

func sortedKeys(m map[uint64]uint64) []uint64 {
	ids := make([]uint64, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Poll drives a replica-agreement check until every region has
// been compared once and found in agreement: each round, regions lists the
// regions to check, and digests returns a region's replica digests, or why
// they cannot be compared yet (a replica still waiting for its snapshot,
// a store unreachable). Replicas not at one applied index are compared
// again next round, poll later; agreed, if set, gets each region found in
// agreement with its digests (none if it has no replica to compare). It returns nil once none is left, the
// *MismatchError (or any other error of Compare, regions or
// digests) at once, and ctx's error with the regions left and why
// (pending) if ctx ends first. The in-process harness and the check of a
// running cluster (ctl check) both run on it.
func Poll(ctx context.Context, poll time.Duration,
	regions func(context.Context) ([]region.Region, error),
	digests func(context.Context, region.Region) ([]Digest, string),
	agreed func(region.Region, []Digest),
) (pending map[uint64]string, err error) {
	verified := map[uint64]bool{}
	for {
		rs, err := regions(ctx)
		if err != nil {
			return nil, err
		}
		pending = map[uint64]string{}
		for _, r := range rs {
			if verified[r.ID] {
				continue
			}
			ds, why := digests(ctx, r)
			if why != "" {
				pending[r.ID] = why
				continue
			}
			var notSame *NotAtSameIndexError
			switch err := Compare(ds); {
			case err == nil:
				verified[r.ID] = true
				if agreed != nil {
					agreed(r, ds)
				}
			case errors.As(err, &notSame):
				pending[r.ID] = "no quiet moment: " + err.Error()
			default:
				return pending, err
			}
		}
		if len(pending) == 0 {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return pending, ctx.Err()
		case <-time.After(poll):
		}
	}
}
