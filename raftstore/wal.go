package raftstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.etcd.io/raft/v3/raftpb"
)

// The round log (WAL): one append-only log per store, shared by every
// region. Each Ready round that persists raft state appends ONE record
// holding, for every region that has any, its new entries, its hard state
// and whether it installs a snapshot, then fdatasyncs once. That fsync is
// what makes a round's raft promises durable (docs/design.md, "The write
// path"); the bbolt transaction that follows it is committed without an
// fsync and made durable by the next checkpoint (engine.go), after which
// the records it covers are dropped with their segment files.
//
// A segment is a file <first seq>.wal of records
//
//	length(4, big endian) | crc32c(payload)(4) | payload
//
// and a payload is
//
//	seq | n | n × (regionID | flags | [hard state] | [snapshot index | term] | m | m × entry)
//
// with every integer a uvarint and every message a uvarint length and its
// protobuf bytes. Appends go to a segment opened fresh at open (and after a
// failed write), never after a record that may be torn. Reading a segment
// stops at its first record that is short or fails its checksum (the tail a
// crash left): every later record is in a later segment.
type wal struct {
	dir    string
	noSync bool
	f      *os.File
	w      *bufio.Writer
	first  uint64 // first seq of the current segment
	size   int64  // bytes in the current segment
	seq    uint64 // the last seq handed out
	broken error  // a write failed: nothing is appended until reset
	buf    []byte
}

// walItem is one region's part of a round.
type walItem struct {
	regionID  uint64
	hard      *raftpb.HardState
	snap      bool // the round installs a snapshot at snapIndex
	snapIndex uint64
	snapTerm  uint64
	entries   []raftpb.Entry
	// mustSync: the item holds what a promise rests on (entries, a vote
	// or term change, a snapshot; raft's Ready.MustSync), so its record is
	// fdatasynced. A record of commit indexes alone is only written: a
	// commit index lost in a power loss is learned again from the leader
	// (etcd syncs the same way). Not encoded.
	mustSync bool
}

type walRecord struct {
	seq   uint64
	items []walItem
}

const (
	walFlagHard = 1 << iota
	walFlagSnap
)

var walCRC = crc32.MakeTable(crc32.Castagnoli)

// walSegmentMax: a checkpoint starts a new segment once the current one
// holds this much (the covered ones are deleted).
const walSegmentMax = 16 << 20

func segmentName(first uint64) string { return fmt.Sprintf("%020d.wal", first) }

func listSegments(dir string) ([]uint64, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var firsts []uint64
	for _, de := range des {
		name, ok := strings.CutSuffix(de.Name(), ".wal")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			continue
		}
		firsts = append(firsts, n)
	}
	slices.Sort(firsts)
	return firsts, nil
}

// openWAL reads every record in dir (creating it if need be) and opens a
// new segment for appends after the last one.
func openWAL(dir string, noSync bool) (*wal, []walRecord, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("create wal dir: %w", err)
	}
	firsts, err := listSegments(dir)
	if err != nil {
		return nil, nil, err
	}
	w := &wal{dir: dir, noSync: noSync}
	var recs []walRecord
	for _, first := range firsts {
		seg, err := readSegment(filepath.Join(dir, segmentName(first)))
		if err != nil {
			return nil, nil, err
		}
		for _, r := range seg {
			if r.seq <= w.seq {
				return nil, nil, fmt.Errorf("wal: record %d after %d in %s: %w", r.seq, w.seq, segmentName(first), errCorrupt)
			}
			w.seq = r.seq
		}
		recs = append(recs, seg...)
		if first > w.seq {
			w.seq = first - 1 // an empty segment still says where seqs went on from
		}
	}
	if err := w.startSegment(); err != nil {
		return nil, nil, err
	}
	return w, recs, nil
}

// readSegment returns the segment's records up to the first torn one.
func readSegment(path string) ([]walRecord, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []walRecord
	for len(data) >= 8 {
		n := binary.BigEndian.Uint32(data)
		sum := binary.BigEndian.Uint32(data[4:])
		if n == 0 || uint64(n) > uint64(len(data)-8) {
			break
		}
		payload := data[8 : 8+n]
		if crc32.Checksum(payload, walCRC) != sum {
			break
		}
		r, err := decodeWALRecord(payload)
		if err != nil {
			return nil, fmt.Errorf("wal %s: %w", filepath.Base(path), err)
		}
		out = append(out, r)
		data = data[8+n:]
	}
	return out, nil
}

func (w *wal) startSegment() error {
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
	w.first = w.seq + 1
	f, err := os.OpenFile(filepath.Join(w.dir, segmentName(w.first)), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("wal: create segment: %w", err)
	}
	if err := w.syncDir(); err != nil {
		f.Close()
		return err
	}
	w.f, w.size = f, 0
	if w.w == nil {
		w.w = bufio.NewWriterSize(f, 256<<10)
	} else {
		w.w.Reset(f)
	}
	return nil
}

func (w *wal) syncDir() error {
	if err := syncDir(w.dir, w.noSync); err != nil {
		return fmt.Errorf("wal: sync dir: %w", err)
	}
	return nil
}

// append writes items as the next record and syncs it. It returns the
// record's seq.
func (w *wal) append(items []walItem) (uint64, error) {
	seq, err := w.encode(items)
	if err != nil {
		return 0, err
	}
	return seq, w.writeEncoded(true)
}

