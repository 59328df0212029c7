package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"reflect"
	"testing"

	"go.etcd.io/bbolt"
)

// The dedup table decides from the log alone: whether a request is a
// duplicate depends on the region's log (its entries and their indexes),
// never on when a replica trimmed, how it batched entries into apply
// rounds, or which region a request ID was seen in elsewhere.

// records returns the dedup records of user keys in sp's range.
func records(t *testing.T, e *Engine, sp Span) []DedupRecord {
	t.Helper()
	var out []DedupRecord
	if err := e.View(func(tx *Tx) error {
		return tx.ForEachDedup(sp.StartKey, sp.EndKey, func(d DedupRecord) error {
			d.Key = bytes.Clone(d.Key) // aliases the transaction's memory
			out = append(out, d)
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// everything is the whole key space.
var everything = Span{ID: 1}

func seen(t *testing.T, e *Engine, key string, id, clock, window uint64) bool {
	t.Helper()
	var ok bool
	if err := e.View(func(tx *Tx) error {
		ok = tx.DedupSeen([]byte(key), id, clock, window)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ok
}

func remember(t *testing.T, e *Engine, recs ...DedupRecord) {
	t.Helper()
	mustUpdate(t, e, func(tx *Tx) error {
		for _, d := range recs {
			if err := tx.DedupRemember(d.Key, d.ID, d.Clock); err != nil {
				return err
			}
		}
		return nil
	})
}

func sweepAll(t *testing.T, e *Engine, sp Span, below uint64, budget int) {
	t.Helper()
	var from []byte
	for {
		mustUpdate(t, e, func(tx *Tx) error {
			var err error
			from, err = tx.SweepDedup(sp.StartKey, sp.EndKey, from, below, budget)
			return err
		})
		if from == nil {
			return
		}
	}
}

// dedupBase is the region's dedup clock base: its clock at index 0.
func dedupBase(t *testing.T, e *Engine, regionID uint64) uint64 {
	t.Helper()
	var base uint64
	if err := e.View(func(tx *Tx) error { base = tx.DedupClock(regionID, 0); return nil }); err != nil {
		t.Fatal(err)
	}
	return base
}

func TestDedupSeenWithinWindowOfItsKey(t *testing.T) {
	const w = 10
	e := testEngine(t)
	remember(t, e, DedupRecord{Clock: 100, ID: 42, Key: []byte("k")})
	for c := uint64(101); c <= 100+w; c++ {
		if !seen(t, e, "k", 42, c, w) {
			t.Errorf("clock %d: request applied at 100 not seen with window %d", c, w)
		}
	}
	if seen(t, e, "k", 42, 101+w, w) {
		t.Errorf("clock %d: request applied at 100 still seen past window %d", 101+w, w)
	}
	if seen(t, e, "k2", 42, 101, w) || seen(t, e, "k\x00", 42, 101, w) {
		t.Error("a request ID applied to key k is seen for another key")
	}
	if seen(t, e, "k", 43, 101, w) {
		t.Error("an unknown request is seen")
	}
	if seen(t, e, "k", 42, 100, w) || seen(t, e, "k", 42, 99, w) {
		t.Error("a request is seen at or before the clock it was applied at")
	}

	// Remembering it again (applied again past the window) moves it.
	remember(t, e, DedupRecord{Clock: 200, ID: 42, Key: []byte("k")})
	if got, want := records(t, e, everything), []DedupRecord{{Clock: 200, ID: 42, Key: []byte("k")}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("records = %v, want %v", got, want)
	}
	// Sweeping below the record leaves it, however often asked.
	sweepAll(t, e, everything, 199, 1)
	if len(records(t, e, everything)) != 1 {
		t.Fatal("sweep removed a record a future entry could still see")
	}
	sweepAll(t, e, everything, 200, 1)
	if r := records(t, e, everything); len(r) != 0 {
		t.Fatalf("records after sweep = %v", r)
	}
	if seen(t, e, "k", 42, 201, w) {
		t.Fatal("trimmed record still seen")
	}
}

// TestDedupKeysKeepUserKeyOrder: the bucket keys sort as (user key, ID)
// do, decode back, and a region's records are exactly a bucket range.
func TestDedupKeysKeepUserKeyOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []byte{0, 1, 0xff, 'a'}
	randKey := func() []byte {
		k := make([]byte, 1+rng.IntN(4))
		for i := range k {
			k[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return k
	}
	for range 5000 {
		a := DedupRecord{Key: randKey(), ID: uint64(rng.IntN(3))}
		b := DedupRecord{Key: randKey(), ID: uint64(rng.IntN(3))}
		if got, want := bytes.Compare(dedupKey(a.Key, a.ID), dedupKey(b.Key, b.ID)), compareDedup(a, b); got != want {
			t.Fatalf("%v vs %v: bucket order %d, record order %d", a, b, got, want)
		}
		key, id, err := parseDedupKey(dedupKey(a.Key, a.ID))
		if err != nil || !bytes.Equal(key, a.Key) || id != a.ID {
			t.Fatalf("%v decodes as %q/%d, %v", a, key, id, err)
		}
		start, end := randKey(), randKey()
		lo, hi := dedupRange(start, end)
		k := dedupKey(a.Key, a.ID)
		inBucket := bytes.Compare(k, lo) >= 0 && bytes.Compare(k, hi) < 0
		inRegion := bytes.Compare(a.Key, start) >= 0 && bytes.Compare(a.Key, end) < 0
		if inBucket != inRegion {
			t.Fatalf("key %q in [%q, %q): region says %v, bucket range says %v", a.Key, start, end, inRegion, inBucket)
		}
	}
	for _, bad := range [][]byte{nil, {0, 1}, []byte("abcdefgh\x00\x01"), append([]byte("a\x00\x02"), make([]byte, 8)...), append([]byte("a\x00\x01b"), make([]byte, 8)...), append([]byte("a"), make([]byte, 8)...)} {
		if _, _, err := parseDedupKey(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("parseDedupKey(%x) = %v, want ErrCorrupt", bad, err)
		}
	}
	if !dedupKeyFits(make([]byte, 16000)) || dedupKeyFits(make([]byte, bbolt.MaxKeySize)) {
		t.Error("dedupKeyFits misjudges")
	}
}

// The sweep budget per apply round of raftstore's trimDedupTx: sweepMin
// plus sweepPerEntry for every entry the round applied, at most sweepMax
// records.
const (
	sweepMin      = 32
	sweepPerEntry = 4
	sweepMax      = 4096
)

// The dedup decision's independence from apply rounds and the sweep's
// bound on the table are raftstore's (its trimming policy drives
// SweepDedup): raftstore/dedup_trim_test.go.

// TestDedupSplitMovesNothing: the split (Tx.SplitDedup, as a split entry
// applied at the parent's index 20 calls it) writes the new region's
// clock base and leaves every record where it is; the new region sees the
// records of its keys for the rest of their window, counted in the
// parent's entries before the split and its own after.
func TestDedupSplitMovesNothing(t *testing.T) {
	const w = 10
	e := testEngine(t)
	parent := Span{ID: 1}
	mustUpdate(t, e, func(tx *Tx) error { return tx.PutRegionMeta(parent.ID, spanMeta(parent)) })
	recs := []DedupRecord{
		{Clock: 12, ID: 1, Key: []byte("a")}, // left of the split: stays
		{Clock: 12, ID: 2, Key: []byte("p")}, // right of it
		{Clock: 15, ID: 3, Key: []byte("user8")},
	}
	remember(t, e, recs...)
	const at = 20 // the split entry's index in the parent: clock 20
	before := records(t, e, everything)
	mustUpdate(t, e, func(tx *Tx) error { return tx.SplitDedup(parent.ID, 9, at, raftInitIndex) })
	if got := records(t, e, everything); !reflect.DeepEqual(got, before) {
		t.Fatalf("split changed the table: %v, was %v", got, before)
	}
	child := Span{ID: 9, StartKey: []byte("user8")}
	if got := records(t, e, child); len(got) != 1 || got[0].ID != 3 {
		t.Errorf("the new region's records = %v", got)
	}
	base := dedupBase(t, e, 9)
	if base != at-raftInitIndex {
		t.Fatalf("new region's clock base %d, want %d", base, at-raftInitIndex)
	}
	// Entry raftInitIndex+1 of the new region is clock 21: record 3
	// (clock 15) is seen until clock 25, entry raftInitIndex+5.
	clockOf := func(i uint64) uint64 { return i + base }
	if !seen(t, e, "user8", 3, clockOf(raftInitIndex+1), w) || !seen(t, e, "user8", 3, clockOf(raftInitIndex+5), w) {
		t.Error("the new region does not see a live record of its range")
	}
	if seen(t, e, "user8", 3, clockOf(raftInitIndex+6), w) {
		t.Error("a record outlives its window in the new region")
	}
	if !seen(t, e, "a", 1, 21, w) {
		t.Error("the parent no longer sees a record of its range")
	}
	if b := dedupBase(t, e, parent.ID); b != 0 {
		t.Errorf("the split changed the parent's clock base to %d", b)
	}
	// A split of the new region goes on from its clock, not its index.
	mustUpdate(t, e, func(tx *Tx) error { return tx.SplitDedup(9, 11, raftInitIndex+3, raftInitIndex) })
	if b, want := dedupBase(t, e, 11), clockOf(raftInitIndex+3)-raftInitIndex; b != want {
		t.Errorf("a grandchild's clock base %d, want %d", b, want)
	}
}

// TestDedupDestroyForgetsOnlyTheRange: a destroyed replica's state goes
// with its dedup clock base (Tx.DeleteRegion), and the clear of its range
// that follows (Tx.ClearDedupRange in one transaction, or
// Engine.ClearUserRange in bounded ones, as raftstore's clear does) takes
// the records of that range and no other.
func TestDedupDestroyForgetsOnlyTheRange(t *testing.T) {
	for _, tc := range []struct {
		name  string
		clear func(e *Engine, sp Span) error
	}{
		{"Tx.ClearDedupRange", func(e *Engine, sp Span) error {
			return e.LockedUpdate(func(tx *Tx) error { return tx.ClearDedupRange(sp.StartKey, sp.EndKey) })
		}},
		{"Engine.ClearUserRange", func(e *Engine, sp Span) error {
			return e.ClearUserRange(sp.StartKey, sp.EndKey, func() error { return nil })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One key a transaction: the bounded clear takes several.
			e, err := Open(t.TempDir(), Options{NoSync: true, ClearBatchKeys: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			remember(t, e, DedupRecord{Clock: 11, ID: 1, Key: []byte("a")}, DedupRecord{Clock: 12, ID: 2, Key: []byte("m")},
				DedupRecord{Clock: 13, ID: 3, Key: []byte("m\x00")}, DedupRecord{Clock: 14, ID: 4, Key: []byte("t")})
			r := Span{ID: 7, StartKey: []byte("m"), EndKey: []byte("t")}
			mustUpdate(t, e, func(tx *Tx) error {
				if err := tx.PutRegionMeta(r.ID, spanMeta(r)); err != nil {
					return err
				}
				if err := putDedupBaseTx(tx.tx, r.ID, 99); err != nil {
					return err
				}
				// A placeholder (uninitialized) holds no range: its state
				// goes, and nothing of the table.
				return tx.DeleteRegion(8)
			})
			if got := records(t, e, everything); len(got) != 4 {
				t.Fatalf("records after destroying a placeholder = %v", got)
			}
			if b := dedupBase(t, e, r.ID); b != 99 {
				t.Fatalf("destroying a placeholder changed another region's clock base to %d", b)
			}
			mustUpdate(t, e, func(tx *Tx) error { return tx.DeleteRegion(r.ID) })
			if err := tc.clear(e, r); err != nil {
				t.Fatal(err)
			}
			got := records(t, e, everything)
			if len(got) != 2 || string(got[0].Key) != "a" || string(got[1].Key) != "t" {
				t.Errorf("records after destroying [m, t) = %v", got)
			}
			if b := dedupBase(t, e, r.ID); b != 0 {
				t.Errorf("clock base %d left", b)
			}
		})
	}
}

// TestDedupConvertsTheOldLayout: a store written by the per-region layout
// (dedup2) opens with the same decisions: each region's records at the
// same clocks (its own log index, base 0), records of keys outside their
// region dropped, the old buckets gone.
func TestDedupConvertsTheOldLayout(t *testing.T) {
	dir := t.TempDir()
	e, err := openEngine(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	left := Span{ID: 1, EndKey: []byte("m")}
	right := Span{ID: 2, StartKey: []byte("m")}
	old := func(regionID, index, id uint64, key string) (k, v []byte) {
		k = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, regionID), id)
		v = append(binary.BigEndian.AppendUint64(nil, index), key...)
		return k, v
	}
	const n = dedupConvertBatch + 10 // more than one batch
	mustUpdate(t, e, func(tx *Tx) error {
		for _, r := range []Span{left, right} {
			if err := tx.PutRegionMeta(r.ID, spanMeta(r)); err != nil {
				return err
			}
		}
		b, err := tx.tx.CreateBucket(bucketDedupV2)
		if err != nil {
			return err
		}
		if _, err := tx.tx.CreateBucket(bucketDedupV2Idx); err != nil {
			return err
		}
		for i := uint64(0); i < n; i++ {
			if err := b.Put(old(1, 100+i, 1000+i, fmt.Sprintf("a%06d", i))); err != nil {
				return err
			}
		}
		k, v := old(2, raftInitIndex, 7, "p") // a split's re-based record
		if err := b.Put(k, v); err != nil {
			return err
		}
		k, v = old(2, 9, 8, "b") // outside its region: dropped
		if err := b.Put(k, v); err != nil {
			return err
		}
		k, v = old(3, 9, 9, "x") // a region this store no longer holds
		return b.Put(k, v)
	})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = openEngine(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketDedupV2) != nil || tx.Bucket(bucketDedupV2Idx) != nil {
			return errors.New("old buckets left")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := records(t, e, right); !reflect.DeepEqual(got, []DedupRecord{{Clock: raftInitIndex, ID: 7, Key: []byte("p")}}) {
		t.Errorf("region 2 records = %v", got)
	}
	got := records(t, e, left)
	if len(got) != n {
		t.Fatalf("region 1 has %d records, want %d", len(got), n)
	}
	for i, d := range got {
		if want := (DedupRecord{Clock: 100 + uint64(i), ID: 1000 + uint64(i), Key: fmt.Appendf(nil, "a%06d", i)}); !reflect.DeepEqual(d, want) {
			t.Fatalf("record %d = %v, want %v", i, d, want)
		}
	}
	if !seen(t, e, "a000003", 1003, 110, 10) || seen(t, e, "a000003", 1003, 114, 10) {
		t.Error("a converted record decides differently")
	}
}

// snapSource builds an engine holding region r with data, a dedup clock
// base and records.
func snapSource(t *testing.T, r Span, kvs map[string]string, base uint64, recs []DedupRecord) *Engine {
	t.Helper()
	e := testEngine(t)
	mustUpdate(t, e, func(tx *Tx) error {
		if err := tx.PutRegionMeta(r.ID, spanMeta(r)); err != nil {
			return err
		}
		if err := tx.PutApplyState(r.ID, ApplyState{AppliedIndex: 50, AppliedTerm: 6, TruncatedIndex: 40, TruncatedTerm: 6}); err != nil {
			return err
		}
		if err := putDedupBaseTx(tx.tx, r.ID, base); err != nil {
			return err
		}
		for k, v := range kvs {
			if err := tx.Put([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		for _, d := range recs {
			if err := tx.DedupRemember(d.Key, d.ID, d.Clock); err != nil {
				return err
			}
		}
		return nil
	})
	return e
}

// buildSnapshot is the region's snapshot as of e's committed state, and
// the apply state it is of (raftstore's buildSnapshot).
func buildSnapshot(tb testing.TB, e *Engine, regionID uint64) ([]byte, ApplyState) {
	tb.Helper()
	var buf bytes.Buffer
	var as ApplyState
	err := e.View(func(tx *Tx) error {
		var err error
		if as, _, err = tx.SnapshotState(regionID); err != nil {
			return err
		}
		return tx.WriteSnapshot(regionID, &buf)
	})
	if err != nil {
		tb.Fatalf("build snapshot of region %d: %v", regionID, err)
	}
	return buf.Bytes(), as
}

func TestSnapshotCarriesTheDedupTable(t *testing.T) {
	r := Span{ID: testRegionID, StartKey: []byte("m"), EndKey: []byte("t")}
	recs := []DedupRecord{ // in key order, as the snapshot carries them
		{Clock: 1045, ID: 3, Key: []byte("m")},
		{Clock: 1005, ID: 9, Key: []byte("p")},
		{Clock: 1045, ID: 3, Key: []byte("q")},
	}
	src := snapSource(t, r, map[string]string{"a": "left", "n": "1", "p": "2", "z": "right"}, 1000, recs)
	// The records of keys outside the region stay out of its snapshot.
	remember(t, src, DedupRecord{Clock: 30, ID: 5, Key: []byte("a")}, DedupRecord{Clock: 30, ID: 6, Key: []byte("t")})
	snap, as := buildSnapshot(t, src, r.ID)
	if !bytes.HasPrefix(snap, []byte("HKVS4")) {
		t.Fatalf("snapshot magic %q", snap[:5])
	}

	dst := testEngine(t)
	other := DedupRecord{Clock: 7, ID: 77, Key: []byte("b")}
	remember(t, dst,
		DedupRecord{Clock: 2, ID: 99, Key: []byte("n")}, // stale state the snapshot replaces
		other) // another region's, left alone
	mustUpdate(t, dst, func(tx *Tx) error { return tx.Put([]byte("o"), []byte("stale")) })
	var meta []byte
	mustUpdate(t, dst, func(tx *Tx) error {
		var err error
		meta, err = tx.ApplySnapshot(snap, as.AppliedIndex, as.AppliedTerm)
		return err
	})
	got, err := DecodeSpan(meta)
	if err != nil || !bytes.Equal(meta, spanMeta(r)) || got.ID != r.ID || !bytes.Equal(got.StartKey, r.StartKey) || !bytes.Equal(got.EndKey, r.EndKey) {
		t.Errorf("region = %s (%q, %v), want %s", got, meta, err, r)
	}
	if d := records(t, dst, r); !reflect.DeepEqual(d, recs) {
		t.Errorf("dedup records = %v, want %v", d, recs)
	}
	if d := records(t, dst, everything); len(d) != len(recs)+1 || !reflect.DeepEqual(d[0], other) {
		t.Errorf("all records after the apply = %v", d)
	}
	if base := dedupBase(t, dst, r.ID); base != 1000 {
		t.Errorf("clock base %d, want 1000", base)
	}
	kvs, err := dst.Scan(context.Background(), nil, nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(kvs) != 2 || string(kvs[0].Key) != "n" || string(kvs[1].Key) != "p" || string(kvs[1].Value) != "2" {
		t.Errorf("data = %v", kvs)
	}
	if !seen(t, dst, "q", 3, 1051, 10) || seen(t, dst, "n", 99, 1051, 10) {
		t.Error("restored table decides differently")
	}
}

// seal appends the checksum a snapshot ends with, so that a test can feed
// the decoder bodies that are well sealed but malformed.
func seal(body []byte) []byte {
	return binary.BigEndian.AppendUint32(body, crc32.Checksum(body, snapCRC))
}

func TestSnapshotDecoderRefusesCorruptData(t *testing.T) {
	r := Span{ID: testRegionID, StartKey: []byte("m"), EndKey: []byte("t")}
	src := snapSource(t, r, map[string]string{"n": "1", "p": "2"}, 0, []DedupRecord{{Clock: 45, ID: 3, Key: []byte("p")}})
	good, as := buildSnapshot(t, src, r.ID)
	if _, err := decodeSnapshotData(good); err != nil {
		t.Fatalf("valid snapshot refused: %v", err)
	}
	mustRefuse := func(name string, data []byte) {
		t.Helper()
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("%s: decoder panicked: %v", name, p)
			}
		}()
		if _, err := decodeSnapshotData(data); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", name, err)
		}
		if _, err := DecodeSnapshot(data); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: DecodeSnapshot err = %v, want ErrCorrupt", name, err)
		}
		dst := testEngine(t)
		err := dst.LockedUpdate(func(tx *Tx) error {
			_, err := tx.ApplySnapshot(data, as.AppliedIndex, as.AppliedTerm)
			return err
		})
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Tx.ApplySnapshot err = %v, want ErrCorrupt", name, err)
		}
		// The streaming decoder (a snapshot file's apply) refuses it too.
		err = dst.LockedUpdate(func(tx *Tx) error {
			_, err := tx.ApplySnapshotFrom(bytes.NewReader(data), as.AppliedIndex, as.AppliedTerm)
			return err
		})
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Tx.ApplySnapshotFrom err = %v, want ErrCorrupt", name, err)
		}
	}
	for n := range len(good) {
		mustRefuse(fmt.Sprintf("truncated to %d bytes", n), good[:n])
	}
	for i := range len(good) {
		b := bytes.Clone(good)
		b[i] ^= 0x40
		mustRefuse(fmt.Sprintf("bit flipped in byte %d", i), b)
	}
	mustRefuse("old format", append([]byte("HKVS3"), good[5:]...))
	mustRefuse("older format", append([]byte("HKVS2"), good[5:]...))

	// Well sealed, but malformed inside.
	meta := []byte(`{"ID":7,"StartKey":"bQ==","EndKey":"dA=="}`)
	head := append([]byte("HKVS4"), binary.AppendUvarint(nil, uint64(len(meta)))...)
	head = append(head, meta...)
	head = binary.BigEndian.AppendUint64(head, 1000) // the dedup clock base
	rec := func(idx, id uint64, key string) []byte {
		b := binary.BigEndian.AppendUint64(nil, idx)
		b = binary.BigEndian.AppendUint64(b, id)
		b = binary.AppendUvarint(b, uint64(len(key)))
		return append(b, key...)
	}
	kv := func(k, v string) []byte {
		b := binary.AppendUvarint(nil, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(v)))
		return append(b, v...)
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	n := func(v uint64) []byte { return binary.AppendUvarint(nil, v) }
	if _, err := decodeSnapshotData(seal(cat(head, n(1), rec(45, 3, "p"), kv("n", "1")))); err != nil {
		t.Fatalf("hand-built snapshot refused: %v", err)
	}
	mustRefuse("huge record count", seal(cat(head, n(1<<62), rec(45, 3, "p"))))
	mustRefuse("record count past the records", seal(cat(head, n(2), rec(45, 3, "p"))))
	mustRefuse("record key length past the end", seal(cat(head, n(1), rec(45, 3, "p")[:16], n(1<<40), []byte("p"))))
	mustRefuse("record key out of the region", seal(cat(head, n(1), rec(45, 3, "a"))))
	if _, err := decodeSnapshotData(seal(cat(head, n(2), rec(45, 3, "p"), rec(44, 4, "p"), kv("n", "1")))); err != nil {
		t.Fatalf("records in order refused: %v", err)
	}
	mustRefuse("records out of order", seal(cat(head, n(2), rec(45, 3, "p"), rec(44, 2, "p"))))
	mustRefuse("records out of key order", seal(cat(head, n(2), rec(45, 3, "q"), rec(44, 4, "p"))))
	mustRefuse("a repeated record", seal(cat(head, n(2), rec(45, 3, "p"), rec(45, 3, "p"))))
	mustRefuse("no clock base", seal(head[:len(head)-3]))
	mustRefuse("data key out of the region", seal(cat(head, n(0), kv("z", "1"))))
	mustRefuse("key without a value", seal(cat(head, n(0), kv("n", "1")[:2])))
	mustRefuse("no record count", seal(head))
	mustRefuse("bad meta", seal(cat([]byte("HKVS4"), n(3), []byte("{x}"), make([]byte, 8), n(0))))
	mustRefuse("meta length past the end", seal(cat([]byte("HKVS4"), n(1<<50))))
	mustRefuse("empty", nil)
}
