package raftstore

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// The bounded mirror: peerStorage keeps only the log's recent part in
// memory and answers for older indexes, down to the durable log's first
// index, from bbolt, exactly as a MemoryStorage holding the whole log would.

// sizedEnts is ents with size-byte payloads.
func sizedEnts(term, lo, hi uint64, size int) []raftpb.Entry {
	out := ents(term, lo, hi)
	for i := range out {
		out[i].Data = make([]byte, size)
		out[i].Data[0] = byte(out[i].Index)
	}
	return out
}

// mirrorFixture writes region 7's log, [6, 1100] (term 5 to 500, then 6),
// applied through 1000, and loads it as a restart does.
func mirrorFixture(t *testing.T) (*engine.Engine, *peerStorage, *raft.MemoryStorage) {
	t.Helper()
	e, err := engine.Open(t.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	r := testRegion()
	log := append(sizedEnts(5, 6, 500, 100), sizedEnts(6, 501, 1100, 100)...)
	mustUpdate(t, e, func(tx *engine.Tx) error {
		if err := putRegion(tx, r); err != nil {
			return err
		}
		if err := tx.PutHardState(r.ID, raftpb.HardState{Term: 6, Commit: 1050}); err != nil {
			return err
		}
		if err := tx.AppendEntries(r.ID, log, 0); err != nil {
			return err
		}
		return tx.PutApplyState(r.ID, engine.ApplyState{AppliedIndex: 1000, AppliedTerm: 6, TruncatedIndex: 5, TruncatedTerm: 5})
	})
	ref := raft.NewMemoryStorage()
	_ = ref.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 5, Term: 5}})
	_ = ref.Append(log)
	return e, reload(t, e), ref
}

func mirrorFirst(s *peerStorage) uint64 {
	i, _ := s.MemoryStorage.FirstIndex()
	return i
}

// sameEntries compares s and ref over ranges and size limits around the
// mirror's first index.
func sameEntries(t *testing.T, name string, s *peerStorage, ref *raft.MemoryStorage, first, last uint64) {
	t.Helper()
	mf := mirrorFirst(s)
	one := uint64(sizedEnts(6, 1000, 1000, 100)[0].Size())
	for _, lo := range []uint64{first, mf - 5, mf - 1, mf, mf + 3} {
		for _, hi := range []uint64{lo + 1, mf, mf + 1, mf + 10, last + 1} {
			if hi <= lo || lo < first || hi > last+1 {
				continue
			}
			for _, maxSize := range []uint64{0, 1, 3 * one, 7*one + 1, 100 * one, ^uint64(0)} {
				got, err := s.Entries(lo, hi, maxSize)
				want, werr := ref.Entries(lo, hi, maxSize)
				if err != nil || werr != nil || !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: Entries(%d, %d, %d) = %d entries, %v; want %d, %v", name, lo, hi, maxSize, len(got), err, len(want), werr)
				}
			}
		}
	}
}

func TestPeerStorageReadsAcrossMirrorAndLog(t *testing.T) {
	e, s, ref := mirrorFixture(t)
	if got, want := mirrorFirst(s), uint64(1001-mirrorTailEntries); got != want {
		t.Fatalf("mirror loaded from %d, want %d (the applied tail)", got, want)
	}
	check(t, "loaded", s, want{first: 6, last: 1100, terms: map[uint64]uint64{5: 5, 6: 5, 500: 5, 501: 6, 744: 6, 745: 6, 1100: 6}})
	if s.diskReads.Load() == 0 {
		t.Fatal("no read went to bbolt")
	}
	sameEntries(t, "loaded", s, ref, 6, 1100)
	for i := uint64(5); i <= 1100; i += 37 {
		got, err := s.Term(i)
		want, _ := ref.Term(i)
		if err != nil || got != want {
			t.Fatalf("Term(%d) = %d, %v; want %d", i, got, err, want)
		}
	}
	if _, err := s.Entries(5, 10, ^uint64(0)); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("Entries below the durable first index: %v, want ErrCompacted", err)
	}

	// A durable compaction through 600, as applyTx and publish do it.
	mustUpdate(t, e, func(tx *engine.Tx) error {
		term, err := s.termTx(tx, 600)
		if err != nil || term != 6 {
			t.Errorf("termTx(600) = %d, %v", term, err)
		}
		return tx.DeleteLog(7, 6, 600)
	})
	if err := s.trim(1000, 600, 6); err != nil {
		t.Fatal(err)
	}
	_ = ref.Compact(600)
	check(t, "compacted", s, want{first: 601, last: 1100, terms: map[uint64]uint64{600: 6, 601: 6, 1100: 6}})
	sameEntries(t, "compacted", s, ref, 601, 1100)

	// Appends and applies: the mirror keeps the bound, trimming in steps.
	more := sizedEnts(6, 1101, 1500, 100)
	mustUpdate(t, e, func(tx *engine.Tx) error { return tx.AppendEntries(7, more, 1100) })
	_ = s.Append(more)
	_ = ref.Append(more)
	if err := s.trim(1500, 0, 0); err != nil {
		t.Fatal(err)
	}
	if got, want := mirrorFirst(s), uint64(1501-mirrorTailEntries); got != want {
		t.Fatalf("after applying through 1500 the mirror starts at %d, want %d", got, want)
	}
	if err := s.trim(1500+mirrorTrimSlack-1, 0, 0); err != nil || mirrorFirst(s) != 1501-mirrorTailEntries {
		t.Fatalf("trimmed within the slack: mirror at %d, %v", mirrorFirst(s), err)
	}
	sameEntries(t, "trimmed", s, ref, 601, 1500)

	// A snapshot resets both bounds.
	if err := s.applySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 2000, Term: 7}}); err != nil {
		t.Fatal(err)
	}
	check(t, "snapshot", s, want{first: 2001, last: 2000, terms: map[uint64]uint64{2000: 7}})
	if n := s.readErrs.Load(); n != 0 {
		t.Fatalf("%d reads failed: %v", n, *s.lastReadErr.Load())
	}
}

