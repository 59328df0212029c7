// Package wal is the round log: one append-only log per store, shared by
// every region. Each Ready round that persists raft state appends ONE
// record holding, for every region that has any, its new entries, its hard
// state and whether it installs a snapshot. A record that holds what a
// promise rests on (entries, a vote or term change, a snapshot: raft's
// Ready.MustSync) is fdatasynced before the round sends anything; a record
// of commit indexes alone is only written (a commit index lost in a power
// loss is learned again from the leader, as etcd's WAL does). The engine
// above makes the state machine durable at checkpoints and then drops the
// segments a checkpoint covers (Truncate).
//
// # Format
//
// A segment is a file <first seq>.wal of records
//
//	flags|length (4, big endian; top bit: the record was synced) | crc32c(payload) (4) | payload
//
// and a payload is
//
//	seq | n | n × (regionID | flags | [hard state] | [snapshot index | term] | m | m × entry)
//
// with every integer a uvarint and every message a uvarint length and its
// protobuf bytes.
//
// # What a power loss may leave, and what Open accepts
//
//   - Seqs are contiguous within a segment, starting at the segment's
//     first. A segment is fdatasynced before the next one is created, so
//     only the LAST segment can end in damage a power loss left.
//   - A damaged record (short, bad checksum) is a torn tail only if no
//     record after it in that segment carries the synced flag: a synced
//     record's fdatasync made every byte before it durable, so damage
//     before one is corruption, and Open fails naming the file and the
//     offset (etcd's WAL and raft-engine refuse the same). A torn tail is
//     cut off and the segment synced before anything is appended.
//   - The engine's checkpoint may cover records a power loss then took
//     (an unsynced commit-only record the checkpoint's bbolt state already
//     holds): Options.Covered is that checkpoint's seq, and Open hands out
//     seqs after it whatever the segments hold, so no record of the new
//     incarnation reuses a seq that replay would skip. Every record after
//     Covered must be there, in order.
package wal

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

	"github.com/hedgekv/hedgekv/storage/vfs"
)

// ErrCorrupt marks data that is damaged where no crash could have left it.
var ErrCorrupt = errors.New("corrupt data")

// Item is one region's part of a round.
type Item struct {
	RegionID  uint64
	Hard      *raftpb.HardState
	Snap      bool // the round installs a snapshot at SnapIndex
	SnapIndex uint64
	SnapTerm  uint64
	Entries   []raftpb.Entry
	// MustSync: the item holds what a promise rests on, so its record is
	// fdatasynced (see the package comment). Not encoded.
	MustSync bool
}

// Record is one round's record.
type Record struct {
	Seq   uint64
	Items []Item
}

// Options configure Open.
type Options struct {
	FS vfs.FS // nil: the operating system's
	// NoSync skips every fsync (tests that do not crash).
	NoSync bool
	// Covered is the seq of the last record the engine's durable state
	// holds (its checkpoint's): new records get seqs after it.
	Covered uint64
}

// WAL is an open round log. It is not safe for concurrent use; the engine
// orders every call.
type WAL struct {
	fs     vfs.FS
	dir    string
	noSync bool
	f      vfs.File
	w      *bufio.Writer
	first  uint64 // first seq of the current segment
	size   int64  // bytes of whole records in the current segment
	seq    uint64 // the last seq handed out
	broken error  // a write failed: nothing is appended until a new segment
	buf    []byte
	sync   bool // the encoded record is to be synced
}

const (
	flagHard = 1 << iota
	flagSnap
)

// recSynced is the header's flag on a record that was fdatasynced.
const recSynced = 1 << 31

// CRC is the checksum of records (and of the engine's checkpoint file).
var CRC = crc32.MakeTable(crc32.Castagnoli)

// SegmentMax: Truncate starts a new segment once the current one holds
// this much (the covered ones are deleted).
const SegmentMax = 16 << 20

// SegmentName is the file name of the segment whose first seq is first.
func SegmentName(first uint64) string { return fmt.Sprintf("%020d.wal", first) }

