package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/storage/wal"
)

// mergeScan over a random overlay and file agrees with a model: the map
// of the file's pairs with the overlay's writes applied, read in order.
func TestMergeScanMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for round := range 500 {
		model := map[string]string{}
		var file []KV
		for i := range 40 {
			if rng.Intn(2) == 0 {
				k := fmt.Sprintf("k%02d", i)
				file = append(file, KV{Key: []byte(k), Value: []byte("f" + k)})
				model[k] = "f" + k
			}
		}
		ov := newOverlay()
		var items []ovItem
		for range rng.Intn(30) {
			k := fmt.Sprintf("k%02d", rng.Intn(40))
			if rng.Intn(3) == 0 {
				items = append(items, ovItem{key: []byte(k), del: true})
				delete(model, k)
			} else {
				v := fmt.Sprintf("o%d", rng.Int())
				items = append(items, ovItem{key: []byte(k), val: []byte(v)})
				model[k] = v
			}
		}
		ov.add(items)
		start, end := fmt.Sprintf("k%02d", rng.Intn(20)), fmt.Sprintf("k%02d", 20+rng.Intn(21))
		if rng.Intn(4) == 0 {
			end = ""
		}
		limit := 1 + rng.Intn(25)
		var want []string
		for k, v := range model {
			if k >= start && (end == "" || k < end) {
				want = append(want, k+"="+v)
			}
		}
		slices.Sort(want)
		want = want[:min(limit, len(want))]
		i := 0
		next := func() ([]byte, []byte, bool) {
			for i < len(file) && string(file[i].Key) < start {
				i++
			}
			if i >= len(file) || (end != "" && string(file[i].Key) >= end) {
				return nil, nil, false
			}
			i++
			return file[i-1].Key, file[i-1].Value, true
		}
		var got []string
		for _, kv := range mergeScan(ov.rangeFrom([]byte(start), []byte(end), limit), next, limit) {
			got = append(got, string(kv.Key)+"="+string(kv.Value))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d [%s, %s) limit %d:\n got %v\nwant %v", round, start, end, limit, got, want)
		}
	}
}

