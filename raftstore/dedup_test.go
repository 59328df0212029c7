package raftstore

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

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// The dedup table decides from the log alone: whether a request is a
// duplicate depends on the region's log (its entries and their indexes),
// never on when a replica trimmed, how it batched entries into apply
// rounds, or which region a request ID was seen in elsewhere.

func testEngine(t *testing.T) *engine {
	t.Helper()
	e, err := openEngine(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.close() })
	return e
}

func records(t *testing.T, e *engine, r region.Region) []dedupRecord {
	t.Helper()
	var out []dedupRecord
	if err := e.db.View(func(tx *bbolt.Tx) error {
		var err error
		out, err = regionDedupTx(tx, r)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// everything is the whole key space.
var everything = region.Region{ID: 1}

func seen(t *testing.T, e *engine, key string, id, clock, window uint64) bool {
	t.Helper()
	var ok bool
	if err := e.db.View(func(tx *bbolt.Tx) error {
		ok = seenTx(tx, []byte(key), id, clock, window)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ok
}

func remember(t *testing.T, e *engine, recs ...dedupRecord) {
	t.Helper()
	mustUpdate(t, e, func(tx *bbolt.Tx) error {
		for _, d := range recs {
			if err := rememberTx(tx, d.key, d.id, d.clock); err != nil {
				return err
			}
		}
		return nil
	})
}

func sweepAll(t *testing.T, e *engine, r region.Region, below uint64, budget int) {
	t.Helper()
	var from []byte
	for {
		mustUpdate(t, e, func(tx *bbolt.Tx) error {
			var err error
			from, err = sweepDedupTx(tx, r.StartKey, r.EndKey, from, below, budget)
			return err
		})
		if from == nil {
			return
		}
	}
}

func TestDedupSeenWithinWindowOfItsKey(t *testing.T) {
	const w = 10
	e := testEngine(t)
	remember(t, e, dedupRecord{clock: 100, id: 42, key: []byte("k")})
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
	remember(t, e, dedupRecord{clock: 200, id: 42, key: []byte("k")})
	if got, want := records(t, e, everything), []dedupRecord{{clock: 200, id: 42, key: []byte("k")}}; !reflect.DeepEqual(got, want) {
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
		a := dedupRecord{key: randKey(), id: uint64(rng.IntN(3))}
		b := dedupRecord{key: randKey(), id: uint64(rng.IntN(3))}
		if got, want := bytes.Compare(dedupKey(a.key, a.id), dedupKey(b.key, b.id)), compareDedup(a, b); got != want {
			t.Fatalf("%v vs %v: bucket order %d, record order %d", a, b, got, want)
		}
		key, id, err := parseDedupKey(dedupKey(a.key, a.id))
		if err != nil || !bytes.Equal(key, a.key) || id != a.id {
			t.Fatalf("%v decodes as %q/%d, %v", a, key, id, err)
		}
		start, end := randKey(), randKey()
		lo, hi := dedupRange(start, end)
		k := dedupKey(a.key, a.id)
		inBucket := bytes.Compare(k, lo) >= 0 && bytes.Compare(k, hi) < 0
		inRegion := bytes.Compare(a.key, start) >= 0 && bytes.Compare(a.key, end) < 0
		if inBucket != inRegion {
			t.Fatalf("key %q in [%q, %q): region says %v, bucket range says %v", a.key, start, end, inRegion, inBucket)
		}
	}
	for _, bad := range [][]byte{nil, {0, 1}, []byte("abcdefgh\x00\x01"), append([]byte("a\x00\x02"), make([]byte, 8)...), append([]byte("a\x00\x01b"), make([]byte, 8)...), append([]byte("a"), make([]byte, 8)...)} {
		if _, _, err := parseDedupKey(bad); !errors.Is(err, errCorrupt) {
			t.Errorf("parseDedupKey(%x) = %v, want errCorrupt", bad, err)
		}
	}
	if !dedupKeyFits(make([]byte, 16000)) || dedupKeyFits(make([]byte, bbolt.MaxKeySize)) {
		t.Error("dedupKeyFits misjudges")
	}
}

// applyRounds applies a log of writes the way applyWriteTx does, in apply
// rounds of the given sizes, trimming after each round as applyTx does (the
// real sweep, with its budget), and returns which entries were applied
// (not skipped as duplicates).
func applyRounds(t *testing.T, e *engine, first uint64, ids []uint64, rounds []int, window uint64) []bool {
	t.Helper()
	p := &Peer{regionID: 7, region: region.Region{ID: 7}}
	s := &Store{cfg: Config{DedupWindow: window}, eng: e}
	applied := make([]bool, len(ids))
	i := 0
	for _, n := range rounds {
		mustUpdate(t, e, func(tx *bbolt.Tx) error {
			end := min(i+n, len(ids))
			for ; i < end; i++ {
				clock := dedupClockTx(tx, 7, first+uint64(i))
				key := fmt.Appendf(nil, "k%d", ids[i]%3)
				if seenTx(tx, key, ids[i], clock, window) {
					continue
				}
				applied[i] = true
				if err := rememberTx(tx, key, ids[i], clock); err != nil {
					return err
				}
			}
			return s.trimDedupTx(tx, p, first+uint64(i)-1, n)
		})
	}
	if i != len(ids) {
		t.Fatalf("rounds cover %d of %d entries", i, len(ids))
	}
	return applied
}

// TestDedupDecisionIgnoresApplyRounds: replicas applying the same log in
// different batches decide every entry the same way (scenario 5).
func TestDedupDecisionIgnoresApplyRounds(t *testing.T) {
	const window = 4
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 50 {
		ids := make([]uint64, 60)
		for i := range ids {
			ids[i] = uint64(rng.IntN(8)) + 1 // many retries, near and far apart
		}
		var want []bool
		for r, rounds := range [][]int{
			ones(len(ids)),              // one entry per round (a leader under light load)
			{len(ids)},                  // all in one round (a follower catching up)
			randomRounds(rng, len(ids)), // anything between
			randomRounds(rng, len(ids)),
		} {
			got := applyRounds(t, testEngine(t), 6, ids, rounds, window)
			if r == 0 {
				want = got
				continue
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("trial %d: rounds %v decide %v, one-per-round decides %v (ids %v)", trial, rounds, got, want, ids)
			}
		}
	}
	// The concrete case of the issue: X, then X again 6 entries later with
	// window 4 is applied again everywhere.
	ids := []uint64{100, 2, 3, 4, 5, 6, 100}
	for _, rounds := range [][]int{ones(len(ids)), {len(ids)}} {
		if got := applyRounds(t, testEngine(t), 6, ids, rounds, 4); !got[6] {
			t.Errorf("rounds %v: retry past the window skipped", rounds)
		}
	}
}

func ones(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

func randomRounds(rng *rand.Rand, n int) []int {
	var out []int
	for n > 0 {
		k := min(n, 1+rng.IntN(10))
		out = append(out, k)
		n -= k
	}
	return out
}

// TestDedupSweepBoundsTheTable: a region writing a fresh request every
// entry keeps about a window of records, not every request it ever saw,
// and never trims a live one.
func TestDedupSweepBoundsTheTable(t *testing.T) {
	const window = 2000
	e := testEngine(t)
	r := region.Region{ID: 7}
	p := &Peer{regionID: 7, region: r}
	s := &Store{cfg: Config{DedupWindow: window}, eng: e}
	rng := rand.New(rand.NewPCG(5, 6))
	idx := uint64(raftInitIndex)
	maxSize := 0
	for round := range 2000 {
		n := 1 + rng.IntN(10)
		mustUpdate(t, e, func(tx *bbolt.Tx) error {
			for range n {
				idx++
				if err := rememberTx(tx, fmt.Appendf(nil, "k%08x", rng.Uint32()), rng.Uint64(), idx); err != nil {
					return err
				}
			}
			return s.trimDedupTx(tx, p, idx, n)
		})
		if round%100 == 99 {
			recs := records(t, e, r)
			maxSize = max(maxSize, len(recs))
			live := 0
			for _, d := range recs {
				if d.clock+window > idx {
					live++
				}
			}
			if want := int(min(idx-raftInitIndex, window)); live != want {
				t.Fatalf("after entry %d: %d live records, want %d", idx, live, want)
			}
		}
	}
	if maxSize > 2*window {
		t.Errorf("the table grew to %d records with a window of %d", maxSize, window)
	}
	t.Logf("at most %d records for a window of %d", maxSize, window)
}

// TestDedupSplitMovesNothing: the split writes the new region's clock base
// and leaves every record where it is; the new region sees the records of
// its keys for the rest of their window, counted in the parent's entries
// before the split and its own after.
func TestDedupSplitMovesNothing(t *testing.T) {
	const w = 10
	f := newSplitFixture(t, 0)
	f.s.cfg.DedupWindow = w
	recs := []dedupRecord{
		{clock: 12, id: 1, key: []byte("a")}, // left of the split: stays
		{clock: 12, id: 2, key: []byte("p")}, // right of it
		{clock: 15, id: 3, key: []byte("user8")},
	}
	remember(t, f.e, recs...)
	f.lastAt = 19 // the split applies at 20: clock 20
	before := records(t, f.e, everything)
	f.split(t, 9)
	if got := records(t, f.e, everything); !reflect.DeepEqual(got, before) {
		t.Fatalf("split changed the table: %v, was %v", got, before)
	}
	child := region.Region{ID: 9, StartKey: []byte("user8")}
	if got := records(t, f.e, child); len(got) != 1 || got[0].id != 3 {
		t.Errorf("the new region's records = %v", got)
	}
	var base uint64
	if err := f.e.db.View(func(tx *bbolt.Tx) error { base = dedupBaseTx(tx, 9); return nil }); err != nil {
		t.Fatal(err)
	}
	if base != 20-raftInitIndex {
		t.Fatalf("new region's clock base %d, want %d", base, 20-raftInitIndex)
	}
	// Entry raftInitIndex+1 of the new region is clock 21: record 3
	// (clock 15) is seen until clock 25, entry raftInitIndex+5.
	clockOf := func(i uint64) uint64 { return i + base }
	if !seen(t, f.e, "user8", 3, clockOf(raftInitIndex+1), w) || !seen(t, f.e, "user8", 3, clockOf(raftInitIndex+5), w) {
		t.Error("the new region does not see a live record of its range")
	}
	if seen(t, f.e, "user8", 3, clockOf(raftInitIndex+6), w) {
		t.Error("a record outlives its window in the new region")
	}
	if !seen(t, f.e, "a", 1, 21, w) {
		t.Error("the parent no longer sees a record of its range")
	}
}

func TestDedupDestroyForgetsOnlyTheRange(t *testing.T) {
	e := testEngine(t)
	remember(t, e, dedupRecord{clock: 11, id: 1, key: []byte("a")}, dedupRecord{clock: 12, id: 2, key: []byte("m")},
		dedupRecord{clock: 13, id: 3, key: []byte("m\x00")}, dedupRecord{clock: 14, id: 4, key: []byte("t")})
	mustUpdate(t, e, func(tx *bbolt.Tx) error {
		if err := putDedupBaseTx(tx, 7, 99); err != nil {
			return err
		}
		// A placeholder (uninitialized) holds no range: nothing goes.
		if err := destroyDedupTx(tx, region.Region{ID: 8}, false); err != nil {
			return err
		}
		return destroyDedupTx(tx, region.Region{ID: 7, StartKey: []byte("m"), EndKey: []byte("t")}, true)
	})
	got := records(t, e, everything)
	if len(got) != 2 || string(got[0].key) != "a" || string(got[1].key) != "t" {
		t.Errorf("records after destroying [m, t) = %v", got)
	}
	if err := e.db.View(func(tx *bbolt.Tx) error {
		if b := dedupBaseTx(tx, 7); b != 0 {
			return fmt.Errorf("clock base %d left", b)
		}
		return nil
	}); err != nil {
		t.Error(err)
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
	left := region.Region{ID: 1, EndKey: []byte("m")}
	right := region.Region{ID: 2, StartKey: []byte("m")}
	old := func(regionID, index, id uint64, key string) (k, v []byte) {
		k = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, regionID), id)
		v = append(binary.BigEndian.AppendUint64(nil, index), key...)
		return k, v
	}
	const n = dedupConvertBatch + 10 // more than one batch
	mustUpdate(t, e, func(tx *bbolt.Tx) error {
		for _, r := range []region.Region{left, right} {
			if err := putRegion(tx, r); err != nil {
				return err
			}
		}
		b, err := tx.CreateBucket(bucketDedupV2)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucket(bucketDedupV2Idx); err != nil {
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
	e.close()
	e, err = openEngine(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	if err := e.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketDedupV2) != nil || tx.Bucket(bucketDedupV2Idx) != nil {
			return errors.New("old buckets left")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := records(t, e, right); !reflect.DeepEqual(got, []dedupRecord{{clock: raftInitIndex, id: 7, key: []byte("p")}}) {
		t.Errorf("region 2 records = %v", got)
	}
	got := records(t, e, left)
	if len(got) != n {
		t.Fatalf("region 1 has %d records, want %d", len(got), n)
	}
	for i, d := range got {
		if want := (dedupRecord{clock: 100 + uint64(i), id: 1000 + uint64(i), key: fmt.Appendf(nil, "a%06d", i)}); !reflect.DeepEqual(d, want) {
			t.Fatalf("record %d = %v, want %v", i, d, want)
		}
	}
	if !seen(t, e, "a000003", 1003, 110, 10) || seen(t, e, "a000003", 1003, 114, 10) {
		t.Error("a converted record decides differently")
	}
}

// snapSource builds an engine holding region r with data, a dedup clock
// base and records.
func snapSource(t *testing.T, r region.Region, kvs map[string]string, base uint64, recs []dedupRecord) *engine {
	t.Helper()
	e := testEngine(t)
	mustUpdate(t, e, func(tx *bbolt.Tx) error {
		if err := putRegion(tx, r); err != nil {
			return err
		}
		if err := putApplyState(tx, r.ID, applyState{AppliedIndex: 50, AppliedTerm: 6, TruncatedIndex: 40, TruncatedTerm: 6}); err != nil {
			return err
		}
		if err := putDedupBaseTx(tx, r.ID, base); err != nil {
			return err
		}
		for k, v := range kvs {
			if err := tx.Bucket(bucketData).Put([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		for _, d := range recs {
			if err := rememberTx(tx, d.key, d.id, d.clock); err != nil {
				return err
			}
		}
		return nil
	})
	return e
}

func TestSnapshotCarriesTheDedupTable(t *testing.T) {
	r := testRegion()
	r.StartKey, r.EndKey = []byte("m"), []byte("t")
	recs := []dedupRecord{ // in key order, as the snapshot carries them
		{clock: 1045, id: 3, key: []byte("m")},
		{clock: 1005, id: 9, key: []byte("p")},
		{clock: 1045, id: 3, key: []byte("q")},
	}
	src := snapSource(t, r, map[string]string{"a": "left", "n": "1", "p": "2", "z": "right"}, 1000, recs)
	// The records of keys outside the region stay out of its snapshot.
	remember(t, src, dedupRecord{clock: 30, id: 5, key: []byte("a")}, dedupRecord{clock: 30, id: 6, key: []byte("t")})
	snap, err := src.buildSnapshot(r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(snap.Data, []byte("HKVS4")) {
		t.Fatalf("snapshot magic %q", snap.Data[:5])
	}

	dst := testEngine(t)
	other := dedupRecord{clock: 7, id: 77, key: []byte("b")}
	remember(t, dst,
		dedupRecord{clock: 2, id: 99, key: []byte("n")}, // stale state the snapshot replaces
		other) // another region's, left alone
	mustUpdate(t, dst, func(tx *bbolt.Tx) error { return tx.Bucket(bucketData).Put([]byte("o"), []byte("stale")) })
	var got region.Region
	mustUpdate(t, dst, func(tx *bbolt.Tx) error {
		var err error
		got, err = applySnapshotTx(tx, snap)
		return err
	})
	if got.ID != r.ID || !bytes.Equal(got.StartKey, r.StartKey) || !bytes.Equal(got.EndKey, r.EndKey) {
		t.Errorf("region = %v, want %v", got, r)
	}
	if d := records(t, dst, r); !reflect.DeepEqual(d, recs) {
		t.Errorf("dedup records = %v, want %v", d, recs)
	}
	if d := records(t, dst, everything); len(d) != len(recs)+1 || !reflect.DeepEqual(d[0], other) {
		t.Errorf("all records after the apply = %v", d)
	}
	var base uint64
	if err := dst.db.View(func(tx *bbolt.Tx) error { base = dedupBaseTx(tx, r.ID); return nil }); err != nil {
		t.Fatal(err)
	}
	if base != 1000 {
		t.Errorf("clock base %d, want 1000", base)
	}
	kvs, err := dst.scan(context.Background(), nil, nil, 100)
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
	r := testRegion()
	r.StartKey, r.EndKey = []byte("m"), []byte("t")
	src := snapSource(t, r, map[string]string{"n": "1", "p": "2"}, 0, []dedupRecord{{clock: 45, id: 3, key: []byte("p")}})
	snap, err := src.buildSnapshot(r.ID)
	if err != nil {
		t.Fatal(err)
	}
	good := snap.Data
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
		if _, err := decodeSnapshotData(data); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: err = %v, want errCorrupt", name, err)
		}
		if _, _, err := decodeSnapshotRegion(data); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: decodeSnapshotRegion err = %v, want errCorrupt", name, err)
		}
		dst := testEngine(t)
		err := dst.db.Update(func(tx *bbolt.Tx) error {
			_, err := applySnapshotTx(tx, raftpb.Snapshot{Data: data, Metadata: snap.Metadata})
			return err
		})
		if !errors.Is(err, errCorrupt) {
			t.Errorf("%s: applySnapshotTx err = %v, want errCorrupt", name, err)
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
