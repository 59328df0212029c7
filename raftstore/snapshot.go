package raftstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// A region snapshot carries the region's metadata and every key-value pair
// in its range, as of one applied index:
//
//	"HKVS2" | uvarint len(meta) | meta JSON
//	        | uvarint n | n × (index(8) | requestID(8))      the dedup table (dedup.go)
//	        | { uvarint len(k) | k | uvarint len(v) | v }*
//
// It is built from one bbolt read transaction, so the data and the applied
// index it is labelled with agree. The gRPC transport streams it in chunks.
var snapMagic = []byte("HKVS2")

// buildSnapshot reads the region's state in one transaction.
func (e *engine) buildSnapshot(regionID uint64) (raftpb.Snapshot, error) {
	var snap raftpb.Snapshot
	err := e.db.View(func(tx *bbolt.Tx) error {
		st := tx.Bucket(bucketRaftState)
		as, err := decodeApplyState(st.Get(stateKey(regionID, suffixApplyState)))
		if err != nil {
			return err
		}
		var r region.Region
		if err := json.Unmarshal(st.Get(stateKey(regionID, suffixRegion)), &r); err != nil {
			return fmt.Errorf("decode region meta: %w", err)
		}
		meta, _ := json.Marshal(r)
		var buf bytes.Buffer
		buf.Write(snapMagic)
		writeChunk(&buf, meta)
		dd := regionDedupTx(tx, regionID)
		var l [binary.MaxVarintLen64]byte
		buf.Write(l[:binary.PutUvarint(l[:], uint64(len(dd)))])
		for _, e := range dd {
			buf.Write(uint64Bytes(e.index))
			buf.Write(uint64Bytes(e.id))
		}
		c := tx.Bucket(bucketData).Cursor()
		for k, v := c.Seek(r.StartKey); k != nil && (len(r.EndKey) == 0 || bytes.Compare(k, r.EndKey) < 0); k, v = c.Next() {
			writeChunk(&buf, k)
			writeChunk(&buf, v)
		}
		snap.Data = buf.Bytes()
		snap.Metadata = raftpb.SnapshotMetadata{
			Index:     as.AppliedIndex,
			Term:      as.AppliedTerm,
			ConfState: confStateOf(r),
		}
		return nil
	})
	if err != nil {
		return raftpb.Snapshot{}, fmt.Errorf("build snapshot of region %d: %w", regionID, err)
	}
	return snap, nil
}

func writeChunk(buf *bytes.Buffer, b []byte) {
	var l [binary.MaxVarintLen64]byte
	buf.Write(l[:binary.PutUvarint(l[:], uint64(len(b)))])
	buf.Write(b)
}

func readChunk(b []byte) (chunk, rest []byte, err error) {
	n, w := binary.Uvarint(b)
	if w <= 0 || uint64(len(b)-w) < n {
		return nil, nil, fmt.Errorf("snapshot: truncated chunk: %w", errCorrupt)
	}
	return b[w : w+int(n)], b[w+int(n):], nil
}

// decodeSnapshotRegion returns the region metadata in snapshot data.
func decodeSnapshotRegion(data []byte) (region.Region, []byte, error) {
	if !bytes.HasPrefix(data, snapMagic) {
		return region.Region{}, nil, fmt.Errorf("snapshot: bad magic: %w", errCorrupt)
	}
	meta, rest, err := readChunk(data[len(snapMagic):])
	if err != nil {
		return region.Region{}, nil, err
	}
	var r region.Region
	if err := json.Unmarshal(meta, &r); err != nil {
		return region.Region{}, nil, fmt.Errorf("snapshot: decode region: %w", err)
	}
	return r, rest, nil
}

// applySnapshotTx replaces the region's data, log and state with the
// snapshot's, inside the loop's transaction.
func applySnapshotTx(tx *bbolt.Tx, snap raftpb.Snapshot) (region.Region, error) {
	r, rest, err := decodeSnapshotRegion(snap.Data)
	if err != nil {
		return region.Region{}, err
	}
	n, w := binary.Uvarint(rest)
	if w <= 0 || uint64(len(rest)-w) < n*16 {
		return region.Region{}, fmt.Errorf("snapshot: bad dedup table: %w", errCorrupt)
	}
	rest = rest[w:]
	dd := make([]dedupEntry, n)
	for i := range dd {
		dd[i] = dedupEntry{index: binary.BigEndian.Uint64(rest), id: binary.BigEndian.Uint64(rest[8:])}
		rest = rest[16:]
	}
	if err := replaceDedupTx(tx, r.ID, dd); err != nil {
		return region.Region{}, fmt.Errorf("region %d dedup table: %w", r.ID, err)
	}
	if err := deleteRange(tx, r.StartKey, r.EndKey); err != nil {
		return region.Region{}, fmt.Errorf("clear region %d data: %w", r.ID, err)
	}
	data := tx.Bucket(bucketData)
	for len(rest) > 0 {
		var k, v []byte
		if k, rest, err = readChunk(rest); err != nil {
			return region.Region{}, err
		}
		if v, rest, err = readChunk(rest); err != nil {
			return region.Region{}, err
		}
		if err := data.Put(k, v); err != nil {
			return region.Region{}, err
		}
	}
	if err := deleteLog(tx, r.ID, 0, ^uint64(0)); err != nil {
		return region.Region{}, fmt.Errorf("clear region %d log: %w", r.ID, err)
	}
	idx, term := snap.Metadata.Index, snap.Metadata.Term
	if err := putApplyState(tx, r.ID, applyState{AppliedIndex: idx, AppliedTerm: term, TruncatedIndex: idx, TruncatedTerm: term}); err != nil {
		return region.Region{}, err
	}
	return r, putRegion(tx, r)
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
