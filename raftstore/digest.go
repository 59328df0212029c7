package raftstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
)

// Replica agreement.
//
// Apply is deterministic, so two replicas of a region that have applied
// the same log index must hold the same data, metadata and applied term. A
// ReplicaDigest summarizes one replica's state at one applied index; it is
// read in ONE bbolt read transaction, and the apply transaction writes the
// data and the applied index together, so the two always agree. Digests
// taken on different stores at different moments are comparable as soon as
// their applied indexes are equal: nothing else is needed for a "quiet
// moment". CompareReplicas compares them; once they differ, RegionDump of
// two disagreeing replicas (again at one applied index) and
// DiffReplicas name the first differing key.
//
// The data hash is SHA-256 over every key-value pair of the region's range,
// in key order, each written as uvarint(len(key)) | key | uvarint(len(value))
// | value (the pair encoding of a snapshot). The dedup table (dedup.go) is
// hashed separately: only its live records (clock + DedupWindow > the clock
// at applied), which every replica holds alike, since trimming a little per
// apply round may leave different dead records on different replicas. A replica
// that decided a retried write differently from its peers keeps a
// different table long after the key's data has been overwritten.

// ReplicaDigest is one replica's state of a region at one applied index.
type ReplicaDigest struct {
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

func (d ReplicaDigest) String() string {
	return fmt.Sprintf("store %d: region %d applied %d/%d epoch %d/%d range [%q,%q) peers %s: %d keys, %d bytes, sha256 %s, %d dedup records %s",
		d.StoreID, d.Region.ID, d.AppliedIndex, d.AppliedTerm, d.Region.Epoch.ConfVer, d.Region.Epoch.Version,
		d.Region.StartKey, d.Region.EndKey, peersString(d.Region.Peers), d.Keys, d.Bytes, d.shortHash(),
		d.DedupRecords, hex.EncodeToString(d.DedupHash[:8]))
}

func (d ReplicaDigest) shortHash() string { return hex.EncodeToString(d.Hash[:8]) }

// ReplicaNotFoundError: the store does not host an initialized replica of
// the region (it never had one, it was removed, or its peer still waits for
// its first snapshot: Uninitialized).
type ReplicaNotFoundError struct {
	StoreID       uint64
	RegionID      uint64
	Uninitialized bool
}

func (e *ReplicaNotFoundError) Error() string {
	if e.Uninitialized {
		return fmt.Sprintf("store %d: replica of region %d is not initialized", e.StoreID, e.RegionID)
	}
	return fmt.Sprintf("store %d hosts no replica of region %d", e.StoreID, e.RegionID)
}

// RegionDigest returns this store's digest of its replica of regionID.
func (s *Store) RegionDigest(regionID uint64) (ReplicaDigest, error) {
	d := ReplicaDigest{StoreID: s.cfg.StoreID}
	err := s.viewReplica(regionID, func(tx *engine.Tx, r region.Region, as engine.ApplyState) error {
		d.Region, d.AppliedIndex, d.AppliedTerm = r, as.AppliedIndex, as.AppliedTerm
		self, _ := r.PeerOnStore(s.cfg.StoreID)
		d.PeerID = self.ID
		h := sha256.New()
		forEachInRange(tx, r, func(k, v []byte) {
			writeHashChunk(h, k)
			writeHashChunk(h, v)
			d.Keys++
			d.Bytes += uint64(len(k) + len(v))
		})
		h.Sum(d.Hash[:0])
		dh := sha256.New()
		now := tx.DedupClock(r.ID, as.AppliedIndex)
		if err := tx.ForEachDedup(r.StartKey, r.EndKey, func(rec engine.DedupRecord) error {
			if rec.Clock+s.cfg.DedupWindow <= now {
				return nil // dead: no later entry can see it; trimmed at leisure
			}
			var b [16]byte
			binary.BigEndian.PutUint64(b[:], rec.Clock)
			binary.BigEndian.PutUint64(b[8:], rec.ID)
			dh.Write(b[:])
			writeHashChunk(dh, rec.Key)
			d.DedupRecords++
			return nil
		}); err != nil {
			return err
		}
		dh.Sum(d.DedupHash[:0])
		return nil
	})
	return d, err
}

// RegionDump returns every key-value pair of this store's replica of
// regionID and the applied index they are as of. It exists to name the
// first differing key once digests differ: it copies the whole range.
func (s *Store) RegionDump(regionID uint64) (applied uint64, kvs []KV, err error) {
	err = s.viewReplica(regionID, func(tx *engine.Tx, r region.Region, as engine.ApplyState) error {
		applied = as.AppliedIndex
		forEachInRange(tx, r, func(k, v []byte) {
			kvs = append(kvs, KV{Key: bytes.Clone(k), Value: bytes.Clone(v)})
		})
		return nil
	})
	return applied, kvs, err
}

// viewReplica runs fn in one read transaction with the replica's metadata
// and apply state as persisted, if this store hosts an initialized replica
// of regionID that has not been removed.
func (s *Store) viewReplica(regionID uint64, fn func(tx *engine.Tx, r region.Region, as engine.ApplyState) error) error {
	if s.stopped() {
		return ErrStopped
	}
	notFound := &ReplicaNotFoundError{StoreID: s.cfg.StoreID, RegionID: regionID}
	p, ok := s.peer(regionID)
	if !ok {
		return notFound
	}
	p.mu.Lock()
	initialized, removed := p.initialized && !p.applyingSnapshotLocked(), p.removed
	p.mu.Unlock()
	if removed {
		return notFound
	}
	if !initialized {
		notFound.Uninitialized = true
		return notFound
	}
	return s.eng.ViewCommitted(func(tx *engine.Tx) error {
		meta := tx.RegionMeta(regionID)
		if meta == nil {
			return notFound // destroyed since the lookup
		}
		r, err := decodeRegion(meta)
		if err != nil {
			return fmt.Errorf("region %d: %w", regionID, err)
		}
		if _, ok := r.PeerOnStore(s.cfg.StoreID); !ok {
			return notFound // applied its own removal; being destroyed
		}
		as, err := tx.ApplyState(regionID)
		if err != nil {
			return err
		}
		return fn(tx, r, as)
	})
}

// forEachInRange calls fn for every pair of r's range in key order. k and v
// are the transaction's memory: valid only inside it.
func forEachInRange(tx *engine.Tx, r region.Region, fn func(k, v []byte)) {
	tx.ForEachData(r.StartKey, r.EndKey, func(k, v []byte) bool {
		fn(k, v)
		return true
	})
}

func writeHashChunk(h hash.Hash, b []byte) {
	var l [binary.MaxVarintLen64]byte
	h.Write(l[:binary.PutUvarint(l[:], uint64(len(b)))])
	h.Write(b)
}

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

// ReplicaMismatchError: replicas of a region at the same applied index
// disagree.
type ReplicaMismatchError struct {
	RegionID     uint64
	AppliedIndex uint64
	Stores       []uint64 // every store compared, ascending
	// Groups partitions Stores by state, largest group first (ties: by
	// lowest store ID).
	Groups [][]uint64
	// What differs between Groups[0] and Groups[1]: "applied term",
	// "region metadata" or "data".
	What    string
	Digests []ReplicaDigest // as compared, by store ID
	// Diff names the first differing key; set by a caller that dumped two
	// disagreeing replicas (see DiffReplicas). DiffNote says why not, if
	// that was tried and failed.
	Diff     *KeyDifference
	DiffNote string
}

func (e *ReplicaMismatchError) Error() string {
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

func (e *ReplicaMismatchError) digest(storeID uint64) (ReplicaDigest, bool) {
	for _, d := range e.Digests {
		if d.StoreID == storeID {
			return d, true
		}
	}
	return ReplicaDigest{}, false
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

// CompareReplicas compares the digests of one region taken on several
// stores. It returns nil if they agree, *NotAtSameIndexError if they are
// not at one applied index (not comparable yet), and *ReplicaMismatchError
// if they are and disagree. Fewer than two digests always agree.
func CompareReplicas(ds []ReplicaDigest) error {
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
			return fmt.Errorf("compare replicas: digests of regions %d and %d: %w", rid, d.Region.ID, ErrInvalidRequest)
		}
		if _, dup := applied[d.StoreID]; dup {
			return fmt.Errorf("compare replicas: two digests of store %d: %w", d.StoreID, ErrInvalidRequest)
		}
		applied[d.StoreID] = d.AppliedIndex
		same = same && d.AppliedIndex == ds[0].AppliedIndex
	}
	if !same {
		return &NotAtSameIndexError{RegionID: rid, Applied: applied}
	}
	// Group by state; groups keep the order of their first store.
	var groups [][]uint64
	var reps []ReplicaDigest
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
	e := &ReplicaMismatchError{RegionID: rid, AppliedIndex: ds[0].AppliedIndex, Digests: ds}
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
func differs(a, b ReplicaDigest) string {
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
// sorted by key, as RegionDump returns them) disagree on: present in one
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

// DiffReplicas describes the first difference between two dumps of a
// region taken at one applied index; ok is false if they are equal.
func DiffReplicas(applied uint64, storeA uint64, a []KV, storeB uint64, b []KV) (d KeyDifference, ok bool) {
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

// IsReplicaNotFound reports whether err says the store hosts no
// initialized replica of the region.
func IsReplicaNotFound(err error) bool {
	var nf *ReplicaNotFoundError
	return errors.As(err, &nf)
}

// PollReplicas drives a replica-agreement check until every region has
// been compared once and found in agreement: each round, regions lists the
// regions to check, and digests returns a region's replica digests, or why
// they cannot be compared yet (a replica still waiting for its snapshot,
// a store unreachable). Replicas not at one applied index are compared
// again next round, poll later; agreed, if set, gets each region found in
// agreement with its digests (none if it has no replica to compare). It returns nil once none is left, the
// *ReplicaMismatchError (or any other error of CompareReplicas, regions or
// digests) at once, and ctx's error with the regions left and why
// (pending) if ctx ends first. The in-process harness and the check of a
// running cluster (ctl check) both run on it.
func PollReplicas(ctx context.Context, poll time.Duration,
	regions func(context.Context) ([]region.Region, error),
	digests func(context.Context, region.Region) ([]ReplicaDigest, string),
	agreed func(region.Region, []ReplicaDigest),
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
			switch err := CompareReplicas(ds); {
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
