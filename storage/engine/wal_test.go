package engine

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/storage/vfs"
	"github.com/hedgekv/hedgekv/storage/wal"
)

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
	r := Span{ID: testRegionID}
	if err := seedRegion(e, nil); err != nil {
		t.Fatal(err)
	}
	round := func(items []wal.Item, inBolt bool) {
		t.Helper()
		err := e.Round(func() []wal.Item { return items }, nil, func(tx *Tx) error {
			for _, it := range items {
				if err := tx.AppendEntries(it.RegionID, it.Entries, 0); err != nil {
					return err
				}
				if it.Hard != nil {
					if err := tx.PutHardState(it.RegionID, *it.Hard); err != nil {
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
	round([]wal.Item{{RegionID: r.ID, Hard: &raftpb.HardState{Term: 2, Vote: 1, Commit: 7}, Entries: ents(2, 6, 9)}}, true)
	round([]wal.Item{{RegionID: r.ID, Hard: &raftpb.HardState{Term: 3, Vote: 2, Commit: 7}, Entries: ents(3, 8, 8)}}, true)
	if _, err := e.wal.Append([]wal.Item{{RegionID: r.ID, Hard: &raftpb.HardState{Term: 3, Vote: 2, Commit: 9}, Entries: ents(3, 9, 10)}}); err != nil {
		t.Fatal(err)
	}
	// A snapshot round that never committed: skipped.
	if _, err := e.wal.Append([]wal.Item{{RegionID: r.ID, Snap: true, SnapIndex: 30, SnapTerm: 3, Hard: &raftpb.HardState{Term: 3, Vote: 2, Commit: 30}, Entries: ents(3, 31, 31)}}); err != nil {
		t.Fatal(err)
	}
	crash(e)

	e, err = openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { e.Close() }()
	pps, err := e.LoadPeers(testMirror)
	if err != nil || len(pps) != 1 {
		t.Fatalf("LoadPeers: %d, %v", len(pps), err)
	}
	p := pps[0]
	var got []uint64
	for _, ent := range p.Entries {
		got = append(got, ent.Index*10+ent.Term)
	}
	want := []uint64{62, 72, 83, 93, 103}
	if !reflect.DeepEqual(got, want) || p.Hard != (raftpb.HardState{Term: 3, Vote: 2, Commit: 9}) {
		t.Fatalf("after replay: entries (index*10+term) %v, hard state %+v; want %v and term 3 vote 2 commit 9", got, p.Hard, want)
	}
	// Replayed and checkpointed at open: the WAL is empty now and a
	// second crash and open finds the same.
	crash(e)
	e2, err := openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	pps2, err := e2.LoadPeers(testMirror)
	e2.Close()
	if err != nil || len(pps2) != 1 || !reflect.DeepEqual(pps2[0].Entries, p.Entries) || pps2[0].Hard != p.Hard {
		t.Fatalf("second open: %v, %+v", err, pps2)
	}
	if e, err = openEngine(dir, false); err != nil { // for the deferred close
		t.Fatal(err)
	}
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
		return e.Round(func() []wal.Item { return nil }, nil, func(tx *Tx) error {
			return tx.Put([]byte(k), []byte(v))
		})
	}
	for i := range 2000 {
		if err := put(string(rune('a'+i%26))+string(rune(i)), "before"); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.CheckpointIfDue(true); err != nil {
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
	defer e.Close()
	err = e.View(func(tx *Tx) error {
		n := 0
		tx.ForEachData(nil, nil, func(k, v []byte) bool {
			n++
			if string(v) != "before" {
				t.Fatalf("key %q = %q after restore, want the checkpoint's value", k, v)
			}
			return true
		})
		if n != 2000 {
			t.Fatalf("%d keys after restore, want 2000", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkBolt(e); err != nil {
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
		err := e.Round(func() []wal.Item { return nil }, nil, func(tx *Tx) error {
			return tx.Put([]byte{byte(i >> 8), byte(i)}, []byte(v))
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
	defer e.Close()
	err = e.View(func(tx *Tx) error {
		n := 0
		tx.ForEachData(nil, nil, func(k, v []byte) bool {
			n++
			if string(v) != "at-checkpoint" {
				t.Fatalf("key %x = %q after restore, want the checkpoint's value", k, v)
			}
			return true
		})
		if n != 2000 {
			t.Fatalf("%d keys after restore, want 2000", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkBolt(e); err != nil {
		t.Fatal(err)
	}
}

// A power loss after a checkpoint that covers an unsynced round-log record
// (commit indexes only: written, not fdatasynced) leaves the WAL one
// record short of the checkpoint's wal_seq. The next incarnation's records
// must not reuse the seqs the checkpoint covers: replay skips those, so an
// append acknowledged after the restart would vanish at the next crash.
func TestWALSeqsNotReusedAfterPowerLoss(t *testing.T) {
	dir := t.TempDir()
	e, err := openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	r := Span{ID: testRegionID}
	if err := seedRegion(e, nil); err != nil {
		t.Fatal(err)
	}
	round := func(e *Engine, it wal.Item) {
		t.Helper()
		err := e.Round(func() []wal.Item { return []wal.Item{it} }, nil, func(tx *Tx) error {
			if err := tx.AppendEntries(it.RegionID, it.Entries, 0); err != nil {
				return err
			}
			return tx.PutHardState(it.RegionID, *it.Hard)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	segSize := func() int64 {
		t.Helper()
		firsts, err := wal.ListSegments(vfs.Default, filepath.Join(dir, "wal"))
		if err != nil || len(firsts) == 0 {
			t.Fatalf("segments: %v %v", firsts, err)
		}
		fi, err := os.Stat(filepath.Join(dir, "wal", wal.SegmentName(firsts[len(firsts)-1])))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	round(e, wal.Item{RegionID: r.ID, Hard: &raftpb.HardState{Term: 2, Vote: 1, Commit: 5}, Entries: ents(2, 6, 7), MustSync: true})
	synced := segSize()
	round(e, wal.Item{RegionID: r.ID, Hard: &raftpb.HardState{Term: 2, Vote: 1, Commit: 7}}) // commit only: not synced
	if err := e.CheckpointIfDue(true); err != nil {
		t.Fatal(err)
	}
	crash(e)
	// The power loss: the segment loses what was never fdatasynced.
	firsts, _ := wal.ListSegments(vfs.Default, filepath.Join(dir, "wal"))
	for _, first := range firsts {
		p := filepath.Join(dir, "wal", wal.SegmentName(first))
		if fi, _ := os.Stat(p); fi != nil && fi.Size() > synced {
			if err := os.Truncate(p, synced); err != nil {
				t.Fatal(err)
			}
		}
	}
	if e, err = openEngine(dir, false); err != nil {
		t.Fatal(err)
	}
	// The new incarnation's first round: an append it acknowledges.
	round(e, wal.Item{RegionID: r.ID, Hard: &raftpb.HardState{Term: 2, Vote: 1, Commit: 7}, Entries: ents(2, 8, 8), MustSync: true})
	crash(e) // kill -9 before the next checkpoint
	if e, err = openEngine(dir, false); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	pps, err := e.LoadPeers(testMirror)
	if err != nil || len(pps) != 1 {
		t.Fatalf("LoadPeers: %d, %v", len(pps), err)
	}
	var got []uint64
	for _, ent := range pps[0].Entries {
		got = append(got, ent.Index)
	}
	if !reflect.DeepEqual(got, []uint64{6, 7, 8}) {
		t.Fatalf("log after power loss, append and crash: %v, want [6 7 8] (the acknowledged append of 8 was lost)", got)
	}
}

// A round log damaged where no crash could have left it fails the open,
// naming the file and offset and saying how to rebuild the store.
func TestEngineRefusesCorruptWAL(t *testing.T) {
	dir := t.TempDir()
	e, err := openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(3) {
		if _, err := e.wal.Append([]wal.Item{{RegionID: 1, Entries: ents(1, i+1, i+1)}}); err != nil {
			t.Fatal(err)
		}
	}
	crash(e)
	firsts, _ := wal.ListSegments(vfs.Default, filepath.Join(dir, "wal"))
	seg := filepath.Join(dir, "wal", wal.SegmentName(firsts[len(firsts)-1]))
	data, err := os.ReadFile(seg)
	if err != nil || len(data) < 20 {
		t.Fatalf("segment: %d bytes, %v", len(data), err)
	}
	data[12] ^= 0xff // inside the first record, two synced ones after it
	if err := os.WriteFile(seg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = openEngine(dir, false)
	if !errors.Is(err, wal.ErrCorrupt) || !strings.Contains(err.Error(), "offset") || !strings.Contains(err.Error(), "remove-store") {
		t.Fatalf("open over a corrupt round log: %v", err)
	}
}
