package raftstore

import (
	"errors"

	"github.com/hedgekv/hedgekv/region"
)

// Routing: every request, read or write, finds its peer here and is
// checked against the peer's region (epoch, key range, whether it holds
// data) before anything else is done for it.

// route finds the peer a request is for and checks its epoch and key.
// regionID 0 means "the region holding key on this store".
func (s *Store) route(regionID uint64, epoch region.Epoch, key []byte) (*Peer, error) {
	if s.stopped() {
		return nil, ErrStopped
	}
	if regionID == 0 {
		s.mu.RLock()
		r, ok := s.ranges.Lookup(key)
		s.mu.RUnlock()
		if !ok {
			return nil, &region.RegionNotFoundError{}
		}
		regionID = r.ID
	}
	p, ok := s.peer(regionID)
	if !ok {
		return nil, &region.RegionNotFoundError{RegionID: regionID}
	}
	p.mu.Lock()
	err := p.checkServingLocked(epoch, key)
	p.mu.Unlock()
	if err != nil {
		return nil, s.withCurrentRegion(err, key)
	}
	s.touch(p, wakeRequest)
	return p, nil
}

// withCurrentRegion adds to an EpochNotMatch the region that holds key on
// this store now, so the client can route there without another round
// trip. It takes the store's lock: never call it holding a peer's.
func (s *Store) withCurrentRegion(err error, key []byte) error {
	var en *region.EpochNotMatchError
	if errors.As(err, &en) {
		s.mu.RLock()
		if cur, ok := s.ranges.Lookup(key); ok && cur.ID != en.RegionID {
			en.Current = append(en.Current, cur.Clone())
		}
		s.mu.RUnlock()
	}
	return err
}

// checkServingLocked refuses a request for a peer that holds no data (a
// placeholder, one removed, or one applying a snapshot), then checks
// epoch and key.
func (p *Peer) checkServingLocked(epoch region.Epoch, key []byte) error {
	if !p.initialized || p.removed || p.applyingSnapshotLocked() {
		return &region.RegionNotFoundError{RegionID: p.regionID}
	}
	if p.region.Merge != nil {
		// Frozen for a merge: its keys are about to move to its left
		// neighbour, and a read here could miss the writes made there
		// (merge.go). The client refreshes its route and retries.
		return &region.EpochNotMatchError{RegionID: p.regionID}
	}
	return p.checkLocked(epoch, key)
}

// checkLocked refuses a request routed with another epoch or for a key
// outside the region. A zero epoch skips the epoch check (CLI, tests).
func (p *Peer) checkLocked(epoch region.Epoch, key []byte) error {
	if epoch != (region.Epoch{}) && epoch != p.region.Epoch {
		return &region.EpochNotMatchError{RegionID: p.regionID, Current: []region.Region{p.region.Clone()}}
	}
	if !p.region.Contains(key) {
		return &region.KeyNotInRegionError{Key: key, RegionID: p.regionID, StartKey: p.region.StartKey, EndKey: p.region.EndKey}
	}
	return nil
}
