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
	// snaps, if set, makes Snapshot file a streaming source and return
	// its descriptor (snapstream.go); unset (tests), it builds in memory.
	snaps     *snapshots
	buildErrs *atomic.Uint64
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

// Snapshot returns a snapshot of the region at its applied index: with a
// streaming source, its metadata and a descriptor of its data (raft calls
// this under the peer's mutex: it opens a read transaction and reads two
// keys, whatever the region's size); without, the whole snapshot.
func (s *peerStorage) Snapshot() (raftpb.Snapshot, error) {
	var snap raftpb.Snapshot
	var err error
	if s.snaps != nil {
		snap, err = s.snaps.open(s.regionID)
	} else {
		snap, err = s.eng.buildSnapshot(s.regionID)
	}
	if err != nil {
		// Raft retries at the follower's next heartbeat response; any other
		// error would make it panic. Say so, once a while per region.
		if s.buildErrs != nil {
			s.buildErrs.Add(1)
		}
		if s.snaps != nil {
			s.snaps.buildFailed(s.regionID, err)
		}
		return raftpb.Snapshot{}, raft.ErrSnapshotTemporarilyUnavailable
	}
	s.built.Add(1)
	return snap, nil
}
