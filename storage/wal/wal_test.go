package wal

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/storage/vfs"
)

func ents(term, lo, hi uint64) []raftpb.Entry {
	var out []raftpb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, raftpb.Entry{Term: term, Index: i, Data: []byte("entry")})
	}
	return out
}

func open(t *testing.T, dir string, covered uint64) (*WAL, []Record) {
	t.Helper()
	w, recs, err := Open(dir, Options{Covered: covered})
	if err != nil {
		t.Fatal(err)
	}
	return w, recs
}

func appendAll(t *testing.T, w *WAL, sync bool, items ...[]Item) {
	t.Helper()
	for _, it := range items {
		if _, err := w.Encode(it); err != nil {
			t.Fatal(err)
		}
		if err := w.WriteEncoded(sync); err != nil {
			t.Fatal(err)
		}
	}
}

func seqs(recs []Record) []uint64 {
	var out []uint64
	for _, r := range recs {
		out = append(out, r.Seq)
	}
	return out
}

func lastSegment(t *testing.T, dir string) string {
	t.Helper()
	firsts, err := ListSegments(vfs.Default, dir)
	if err != nil || len(firsts) == 0 {
		t.Fatalf("segments: %v, %v", firsts, err)
	}
	return filepath.Join(dir, SegmentName(firsts[len(firsts)-1]))
}

func TestRoundTripTornTailAndTruncate(t *testing.T) {
	dir := t.TempDir()
	w, recs := open(t, dir, 0)
	if len(recs) != 0 {
		t.Fatalf("open empty: %d records", len(recs))
	}
	hs := raftpb.HardState{Term: 3, Vote: 2, Commit: 7}
	items := [][]Item{
		{{RegionID: 1, Hard: &hs, Entries: ents(3, 5, 7)}, {RegionID: 9, Entries: ents(2, 1, 1)}},
		{{RegionID: 1, Snap: true, SnapIndex: 20, SnapTerm: 3}},
		{{RegionID: 2, Hard: &raftpb.HardState{Term: 1, Vote: 1}}},
	}
	for i, it := range items {
		if seq, err := w.Append(it); err != nil || seq != uint64(i+1) {
			t.Fatalf("append %d: seq %d, %v", i, seq, err)
		}
	}
	w.Close()
	w, recs = open(t, dir, 0)
	if len(recs) != 3 {
		t.Fatalf("reopen: %d records", len(recs))
	}
	for i, r := range recs {
		if r.Seq != uint64(i+1) || !reflect.DeepEqual(r.Items, items[i]) {
			t.Fatalf("record %d = %+v, want seq %d %+v", i, r, i+1, items[i])
		}
	}
	// A new segment was started at open; a torn record at its end is
	// dropped (and cut off the file), the ones before stay.
	appendAll(t, w, true, items[0])
	seg := filepath.Join(dir, SegmentName(4))
	w.Close()
	whole, _ := os.Stat(seg)
	f, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{0, 0, 1, 0, 1, 2, 3, 4, 5}) // a header promising 256 bytes, and 1 of them
	f.Close()
	w, recs = open(t, dir, 0)
	if len(recs) != 4 || recs[3].Seq != 4 {
		t.Fatalf("reopen after a torn tail: %d records", len(recs))
	}
	if fi, _ := os.Stat(seg); fi.Size() != whole.Size() {
		t.Fatalf("torn tail not cut: %d bytes, want %d", fi.Size(), whole.Size())
	}
	if seq, err := w.Append(items[2]); err != nil || seq != 5 {
		t.Fatalf("append after a torn tail: seq %d, %v", seq, err)
	}
	// Only segments every record of which is covered go.
	if err := w.Truncate(3); err != nil {
		t.Fatal(err)
	}
	if firsts, _ := ListSegments(vfs.Default, dir); !reflect.DeepEqual(firsts, []uint64{4, 5}) {
		t.Fatalf("segments after Truncate(3): %v, want [4 5]", firsts)
	}
	if err := w.Truncate(5); err != nil {
		t.Fatal(err)
	}
	if firsts, _ := ListSegments(vfs.Default, dir); !reflect.DeepEqual(firsts, []uint64{5}) {
		t.Fatalf("segments after Truncate(5): %v, want [5]", firsts)
	}
	w.Close()
	_, recs = open(t, dir, 5) // what Truncate(5) dropped, a checkpoint covers
	if !reflect.DeepEqual(seqs(recs), []uint64{5}) {
		t.Fatalf("reopen after truncate: %v", seqs(recs))
	}
}

// A damaged record with a synced record after it in the same segment is
// not a torn tail: the synced record's fdatasync made every byte before
// it durable. Open refuses, naming the file and the offset, instead of
// reading the damage as the end of the log (which dropped the later
// records and handed their seqs out again).
func TestDamageBeforeSyncedRecordIsCorruption(t *testing.T) {
	dir := t.TempDir()
	w, _ := open(t, dir, 0)
	hs := raftpb.HardState{Term: 2, Vote: 1, Commit: 3}
	appendAll(t, w, true, []Item{{RegionID: 1, Hard: &hs, Entries: ents(2, 1, 3)}})
	seg := lastSegment(t, dir)
	fi, _ := os.Stat(seg)
	second := fi.Size()
	appendAll(t, w, false, []Item{{RegionID: 1, Hard: &hs}})
	appendAll(t, w, true, []Item{{RegionID: 1, Entries: ents(2, 4, 4)}})
	w.Close()
	// Flip a byte in the second record's payload.
	data, _ := os.ReadFile(seg)
	data[second+9] ^= 0xff
	if err := os.WriteFile(seg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, recs, err := Open(dir, Options{})
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open over a damaged record before a synced one: %v records, err %v; want ErrCorrupt", seqs(recs), err)
	}
	if !strings.Contains(err.Error(), filepath.Base(seg)) || !strings.Contains(err.Error(), "offset") {
		t.Fatalf("error does not name the file and offset: %v", err)
	}
}

