package raftstore

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3/raftpb"
)

// The cost of applying a split, measured on the real apply path
// (applySplitTx inside one engine write transaction, committed): a region
// holding n keys, each written once by its own request (random request
// IDs, random user keys), so that its dedup table is full, split at its
// middle key. Issue 18 measured 11.8 s for n = 100,000 when the split
// moved the table's records; a split must cost the same whatever the
// region holds.

// splitFixture is an engine holding one region [nil, +inf) with n keys and
// their dedup records, as apply rounds of a busy leader would leave them.
type splitFixture struct {
	e      *engine.Engine
	s      *Store
	p      *Peer
	mid    []byte // the middle key
	lastAt uint64 // the index the last write was applied at
}

func newSplitFixture(tb testing.TB, n int) *splitFixture {
	tb.Helper()
	e, err := engine.Open(tb.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	r := testRegion()
	r.ID = 1
	rng := rand.New(rand.NewPCG(uint64(n), 18))
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "user%016x", rng.Uint64())
	}
	value := make([]byte, 100)
	const perRound = 500 // a busy apply round
	window := uint64(max(n, 1)) + 1000
	idx := uint64(raftInitIndex)
	for lo := 0; lo < n || lo == 0; lo += perRound {
		err := e.Update(func(tx *engine.Tx) error {
			if lo == 0 {
				if err := putRegion(tx, r); err != nil {
					return err
				}
			}
			for _, k := range keys[lo:min(lo+perRound, n)] {
				idx++
				if err := tx.DedupRemember(k, rng.Uint64(), idx); err != nil {
					return err
				}
				if err := tx.Put(k, value); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			tb.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	mid := []byte("user8")
	p := &Peer{regionID: r.ID, id: 1, region: r, initialized: true}
	s := &Store{cfg: Config{DedupWindow: window}, eng: e, peers: map[uint64]*Peer{r.ID: p}}
	return &splitFixture{e: e, s: s, p: p, mid: mid, lastAt: idx}
}

// split applies the split entry at the next index and returns how long the
// apply took and how long the rest of its update (the commit, and the
// checkpoint's bookkeeping: no fsync) took.
func (f *splitFixture) split(tb testing.TB, newID uint64) (apply, commit time.Duration) {
	tb.Helper()
	rp := &readyPeer{p: f.p}
	f.lastAt++
	cmd := command{op: opSplit, id: 99, key: f.mid, value: encodeSplit(newID, f.p.region.Epoch)}
	ent := raftpb.Entry{Index: f.lastAt, Term: 6}
	start := time.Now()
	err := f.e.Update(func(tx *engine.Tx) error {
		err := f.s.applySplitTx(tx, rp, &ent, cmd)
		apply = time.Since(start)
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	commit = time.Since(start) - apply
	if len(rp.acked) != 1 || rp.acked[0].err != nil || len(rp.created) != 1 {
		tb.Fatalf("split not applied: acked %+v, created %d", rp.acked, len(rp.created))
	}
	return apply, commit
}

// BenchmarkSplitApply: go test ./raftstore/ -run '^$' -bench SplitApply -benchtime 1x
func BenchmarkSplitApply(b *testing.B) {
	for _, n := range []int{0, 10000, 100000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			var apply, commit time.Duration
			for i := range b.N {
				b.StopTimer()
				f := newSplitFixture(b, n)
				b.StartTimer()
				a, c := f.split(b, 1000+uint64(i))
				apply += a
				commit += c
			}
			b.ReportMetric(float64(apply.Microseconds())/float64(b.N)/1000, "apply-ms/op")
			b.ReportMetric(float64(commit.Microseconds())/float64(b.N)/1000, "commit-ms/op")
		})
	}
}

// TestSplitApplyCostIsIndependentOfTheDedupTable: splitting a region
// whose dedup table is full (HEDGEKV_SPLIT_COST_N records, 100,000 by
// default: DedupWindow's default) costs about what splitting one with an
// empty table does. The bound is loose (shared 2-core machines, -race):
// the old split took seconds here.
func TestSplitApplyCostIsIndependentOfTheDedupTable(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 100,000-record dedup table")
	}
	n := 100000
	if v, err := strconv.Atoi(os.Getenv("HEDGEKV_SPLIT_COST_N")); err == nil && v > 0 {
		n = v
	}
	empty := newSplitFixture(t, 0)
	full := newSplitFixture(t, n)
	ea, ec := empty.split(t, 1000)
	fa, fc := full.split(t, 1000)
	t.Logf("split apply with %d records: apply %v, commit %v; with none: apply %v, commit %v", n, fa, fc, ea, ec)
	if limit := 50*time.Millisecond + 20*ea; fa > limit {
		t.Errorf("split apply with %d dedup records took %v, want under %v (an empty region's took %v)", n, fa, limit, ea)
	}
}

// TestSplitKeyCountsInBatchesAndSplitsNearTheMiddle: the split check
// counts a region exactly across its many short read transactions and
// picks a split key within a sample's distance of the middle, by count or
// by size.
func TestSplitKeyCountsInBatchesAndSplitsNearTheMiddle(t *testing.T) {
	e := testEngine(t)
	const n = 3*splitCheckBatch + 17
	mustUpdate(t, e, func(tx *engine.Tx) error {
		for _, k := range []string{"a", "zz"} { // outside the region
			if err := tx.Put([]byte(k), []byte("x")); err != nil {
				return err
			}
		}
		for i := range n {
			if err := tx.Put(fmt.Appendf(nil, "k%06d", i), make([]byte, 10)); err != nil {
				return err
			}
		}
		return nil
	})
	r := region.Region{ID: 1, StartKey: []byte("b"), EndKey: []byte("z"), Epoch: region.Epoch{Version: 3}}
	size, key, ok := splitKey(e, r, 0, 1<<30, nil, nil)
	if !size.counted || size.keys != n || size.bytes != n*(7+10) || size.version != 3 || ok {
		t.Fatalf("under the threshold: size %+v, key %q, ok %v", size, key, ok)
	}
	mid := func(key []byte) int {
		var i int
		if _, err := fmt.Sscanf(string(key), "k%06d", &i); err != nil {
			t.Fatalf("split key %q: %v", key, err)
		}
		return i
	}
	_, key, ok = splitKey(e, r, n-1, 0, nil, nil)
	if !ok || mid(key) < n/2 || mid(key) > n/2+splitSampleKeys {
		t.Fatalf("over the key threshold: split at %q, ok %v", key, ok)
	}
	_, key, ok = splitKey(e, r, 0, 1000, nil, nil)
	if !ok || mid(key) < n/2 || mid(key) > n/2+splitSampleKeys {
		t.Fatalf("over the size threshold: split at %q, ok %v", key, ok)
	}
	stop := make(chan struct{})
	close(stop)
	if size, _, ok := splitKey(e, r, 1, 0, nil, stop); size.counted || ok {
		t.Fatal("a stopped check counted")
	}

	// A few big values: sampled by size, split by size.
	big := testEngine(t)
	mustUpdate(t, big, func(tx *engine.Tx) error {
		for i := range 8 {
			if err := tx.Put(fmt.Appendf(nil, "k%06d", i), make([]byte, 1<<20)); err != nil {
				return err
			}
		}
		return nil
	})
	_, key, ok = splitKey(big, region.Region{ID: 1}, 0, 4<<20, nil, nil)
	if !ok || mid(key) != 4 {
		t.Fatalf("8 values of 1 MiB over 4 MiB: split at %q, ok %v", key, ok)
	}
	// A single key cannot be split.
	one := testEngine(t)
	mustUpdate(t, one, func(tx *engine.Tx) error { return tx.Put([]byte("k"), make([]byte, 1<<20)) })
	if _, key, ok := splitKey(one, region.Region{ID: 1}, 0, 1<<10, nil, nil); ok {
		t.Fatalf("a one-key region split at %q", key)
	}
}

// BenchmarkSnapshotApplyFullDedup: applying a snapshot of a region with a
// full dedup table (the records go in sorted, in the round's transaction).
// go test ./raftstore/ -run '^$' -bench SnapshotApplyFullDedup -benchtime 1x
func BenchmarkSnapshotApplyFullDedup(b *testing.B) {
	f := newSplitFixture(b, 100000)
	if err := f.e.Update(func(tx *engine.Tx) error {
		return tx.PutApplyState(1, engine.ApplyState{AppliedIndex: f.lastAt, AppliedTerm: 6, TruncatedIndex: f.lastAt, TruncatedTerm: 6})
	}); err != nil {
		b.Fatal(err)
	}
	snap, err := buildSnapshot(f.e, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		dst, err := engine.Open(b.TempDir(), engine.Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := dst.Update(func(tx *engine.Tx) error {
			_, err := tx.ApplySnapshot(snap.Data, snap.Metadata.Index, snap.Metadata.Term)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		dst.Close()
	}
	b.ReportMetric(float64(len(snap.Data))/(1<<20), "snapshot-MiB")
}
