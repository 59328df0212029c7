package raftstore

import (
	"sync/atomic"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// peerStorage is a region peer's raft.Storage. The log since the last
// compaction is mirrored in a raft.MemoryStorage so that raft's frequent
// Term/Entries calls never touch disk; bbolt holds the durable copy, written
// by the Ready loop before the mirror is updated, and the mirror is rebuilt
// from it on restart. Snapshot is the one method that reads bbolt: it builds
// the region snapshot at the current applied index on demand.
type peerStorage struct {
	*raft.MemoryStorage
	eng      *engine
	built    *atomic.Uint64
	regionID uint64
}

var _ raft.Storage = (*peerStorage)(nil)

// newPeerStorage rebuilds the mirror from what was persisted.
func newPeerStorage(eng *engine, p persistedPeer, built *atomic.Uint64) (*peerStorage, error) {
	ms := raft.NewMemoryStorage()
	if p.apply.TruncatedIndex > 0 {
		err := ms.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{
			Index:     p.apply.TruncatedIndex,
			Term:      p.apply.TruncatedTerm,
			ConfState: confStateOf(p.region),
		}})
		if err != nil {
			return nil, err
		}
	}
	if err := ms.Append(p.entries); err != nil {
		return nil, err
	}
	if err := ms.SetHardState(p.hard); err != nil {
		return nil, err
	}
	return &peerStorage{MemoryStorage: ms, eng: eng, regionID: p.region.ID, built: built}, nil
}

// Snapshot builds a snapshot of the region at its applied index.
func (s *peerStorage) Snapshot() (raftpb.Snapshot, error) {
	snap, err := s.eng.buildSnapshot(s.regionID)
	if err != nil {
		// Raft retries later; a transient failure must not crash the peer.
		return raftpb.Snapshot{}, raft.ErrSnapshotTemporarilyUnavailable
	}
	s.built.Add(1)
	return snap, nil
}
