// Package region is the pure model of a key range replicated by one Raft
// group: its bounds, its epoch, its peers, and the typed errors a request
// about a region can meet. It does no I/O and starts no goroutines, so every
// layer above (raftstore, server, client) can share it.
package region

import (
	"bytes"
	"fmt"
)

// Epoch versions a region's shape. ConfVer moves on every membership change,
// Version on every split or merge; a request carrying an older epoch was
// routed with stale metadata and must be refused with EpochNotMatch.
type Epoch struct {
	ConfVer uint64
	Version uint64
}

// Peer is one replica of a region: a Raft member ID placed on a store.
type Peer struct {
	ID      uint64
	StoreID uint64
	// IsLearner: the peer receives the log but does not vote (a replica
	// being added, until it has caught up and is promoted).
	IsLearner bool `json:",omitempty"`
}

// Region is a key range [StartKey, EndKey) and its replicas. An empty EndKey
// means +infinity, an empty StartKey -infinity.
type Region struct {
	ID       uint64
	StartKey []byte
	EndKey   []byte
	Epoch    Epoch
	Peers    []Peer
	// Merge is set while the region is frozen for a merge into its left
	// neighbour: it serves nothing until the merge commits (and the region
	// is gone) or rolls back. Nil otherwise.
	Merge *MergeState `json:",omitempty"`
	// AbortedMerge, on a region that was to absorb its right neighbour,
	// names the neighbour's freeze its log aborted (Target is then the
	// neighbour's ID): a commit of that freeze is refused from then on,
	// so the neighbour may unfreeze. Only the latest abort is kept: a new
	// freeze has a later index.
	AbortedMerge *MergeState `json:",omitempty"`
	// LastRegionID is the cluster's region ID counter: the last ID it
	// handed out. Only the first region (StartKey empty, which every
	// split leaves on the left) holds it; every other region's is 0. It
	// is replicated state like the rest of the descriptor: raft entries
	// move it and snapshots carry it.
	LastRegionID uint64 `json:",omitempty"`
}

// MergeState records a region's freeze for a merge: the region that is to
// absorb it, and the log index of the freeze entry.
type MergeState struct {
	Target uint64
	Index  uint64
}

// Contains reports whether key falls inside the region's range.
func (r *Region) Contains(key []byte) bool {
	return bytes.Compare(key, r.StartKey) >= 0 && (len(r.EndKey) == 0 || bytes.Compare(key, r.EndKey) < 0)
}

// Overlaps reports whether r's and o's half-open ranges share a key (an
// empty end key is the end of the key space).
func (r *Region) Overlaps(o Region) bool {
	rBeforeO := len(r.EndKey) > 0 && bytes.Compare(r.EndKey, o.StartKey) <= 0
	oBeforeR := len(o.EndKey) > 0 && bytes.Compare(o.EndKey, r.StartKey) <= 0
	return !rBeforeO && !oBeforeR
}

// PeerOnStore returns the region's peer hosted by storeID.
func (r *Region) PeerOnStore(storeID uint64) (Peer, bool) {
	for _, p := range r.Peers {
		if p.StoreID == storeID {
			return p, true
		}
	}
	return Peer{}, false
}

// PeerByID returns the peer with Raft ID id.
func (r *Region) PeerByID(id uint64) (Peer, bool) {
	for _, p := range r.Peers {
		if p.ID == id {
			return p, true
		}
	}
	return Peer{}, false
}

// Voters returns the region's voting peers (learners left out).
func (r *Region) Voters() []Peer {
	out := make([]Peer, 0, len(r.Peers))
	for _, p := range r.Peers {
		if !p.IsLearner {
			out = append(out, p)
		}
	}
	return out
}