// Big entries: the mirror's applied tail is bounded in bytes too, at open
// and running.
func TestMirrorTailBoundedInBytes(t *testing.T) {
	e, err := engine.Open(t.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	r := testRegion()
	const size = 64 << 10
	log := sizedEnts(5, 6, 105, size)
	mustUpdate(t, e, func(tx *engine.Tx) error {
		if err := putRegion(tx, r); err != nil {
			return err
		}
		if err := tx.AppendEntries(r.ID, log, 0); err != nil {
			return err
		}
		return tx.PutApplyState(r.ID, engine.ApplyState{AppliedIndex: 100, AppliedTerm: 5, TruncatedIndex: 5, TruncatedTerm: 5})
	})
	s := reload(t, e)
	esz := uint64(log[0].Size()) // with its encoding's overhead
	kept := 100 - mirrorFirst(s) + 1
	if kept*esz > mirrorTailBytes || (kept+1)*esz <= mirrorTailBytes {
		t.Fatalf("loaded %d applied entries of %d bytes in the mirror; want the most within %d bytes", kept, size, mirrorTailBytes)
	}
	check(t, "big", s, want{first: 6, last: 105, terms: map[uint64]uint64{5: 5, 6: 5, 105: 5}})
	more := sizedEnts(5, 106, 120, size)
	mustUpdate(t, e, func(tx *engine.Tx) error { return tx.AppendEntries(7, more, 105) })
	_ = s.Append(more)
	if err := s.trim(110, 0, 0); err != nil {
		t.Fatal(err)
	}
	if kept := 110 - mirrorFirst(s) + 1; kept*size > mirrorTailBytes {
		t.Fatalf("running: %d applied entries of %d bytes in the mirror", kept, size)
	}
	check(t, "big running", s, want{first: 6, last: 120, terms: map[uint64]uint64{6: 5, 120: 5}})
}

// A split-born peer (the initial apply state, no log) and a placeholder
// (nothing persisted) get an empty mirror at their first index.
func TestPeerStorageOfNewPeers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		apply engine.ApplyState
		first uint64
	}{{"split-born", initApplyState, raftInitIndex + 1}, {"placeholder", engine.ApplyState{}, 1}} {
		s, err := newPeerStorage(nil, persistedPeer{region: testRegion(), apply: tc.apply}, nil)
		if err != nil {
			t.Fatal(err)
		}
		check(t, tc.name, s, want{first: tc.first, last: tc.first - 1, terms: map[uint64]uint64{tc.first - 1: tc.apply.TruncatedTerm}})
		if err := s.trim(tc.apply.AppliedIndex, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// A follower lagging by more entries than the mirror keeps, and fewer than
// the durable log keeps, catches up from the log read from bbolt, not by a
// snapshot. It was killed (its restart replays its WAL and loads only the
// log's tail); the leader is restarted after (its mirror, too, is rebuilt
// from the tail) and the replicas still agree.
func TestLaggingFollowerCatchesUpFromTheLog(t *testing.T) {
	c := newMiniCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c.load(ctx, "a", 100, 100)
	c.agree(1, 3)
	leader := c.mustLeaderOf([]byte("k"))
	lagger := uint64(1)
	for lagger == leader.ID() {
		lagger++
	}
	c.kill(lagger)
	const lag = 4 * mirrorTailEntries // well past the mirror, short of LogGCThreshold (5000)
	c.load(ctx, "k", lag, 100)
	leader = c.mustLeaderOf([]byte("k"))
	// The mirror also keeps what the open batch wrote (batch.go): commit
	// it, and let one more round trim.
	if err := leader.eng.CheckpointIfDue(true); err != nil {
		t.Fatal(err)
	}
	c.put(ctx, []byte("k-trim"), []byte("v"))
	lp, _ := leader.peer(1)
	if first, _ := lp.storage.FirstIndex(); first > 100 {
		t.Fatalf("the leader compacted its log through %d", first-1)
	}
	lp.mu.Lock()
	applied, mfirst := lp.applied, mirrorFirst(lp.storage)
	lp.mu.Unlock()
	if applied+1-mfirst > mirrorTailEntries+mirrorTrimSlack {
		t.Fatalf("the leader's mirror holds %d applied entries, bound %d", applied+1-mfirst, mirrorTailEntries+mirrorTrimSlack)
	}
	built, reads := leader.Stats().SnapshotsBuilt, lp.storage.diskReads.Load()
	s := c.start(lagger)
	c.agree(1, 3)
	if n := s.Stats().SnapshotsApplied; n != 0 {
		t.Fatalf("the lagging follower applied %d snapshots", n)
	}
	if n := leader.Stats().SnapshotsBuilt - built; n != 0 {
		t.Fatalf("the leader built %d snapshots", n)
	}
	if lp.storage.diskReads.Load() == reads {
		t.Fatal("the leader read no entries from bbolt: the follower did not lag past its mirror")
	}
	if n := lp.storage.readErrs.Load(); n != 0 {
		t.Fatalf("%d log reads failed: %v", n, *lp.storage.lastReadErr.Load())
	}

	c.stop(leader.ID())
	c.start(leader.ID())
	c.load(ctx, "z", 50, 100)
	c.agree(1, 3)
}
