package engine

import (
	"encoding/json"
	"testing"

	"go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// FuzzLoadPeers: the persisted state of one region as a restarting store
// reads it (LoadPeers): region meta (JSON), hard state and log entries
// (raft protobuf), apply state, as raw bytes. A corrupt record must fail
// the load with an error, never crash it, and whatever loads holds a log
// that goes on one index per entry from where it says it starts (raft's
// MemoryStorage panics on one that does not).
func FuzzLoadPeers(f *testing.F) {
	meta, _ := json.Marshal(map[string]any{"ID": 7, "StartKey": []byte("a"), "Epoch": map[string]uint64{"ConfVer": 1, "Version": 2}})
	hs, _ := (&raftpb.HardState{Term: 6, Vote: 1, Commit: 6}).Marshal()
	ent := func(e raftpb.Entry) []byte {
		b, _ := e.Marshal()
		return b
	}
	initApply := ApplyState{AppliedIndex: 5, AppliedTerm: 5, TruncatedIndex: 5, TruncatedTerm: 5}
	e6 := ent(raftpb.Entry{Term: 6, Index: 6, Data: []byte("put k")})
	e7 := ent(raftpb.Entry{Term: 6, Index: 7})
	f.Add(meta, hs, initApply.Encode(), e6, e7)
	f.Add(meta, hs, initApply.Encode(), e7, e6) // entries out of order
	f.Add(meta, hs, ApplyState{AppliedIndex: 6, AppliedTerm: 6, TruncatedIndex: 6, TruncatedTerm: 6}.Encode(), []byte(nil), e7)
	f.Add(meta, hs, initApply.Encode(), ent(raftpb.Entry{Term: 6, Index: 60}), []byte(nil)) // a gap
	f.Add(meta[:len(meta)/2], hs, initApply.Encode(), e6, e7)                               // truncated meta
	f.Add([]byte(`{"ID":7,"StartKey":"!!"}`), hs, initApply.Encode(), e6, e7)               // bad base64
	f.Add(meta, hs[:1], initApply.Encode(), e6, e7)                                         // truncated hard state
	f.Add(meta, hs, initApply.Encode()[:31], e6, e7)                                        // short apply state
	f.Add(meta, hs, initApply.Encode(), e6[:len(e6)-1], e7)                                 // truncated entry
	f.Add(meta, hs, ApplyState{TruncatedIndex: ^uint64(0)}.Encode(), e6, e7)                // truncated index at the top

	e, err := Open(f.TempDir(), Options{NoSync: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = e.Close() })
	mb := MirrorBound{Entries: 256, Bytes: 1 << 20}
	f.Fuzz(func(t *testing.T, meta, hard, apply, ent1, ent2 []byte) {
		err := e.db.Update(func(tx *bbolt.Tx) error {
			for _, b := range [][]byte{bucketRaftState, bucketRaftLog} {
				if err := tx.DeleteBucket(b); err != nil {
					return err
				}
				if _, err := tx.CreateBucket(b); err != nil {
					return err
				}
			}
			st := tx.Bucket(bucketRaftState)
			put := func(b *bbolt.Bucket, k, v []byte) error {
				if v == nil {
					return nil
				}
				return b.Put(k, v)
			}
			if err := put(st, stateKey(7, suffixRegion), meta); err != nil {
				return err
			}
			if err := put(st, stateKey(7, suffixHardState), hard); err != nil {
				return err
			}
			if err := put(st, stateKey(7, suffixApplyState), apply); err != nil {
				return err
			}
			// The log entries sit where the apply state says the log starts.
			first := uint64(6)
			if as, err := DecodeApplyState(apply); err == nil {
				first = as.TruncatedIndex + 1
			}
			if err := put(tx.Bucket(bucketRaftLog), logKey(7, first), ent1); err != nil {
				return err
			}
			return put(tx.Bucket(bucketRaftLog), logKey(7, first+1), ent2)
		})
		if err != nil {
			t.Fatal(err)
		}
		pps, err := e.LoadPeers(mb)
		if err != nil {
			return
		}
		for _, pp := range pps {
			from := pp.Apply.TruncatedIndex + 1
			if pp.TailFrom > 0 {
				from = pp.TailFrom
			}
			for i, ent := range pp.Entries {
				if want := from + uint64(i); ent.Index != want {
					t.Fatalf("loaded entry %d holds index %d, want %d", i, ent.Index, want)
				}
			}
		}
	})
}
