package raftstore

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
)

// The parts of the old raftstore/dedup_test.go that test raftstore's own
// code, not the engine's: the apply round's trimming (Store.trimDedupTx:
// its budget and where it keeps its place), and the split entry's apply
// (applySplitTx calling Tx.SplitDedup at its index). The engine's side of
// both is tested in storage/engine/dedup_test.go.

func dedupRecords(t *testing.T, e *engine.Engine, r region.Region) []engine.DedupRecord {
	t.Helper()
	var out []engine.DedupRecord
	if err := e.View(func(tx *engine.Tx) error {
		return tx.ForEachDedup(r.StartKey, r.EndKey, func(d engine.DedupRecord) error {
			d.Key = bytes.Clone(d.Key)
			out = append(out, d)
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func dedupSeen(t *testing.T, e *engine.Engine, key string, id, clock, window uint64) bool {
	t.Helper()
	var ok bool
	if err := e.View(func(tx *engine.Tx) error {
		ok = tx.DedupSeen([]byte(key), id, clock, window)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ok
}

// applyRounds applies a log of writes the way applyWriteTx does, in apply
// rounds of the given sizes, trimming after each round as applyTx does (the
// real sweep, with its budget), and returns which entries were applied
// (not skipped as duplicates).
func applyRounds(t *testing.T, e *engine.Engine, first uint64, ids []uint64, rounds []int, window uint64) []bool {
	t.Helper()
	p := &Peer{regionID: 7, region: region.Region{ID: 7}}
	s := &Store{cfg: Config{DedupWindow: window}, eng: e}
	applied := make([]bool, len(ids))
	i := 0
	for _, n := range rounds {
		if err := e.LockedUpdate(func(tx *engine.Tx) error {
			end := min(i+n, len(ids))
			for ; i < end; i++ {
				clock := tx.DedupClock(7, first+uint64(i))
				key := fmt.Appendf(nil, "k%d", ids[i]%3)
				if tx.DedupSeen(key, ids[i], clock, window) {
					continue
				}
				applied[i] = true
				if err := tx.DedupRemember(key, ids[i], clock); err != nil {
					return err
				}
			}
			return s.trimDedupTx(tx, p, first+uint64(i)-1, n)
		}); err != nil {
			t.Fatal(err)
		}
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
		if err := e.LockedUpdate(func(tx *engine.Tx) error {
			for range n {
				idx++
				if err := tx.DedupRemember(fmt.Appendf(nil, "k%08x", rng.Uint32()), rng.Uint64(), idx); err != nil {
					return err
				}
			}
			return s.trimDedupTx(tx, p, idx, n)
		}); err != nil {
			t.Fatal(err)
		}
		if round%100 == 99 {
			recs := dedupRecords(t, e, r)
			maxSize = max(maxSize, len(recs))
			live := 0
			for _, d := range recs {
				if d.Clock+window > idx {
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
	recs := []engine.DedupRecord{
		{Clock: 12, ID: 1, Key: []byte("a")}, // left of the split: stays
		{Clock: 12, ID: 2, Key: []byte("p")}, // right of it
		{Clock: 15, ID: 3, Key: []byte("user8")},
	}
	if err := f.e.LockedUpdate(func(tx *engine.Tx) error {
		for _, d := range recs {
			if err := tx.DedupRemember(d.Key, d.ID, d.Clock); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	everything := region.Region{ID: 1}
	f.lastAt = 19 // the split applies at 20: clock 20
	before := dedupRecords(t, f.e, everything)
	f.split(t, 9)
	if got := dedupRecords(t, f.e, everything); !reflect.DeepEqual(got, before) {
		t.Fatalf("split changed the table: %v, was %v", got, before)
	}
	child := region.Region{ID: 9, StartKey: []byte("user8")}
	if got := dedupRecords(t, f.e, child); len(got) != 1 || got[0].ID != 3 {
		t.Errorf("the new region's records = %v", got)
	}
	var base uint64
	if err := f.e.View(func(tx *engine.Tx) error { base = tx.DedupClock(9, 0); return nil }); err != nil {
		t.Fatal(err)
	}
	if base != 20-raftInitIndex {
		t.Fatalf("new region's clock base %d, want %d", base, 20-raftInitIndex)
	}
	// Entry raftInitIndex+1 of the new region is clock 21: record 3
	// (clock 15) is seen until clock 25, entry raftInitIndex+5.
	clockOf := func(i uint64) uint64 { return i + base }
	if !dedupSeen(t, f.e, "user8", 3, clockOf(raftInitIndex+1), w) || !dedupSeen(t, f.e, "user8", 3, clockOf(raftInitIndex+5), w) {
		t.Error("the new region does not see a live record of its range")
	}
	if dedupSeen(t, f.e, "user8", 3, clockOf(raftInitIndex+6), w) {
		t.Error("a record outlives its window in the new region")
	}
	if !dedupSeen(t, f.e, "a", 1, 21, w) {
		t.Error("the parent no longer sees a record of its range")
	}
}
