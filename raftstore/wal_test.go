package raftstore

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

func TestWALRoundTripTornTailAndTruncate(t *testing.T) {
	dir := t.TempDir()
	w, recs, err := openWAL(dir, false)
	if err != nil || len(recs) != 0 {
		t.Fatalf("open empty: %v, %d records", err, len(recs))
	}
	hs := raftpb.HardState{Term: 3, Vote: 2, Commit: 7}
	items := [][]walItem{
		{{regionID: 1, hard: &hs, entries: ents(3, 5, 7)}, {regionID: 9, entries: ents(2, 1, 1)}},
		{{regionID: 1, snap: true, snapIndex: 20, snapTerm: 3}},
		{{regionID: 2, hard: &raftpb.HardState{Term: 1, Vote: 1}}},
	}
	for i, it := range items {
		if seq, err := w.append(it); err != nil || seq != uint64(i+1) {
			t.Fatalf("append %d: seq %d, %v", i, seq, err)
		}
	}
	w.close()
	w, recs, err = openWAL(dir, false)
	if err != nil || len(recs) != 3 {
		t.Fatalf("reopen: %v, %d records", err, len(recs))
	}
	for i, r := range recs {
		if r.seq != uint64(i+1) || !reflect.DeepEqual(r.items, items[i]) {
			t.Fatalf("record %d = %+v, want seq %d %+v", i, r, i+1, items[i])
		}
	}
	// A new segment was started at open; a torn record at its end is
	// dropped, the ones before stay.
	if _, err := w.append(items[0]); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(dir, segmentName(4))
	w.close()
	f, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{0, 0, 1, 0, 1, 2, 3, 4, 5}) // a header promising 256 bytes, and 1 of them
	f.Close()
	w, recs, err = openWAL(dir, false)
	if err != nil || len(recs) != 4 || recs[3].seq != 4 {
		t.Fatalf("reopen after a torn tail: %v, %d records", err, len(recs))
	}
	if seq, err := w.append(items[2]); err != nil || seq != 5 {
		t.Fatalf("append after a torn tail: seq %d, %v", seq, err)
	}
	// Only segments every record of which is covered go.
	if err := w.truncate(3); err != nil {
		t.Fatal(err)
	}
	if firsts, _ := listSegments(dir); !reflect.DeepEqual(firsts, []uint64{4, 5}) {
		t.Fatalf("segments after truncate(3): %v, want [4 5]", firsts)
	}
	if err := w.truncate(5); err != nil {
		t.Fatal(err)
	}
	firsts, _ := listSegments(dir)
	if !reflect.DeepEqual(firsts, []uint64{5}) {
		t.Fatalf("segments after truncate: %v, want [5]", firsts)
	}
	w.close()
	_, recs, err = openWAL(dir, false)
	if err != nil || len(recs) != 1 || recs[0].seq != 5 {
		t.Fatalf("reopen after truncate: %v, %+v", err, recs)
	}
}

// crash closes the engine's files the way kill -9 would: no checkpoint.
func crash(e *engine) {
	if e.batch != nil { // the uncommitted rounds die with the process
		_ = e.batch.Rollback()
	}
	if e.pin != nil {
		e.pin.Rollback()
	}
	e.wal.close()
	e.db.Close()
	e.lock.Close()
}

