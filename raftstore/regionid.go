package raftstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3/raftpb"
)

// Region IDs come from one counter for the whole cluster, so that they
// read as a sequence (1, 2, 3, ...), as TiKV's (from PD) and CockroachDB's
// (from a range-ID key) do. The counter is part of the first region's
// descriptor (region.Region.LastRegionID): an opAllocRegionID entry in
// that region's log takes the next ID, so every replica agrees on it, a
// restart re-applies it from the log, and a snapshot carries it. The
// first region is the one holding the empty key; every split keeps it on
// the left, so it is never cut away from the counter.
//
// A store with a replica of the first region proposes the entry itself
// (forwarded to the leader from a follower); one without asks a store
// that has one (RegionIDSource: the server asks its peers over gRPC).
// Peer IDs are scoped to their raft group and still come from a per-store
// counter (allocPeerID).

// RegionIDSource takes a region ID from the cluster's counter through
// another store, for a store that holds no replica of the first region.
type RegionIDSource interface {
	AllocRegionID(ctx context.Context) (uint64, error)
}

// SetRegionIDSource sets where a store without a replica of the first
// region gets region IDs; call before Start. Without one such a store
// cannot split.
func (s *Store) SetRegionIDSource(src RegionIDSource) { s.regionIDs = src }

// AllocRegionID takes the next region ID from the cluster's counter
// through this store's replica of the first region (forwarded to its
// leader if need be). A store without one fails with a
// *region.RegionNotFoundError. An error may hide an ID taken: IDs are
// never reused, so a lost one is only a gap in the sequence.
func (s *Store) AllocRegionID(ctx context.Context) (uint64, error) {
	floor := make([]byte, 8)
	binary.BigEndian.PutUint64(floor, s.maxRegionID())
	res, err := s.proposeResult(ctx, WriteOptions{Forward: true}, command{op: opAllocRegionID, value: floor})
	if err != nil {
		return 0, err
	}
	if len(res) != 8 {
		return 0, fmt.Errorf("region id: a %d-byte answer: %w", len(res), errCorrupt)
	}
	return binary.BigEndian.Uint64(res), nil
}

// newRegionID is a region ID for a split: through this store's replica of
// the first region, or through another store when it has none.
func (s *Store) newRegionID(ctx context.Context) (uint64, error) {
	id, err := s.AllocRegionID(ctx)
	var notHere *region.RegionNotFoundError
	if errors.As(err, &notHere) && s.regionIDs != nil {
		id, err = s.regionIDs.AllocRegionID(ctx)
	}
	if err != nil {
		return 0, fmt.Errorf("allocate a region id: %w", err)
	}
	return id, nil
}

// maxRegionID is the largest region ID this store knows of: the floor an
// allocation sends, so that a cluster whose IDs came from elsewhere (the
// per-store IDs of earlier versions) never has one handed out again.
func (s *Store) maxRegionID() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var most uint64
	for id := range s.peers {
		most = max(most, id)
	}
	return most
}

// applyAllocRegionIDTx moves the counter past the larger of its value and
// the proposer's floor, and answers the ID it reached. Only the first
// region holds the counter: an entry applied elsewhere (it cannot be, as
// it is routed by the empty key) is refused.
func (s *Store) applyAllocRegionIDTx(tx *engine.Tx, rp *readyPeer, e *raftpb.Entry, cmd command) error {
	p := rp.p
	if len(p.region.StartKey) != 0 {
		rp.ack(cmd.id, e.Term, &region.KeyNotInRegionError{Key: nil, RegionID: p.regionID, StartKey: p.region.StartKey, EndKey: p.region.EndKey})
		return nil
	}
	if len(cmd.value) != 8 {
		return fmt.Errorf("region id command: %w", errCorrupt)
	}
	r := p.region.Clone()
	r.LastRegionID = max(r.LastRegionID, r.ID, binary.BigEndian.Uint64(cmd.value)) + 1
	// Not a change of shape (no range, epoch or peer moves): nothing is
	// published and no checkpoint is forced; a restart re-applies the
	// entry from the log and reaches the same counter.
	if err := putRegion(tx, r); err != nil {
		return err
	}
	p.setRegion(r)
	res := make([]byte, 8)
	binary.BigEndian.PutUint64(res, r.LastRegionID)
	rp.ackResult(cmd.id, e.Term, res)
	return nil
}
