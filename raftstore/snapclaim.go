package raftstore

import (
	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/raft/v3/raftpb"
)

// Snapshot claims: the ranges of snapshots on their way into this store.
//
// A snapshot for a region not initialized here (a placeholder) writes its
// range's data. It must not overlap a region that holds part of that range
// here: that region could still apply older writes to the range (it has not
// applied the split that gave the keys away), or later apply the split
// itself and create the region over the snapshot. Checking the initialized
// regions (s.ranges) alone left a hole: a snapshot admitted but not yet
// applied holds its range in neither. Seen splitting 10,000 regions on a
// store that fell behind: region N's snapshot (from before N split off
// N+1) was applying, N+1's snapshot was admitted beside it, then N, whole,
// applied its split and created N+1 afresh at index 5 over the snapshot
// the leader had already counted; the leader's next heartbeat panicked
// the store's raft (`tocommit(7) is out of range [lastIndex(5)]`).
//
// So an admitted snapshot claims its range from admission until its peer
// publishes it (the range enters s.ranges in the same critical section)
// or is gone, and a snapshot overlapping another region's claim is refused
// as one overlapping an initialized region is: its leader sends it again
// later. TiKV keeps the same list (pending_snapshot_regions). A claim
// whose message raft did not take (a stale snapshot) ends when the step
// returns (settleSnapClaim). And a round publishes a split's shrunk
// parent and its new region under shapeMu, which the admission takes: in
// between, the new region's range was nobody's, and a snapshot of the
// region after it was admitted there (the same panic, a second way).

type snapClaim struct {
	p *Peer
	r region.Region
	// settled: the message was stepped (or dropped); taken: raft took
	// the snapshot. Both under s.mu.
	settled, taken bool
}

// claimSnapshot admits a snapshot of region r for the uninitialized peer
// p if its range overlaps no initialized region and no other region's
// live claim, and records its claim. False: refuse it.
func (s *Store) claimSnapshot(p *Peer, r region.Region) bool {
	s.shapeMu.Lock()
	defer s.shapeMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.overlapsRangesLocked(r) {
		return false
	}
	for id, cs := range s.snapClaims {
		live := cs[:0]
		for _, c := range cs {
			if s.claimLiveLocked(id, c) {
				live = append(live, c)
			}
		}
		if len(live) == 0 {
			delete(s.snapClaims, id)
			continue
		}
		s.snapClaims[id] = live
		if id == r.ID {
			continue // a newer snapshot of the same region
		}
		for _, c := range live {
			if overlapsSkippingMerge(c.r, r) {
				return false
			}
		}
	}
	if s.snapClaims == nil {
		s.snapClaims = make(map[uint64][]*snapClaim)
	}
	s.snapClaims[r.ID] = append(s.snapClaims[r.ID], &snapClaim{p: p, r: r})
	return true
}

// claimLiveLocked reports whether c still claims its range: its peer is
// the region's peer here, not removed, and raft took (or is about to
// step) its snapshot. Its publish deletes it (endSnapClaimsLocked).
func (s *Store) claimLiveLocked(id uint64, c *snapClaim) bool {
	if s.peers[id] != c.p || c.p.isRemoved() {
		return false
	}
	return !c.settled || c.taken
}

// settleSnapClaim records, once MsgSnap m was handled by p, whether raft
// took its snapshot: raft commits up to a snapshot's index as it restores
// it, and an uninitialized peer's commit index is 0 until then.
func (s *Store) settleSnapClaim(p *Peer, m *Message) {
	p.mu.Lock()
	taken := p.rn.BasicStatus().Commit >= m.Msg.Snapshot.Metadata.Index
	p.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.snapClaims[m.RegionID] {
		if c.p == p && !c.settled {
			c.settled, c.taken = true, taken
		}
	}
}

// endSnapClaimsLocked: region id's snapshot is published (its range is in
// s.ranges from now on). Called with s.mu held.
func (s *Store) endSnapClaimsLocked(id uint64) {
	delete(s.snapClaims, id)
}

// overlapsRangesLocked reports whether r's range overlaps an initialized
// region on this store other than r itself.
func (s *Store) overlapsRangesLocked(r region.Region) bool {
	for _, o := range s.ranges.All() {
		if o.ID != r.ID && overlapsSkippingMerge(o, r) {
			return true
		}
	}
	return false
}

// overlapsSkippingMerge reports whether o and r share a key, unless o is
// frozen for a merge into r: r's snapshot holds o's keys and takes its
// place (dropMergedBy).
func overlapsSkippingMerge(o, r region.Region) bool {
	if o.Merge != nil && o.Merge.Target == r.ID {
		return false
	}
	return o.Overlaps(r)
}

// holdsSnapshotLocked reports whether p, not initialized, has taken a
// snapshot that is on its way in: a split must not create the region over
// it (applySplitTx).
func (p *Peer) holdsSnapshotLocked() bool {
	return !p.initialized && (p.applyingSnapshotLocked() || p.rn.BasicStatus().Commit > 0)
}

func isSnapMsg(m *Message) bool {
	return m.Notice == nil && m.Msg.Type == raftpb.MsgSnap && m.Msg.Snapshot != nil
}