// A round whose WAL record was synced but whose bbolt transaction never
// committed (a kill between the two), and rounds whose bbolt commits were
// never synced (the restore goes back to the checkpoint before them), are
// rebuilt from the WAL on open: the raft log and hard state come back as
// the rounds left them; a record that installs a snapshot is skipped.
func TestEngineReplaysWALAfterCrash(t *testing.T) {
	dir := t.TempDir()
	e, err := openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	r := testRegion()
	if err := e.update(func(tx *bbolt.Tx) error {
		if err := putRegion(tx, r); err != nil {
			return err
		}
		return putApplyState(tx, r.ID, applyState{AppliedIndex: 5, AppliedTerm: 1, TruncatedIndex: 5, TruncatedTerm: 1})
	}); err != nil {
		t.Fatal(err)
	}
	round := func(items []walItem, inBolt bool) {
		t.Helper()
		err := e.round(func() []walItem { return items }, nil, func(tx *bbolt.Tx) error {
			for _, it := range items {
				if err := appendEntries(tx, it.regionID, it.entries, 0); err != nil {
					return err
				}
				if it.hard != nil {
					if err := putHardState(tx, it.regionID, *it.hard); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Round 1: WAL + bbolt (unsynced), then a conflicting overwrite of its
	// tail in round 2, then round 3 in the WAL only.
	round([]walItem{{regionID: r.ID, hard: &raftpb.HardState{Term: 2, Vote: 1, Commit: 7}, entries: ents(2, 6, 9)}}, true)
	round([]walItem{{regionID: r.ID, hard: &raftpb.HardState{Term: 3, Vote: 2, Commit: 7}, entries: ents(3, 8, 8)}}, true)
	if _, err := e.wal.append([]walItem{{regionID: r.ID, hard: &raftpb.HardState{Term: 3, Vote: 2, Commit: 9}, entries: ents(3, 9, 10)}}); err != nil {
		t.Fatal(err)
	}
	// A snapshot round that never committed: skipped.
	if _, err := e.wal.append([]walItem{{regionID: r.ID, snap: true, snapIndex: 30, snapTerm: 3, hard: &raftpb.HardState{Term: 3, Vote: 2, Commit: 30}, entries: ents(3, 31, 31)}}); err != nil {
		t.Fatal(err)
	}
	crash(e)

	e, err = openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	pps, err := e.loadPeers()
	if err != nil || len(pps) != 1 {
		t.Fatalf("loadPeers: %d, %v", len(pps), err)
	}
	p := pps[0]
	var got []uint64
	for _, ent := range p.entries {
		got = append(got, ent.Index*10+ent.Term)
	}
	want := []uint64{62, 72, 83, 93, 103}
	if !reflect.DeepEqual(got, want) || p.hard != (raftpb.HardState{Term: 3, Vote: 2, Commit: 9}) {
		t.Fatalf("after replay: entries (index*10+term) %v, hard state %+v; want %v and term 3 vote 2 commit 9", got, p.hard, want)
	}
	// Replayed and checkpointed at open: the WAL is empty now and a
	// second crash and open finds the same.
	crash(e)
	e2, err := openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	pps2, err := e2.loadPeers()
	e2.close()
	if err != nil || !reflect.DeepEqual(pps2[0].entries, p.entries) || pps2[0].hard != p.hard {
		t.Fatalf("second open: %v, %+v", err, pps2)
	}
	e, _ = openEngine(dir, false) // for the deferred close
}

// Commits after a checkpoint never overwrite a page its tree uses, so
// restoring its meta pages gives back exactly its state, whatever was
// committed (unsynced) after it: the state a power loss can leave.
func TestCheckpointRestoreGivesCheckpointState(t *testing.T) {
	dir := t.TempDir()
	e, err := openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	put := func(k, v string) error {
		return e.round(func() []walItem { return nil }, nil, func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketData).Put([]byte(k), []byte(v))
		})
	}
	for i := range 2000 {
		if err := put(string(rune('a'+i%26))+string(rune(i)), "before"); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.checkpointIfDue(true); err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		if err := put(string(rune('a'+i%26))+string(rune(i)), "after-checkpoint-unsynced-and-longer"); err != nil {
			t.Fatal(err)
		}
	}
	crash(e)
	e, err = openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	err = e.db.View(func(tx *bbolt.Tx) error {
		n := 0
		err := tx.Bucket(bucketData).ForEach(func(k, v []byte) error {
			n++
			if string(v) != "before" {
				t.Fatalf("key %q = %q after restore, want the checkpoint's value", k, v)
			}
			return nil
		})
		if n != 2000 {
			t.Fatalf("%d keys after restore, want 2000", n)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// The background checkpoint pins the state it was started at: commits
// made while its sync runs, and after, are not in it, and the restore
// gives that state exactly.
func TestAsyncCheckpointRestoresItsState(t *testing.T) {
	dir := t.TempDir()
	e, err := openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	put := func(i int, v string) {
		t.Helper()
		err := e.round(func() []walItem { return nil }, nil, func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketData).Put([]byte{byte(i >> 8), byte(i)}, []byte(v))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2000 {
		put(i, "at-checkpoint")
	}
	if err := e.checkpointAsync(); err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		put(i, "written-while-the-checkpoint-synced-or-after")
	}
	e.ckptMu.Lock() // the background sync is done
	e.ckptMu.Unlock()
	if e.ckptErr != nil {
		t.Fatal(e.ckptErr)
	}
	for i := range 2000 {
		put(i, "after")
	}
	crash(e)
	e, err = openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	err = e.db.View(func(tx *bbolt.Tx) error {
		n := 0
		if err := tx.Bucket(bucketData).ForEach(func(k, v []byte) error {
			n++
			if string(v) != "at-checkpoint" {
				t.Fatalf("key %x = %q after restore, want the checkpoint's value", k, v)
			}
			return nil
		}); err != nil {
			return err
		}
		if n != 2000 {
			t.Fatalf("%d keys after restore, want 2000", n)
		}
		for err := range tx.Check() {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
