package raftstore

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// The bbolt log must behave as a raft.Storage exactly like raft's own
// MemoryStorage, and keep behaving so after a reload from disk, across
// appends that overwrite a conflicting tail, compaction and snapshots.

func testRegion() region.Region {
	return region.Region{ID: 7, Epoch: region.Epoch{ConfVer: 1, Version: 1}, Peers: []region.Peer{{ID: 1, StoreID: 1}, {ID: 2, StoreID: 2}, {ID: 3, StoreID: 3}}}
}

func mustUpdate(t testing.TB, e *engine.Engine, fn func(*engine.Tx) error) {
	t.Helper()
	if err := e.Update(fn); err != nil {
		t.Fatal(err)
	}
}

// testEngine is an engine in a temporary directory, without fsyncs,
// closed when the test ends.
func testEngine(tb testing.TB) *engine.Engine {
	tb.Helper()
	e, err := engine.Open(tb.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = e.Close() })
	return e
}

// reload rebuilds the region's storage from what bbolt holds.
func reload(t *testing.T, e *engine.Engine) *peerStorage {
	t.Helper()
	pps, err := loadPeers(e)
	if err != nil || len(pps) != 1 {
		t.Fatalf("loadPeers = %d peers, %v", len(pps), err)
	}
	ps, err := newPeerStorage(e, pps[0], new(atomic.Uint64))
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func ents(term uint64, lo, hi uint64) []raftpb.Entry {
	var out []raftpb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, raftpb.Entry{Index: i, Term: term, Data: []byte{byte(i)}})
	}
	return out
}

type want struct {
	first, last uint64
	terms       map[uint64]uint64 // index -> term; others checked via errors
}

func check(t *testing.T, name string, s raft.Storage, w want) {
	t.Helper()
	if fi, _ := s.FirstIndex(); fi != w.first {
		t.Errorf("%s: FirstIndex = %d, want %d", name, fi, w.first)
	}
	if li, _ := s.LastIndex(); li != w.last {
		t.Errorf("%s: LastIndex = %d, want %d", name, li, w.last)
	}
	for i, term := range w.terms {
		if got, err := s.Term(i); err != nil || got != term {
			t.Errorf("%s: Term(%d) = %d, %v; want %d", name, i, got, err, term)
		}
	}
	if _, err := s.Term(w.first - 2); w.first >= 2 && !errors.Is(err, raft.ErrCompacted) {
		t.Errorf("%s: Term(%d) err = %v, want ErrCompacted", name, w.first-2, err)
	}
	if _, err := s.Term(w.last + 1); !errors.Is(err, raft.ErrUnavailable) {
		t.Errorf("%s: Term(last+1) err = %v, want ErrUnavailable", name, err)
	}
	if _, err := s.Entries(w.first-1, w.last+1, ^uint64(0)); !errors.Is(err, raft.ErrCompacted) {
		t.Errorf("%s: Entries(first-1) err = %v, want ErrCompacted", name, err)
	}
	if w.last >= w.first {
		es, err := s.Entries(w.first, w.last+1, ^uint64(0))
		if err != nil || uint64(len(es)) != w.last-w.first+1 {
			t.Errorf("%s: Entries(all) = %d entries, %v", name, len(es), err)
		}
		for _, e := range es {
			if term, ok := w.terms[e.Index]; ok && e.Term != term {
				t.Errorf("%s: entry %d has term %d, want %d", name, e.Index, e.Term, term)
			}
		}
		// maxSize always returns at least one entry.
		if es, _ := s.Entries(w.first, w.last+1, 1); len(es) != 1 {
			t.Errorf("%s: Entries(maxSize=1) = %d entries, want 1", name, len(es))
		}
	}
}

