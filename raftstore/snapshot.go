package raftstore

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"

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

// buildSnapshot reads the region's state in one transaction and returns
// the whole snapshot in memory (tests, and a peerStorage with no
// streaming source: the store streams snapshots instead, snapstream.go).
func (e *engine) buildSnapshot(regionID uint64) (raftpb.Snapshot, error) {
	var snap raftpb.Snapshot
	err := e.db.View(func(tx *bbolt.Tx) error {
		md, r, err := snapshotMetaTx(tx, regionID)
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		if err := writeSnapshotTx(tx, r, &buf); err != nil {
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
func snapshotMetaTx(tx *bbolt.Tx, regionID uint64) (raftpb.SnapshotMetadata, region.Region, error) {
	st := tx.Bucket(bucketRaftState)
	as, err := decodeApplyState(st.Get(stateKey(regionID, suffixApplyState)))
	if err != nil {
		return raftpb.SnapshotMetadata{}, region.Region{}, err
	}
	var r region.Region
	if err := json.Unmarshal(st.Get(stateKey(regionID, suffixRegion)), &r); err != nil {
		return raftpb.SnapshotMetadata{}, region.Region{}, fmt.Errorf("decode region meta: %w", err)
	}
	md := raftpb.SnapshotMetadata{Index: as.AppliedIndex, Term: as.AppliedTerm, ConfState: confStateOf(r)}
	return md, r, nil
}

// writeSnapshotTx writes the snapshot of region r as of tx to w, in the
// format above, a key-value pair at a time: its memory is the dedup table
// and w's buffer, whatever the region's size.
func writeSnapshotTx(tx *bbolt.Tx, r region.Region, w io.Writer) error {
	h := crc32.New(snapCRC)
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), 64<<10)
	meta, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode region meta: %w", err)
	}
	bw.Write(snapMagic)
	writeChunk(bw, meta)
	dd, err := regionDedupTx(tx, r)
	if err != nil {
		return err
	}
	bw.Write(uint64Bytes(dedupBaseTx(tx, r.ID)))
	var l [binary.MaxVarintLen64]byte
	bw.Write(l[:binary.PutUvarint(l[:], uint64(len(dd)))])
	for _, d := range dd {
		bw.Write(uint64Bytes(d.clock))
		bw.Write(uint64Bytes(d.id))
		writeChunk(bw, d.key)
	}
	c := tx.Bucket(bucketData).Cursor()
	for k, v := c.Seek(r.StartKey); k != nil && (len(r.EndKey) == 0 || bytes.Compare(k, r.EndKey) < 0); k, v = c.Next() {
		writeChunk(bw, k)
		if err := writeChunk(bw, v); err != nil {
			return fmt.Errorf("write snapshot: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	if _, err := w.Write(binary.BigEndian.AppendUint32(nil, h.Sum32())); err != nil {
		return fmt.Errorf("write snapshot checksum: %w", err)
	}
	return nil
}

func writeChunk(w *bufio.Writer, b []byte) error {
	var l [binary.MaxVarintLen64]byte
	w.Write(l[:binary.PutUvarint(l[:], uint64(len(b)))])
	_, err := w.Write(b)
	return err
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

// Bounds the streaming decoder puts on what a snapshot's lengths may ask
// it to allocate: the region metadata, and one value (a write's value is
// bounded far lower, by the server and by raft's uncommitted-size limit).
const (
	maxSnapMetaLen  = 1 << 20
	maxSnapValueLen = 64 << 20
)

// snapStream reads a snapshot from a stream, checksumming what it consumes.
type snapStream struct {
	br *bufio.Reader
	h  hash.Hash32
	n  int64 // bytes consumed
}

func (s *snapStream) ReadByte() (byte, error) {
	b, err := s.br.ReadByte()
	if err != nil {
		return 0, truncated(err)
	}
	s.h.Write([]byte{b})
	s.n++
	return b, nil
}

// read reads exactly len(buf) bytes.
func (s *snapStream) read(buf []byte) error {
	if _, err := io.ReadFull(s.br, buf); err != nil {
		return truncated(err)
	}
	s.h.Write(buf)
	s.n += int64(len(buf))
	return nil
}

// chunk reads one length-prefixed chunk of at most limit bytes into buf's
// storage (grown if needed).
func (s *snapStream) chunk(buf []byte, limit uint64, what string) ([]byte, error) {
	n, err := binary.ReadUvarint(s)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %s length: %w", what, truncated(err))
	}
	if n > limit {
		return nil, fmt.Errorf("snapshot: %d-byte %s: %w", n, what, errCorrupt)
	}
	if uint64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	return buf, s.read(buf)
}

// truncated turns the end of the stream (or a bad varint) into errCorrupt;
// a read error of the stream itself stays what it is, wrapped.
func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, errCorrupt) {
		return fmt.Errorf("snapshot: truncated: %w", errCorrupt)
	}
	if err.Error() == "binary: varint overflows a 64-bit integer" {
		return fmt.Errorf("snapshot: bad varint: %w", errCorrupt)
	}
	return err
}

// decodeSnapshotStream checks and decodes a snapshot read from r, with the
// same rules as decodeSnapshotData, in bounded memory: header gets the
// metadata and the dedup table (kvs empty), then kv every pair in order
// (k and v are reused by the next call: copy to keep). The checksum is
// verified only at the end: a caller that writes as it goes must discard
// what it wrote on any error (the Ready loop's transaction rolls back).
// It never panics on bad input.
func decodeSnapshotStream(r io.Reader, header func(*snapshotData) error, kv func(k, v []byte) error) error {
	s := &snapStream{br: bufio.NewReaderSize(r, 256<<10), h: crc32.New(snapCRC)}
	magic := make([]byte, len(snapMagic))
	if err := s.read(magic); err != nil || !bytes.Equal(magic, snapMagic) {
		return fmt.Errorf("snapshot: bad magic: %w", errCorrupt)
	}
	var sd snapshotData
	meta, err := s.chunk(nil, maxSnapMetaLen, "region meta")
	if err != nil {
		return err
	}
	if err := json.Unmarshal(meta, &sd.region); err != nil {
		return fmt.Errorf("snapshot: decode region: %v: %w", err, errCorrupt)
	}
	rg := &sd.region
	var b8 [8]byte
	if err := s.read(b8[:]); err != nil {
		return fmt.Errorf("snapshot: no dedup clock base: %w", errCorrupt)
	}
	sd.dedupBase = binary.BigEndian.Uint64(b8[:])
	n, err := binary.ReadUvarint(s)
	if err != nil {
		return fmt.Errorf("snapshot: bad dedup table: %w", errCorrupt)
	}
	sd.dedup = make([]dedupRecord, 0, min(n, 1024))
	for range n {
		var rec [16]byte
		if err := s.read(rec[:]); err != nil {
			return fmt.Errorf("snapshot: truncated dedup record: %w", errCorrupt)
		}
		d := dedupRecord{clock: binary.BigEndian.Uint64(rec[:]), id: binary.BigEndian.Uint64(rec[8:])}
		if d.key, err = s.chunk(nil, bbolt.MaxKeySize, "dedup record key"); err != nil {
			return err
		}
		if !rg.Contains(d.key) || len(d.key) == 0 {
			return fmt.Errorf("snapshot: dedup record key %q outside region %d: %w", d.key, rg.ID, errCorrupt)
		}
		if !dedupKeyFits(d.key) {
			return fmt.Errorf("snapshot: dedup record of a %d-byte key: %w", len(d.key), errCorrupt)
		}
		if k := len(sd.dedup); k > 0 && compareDedup(sd.dedup[k-1], d) >= 0 {
			return fmt.Errorf("snapshot: dedup record %v out of order: %w", d, errCorrupt)
		}
		sd.dedup = append(sd.dedup, d)
	}
	if err := header(&sd); err != nil {
		return err
	}
	var k, v []byte
	for {
		// A pair takes at least 2 bytes and the checksum 4: fewer than 5
		// left means the checksum is next.
		next, err := s.br.Peek(5)
		if len(next) < 5 {
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("snapshot: read: %w", err)
			}
			if len(next) != 4 {
				return fmt.Errorf("snapshot: truncated checksum: %w", errCorrupt)
			}
			if s.h.Sum32() != binary.BigEndian.Uint32(next) {
				return fmt.Errorf("snapshot: checksum mismatch: %w", errCorrupt)
			}
			return nil
		}
		if k, err = s.chunk(k, bbolt.MaxKeySize, "key"); err != nil {
			return err
		}
		if v, err = s.chunk(v, maxSnapValueLen, "value"); err != nil {
			return err
		}
		if !rg.Contains(k) {
			return fmt.Errorf("snapshot: key %q outside region %d: %w", k, rg.ID, errCorrupt)
		}
		if len(k) == 0 {
			return fmt.Errorf("snapshot: pair of %d-byte key, %d-byte value cannot be stored: %w", len(k), len(v), errCorrupt)
		}
		if err := kv(k, v); err != nil {
			return err
		}
	}
}