// ListSegments returns the first seqs of dir's segments, in order.
func ListSegments(fs vfs.FS, dir string) ([]uint64, error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, err
	}
	var firsts []uint64
	for _, name := range names {
		name, ok := strings.CutSuffix(name, ".wal")
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

// MkdirAll creates dir and its missing parents, and syncs the parent of
// each directory it created: a directory's entry is durable only once its
// parent is synced.
func MkdirAll(fs vfs.FS, dir string, noSync bool) error {
	dir = filepath.Clean(dir)
	if _, err := fs.Stat(dir); err == nil {
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := MkdirAll(fs, parent, noSync); err != nil {
			return err
		}
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if noSync || parent == dir {
		return nil
	}
	return vfs.SyncDir(fs, parent)
}

// Open reads every record in dir (creating it if need be), cuts off a
// torn tail of the last segment, and opens a new segment for appends.
func Open(dir string, opts Options) (*WAL, []Record, error) {
	fs := opts.FS
	if fs == nil {
		fs = vfs.Default
	}
	if err := MkdirAll(fs, dir, opts.NoSync); err != nil {
		return nil, nil, fmt.Errorf("wal: create dir: %w", err)
	}
	firsts, err := ListSegments(fs, dir)
	if err != nil {
		return nil, nil, fmt.Errorf("wal: %w", err)
	}
	w := &WAL{fs: fs, dir: dir, noSync: opts.NoSync}
	var recs []Record
	var prev uint64 // the last seq read
	for i, first := range firsts {
		name := SegmentName(first)
		last := i == len(firsts)-1
		seg, end, torn, err := readSegment(fs, filepath.Join(dir, name), first, last)
		if err != nil {
			return nil, nil, err
		}
		// Every seq before first was handed out before this segment was
		// created; after Covered, each of them must be here. (readSegment
		// checked that the segment's records start at first.)
		if first > opts.Covered+1 && prev+1 < first {
			return nil, nil, fmt.Errorf("wal: %s starts at seq %d but the log before it ends at %d (covered to %d): %w",
				name, first, prev, opts.Covered, ErrCorrupt)
		}
		if len(seg) > 0 && first <= prev {
			return nil, nil, fmt.Errorf("wal: %s starts at seq %d after seq %d: %w", name, first, prev, ErrCorrupt)
		}
		if first > 0 {
			prev = max(prev, first-1)
		}
		if len(seg) > 0 {
			prev = seg[len(seg)-1].Seq
		}
		recs = append(recs, seg...)
		if last {
			if err := w.settleLast(filepath.Join(dir, name), end, torn); err != nil {
				return nil, nil, err
			}
		}
	}
	w.seq = max(prev, opts.Covered)
	if err := w.startSegment(); err != nil {
		return nil, nil, err
	}
	return w, recs, nil
}

// settleLast makes the last segment what was read of it, durably, before
// a new segment follows it: a torn tail cut off, and (kill -9 keeps what
// was written but not synced) every byte synced, so that no later
// segment's record can outlive an earlier one's.
func (w *WAL) settleLast(path string, end int64, torn bool) error {
	if w.noSync && !torn {
		return nil
	}
	f, err := w.fs.OpenReadWrite(path)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	defer f.Close()
	if torn {
		if err := f.Truncate(end); err != nil {
			return fmt.Errorf("wal: cut torn tail of %s at %d: %w", filepath.Base(path), end, err)
		}
	}
	if w.noSync {
		return nil
	}
	if err := f.SyncData(); err != nil {
		return fmt.Errorf("wal: sync %s: %w", filepath.Base(path), err)
	}
	return nil
}

// readSegment returns the segment's records up to its end or to damage a
// crash may have left (torn; end is where the whole records end). Damage
// anywhere else is ErrCorrupt.
func readSegment(fs vfs.FS, path string, first uint64, last bool) (recs []Record, end int64, torn bool, err error) {
	data, err := vfs.ReadFile(fs, path)
	if err != nil {
		return nil, 0, false, fmt.Errorf("wal: %w", err)
	}
	name := filepath.Base(path)
	off := 0
	want := first
	for off < len(data) {
		r, n, err := recordAt(data, off)
		if errors.Is(err, errDamaged) {
			break
		}
		if err != nil {
			return nil, 0, false, fmt.Errorf("wal: %s offset %d: %w", name, off, err)
		}
		if r.Seq != want {
			return nil, 0, false, fmt.Errorf("wal: %s offset %d: record seq %d, want %d: %w", name, off, r.Seq, want, ErrCorrupt)
		}
		recs = append(recs, r)
		want++
		off += n
	}
	if off == len(data) {
		return recs, int64(off), false, nil
	}
	// Damage at off. Only the last segment may end in a crash's tail, and
	// only if nothing synced follows it.
	if !last {
		return nil, 0, false, fmt.Errorf("wal: %s offset %d: damaged record in a segment that is not the last: %w", name, off, ErrCorrupt)
	}
	if at, seq, found := syncedRecordAfter(data, off+1, want); found {
		return nil, 0, false, fmt.Errorf("wal: %s offset %d: damaged record followed by synced record %d at offset %d: %w",
			name, off, seq, at, ErrCorrupt)
	}
	return recs, int64(off), true, nil
}

// errDamaged: a record is short or fails its checksum, as a crash may
// leave one.
var errDamaged = errors.New("damaged record")

// recordAt decodes the record at off and returns its length in bytes. A
// record whose checksum holds but which does not decode is ErrCorrupt: no
// crash writes one.
func recordAt(data []byte, off int) (r Record, n int, err error) {
	rest := data[off:]
	if len(rest) < 8 {
		return r, 0, errDamaged
	}
	hdr := binary.BigEndian.Uint32(rest)
	size := hdr &^ recSynced
	if size == 0 || uint64(size) > uint64(len(rest)-8) {
		return r, 0, errDamaged
	}
	payload := rest[8 : 8+size]
	if crc32.Checksum(payload, CRC) != binary.BigEndian.Uint32(rest[4:]) {
		return r, 0, errDamaged
	}
	if r, err = decodeRecord(payload); err != nil {
		return r, 0, fmt.Errorf("%w: %w", err, ErrCorrupt)
	}
	return r, 8 + int(size), nil
}

// syncedRecordAfter looks for a whole record with the synced flag at any
// offset from from on whose seq is at least want (one that could follow
// the damaged record). Candidates are filtered on the flag and a plausible
// seq before their checksum is computed.
func syncedRecordAfter(data []byte, from int, want uint64) (at int, seq uint64, found bool) {
	for o := from; o+8 < len(data); o++ {
		hdr := binary.BigEndian.Uint32(data[o:])
		if hdr&recSynced == 0 {
			continue
		}
		size := hdr &^ recSynced
		if size == 0 || uint64(size) > uint64(len(data)-o-8) {
			continue
		}
		s, k := binary.Uvarint(data[o+8 : o+8+int(size)])
		// Each record takes at least 9 bytes: seqs past the damage grow
		// by one per record.
		if k <= 0 || s < want || s > want+uint64(len(data)-from)/9+1 {
			continue
		}
		if _, _, err := recordAt(data, o); err == nil {
			return o, s, true
		}
	}
	return 0, 0, false
}

func (w *WAL) startSegment() error {
	if w.f != nil {
		// The old segment ends with whole records, all durable, before a
		// new one exists (see the package comment).
		err := w.f.Truncate(w.size)
		if err == nil && !w.noSync {
			err = w.f.SyncData()
		}
		if err != nil {
			return fmt.Errorf("wal: settle segment %s: %w", SegmentName(w.first), err)
		}
		w.f.Close()
		w.f = nil
	}
	w.first = w.seq + 1
	f, err := w.fs.Create(filepath.Join(w.dir, SegmentName(w.first)))
	if err != nil {
		return fmt.Errorf("wal: create segment: %w", err)
	}
	if !w.noSync {
		if err := vfs.SyncDir(w.fs, w.dir); err != nil {
			f.Close()
			return fmt.Errorf("wal: sync dir: %w", err)
		}
	}
	w.f, w.size = f, 0
	if w.w == nil {
		w.w = bufio.NewWriterSize(f, 256<<10)
	} else {
		w.w.Reset(f)
	}
	return nil
}

// Seq is the last seq handed out.
func (w *WAL) Seq() uint64 { return w.seq }

// Dir is the log's directory.
func (w *WAL) Dir() string { return w.dir }

// Broken is the error that stopped appends, if any: only Truncate's new
// segment clears it.
func (w *WAL) Broken() error { return w.broken }

// Append writes items as the next record and syncs it. It returns the
// record's seq.
func (w *WAL) Append(items []Item) (uint64, error) {
	seq, err := w.Encode(items)
	if err != nil {
		return 0, err
	}
	return seq, w.WriteEncoded(true)
}

// Encode makes items the next record (seq returned); WriteEncoded then
// writes it (and syncs it if sync), and may run on another goroutine
// meanwhile, as long as nothing else touches the WAL until it returns.
func (w *WAL) Encode(items []Item) (uint64, error) {
	if w.broken != nil {
		return 0, w.broken
	}
	var err error
	if w.buf, err = encodeRecord(w.buf[:0], w.seq+1, items); err != nil {
		return 0, err
	}
	w.seq++
	return w.seq, nil
}

// WriteEncoded writes the record Encode made, and fdatasyncs it if sync.
func (w *WAL) WriteEncoded(sync bool) error {
	if err := w.write(w.buf, sync); err != nil {
		w.broken = fmt.Errorf("wal: %w", err)
		return w.broken
	}
	return nil
}

func (w *WAL) write(payload []byte, sync bool) error {
	hdr := uint32(len(payload))
	if uint64(len(payload)) >= recSynced {
		return fmt.Errorf("record of %d bytes is too large", len(payload))
	}
	if sync {
		hdr |= recSynced
	}
	var h [8]byte
	binary.BigEndian.PutUint32(h[:], hdr)
	binary.BigEndian.PutUint32(h[4:], crc32.Checksum(payload, CRC))
	if _, err := w.w.Write(h[:]); err != nil {
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
	return w.f.SyncData()
}

// Truncate drops the segments whose every record is at most covered (a
// checkpoint made them durable elsewhere). A new segment starts first if
// the current one grew past SegmentMax or a write failed in it (its
// records stay until a later checkpoint covers them).
func (w *WAL) Truncate(covered uint64) error {
	if w.broken != nil || w.size >= SegmentMax {
		if err := w.startSegment(); err != nil {
			w.broken = err
			return err
		}
		w.broken = nil
	}
	firsts, err := ListSegments(w.fs, w.dir)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	removed := false
	for i, first := range firsts {
		// Every record of segment i is below the next segment's first.
		if first >= w.first || i+1 >= len(firsts) || firsts[i+1] > covered+1 {
			break
		}
		if err := w.fs.Remove(filepath.Join(w.dir, SegmentName(first))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("wal: %w", err)
		}
		removed = true
	}
	// A removal that a power loss undoes is harmless (the segment's
	// records are covered) but each one brought back is read at every
	// open until the next removal sticks: make them durable.
	if removed && !w.noSync {
		if err := vfs.SyncDir(w.fs, w.dir); err != nil {
			return fmt.Errorf("wal: sync dir: %w", err)
		}
	}
	return nil
}

// Close closes the current segment.
func (w *WAL) Close() error {
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

func encodeRecord(b []byte, seq uint64, items []Item) ([]byte, error) {
	b = binary.AppendUvarint(b, seq)
	b = binary.AppendUvarint(b, uint64(len(items)))
	for i := range items {
		it := &items[i]
		b = binary.AppendUvarint(b, it.RegionID)
		var flags byte
		if it.Hard != nil {
			flags |= flagHard
		}
		if it.Snap {
			flags |= flagSnap
		}
		b = append(b, flags)
		if it.Hard != nil {
			b = binary.AppendUvarint(b, uint64(it.Hard.Size()))
			n := len(b)
			b = slices.Grow(b, it.Hard.Size())[:n+it.Hard.Size()]
			if _, err := it.Hard.MarshalToSizedBuffer(b[n:]); err != nil {
				return nil, err
			}
		}
		if it.Snap {
			b = binary.AppendUvarint(b, it.SnapIndex)
			b = binary.AppendUvarint(b, it.SnapTerm)
		}
		b = binary.AppendUvarint(b, uint64(len(it.Entries)))
		for j := range it.Entries {
			e := &it.Entries[j]
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

var errShort = fmt.Errorf("wal record: %w", io.ErrUnexpectedEOF)

func decodeRecord(b []byte) (Record, error) {
	var r Record
	uv := func() (uint64, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, errShort
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
			return nil, errShort
		}
		m := b[:n]
		b = b[n:]
		return m, nil
	}
	var err error
	if r.Seq, err = uv(); err != nil {
		return r, err
	}
	n, err := uv()
	if err != nil {
		return r, err
	}
	if n > uint64(len(b)) {
		return r, errShort
	}
	for range n {
		var it Item
		if it.RegionID, err = uv(); err != nil {
			return r, err
		}
		if len(b) == 0 {
			return r, errShort
		}
		flags := b[0]
		b = b[1:]
		if flags&flagHard != 0 {
			m, err := msg()
			if err != nil {
				return r, err
			}
			it.Hard = new(raftpb.HardState)
			if err := it.Hard.Unmarshal(m); err != nil {
				return r, fmt.Errorf("wal record: hard state: %w", err)
			}
		}
		if flags&flagSnap != 0 {
			it.Snap = true
			if it.SnapIndex, err = uv(); err != nil {
				return r, err
			}
			if it.SnapTerm, err = uv(); err != nil {
				return r, err
			}
		}
		ne, err := uv()
		if err != nil {
			return r, err
		}
		if ne > uint64(len(b)) {
			return r, errShort
		}
		if ne > 0 {
			it.Entries = make([]raftpb.Entry, ne)
		}
		for j := range it.Entries {
			m, err := msg()
			if err != nil {
				return r, err
			}
			if err := it.Entries[j].Unmarshal(m); err != nil {
				return r, fmt.Errorf("wal record: entry: %w", err)
			}
		}
		r.Items = append(r.Items, it)
	}
	if len(b) != 0 {
		return r, fmt.Errorf("wal record: %d trailing bytes: %w", len(b), ErrCorrupt)
	}
	return r, nil
}