// encode makes items the next record (seq returned); writeEncoded then
// writes it (and syncs it if sync), and may run on another goroutine
// meanwhile, as long as nothing else touches the wal until it returns.
func (w *wal) encode(items []walItem) (uint64, error) {
	if w.broken != nil {
		return 0, w.broken
	}
	var err error
	if w.buf, err = encodeWALRecord(w.buf[:0], w.seq+1, items); err != nil {
		return 0, err
	}
	w.seq++
	return w.seq, nil
}

func (w *wal) writeEncoded(sync bool) error {
	if err := w.write(w.buf, sync); err != nil {
		w.broken = fmt.Errorf("wal: %w", err)
		return w.broken
	}
	return nil
}

func (w *wal) write(payload []byte, sync bool) error {
	var hdr [8]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(payload)))
	binary.BigEndian.PutUint32(hdr[4:], crc32.Checksum(payload, walCRC))
	if _, err := w.w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := w.w.Write(payload); err != nil {
		return err
	}
	if err := w.w.Flush(); err != nil {
		return err
	}
	w.size += int64(len(payload)) + 8
	if w.noSync || !sync {
		return nil
	}
	return fdatasyncFile(w.f)
}

// truncate drops the segments whose every record is at most covered (a
// checkpoint made them durable in bbolt). A new segment starts first if
// the current one grew past walSegmentMax or a write failed in it (its
// records stay until a later checkpoint covers them).
func (w *wal) truncate(covered uint64) error {
	if w.broken != nil || w.size >= walSegmentMax {
		w.broken = nil
		if err := w.startSegment(); err != nil {
			w.broken = err
			return err
		}
	}
	firsts, err := listSegments(w.dir)
	if err != nil {
		return err
	}
	for i, first := range firsts {
		// Every record of segment i is below the next segment's first.
		if first >= w.first || i+1 >= len(firsts) || firsts[i+1] > covered+1 {
			break
		}
		if err := os.Remove(filepath.Join(w.dir, segmentName(first))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

func (w *wal) close() error {
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

func encodeWALRecord(b []byte, seq uint64, items []walItem) ([]byte, error) {
	b = binary.AppendUvarint(b, seq)
	b = binary.AppendUvarint(b, uint64(len(items)))
	for i := range items {
		it := &items[i]
		b = binary.AppendUvarint(b, it.regionID)
		var flags byte
		if it.hard != nil {
			flags |= walFlagHard
		}
		if it.snap {
			flags |= walFlagSnap
		}
		b = append(b, flags)
		if it.hard != nil {
			b = binary.AppendUvarint(b, uint64(it.hard.Size()))
			n := len(b)
			b = slices.Grow(b, it.hard.Size())[:n+it.hard.Size()]
			if _, err := it.hard.MarshalToSizedBuffer(b[n:]); err != nil {
				return nil, err
			}
		}
		if it.snap {
			b = binary.AppendUvarint(b, it.snapIndex)
			b = binary.AppendUvarint(b, it.snapTerm)
		}
		b = binary.AppendUvarint(b, uint64(len(it.entries)))
		for j := range it.entries {
			e := &it.entries[j]
			sz := e.Size()
			b = binary.AppendUvarint(b, uint64(sz))
			n := len(b)
			b = slices.Grow(b, sz)[:n+sz]
			if _, err := e.MarshalToSizedBuffer(b[n:]); err != nil {
				return nil, err
			}
		}
	}
	return b, nil
}

var errWALShort = fmt.Errorf("wal record: %w", io.ErrUnexpectedEOF)

func decodeWALRecord(b []byte) (walRecord, error) {
	var r walRecord
	uv := func() (uint64, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, errWALShort
		}
		b = b[n:]
		return v, nil
	}
	msg := func() ([]byte, error) {
		n, err := uv()
		if err != nil {
			return nil, err
		}
		if n > uint64(len(b)) {
			return nil, errWALShort
		}
		m := b[:n]
		b = b[n:]
		return m, nil
	}
	var err error
	if r.seq, err = uv(); err != nil {
		return r, err
	}
	n, err := uv()
	if err != nil {
		return r, err
	}
	for range n {
		var it walItem
		if it.regionID, err = uv(); err != nil {
			return r, err
		}
		if len(b) == 0 {
			return r, errWALShort
		}
		flags := b[0]
		b = b[1:]
		if flags&walFlagHard != 0 {
			m, err := msg()
			if err != nil {
				return r, err
			}
			it.hard = new(raftpb.HardState)
			if err := it.hard.Unmarshal(m); err != nil {
				return r, fmt.Errorf("wal record: hard state: %w", err)
			}
		}
		if flags&walFlagSnap != 0 {
			it.snap = true
			if it.snapIndex, err = uv(); err != nil {
				return r, err
			}
			if it.snapTerm, err = uv(); err != nil {
				return r, err
			}
		}
		ne, err := uv()
		if err != nil {
			return r, err
		}
		if ne > uint64(len(b)) {
			return r, errWALShort
		}
		if ne > 0 {
			it.entries = make([]raftpb.Entry, ne)
		}
		for j := range it.entries {
			m, err := msg()
			if err != nil {
				return r, err
			}
			if err := it.entries[j].Unmarshal(m); err != nil {
				return r, fmt.Errorf("wal record: entry: %w", err)
			}
		}
		r.items = append(r.items, it)
	}
	if len(b) != 0 {
		return r, fmt.Errorf("wal record: %d trailing bytes: %w", len(b), errCorrupt)
	}
	return r, nil
}
