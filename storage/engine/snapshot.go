package engine

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"

	"go.etcd.io/bbolt"
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
// a region's own log, or "HKVS2", whose has no keys) is ErrCorrupt.
var snapMagic = []byte("HKVS4")

var snapCRC = crc32.MakeTable(crc32.Castagnoli)

// writeSnapshotTx writes the snapshot of region r as of tx to w, in the
// format above, a key-value pair at a time: its memory is the dedup table
// and w's buffer, whatever the region's size.
func writeSnapshotTx(tx *bbolt.Tx, meta []byte, w io.Writer) error {
	r, err := DecodeSpan(meta)
	if err != nil {
		return err
	}
	h := crc32.New(snapCRC)
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), 64<<10)
	bw.Write(snapMagic)
	writeChunk(bw, meta)
	dd, err := rangeDedupTx(tx, r.StartKey, r.EndKey)
	if err != nil {
		return err
	}
	bw.Write(uint64Bytes(dedupBaseTx(tx, r.ID)))
	var l [binary.MaxVarintLen64]byte
	bw.Write(l[:binary.PutUvarint(l[:], uint64(len(dd)))])
	for _, d := range dd {
		bw.Write(uint64Bytes(d.Clock))
		bw.Write(uint64Bytes(d.ID))
		writeChunk(bw, d.Key)
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
		return nil, nil, fmt.Errorf("snapshot: truncated chunk: %w", ErrCorrupt)
	}
	return b[w : w+int(n)], b[w+int(n):], nil
}

// snapshotData is a decoded snapshot. kvs is the validated key-value
// section, walked with forEachKV.
type snapshotData struct {
	meta      []byte // the region's metadata
	span      Span   // read from meta
	dedupBase uint64
	dedup     []DedupRecord
	kvs       []byte
}

