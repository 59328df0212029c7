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

func records(t *testing.T, e *engine, regionID uint64) []dedupRecord {
	t.Helper()
	var out []dedupRecord
	if err := e.db.View(func(tx *bbolt.Tx) error {
		out = regionDedupTx(tx, regionID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func seen(t *testing.T, e *engine, regionID, index, id, window uint64) bool {
	t.Helper()
	var ok bool
	if err := e.db.View(func(tx *bbolt.Tx) error {
		ok = seenTx(tx, regionID, index, id, window)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestDedupSeenWithinWindowOfItsRegion(t *testing.T) {
	const w = 10
	e := testEngine(t)
	mustUpdate(t, e, func(tx *bbolt.Tx) error { return rememberTx(tx, 7, 100, 42, []byte("k")) })
	for idx := uint64(101); idx <= 100+w; idx++ {
		if !seen(t, e, 7, idx, 42, w) {
			t.Errorf("entry %d: request applied at 100 not seen with window %d", idx, w)
		}
	}
	if seen(t, e, 7, 101+w, 42, w) {
		t.Errorf("entry %d: request applied at 100 still seen past window %d", 101+w, w)
	}
	if seen(t, e, 8, 101, 42, w) {
		t.Error("a request applied in region 7 is seen in region 8")
	}
	if seen(t, e, 7, 101, 43, w) {
		t.Error("an unknown request is seen")
	}

	// Remembering it again (applied again past the window) moves it.
	mustUpdate(t, e, func(tx *bbolt.Tx) error { return rememberTx(tx, 7, 200, 42, []byte("k")) })
	if got, want := records(t, e, 7), []dedupRecord{{index: 200, id: 42, key: []byte("k")}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("records = %v, want %v", got, want)
	}
	// Trimming below the first record leaves it, however often asked.
	mustUpdate(t, e, func(tx *bbolt.Tx) error { return trimDedupTx(tx, 7, 200+w-1, w) })
	if len(records(t, e, 7)) != 1 {
		t.Fatal("trim removed a record a future entry could still see")
	}
	mustUpdate(t, e, func(tx *bbolt.Tx) error { return trimDedupTx(tx, 7, 200+w, w) })
	if r := records(t, e, 7); len(r) != 0 {
		t.Fatalf("records after trim = %v", r)
	}
	if seen(t, e, 7, 201, 42, w) {
		t.Fatal("trimmed record still seen")
	}
}

// applyRounds applies a log of writes the way applyWriteTx does, in apply
// rounds of the given sizes, trimming after each round as applyTx does, and
// returns which entries were applied (not skipped as duplicates).
func applyRounds(t *testing.T, e *engine, regionID, first uint64, ids []uint64, rounds []int, window uint64) []bool {
	t.Helper()
	applied := make([]bool, len(ids))
	i := 0
	for _, n := range rounds {
		mustUpdate(t, e, func(tx *bbolt.Tx) error {
			for end := min(i+n, len(ids)); i < end; i++ {
				idx := first + uint64(i)
				if seenTx(tx, regionID, idx, ids[i], window) {
					continue
				}
				applied[i] = true
				if err := rememberTx(tx, regionID, idx, ids[i], fmt.Appendf(nil, "k%d", ids[i])); err != nil {
					return err
				}
			}
			return trimDedupTx(tx, regionID, first+uint64(i)-1, window)
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
			got := applyRounds(t, testEngine(t), 7, 6, ids, rounds, window)
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
		if got := applyRounds(t, testEngine(t), 7, 6, ids, rounds, 4); !got[6] {
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

func TestDedupSplitMovesLiveRecordsOfTheMovedRange(t *testing.T) {
	const w = 10
	const parent, child, at = 7, 9, 20
	setup := func(t *testing.T) *engine {
		e := testEngine(t)
		mustUpdate(t, e, func(tx *bbolt.Tx) error {
			for _, r := range []dedupRecord{
				{index: 15, id: 1, key: []byte("a")}, // left of the split: stays
				{index: 12, id: 2, key: []byte("p")}, // moved
				{index: 11, id: 3, key: []byte("q")}, // moved: entry 21 could still see it
				{index: 10, id: 4, key: []byte("r")}, // dead: 21-10 > w
				{index: 3, id: 5, key: []byte("z")},  // long dead, not trimmed yet here
				{index: 19, id: 6, key: []byte("m")}, // the split key moves
			} {
				if err := rememberTx(tx, parent, r.index, r.id, r.key); err != nil {
					return err
				}
			}
			return nil
		})
		return e
	}

	e := setup(t)
	mustUpdate(t, e, func(tx *bbolt.Tx) error {
		return splitDedupTx(tx, parent, child, at, w, []byte("m"), nil, true)
	})
	if got, want := records(t, e, parent), []dedupRecord{{index: 15, id: 1, key: []byte("a")}}; !reflect.DeepEqual(got, want) {
		t.Errorf("parent records = %v, want %v", got, want)
	}
	wantChild := []dedupRecord{
		{index: raftInitIndex, id: 2, key: []byte("p")},
		{index: raftInitIndex, id: 3, key: []byte("q")},
		{index: raftInitIndex, id: 6, key: []byte("m")},
	}
	if got := records(t, e, child); !reflect.DeepEqual(got, wantChild) {
		t.Errorf("child records = %v, want %v", got, wantChild)
	}
	// Re-based: a full window of the child's own log sees them.
	if !seen(t, e, child, raftInitIndex+1, 2, w) || !seen(t, e, child, raftInitIndex+w, 3, w) || seen(t, e, child, raftInitIndex+w+1, 2, w) {
		t.Error("moved records are not seen for exactly one window of the child's log")
	}
	if seen(t, e, child, raftInitIndex+1, 4, w) || seen(t, e, parent, at+1, 2, w) {
		t.Error("a dead or moved-away record is seen")
	}

	// The split key range may be bounded on the right too.
	e = setup(t)
	mustUpdate(t, e, func(tx *bbolt.Tx) error {
		return splitDedupTx(tx, parent, child, at, w, []byte("m"), []byte("q"), true)
	})
	if got := records(t, e, child); len(got) != 2 || string(got[0].key) != "p" || string(got[1].key) != "m" {
		t.Errorf("child records for [m, q) = %v", got)
	}
	if got := records(t, e, parent); len(got) != 4 { // a, q, r, z
		t.Errorf("parent records after moving [m, q) = %v", got)
	}

	// A child already initialized here (by a snapshot from its own leader)
	// is ahead of the split and keeps its own table.
	e = setup(t)
	own := dedupRecord{index: 30, id: 77, key: []byte("x")}
	mustUpdate(t, e, func(tx *bbolt.Tx) error {
		if err := rememberTx(tx, child, own.index, own.id, own.key); err != nil {
			return err
		}
		return splitDedupTx(tx, parent, child, at, w, []byte("m"), nil, false)
	})
	if got := records(t, e, child); !reflect.DeepEqual(got, []dedupRecord{own}) {
		t.Errorf("initialized child's records = %v, want only its own", got)
	}
	if got := records(t, e, parent); len(got) != 1 {
		t.Errorf("parent records = %v, want only the left one", got)
	}
}

func TestDedupTrimAllForgetsOnlyTheRegion(t *testing.T) {
	e := testEngine(t)
	mustUpdate(t, e, func(tx *bbolt.Tx) error {
		for i := uint64(1); i <= 3; i++ {
			if err := rememberTx(tx, 7, 10+i, i, []byte("k")); err != nil {
				return err
			}
			if err := rememberTx(tx, 8, 10+i, i, []byte("k")); err != nil {
				return err
			}
		}
		return trimDedupAllTx(tx, 7)
	})
	if r := records(t, e, 7); len(r) != 0 {
		t.Errorf("region 7 records after trimDedupAllTx = %v", r)
	}
	if r := records(t, e, 8); len(r) != 3 {
		t.Errorf("region 8 records = %v, want 3", r)
	}
	if err := e.db.View(func(tx *bbolt.Tx) error {
		if n := tx.Bucket(bucketDedup).Stats().KeyN; n != 3 {
			return fmt.Errorf("%d primary records left, want 3", n)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// snapSource builds an engine holding region r with data and a dedup table.
func snapSource(t *testing.T, r region.Region, kvs map[string]string, recs []dedupRecord) *engine {
	t.Helper()
	e := testEngine(t)
	mustUpdate(t, e, func(tx *bbolt.Tx) error {
		if err := putRegion(tx, r); err != nil {
			return err
		}
		if err := putApplyState(tx, r.ID, applyState{AppliedIndex: 50, AppliedTerm: 6, TruncatedIndex: 40, TruncatedTerm: 6}); err != nil {
			return err
		}
		for k, v := range kvs {
			if err := tx.Bucket(bucketData).Put([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		for _, d := range recs {
			if err := rememberTx(tx, r.ID, d.index, d.id, d.key); err != nil {
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
	recs := []dedupRecord{
		{index: raftInitIndex, id: 9, key: []byte("p")},
		{index: 45, id: 3, key: []byte("q")},
		{index: 48, id: 1, key: []byte("")}, // not in range (a corrupt key would be refused) — replaced below
	}
	recs = recs[:2]
	src := snapSource(t, r, map[string]string{"a": "left", "n": "1", "p": "2", "z": "right"}, recs)
	// Another region's records stay out of its snapshot.
	mustUpdate(t, src, func(tx *bbolt.Tx) error { return rememberTx(tx, 1, 30, 5, []byte("a")) })
	snap, err := src.buildSnapshot(r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(snap.Data, []byte("HKVS3")) {
		t.Fatalf("snapshot magic %q", snap.Data[:5])
	}

	dst := testEngine(t)
	mustUpdate(t, dst, func(tx *bbolt.Tx) error {
		// Stale state the snapshot replaces.
		if err := rememberTx(tx, r.ID, 2, 99, []byte("n")); err != nil {
			return err
		}
		return tx.Bucket(bucketData).Put([]byte("o"), []byte("stale"))
	})
	var got region.Region
	mustUpdate(t, dst, func(tx *bbolt.Tx) error {
		var err error
		got, err = applySnapshotTx(tx, snap)
		return err
	})
	if got.ID != r.ID || !bytes.Equal(got.StartKey, r.StartKey) || !bytes.Equal(got.EndKey, r.EndKey) {
		t.Errorf("region = %v, want %v", got, r)
	}
	if d := records(t, dst, r.ID); !reflect.DeepEqual(d, recs) {
		t.Errorf("dedup records = %v, want %v", d, recs)
	}
	if d := records(t, dst, 1); len(d) != 0 {
		t.Errorf("another region's records travelled: %v", d)
	}
	kvs, err := dst.scan(context.Background(), nil, nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(kvs) != 2 || string(kvs[0].Key) != "n" || string(kvs[1].Key) != "p" || string(kvs[1].Value) != "2" {
		t.Errorf("data = %v", kvs)
	}
	if !seen(t, dst, r.ID, 51, 3, 10) || seen(t, dst, r.ID, 51, 99, 10) {
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
	src := snapSource(t, r, map[string]string{"n": "1", "p": "2"}, []dedupRecord{{index: 45, id: 3, key: []byte("p")}})
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
	mustRefuse("old format", append([]byte("HKVS2"), good[5:]...))

	// Well sealed, but malformed inside.
	meta := []byte(`{"ID":7,"StartKey":"bQ==","EndKey":"dA=="}`)
	head := append([]byte("HKVS3"), binary.AppendUvarint(nil, uint64(len(meta)))...)
	head = append(head, meta...)
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
	mustRefuse("data key out of the region", seal(cat(head, n(0), kv("z", "1"))))
	mustRefuse("key without a value", seal(cat(head, n(0), kv("n", "1")[:2])))
	mustRefuse("no record count", seal(head))
	mustRefuse("bad meta", seal(cat([]byte("HKVS3"), n(3), []byte("{x}"), n(0))))
	mustRefuse("meta length past the end", seal(cat([]byte("HKVS3"), n(1<<50))))
	mustRefuse("empty", nil)
}
