package raftstore

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3/raftpb"
)

// A region snapshot is the engine's (storage/engine, snapshot.go): the
// region's metadata, its dedup clock base and records, and every pair in
// its range, as of one applied index, read in one transaction so that the
// data and the index it is labelled with agree. The gRPC transport
// streams it in chunks (snapstream.go).

// buildSnapshot reads the region's state in one transaction and returns
// the whole snapshot in memory (tests, and a peerStorage with no
// streaming source: the store streams snapshots instead, snapstream.go).
func buildSnapshot(e *engine.Engine, regionID uint64) (raftpb.Snapshot, error) {
	var snap raftpb.Snapshot
	err := e.View(func(tx *engine.Tx) error {
		md, err := snapshotMetaTx(tx, regionID)
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		if err := tx.WriteSnapshot(regionID, &buf); err != nil {
			return err
		}
		snap.Data, snap.Metadata = buf.Bytes(), md
		return nil
	})
	if err != nil {
		return raftpb.Snapshot{}, fmt.Errorf("build snapshot of region %d: %w", regionID, err)
	}
	return snap, nil
}

// snapshotMetaTx returns the metadata of a snapshot of the region taken
// in tx: its applied index and term, and its configuration.
func snapshotMetaTx(tx *engine.Tx, regionID uint64) (raftpb.SnapshotMetadata, error) {
	as, meta, err := tx.SnapshotState(regionID)
	if err != nil {
		return raftpb.SnapshotMetadata{}, err
	}
	r, err := decodeRegion(meta)
	if err != nil {
		return raftpb.SnapshotMetadata{}, err
	}
	return raftpb.SnapshotMetadata{Index: as.AppliedIndex, Term: as.AppliedTerm, ConfState: confStateOf(r)}, nil
}

// decodeSnapshotRegion checks snapshot data and returns the region it is
// of.
func decodeSnapshotRegion(data []byte) (region.Region, error) {
	meta, err := engine.DecodeSnapshot(data)
	if err != nil {
		return region.Region{}, err
	}
	return decodeRegion(meta)
}

// encodeRegion and decodeRegion: a region's metadata as the engine stores
// it (JSON; the engine reads its ID and range: engine.Span).
func encodeRegion(r region.Region) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode region %d: %w", r.ID, err)
	}
	return b, nil
}

func decodeRegion(meta []byte) (region.Region, error) {
	var r region.Region
	if err := json.Unmarshal(meta, &r); err != nil {
		return region.Region{}, fmt.Errorf("decode region meta: %v: %w", err, errCorrupt)
	}
	return r, nil
}

// putRegion writes r's metadata in tx.
func putRegion(tx *engine.Tx, r region.Region) error {
	b, err := encodeRegion(r)
	if err != nil {
		return err
	}
	return tx.PutRegionMeta(r.ID, b)
}

// spanOf is what the engine knows of r.
func spanOf(r region.Region) engine.Span {
	return engine.Span{ID: r.ID, StartKey: r.StartKey, EndKey: r.EndKey}
}

func confStateOf(r region.Region) raftpb.ConfState {
	var cs raftpb.ConfState
	for _, p := range r.Peers {
		if p.IsLearner {
			cs.Learners = append(cs.Learners, p.ID)
		} else {
			cs.Voters = append(cs.Voters, p.ID)
		}
	}
	return cs
}

// errCorrupt: bytes that are not what the store writes (the engine's
// error, so that either layer's check reads the same).
var errCorrupt = engine.ErrCorrupt