// Damage followed only by records never synced is a torn tail: a power
// loss may persist a later unsynced page and not an earlier one.
func TestDamageBeforeUnsyncedRecordsIsTornTail(t *testing.T) {
	dir := t.TempDir()
	w, _ := open(t, dir, 0)
	hs := raftpb.HardState{Term: 2, Vote: 1, Commit: 3}
	appendAll(t, w, true, []Item{{RegionID: 1, Hard: &hs, Entries: ents(2, 1, 3)}})
	seg := lastSegment(t, dir)
	fi, _ := os.Stat(seg)
	second := fi.Size()
	appendAll(t, w, false, []Item{{RegionID: 1, Hard: &hs}}, []Item{{RegionID: 1, Hard: &hs}})
	w.Close()
	data, _ := os.ReadFile(seg)
	data[second+9] ^= 0xff
	os.WriteFile(seg, data, 0o600)
	w, recs := open(t, dir, 0)
	if !reflect.DeepEqual(seqs(recs), []uint64{1}) {
		t.Fatalf("records: %v, want [1]", seqs(recs))
	}
	if seq, err := w.Append([]Item{{RegionID: 1, Hard: &hs}}); err != nil || seq != 2 {
		t.Fatalf("append after the torn tail: %d, %v", seq, err)
	}
	w.Close()
	// The new segment follows a repaired one: the next open is clean.
	_, recs = open(t, dir, 0)
	if !reflect.DeepEqual(seqs(recs), []uint64{1, 2}) {
		t.Fatalf("records after reopen: %v, want [1 2]", seqs(recs))
	}
}

// Only the last segment may end in damage: every earlier one was synced
// whole before the next was created.
func TestDamageInEarlierSegmentIsCorruption(t *testing.T) {
	dir := t.TempDir()
	w, _ := open(t, dir, 0)
	appendAll(t, w, true, []Item{{RegionID: 1, Entries: ents(1, 1, 2)}}, []Item{{RegionID: 1, Entries: ents(1, 3, 3)}})
	seg := lastSegment(t, dir)
	w.Close()
	w, _ = open(t, dir, 0) // a new segment after seg
	appendAll(t, w, true, []Item{{RegionID: 1, Entries: ents(1, 4, 4)}})
	w.Close()
	fi, _ := os.Stat(seg)
	os.Truncate(seg, fi.Size()-3)
	if _, _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open over a torn segment that is not the last: %v; want ErrCorrupt", err)
	}
}

// Seqs the engine's checkpoint covers are never handed out again, even
// when the records that held them were lost; and every record after the
// covered seq must be there.
func TestCoveredSeqsAreNotReused(t *testing.T) {
	dir := t.TempDir()
	w, _ := open(t, dir, 0)
	appendAll(t, w, true, []Item{{RegionID: 1, Entries: ents(1, 1, 1)}})
	w.Close()
	// The checkpoint covers seq 3: records 2 and 3 were lost.
	w, recs := open(t, dir, 3)
	if seq, err := w.Append([]Item{{RegionID: 1, Entries: ents(1, 2, 2)}}); err != nil || seq != 4 {
		t.Fatalf("first append after losing covered records: seq %d (%v), want 4", seq, err)
	}
	w.Close()
	if _, recs = open(t, dir, 3); !reflect.DeepEqual(seqs(recs), []uint64{1, 4}) {
		t.Fatalf("records: %v, want [1 4]", seqs(recs))
	}
	// Covered only to 2: record 3 is missing, which no crash explains.
	if _, _, err := Open(dir, Options{Covered: 2}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with a gap after the covered seq: %v; want ErrCorrupt", err)
	}
}

// A segment whose write failed is cut back to its whole records before
// the next segment starts, so the log still opens.
func TestFailedWriteLeavesNoDamage(t *testing.T) {
	dir := t.TempDir()
	w, _ := open(t, dir, 0)
	appendAll(t, w, true, []Item{{RegionID: 1, Entries: ents(1, 1, 1)}})
	// A partial record, as a write cut short by a full disk leaves.
	if _, err := w.w.Write([]byte{0x80, 0, 0, 40, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	w.w.Flush()
	w.broken = errors.New("injected")
	if err := w.Truncate(0); err != nil {
		t.Fatal(err)
	}
	appendAll(t, w, true, []Item{{RegionID: 1, Entries: ents(1, 2, 2)}})
	w.Close()
	if _, recs := open(t, dir, 0); !reflect.DeepEqual(seqs(recs), []uint64{1, 2}) {
		t.Fatalf("records: %v, want [1 2]", seqs(recs))
	}
}