// Clone returns a deep copy, so a caller may keep it without sharing slices
// with the store's live metadata.
func (r *Region) Clone() Region {
	c := Region{ID: r.ID, Epoch: r.Epoch, LastRegionID: r.LastRegionID}
	c.StartKey = append([]byte(nil), r.StartKey...)
	c.EndKey = append([]byte(nil), r.EndKey...)
	c.Peers = append([]Peer(nil), r.Peers...)
	if r.Merge != nil {
		m := *r.Merge
		c.Merge = &m
	}
	if r.AbortedMerge != nil {
		m := *r.AbortedMerge
		c.AbortedMerge = &m
	}
	return c
}

// ClampRange intersects [start, end) with the region's range. An empty end
// means +infinity. ok is false when the intersection is empty.
func (r *Region) ClampRange(start, end []byte) (s, e []byte, ok bool) {
	s, e = start, end
	if bytes.Compare(s, r.StartKey) < 0 {
		s = r.StartKey
	}
	if len(r.EndKey) > 0 && (len(e) == 0 || bytes.Compare(e, r.EndKey) > 0) {
		e = r.EndKey
	}
	if len(e) > 0 && bytes.Compare(s, e) >= 0 {
		return nil, nil, false
	}
	return s, e, true
}

// String is for logs.
func (r *Region) String() string {
	return fmt.Sprintf("region %d [%q, %q) epoch %d/%d peers %v", r.ID, r.StartKey, r.EndKey, r.Epoch.ConfVer, r.Epoch.Version, r.Peers)
}

// IsStale reports whether epoch e is older than cur in either dimension, so
// a request routed with e must be refused.
func (e Epoch) IsStale(cur Epoch) bool {
	return e.ConfVer < cur.ConfVer || e.Version < cur.Version
}

// Split divides r at key into a left part that keeps r's ID and a right part
// with newID and newPeerIDs (one per existing peer, in order). Both sides get
// the bumped version. It fails if key is not strictly inside r.
func Split(r Region, key []byte, newID uint64, newPeerIDs []uint64) (left, right Region, err error) {
	if len(key) == 0 || !r.Contains(key) || bytes.Equal(key, r.StartKey) {
		return Region{}, Region{}, fmt.Errorf("split key %q not strictly inside %s", key, r.String())
	}
	if len(newPeerIDs) != len(r.Peers) {
		return Region{}, Region{}, fmt.Errorf("split of %s needs %d peer ids, got %d", r.String(), len(r.Peers), len(newPeerIDs))
	}
	left = r.Clone()
	right = r.Clone()
	left.EndKey = append([]byte(nil), key...)
	right.ID = newID
	right.LastRegionID = 0 // the counter stays with the first region
	right.StartKey = append([]byte(nil), key...)
	for i := range right.Peers {
		right.Peers[i].ID = newPeerIDs[i]
	}
	left.Epoch.Version++
	right.Epoch.Version = left.Epoch.Version
	return left, right, nil
}

// Merge returns the region left becomes when it absorbs right, its right
// neighbour: left's ID and peers, the two ranges joined, and a version
// above both sides' so that a route cached for either is stale. It fails
// if the two are not adjacent or do not have replicas on the same stores
// (each store's replica of right becomes its replica of left).
func Merge(left, right Region) (Region, error) {
	if len(left.EndKey) == 0 || !bytes.Equal(left.EndKey, right.StartKey) {
		return Region{}, fmt.Errorf("merge: %s is not the right neighbour of %s", right.String(), left.String())
	}
	if !SameStores(left, right) {
		return Region{}, fmt.Errorf("merge: %s and %s do not have replicas on the same stores", left.String(), right.String())
	}
	m := left.Clone()
	m.Merge, m.AbortedMerge = nil, nil
	m.EndKey = append([]byte(nil), right.EndKey...)
	m.Epoch.Version = max(left.Epoch.Version, right.Epoch.Version) + 1
	return m, nil
}

// SameStores reports whether a and b have replicas on the same stores, in
// the same roles (voter or learner).
func SameStores(a, b Region) bool {
	if len(a.Peers) != len(b.Peers) {
		return false
	}
	for _, p := range a.Peers {
		q, ok := b.PeerOnStore(p.StoreID)
		if !ok || q.IsLearner != p.IsLearner {
			return false
		}
	}
	return true
}
