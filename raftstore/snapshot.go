package raftstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// A region snapshot carries the region's metadata, its dedup clock base
// and records and every key-value pair in its range, as of one applied
// index:
//
//	"HKVS4" | uvarint len(meta) | meta JSON
//	        | base(8) | uvarint n | n × (clock(8) | requestID(8) | uvarint len(key) | key)   the dedup table (dedup.go)
//	        | { uvarint len(k) | k | uvarint len(v) | v }*
//	        | crc32c(4) of all that precedes it
//
// The dedup records are those of the region's range, in strictly
// increasing (key, request ID) order, so that the receiver inserts them
// sorted.
//
// It is built from one bbolt read transaction, so the data and the applied
// index it is labelled with agree. The gRPC transport streams it in chunks.
// The decoder is strict: anything but a whole, well-formed snapshot of the
// current format (truncated, bit-flipped, keys outside the region, records
// out of order, an older format such as "HKVS3", whose dedup table counts
// a region's own log, or "HKVS2", whose has no keys) is errCorrupt.
var snapMagic = []byte("HKVS4")

var snapCRC = crc32.MakeTable(crc32.Castagnoli)

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
		dd, err := regionDedupTx(tx, r)
		if err != nil {
			return err
		}
		buf.Write(uint64Bytes(dedupBaseTx(tx, regionID)))
		var l [binary.MaxVarintLen64]byte
		buf.Write(l[:binary.PutUvarint(l[:], uint64(len(dd)))])
		for _, d := range dd {
			buf.Write(uint64Bytes(d.clock))
			buf.Write(uint64Bytes(d.id))
			writeChunk(&buf, d.key)
		}
		c := tx.Bucket(bucketData).Cursor()
		for k, v := c.Seek(r.StartKey); k != nil && (len(r.EndKey) == 0 || bytes.Compare(k, r.EndKey) < 0); k, v = c.Next() {
			writeChunk(&buf, k)
			writeChunk(&buf, v)
		}
		snap.Data = binary.BigEndian.AppendUint32(buf.Bytes(), crc32.Checksum(buf.Bytes(), snapCRC))
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

// snapshotData is a decoded snapshot. kvs is the validated key-value
// section, walked with forEachKV.
type snapshotData struct {
	region    region.Region
	dedupBase uint64
	dedup     []dedupRecord
	kvs       []byte
}

// decodeSnapshotData checks and decodes the whole snapshot; it never
// panics on bad input. Record keys and kvs alias data.
func decodeSnapshotData(data []byte) (snapshotData, error) {
	var sd snapshotData
	if len(data) < len(snapMagic)+4 || !bytes.HasPrefix(data, snapMagic) {
		return sd, fmt.Errorf("snapshot: bad magic: %w", errCorrupt)
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, snapCRC) != binary.BigEndian.Uint32(data[len(body):]) {
		return sd, fmt.Errorf("snapshot: checksum mismatch: %w", errCorrupt)
	}
	meta, rest, err := readChunk(body[len(snapMagic):])
	if err != nil {
		return sd, err
	}
	if err := json.Unmarshal(meta, &sd.region); err != nil {
		return sd, fmt.Errorf("snapshot: decode region: %v: %w", err, errCorrupt)
	}
	r := &sd.region
	if len(rest) < 8 {
		return sd, fmt.Errorf("snapshot: no dedup clock base: %w", errCorrupt)
	}
	sd.dedupBase, rest = binary.BigEndian.Uint64(rest), rest[8:]
	n, w := binary.Uvarint(rest)
	// A record takes at least 17 bytes: bound n before allocating for it.
	if w <= 0 || n > uint64(len(rest)-w)/17 {
		return sd, fmt.Errorf("snapshot: bad dedup table: %w", errCorrupt)
	}
	rest = rest[w:]
	sd.dedup = make([]dedupRecord, 0, n)
	for range n {
		if len(rest) < 16 {
			return sd, fmt.Errorf("snapshot: truncated dedup record: %w", errCorrupt)
		}
		d := dedupRecord{clock: binary.BigEndian.Uint64(rest), id: binary.BigEndian.Uint64(rest[8:])}
		if d.key, rest, err = readChunk(rest[16:]); err != nil {
			return sd, err
		}
		if !r.Contains(d.key) || len(d.key) == 0 {
			return sd, fmt.Errorf("snapshot: dedup record key %q outside region %d: %w", d.key, r.ID, errCorrupt)
		}
		if !dedupKeyFits(d.key) { // never remembered, so never sent
			return sd, fmt.Errorf("snapshot: dedup record of a %d-byte key: %w", len(d.key), errCorrupt)
		}
		if k := len(sd.dedup); k > 0 && compareDedup(sd.dedup[k-1], d) >= 0 {
			return sd, fmt.Errorf("snapshot: dedup record %v out of order: %w", d, errCorrupt)
		}
		sd.dedup = append(sd.dedup, d)
	}
	sd.kvs = rest
	err = forEachKV(rest, func(k, v []byte) error {
		if !r.Contains(k) {
			return fmt.Errorf("snapshot: key %q outside region %d: %w", k, r.ID, errCorrupt)
		}
		// A pair bbolt cannot store (an empty key, in a region starting at
		// -inf; an oversized key or value) would fail the apply in the
		// Ready loop and stop the store: refuse it here (FuzzSnapshotApply
		// checks it).
		if len(k) == 0 || len(k) > bbolt.MaxKeySize || len(v) > bbolt.MaxValueSize {
			return fmt.Errorf("snapshot: pair of %d-byte key, %d-byte value cannot be stored: %w", len(k), len(v), errCorrupt)
		}
		return nil
	})
	return sd, err
}

// forEachKV walks a snapshot's key-value section.
func forEachKV(b []byte, fn func(k, v []byte) error) error {
	for len(b) > 0 {
		var k, v []byte
		var err error
		if k, b, err = readChunk(b); err != nil {
			return err
		}
		if v, b, err = readChunk(b); err != nil {
			return err
		}
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}

// decodeSnapshotRegion checks snapshot data and returns the region
// metadata it carries.
func decodeSnapshotRegion(data []byte) (region.Region, []byte, error) {
	sd, err := decodeSnapshotData(data)
	if err != nil {
		return region.Region{}, nil, err
	}
	return sd.region, sd.kvs, nil
}

// applySnapshotTx replaces the region's data, dedup table, log and state
// with the snapshot's, inside the loop's transaction.
func applySnapshotTx(tx *bbolt.Tx, snap raftpb.Snapshot) (region.Region, error) {
	sd, err := decodeSnapshotData(snap.Data)
	if err != nil {
		return region.Region{}, err
	}
	r := sd.region
	if err := replaceDedupTx(tx, r, sd.dedup); err != nil {
		return region.Region{}, fmt.Errorf("region %d dedup table: %w", r.ID, err)
	}
	if err := putDedupBaseTx(tx, r.ID, sd.dedupBase); err != nil {
		return region.Region{}, fmt.Errorf("region %d dedup clock: %w", r.ID, err)
	}
	if err := deleteRange(tx, r.StartKey, r.EndKey); err != nil {
		return region.Region{}, fmt.Errorf("clear region %d data: %w", r.ID, err)
	}
	data := tx.Bucket(bucketData)
	if err := forEachKV(sd.kvs, data.Put); err != nil {
		return region.Region{}, err
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