func TestPeerStorageConformance(t *testing.T) {
	e, err := engine.Open(t.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	r := testRegion()
	mustUpdate(t, e, func(tx *engine.Tx) error {
		if err := putRegion(tx, r); err != nil {
			return err
		}
		if err := tx.PutHardState(r.ID, raftpb.HardState{Term: 5, Commit: 5}); err != nil {
			return err
		}
		return tx.PutApplyState(r.ID, engine.ApplyState{AppliedIndex: 5, AppliedTerm: 5, TruncatedIndex: 5, TruncatedTerm: 5})
	})
	s := reload(t, e)
	check(t, "bootstrap", s, want{first: 6, last: 5, terms: map[uint64]uint64{5: 5}})
	if cs := s.MemoryStorage; cs == nil {
		t.Fatal("no mirror")
	}
	if _, cs, _ := s.InitialState(); len(cs.Voters) != 3 {
		t.Errorf("InitialState voters = %v, want 3 peers", cs.Voters)
	}

	// Append 6..20 in term 5, then 15..17 in term 7 over a conflicting tail.
	mustUpdate(t, e, func(tx *engine.Tx) error { return tx.AppendEntries(r.ID, ents(5, 6, 20), 5) })
	check(t, "append", reload(t, e), want{first: 6, last: 20, terms: map[uint64]uint64{5: 5, 6: 5, 20: 5}})
	mustUpdate(t, e, func(tx *engine.Tx) error { return tx.AppendEntries(r.ID, ents(7, 15, 17), 20) })
	s = reload(t, e)
	check(t, "overwrite", s, want{first: 6, last: 17, terms: map[uint64]uint64{14: 5, 15: 7, 17: 7}})

	// The mirror answers like the reloaded copy.
	ms := raft.NewMemoryStorage()
	_ = ms.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 5, Term: 5}})
	_ = ms.Append(ents(5, 6, 20))
	_ = ms.Append(ents(7, 15, 17))
	check(t, "memory reference", ms, want{first: 6, last: 17, terms: map[uint64]uint64{14: 5, 15: 7, 17: 7}})

	// Compact through 10.
	mustUpdate(t, e, func(tx *engine.Tx) error {
		if err := tx.DeleteLog(r.ID, 6, 10); err != nil {
			return err
		}
		return tx.PutApplyState(r.ID, engine.ApplyState{AppliedIndex: 12, AppliedTerm: 5, TruncatedIndex: 10, TruncatedTerm: 5})
	})
	check(t, "compacted", reload(t, e), want{first: 11, last: 17, terms: map[uint64]uint64{10: 5, 11: 5, 17: 7}})

	// Snapshot at the applied index, with data, moved to a fresh engine.
	mustUpdate(t, e, func(tx *engine.Tx) error {
		for _, k := range []string{"a", "b", "c"} {
			if err := tx.Put([]byte(k), []byte("v"+k)); err != nil {
				return err
			}
		}
		return tx.PutApplyState(r.ID, engine.ApplyState{AppliedIndex: 16, AppliedTerm: 7, TruncatedIndex: 10, TruncatedTerm: 5})
	})
	snap, err := reload(t, e).Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if snap.Metadata.Index != 16 || snap.Metadata.Term != 7 || len(snap.Metadata.ConfState.Voters) != 3 {
		t.Fatalf("snapshot metadata = %+v", snap.Metadata)
	}
	e2, err := engine.Open(t.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	mustUpdate(t, e2, func(tx *engine.Tx) error {
		// Stale state the snapshot must replace.
		if err := tx.Put([]byte("b"), []byte("old")); err != nil {
			return err
		}
		if err := tx.AppendEntries(r.ID, ents(2, 1, 3), 0); err != nil {
			return err
		}
		_, err := tx.ApplySnapshot(snap.Data, snap.Metadata.Index, snap.Metadata.Term)
		return err
	})
	check(t, "after snapshot", reload(t, e2), want{first: 17, last: 16, terms: map[uint64]uint64{16: 7}})
	for _, k := range []string{"a", "b", "c"} {
		v, ok, err := e2.Get([]byte(k))
		if err != nil || !ok || string(v) != "v"+k {
			t.Errorf("after snapshot get %s = %q %v %v", k, v, ok, err)
		}
	}
}

func TestCommandRoundTrip(t *testing.T) {
	for _, c := range []command{
		{op: opPut, id: 1, key: []byte("k"), value: []byte("v")},
		{op: opDelete, id: 1 << 60, key: []byte("key")},
		{op: opPut, id: 3, key: []byte("k"), value: nil},
		{op: opCommitMerge, id: 4, key: []byte("m"), value: []byte("meta")},
	} {
		got, err := decodeCommand(c.encode())
		if err != nil || got.op != c.op || got.id != c.id || string(got.key) != string(c.key) || string(got.value) != string(c.value) {
			t.Errorf("round trip %+v = %+v, %v", c, got, err)
		}
	}
	// The op past the last one is unknown (the merge's took 6 to 9).
	for _, bad := range [][]byte{nil, {1}, {byte(opRollbackMerge + 1), 0, 0, 0, 0, 0, 0, 0, 0, 0}, {1, 0, 0, 0, 0, 0, 0, 0, 0, 200}} {
		if _, err := decodeCommand(bad); err == nil {
			t.Errorf("decodeCommand(%v) succeeded", bad)
		}
	}
}