// applySnapshotStreamTx is applySnapshotTx for a snapshot read from r (a
// file received whole before raft saw it), a pair at a time.
func applySnapshotStreamTx(tx *bbolt.Tx, md raftpb.SnapshotMetadata, r io.Reader) (region.Region, error) {
	var rg region.Region
	data := tx.Bucket(bucketData)
	var arena []byte
	err := decodeSnapshotStream(r, func(sd *snapshotData) error {
		rg = sd.region
		if err := replaceDedupTx(tx, rg, sd.dedup); err != nil {
			return fmt.Errorf("region %d dedup table: %w", rg.ID, err)
		}
		if err := putDedupBaseTx(tx, rg.ID, sd.dedupBase); err != nil {
			return fmt.Errorf("region %d dedup clock: %w", rg.ID, err)
		}
		if err := deleteRange(tx, rg.StartKey, rg.EndKey); err != nil {
			return fmt.Errorf("clear region %d data: %w", rg.ID, err)
		}
		return nil
	}, func(k, v []byte) error {
		// bbolt keeps the slices it is given until commit: copy them, in
		// slabs rather than a pair at a time.
		if n := len(k) + len(v); cap(arena)-len(arena) < n {
			arena = make([]byte, 0, max(n, 1<<20))
		}
		arena = append(arena, k...)
		kc := arena[len(arena)-len(k):]
		arena = append(arena, v...)
		vc := arena[len(arena)-len(v):]
		return data.Put(kc, vc)
	})
	if err != nil {
		return region.Region{}, err
	}
	if err := deleteLog(tx, rg.ID, 0, ^uint64(0)); err != nil {
		return region.Region{}, fmt.Errorf("clear region %d log: %w", rg.ID, err)
	}
	idx, term := md.Index, md.Term
	if err := putApplyState(tx, rg.ID, applyState{AppliedIndex: idx, AppliedTerm: term, TruncatedIndex: idx, TruncatedTerm: term}); err != nil {
		return region.Region{}, err
	}
	return rg, putRegion(tx, rg)
}