// decodeSnapshotData checks and decodes the whole snapshot; it never
// panics on bad input. Record keys and kvs alias data.
func decodeSnapshotData(data []byte) (snapshotData, error) {
	var sd snapshotData
	if len(data) < len(snapMagic)+4 || !bytes.HasPrefix(data, snapMagic) {
		return sd, fmt.Errorf("snapshot: bad magic: %w", ErrCorrupt)
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, snapCRC) != binary.BigEndian.Uint32(data[len(body):]) {
		return sd, fmt.Errorf("snapshot: checksum mismatch: %w", ErrCorrupt)
	}
	meta, rest, err := readChunk(body[len(snapMagic):])
	if err != nil {
		return sd, err
	}
	if sd.span, err = DecodeSpan(meta); err != nil {
		return sd, fmt.Errorf("snapshot: %w", err)
	}
	sd.meta = meta
	r := &sd.span
	if len(rest) < 8 {
		return sd, fmt.Errorf("snapshot: no dedup clock base: %w", ErrCorrupt)
	}
	sd.dedupBase, rest = binary.BigEndian.Uint64(rest), rest[8:]
	n, w := binary.Uvarint(rest)
	// A record takes at least 17 bytes: bound n before allocating for it.
	if w <= 0 || n > uint64(len(rest)-w)/17 {
		return sd, fmt.Errorf("snapshot: bad dedup table: %w", ErrCorrupt)
	}
	rest = rest[w:]
	sd.dedup = make([]DedupRecord, 0, n)
	for range n {
		if len(rest) < 16 {
			return sd, fmt.Errorf("snapshot: truncated dedup record: %w", ErrCorrupt)
		}
		d := DedupRecord{Clock: binary.BigEndian.Uint64(rest), ID: binary.BigEndian.Uint64(rest[8:])}
		if d.Key, rest, err = readChunk(rest[16:]); err != nil {
			return sd, err
		}
		if !r.Contains(d.Key) || len(d.Key) == 0 {
			return sd, fmt.Errorf("snapshot: dedup record key %q outside region %d: %w", d.Key, r.ID, ErrCorrupt)
		}
		if !dedupKeyFits(d.Key) { // never remembered, so never sent
			return sd, fmt.Errorf("snapshot: dedup record of a %d-byte key: %w", len(d.Key), ErrCorrupt)
		}
		if k := len(sd.dedup); k > 0 && compareDedup(sd.dedup[k-1], d) >= 0 {
			return sd, fmt.Errorf("snapshot: dedup record %v out of order: %w", d, ErrCorrupt)
		}
		sd.dedup = append(sd.dedup, d)
	}
	sd.kvs = rest
	err = forEachKV(rest, func(k, v []byte) error {
		if !r.Contains(k) {
			return fmt.Errorf("snapshot: key %q outside region %d: %w", k, r.ID, ErrCorrupt)
		}
		// A pair bbolt cannot store (an empty key, in a region starting at
		// -inf; an oversized key or value) would fail the apply in the
		// Ready loop and stop the store: refuse it here (FuzzSnapshotApply
		// checks it).
		if len(k) == 0 || len(k) > bbolt.MaxKeySize || len(v) > bbolt.MaxValueSize {
			return fmt.Errorf("snapshot: pair of %d-byte key, %d-byte value cannot be stored: %w", len(k), len(v), ErrCorrupt)
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

// DecodeSnapshot checks snapshot data (every rule of the format) and
// returns the region metadata it carries.
func DecodeSnapshot(data []byte) ([]byte, error) {
	sd, err := decodeSnapshotData(data)
	if err != nil {
		return nil, err
	}
	return sd.meta, nil
}

// applySnapshotTx replaces the region's data, dedup table, log and state
// with the snapshot's, as of index and term, and returns its metadata.
func applySnapshotTx(tx *bbolt.Tx, data []byte, index, term uint64) ([]byte, error) {
	sd, err := decodeSnapshotData(data)
	if err != nil {
		return nil, err
	}
	if err := clearForSnapshotTx(tx, &sd); err != nil {
		return nil, err
	}
	b := tx.Bucket(bucketData)
	if err := forEachKV(sd.kvs, b.Put); err != nil {
		return nil, err
	}
	return sd.meta, finishSnapshotTx(tx, sd.span.ID, sd.meta, index, term)
}

// clearForSnapshotTx is a snapshot apply's first step: the region's range
// of data and dedup records replaced by the snapshot's records, its clock
// base set.
func clearForSnapshotTx(tx *bbolt.Tx, sd *snapshotData) error {
	r := sd.span
	if err := replaceDedupTx(tx, r, sd.dedup); err != nil {
		return fmt.Errorf("region %d dedup table: %w", r.ID, err)
	}
	if err := putDedupBaseTx(tx, r.ID, sd.dedupBase); err != nil {
		return fmt.Errorf("region %d dedup clock: %w", r.ID, err)
	}
	if err := deleteRange(tx, r.StartKey, r.EndKey); err != nil {
		return fmt.Errorf("clear region %d data: %w", r.ID, err)
	}
	return nil
}

// finishSnapshotTx is a snapshot apply's last step: the region's log
// emptied, its apply state at the snapshot, its metadata the snapshot's.
func finishSnapshotTx(tx *bbolt.Tx, regionID uint64, meta []byte, index, term uint64) error {
	if err := deleteLog(tx, regionID, 0, ^uint64(0)); err != nil {
		return fmt.Errorf("clear region %d log: %w", regionID, err)
	}
	if err := putApplyState(tx, regionID, ApplyState{AppliedIndex: index, AppliedTerm: term, TruncatedIndex: index, TruncatedTerm: term}); err != nil {
		return err
	}
	return putRegionMeta(tx, regionID, meta)
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
		return nil, fmt.Errorf("snapshot: %d-byte %s: %w", n, what, ErrCorrupt)
	}
	if uint64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	return buf, s.read(buf)
}

// truncated turns the end of the stream (or a bad varint) into ErrCorrupt;
// a read error of the stream itself stays what it is, wrapped.
func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrCorrupt) {
		return fmt.Errorf("snapshot: truncated: %w", ErrCorrupt)
	}
	if err.Error() == "binary: varint overflows a 64-bit integer" {
		return fmt.Errorf("snapshot: bad varint: %w", ErrCorrupt)
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
		return fmt.Errorf("snapshot: bad magic: %w", ErrCorrupt)
	}
	var sd snapshotData
	meta, err := s.chunk(nil, maxSnapMetaLen, "region meta")
	if err != nil {
		return err
	}
	if sd.span, err = DecodeSpan(meta); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	sd.meta = bytes.Clone(meta)
	rg := &sd.span
	var b8 [8]byte
	if err := s.read(b8[:]); err != nil {
		return fmt.Errorf("snapshot: no dedup clock base: %w", ErrCorrupt)
	}
	sd.dedupBase = binary.BigEndian.Uint64(b8[:])
	n, err := binary.ReadUvarint(s)
	if err != nil {
		return fmt.Errorf("snapshot: bad dedup table: %w", ErrCorrupt)
	}
	sd.dedup = make([]DedupRecord, 0, min(n, 1024))
	for range n {
		var rec [16]byte
		if err := s.read(rec[:]); err != nil {
			return fmt.Errorf("snapshot: truncated dedup record: %w", ErrCorrupt)
		}
		d := DedupRecord{Clock: binary.BigEndian.Uint64(rec[:]), ID: binary.BigEndian.Uint64(rec[8:])}
		if d.Key, err = s.chunk(nil, bbolt.MaxKeySize, "dedup record key"); err != nil {
			return err
		}
		if !rg.Contains(d.Key) || len(d.Key) == 0 {
			return fmt.Errorf("snapshot: dedup record key %q outside region %d: %w", d.Key, rg.ID, ErrCorrupt)
		}
		if !dedupKeyFits(d.Key) {
			return fmt.Errorf("snapshot: dedup record of a %d-byte key: %w", len(d.Key), ErrCorrupt)
		}
		if k := len(sd.dedup); k > 0 && compareDedup(sd.dedup[k-1], d) >= 0 {
			return fmt.Errorf("snapshot: dedup record %v out of order: %w", d, ErrCorrupt)
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
				return fmt.Errorf("snapshot: truncated checksum: %w", ErrCorrupt)
			}
			if s.h.Sum32() != binary.BigEndian.Uint32(next) {
				return fmt.Errorf("snapshot: checksum mismatch: %w", ErrCorrupt)
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
			return fmt.Errorf("snapshot: key %q outside region %d: %w", k, rg.ID, ErrCorrupt)
		}
		if len(k) == 0 {
			return fmt.Errorf("snapshot: pair of %d-byte key, %d-byte value cannot be stored: %w", len(k), len(v), ErrCorrupt)
		}
		if err := kv(k, v); err != nil {
			return err
		}
	}
}

// applySnapshotStreamTx is applySnapshotTx for a snapshot read from r (a
// file received whole before raft saw it), a pair at a time.
func applySnapshotStreamTx(tx *bbolt.Tx, r io.Reader, index, term uint64) ([]byte, error) {
	var sd snapshotData
	b := tx.Bucket(bucketData)
	var arena []byte
	err := decodeSnapshotStream(r, func(h *snapshotData) error {
		sd = *h
		return clearForSnapshotTx(tx, &sd)
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
		return b.Put(kc, vc)
	})
	if err != nil {
		return nil, err
	}
	return sd.meta, finishSnapshotTx(tx, sd.span.ID, sd.meta, index, term)
}