// A round's user writes are read back before the batch commits (from the
// overlay), deletions hide the file's pairs, and a commit changes nothing
// a reader sees.
func TestRoundWritesVisibleBeforeCommit(t *testing.T) {
	// A batch that never times out: a round slower than the default 20 ms
	// (a loaded -race run) would commit its own batch at once.
	e, err := Open(t.TempDir(), Options{NoSync: true, BatchInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	write := func(fn func(tx *Tx) error) {
		t.Helper()
		if err := e.Round(func() []wal.Item { return nil }, nil, fn); err != nil {
			t.Fatal(err)
		}
	}
	write(func(tx *Tx) error {
		for _, k := range []string{"a", "b", "c"} {
			if err := tx.Put([]byte(k), []byte("1")); err != nil {
				return err
			}
		}
		return nil
	})
	if err := e.CheckpointIfDue(true); err != nil {
		t.Fatal(err)
	}
	write(func(tx *Tx) error {
		if err := tx.Delete([]byte("a")); err != nil {
			return err
		}
		if err := tx.Put([]byte("b"), []byte("2")); err != nil {
			return err
		}
		return tx.Put([]byte("d"), []byte("2"))
	})
	check := func(when string) {
		t.Helper()
		if _, found, _ := e.Get([]byte("a")); found {
			t.Errorf("%s: a deleted in the open batch is found", when)
		}
		if v, _, _ := e.Get([]byte("b")); string(v) != "2" {
			t.Errorf("%s: b = %q, want 2", when, v)
		}
		kvs, err := e.Scan(context.Background(), nil, nil, 10)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, kv := range kvs {
			got = append(got, string(kv.Key)+"="+string(kv.Value))
		}
		if want := []string{"b=2", "c=1", "d=2"}; !slices.Equal(got, want) {
			t.Errorf("%s: scan %v, want %v", when, got, want)
		}
		got = nil
		kvs, _ = e.BatchGet([][]byte{[]byte("a"), []byte("b"), []byte("c")})
		for _, kv := range kvs {
			got = append(got, string(kv.Key)+"="+string(kv.Value))
		}
		if want := []string{"b=2", "c=1"}; !slices.Equal(got, want) {
			t.Errorf("%s: batch get %v, want %v", when, got, want)
		}
	}
	if e.batch == nil || e.ov.len() != 3 {
		t.Fatalf("after a round: batch open %v, overlay %d items; want open, 3", e.batch != nil, e.ov.len())
	}
	check("before the commit")
	if err := e.CheckpointIfDue(true); err != nil {
		t.Fatal(err)
	}
	if e.batch != nil || e.ov.len() != 0 {
		t.Fatalf("after a checkpoint: batch open %v, overlay %d items; want neither", e.batch != nil, e.ov.len())
	}
	check("after the commit")
}

// Readers running beside rounds and commits never see a state that is
// not one the rounds made: every round rewrites all keys with one value,
// so a scan must see all keys, all with one value.
func TestReadersSeeWholeRoundsAcrossCommits(t *testing.T) {
	e, err := openEngine(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	const keys = 50
	writeAll := func(gen int) error {
		return e.Round(func() []wal.Item { return nil }, nil, func(tx *Tx) error {
			for i := range keys {
				if err := tx.Put(fmt.Appendf(nil, "k%03d", i), fmt.Appendf(nil, "%d", gen)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := writeAll(0); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				kvs, err := e.Scan(context.Background(), nil, nil, 2*keys)
				if err != nil {
					errs <- err
					return
				}
				if len(kvs) != keys {
					errs <- fmt.Errorf("scan saw %d keys, want %d", len(kvs), keys)
					return
				}
				for _, kv := range kvs {
					if string(kv.Value) != string(kvs[0].Value) {
						errs <- fmt.Errorf("scan saw %s=%s beside %s=%s: parts of two rounds", kv.Key, kv.Value, kvs[0].Key, kvs[0].Value)
						return
					}
				}
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	for gen := 1; gen < 400 && time.Now().Before(deadline); gen++ {
		if err := writeAll(gen); err != nil {
			t.Fatal(err)
		}
		if gen%7 == 0 {
			if err := e.CheckpointIfDue(true); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A round that fails loses the open batch (the rounds before it since the
// last commit): the store is frozen until RecoverLost rebuilds their raft
// log and hard state from the WAL; rounds and checkpoints are refused
// meanwhile.
func TestLostBatchRebuiltFromWAL(t *testing.T) {
	e, err := openEngine(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	log := ents(2, 1, 5)
	item := wal.Item{RegionID: 7, Entries: log}
	err = e.Round(func() []wal.Item { return []wal.Item{item} }, nil, func(tx *Tx) error {
		return tx.AppendEntries(7, log, 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	boom := fmt.Errorf("boom")
	if err := e.Round(func() []wal.Item { return nil }, nil, func(*Tx) error { return boom }); err != boom {
		t.Fatalf("failed round: %v", err)
	}
	if err := e.Round(func() []wal.Item { return nil }, nil, func(*Tx) error { return nil }); err != errBatchLost {
		t.Fatalf("a round after the loss: %v, want errBatchLost", err)
	}
	// No checkpoint may pass over the loss: it would drop the WAL records
	// that alone hold the lost rounds, behind the back of peers that
	// applied them. The idle loop's checkpoint reports it, so the store
	// freezes and rebuilds its peers even with no round to run.
	e.sinceCkpt = true
	e.ckptAt = time.Time{}
	for _, force := range []bool{false, true} {
		if err := e.CheckpointIfDue(force); !errors.Is(err, errBatchLost) {
			t.Fatalf("checkpoint (force %v) after the loss: %v, want errBatchLost", force, err)
		}
	}
	if err := e.RecoverLost(nil); err != nil {
		t.Fatal(err)
	}
	err = e.View(func(tx *Tx) error {
		for _, ent := range log {
			term, ok, err := tx.Term(7, ent.Index)
			if err != nil {
				return err
			}
			if !ok || term != ent.Term {
				return fmt.Errorf("entry %d not rebuilt (found %v, term %d)", ent.Index, ok, term)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Round(func() []wal.Item { return nil }, nil, func(*Tx) error { return nil }); err != nil {
		t.Fatalf("a round after the rebuild: %v", err)
	}
}
