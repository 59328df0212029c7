package raftstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3/raftpb"
)

// Fuzz targets for what a store reads from its peers and its disk: region
// snapshots (the HKVS4 format of snapshot.go), raft messages as
// HandleRaftMessage receives them from the transport, and the persisted
// state a restarting store loads.

// fuzzEngine opens a scratch engine for one fuzz target; inputs share it.
func fuzzEngine(f *testing.F) *engine.Engine {
	e, err := engine.Open(f.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = e.Close() })
	return e
}

// fuzzSnapshot builds a real snapshot of region r holding kvs (alternating
// keys and values) and dedup records, with the engine's own encoder.
func fuzzSnapshot(tb testing.TB, e *engine.Engine, r region.Region, dedup []engine.DedupRecord, kvs ...string) []byte {
	tb.Helper()
	err := e.Update(func(tx *engine.Tx) error {
		if err := putRegion(tx, r); err != nil {
			return err
		}
		if err := tx.PutApplyState(r.ID, engine.ApplyState{AppliedIndex: 10, AppliedTerm: 6, TruncatedIndex: 5, TruncatedTerm: 5}); err != nil {
			return err
		}
		if err := tx.ClearDedupRange(r.StartKey, r.EndKey); err != nil {
			return err
		}
		for _, d := range dedup {
			if err := tx.DedupRemember(d.Key, d.ID, d.Clock); err != nil {
				return err
			}
		}
		for i := 0; i+1 < len(kvs); i += 2 {
			if err := tx.Put([]byte(kvs[i]), []byte(kvs[i+1])); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	snap, err := buildSnapshot(e, r.ID)
	if err != nil {
		tb.Fatal(err)
	}
	return snap.Data
}

// snapshotSeeds are valid snapshots, then truncated and corrupted ones.
func snapshotSeeds(f *testing.F) [][]byte {
	e := fuzzEngine(f)
	peers := []region.Peer{{ID: 1, StoreID: 1}, {ID: 2, StoreID: 2}, {ID: 3, StoreID: 3, IsLearner: true}}
	full := fuzzSnapshot(f, e, region.Region{ID: 3, StartKey: []byte("b"), EndKey: []byte("m"), Epoch: region.Epoch{ConfVer: 2, Version: 5}, Peers: peers},
		[]engine.DedupRecord{{Clock: 1008, ID: 77, Key: []byte("c")}, {Clock: 1009, ID: 78, Key: []byte("k")}, {Clock: 1009, ID: 79, Key: []byte("k")}},
		"a", "outside", "b", "1", "c", "", "l\xff", "big", "m", "outside")
	empty := fuzzSnapshot(f, e, region.Region{ID: 4, StartKey: []byte("x"), Epoch: region.Epoch{ConfVer: 1, Version: 1}}, nil)
	unbounded := fuzzSnapshot(f, e, region.Region{ID: 5, Peers: peers[:1]}, []engine.DedupRecord{{Clock: 6, ID: 1, Key: []byte("zz")}}, "zz", "top")
	flipped := bytes.Clone(full)
	flipped[len(flipped)/2] ^= 0x10
	return [][]byte{
		full, empty, unbounded,
		full[:len(full)-1],                   // checksum cut
		full[:len(full)/2],                   // truncated body
		flipped,                              // bit flip: checksum mismatch
		fixCRC(flipped),                      // the same flip, re-checksummed
		append([]byte("HKVS3"), full[5:]...), // an older format
		append([]byte("HKVS2"), full[5:]...), // an older one
		fixCRC(append(bytes.Clone(full[:len(full)-4]), 0x05)), // a trailing half chunk
		[]byte("HKVS4"),
		nil,
		// A region from -inf holding an empty key: decoded, but bbolt
		// cannot store it, so the apply failed and stopped the store.
		fixCRC(append(append(bytes.Clone(unbounded[:len(unbounded)-4]), 0, 1, 'v'), 0, 0, 0, 0)),
	}
}

// fixCRC replaces the last 4 bytes of b (or appends them) with the
// checksum of what precedes, so mutated inputs get past the checksum and
// reach the structure decoder.
func fixCRC(b []byte) []byte {
	if len(b) < len("HKVS4")+4 {
		return b
	}
	body := bytes.Clone(b[:len(b)-4])
	return binary.BigEndian.AppendUint32(body, crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
}

// FuzzHandleRaftMessage: a raft message exactly as the gRPC transport hands
// it to the store (server/raft_service.go: pb.RaftMessage.message bytes
// unmarshalled into a raftpb.Message; for the Snapshot RPC the reassembled
// data in place of the snapshot's), or, when kind is not 0, a notice of
// that kind made of the message's fields. The store holds region 1 with its peer
// 1; the message goes to region 1 but never to peer 1, so it runs every
// check HandleRaftMessage makes before stepping raft (tombstones, notices,
// placeholders, the MsgSnap validation) without stepping raft itself,
// which trusts its peers and panics on inconsistent input by design.
func FuzzHandleRaftMessage(f *testing.F) {
	snaps := snapshotSeeds(f)
	addNotice := func(m raftpb.Message, data []byte, kind NoticeKind) {
		b, err := m.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, data, byte(kind))
	}
	add := func(m raftpb.Message, data []byte) { addNotice(m, data, 0) }
	add(raftpb.Message{Type: raftpb.MsgSnap, From: 2, To: 3, Term: 6, Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 10, Term: 6}}}, snaps[0])
	add(raftpb.Message{Type: raftpb.MsgSnap, From: 2, To: 3, Term: 6, Snapshot: &raftpb.Snapshot{Data: snaps[1]}}, nil)
	add(raftpb.Message{Type: raftpb.MsgSnap, From: 2, To: 3, Term: 6, Snapshot: &raftpb.Snapshot{}}, snaps[5])
	add(raftpb.Message{Type: raftpb.MsgSnap, From: 2, To: 3, Term: 6}, nil) // no snapshot at all
	add(raftpb.Message{Type: raftpb.MsgApp, From: 2, To: 3, Term: 6, Index: 5, LogTerm: 5, Entries: []raftpb.Entry{{Term: 6, Index: 6, Data: command{op: opPut, id: 1, key: []byte("k")}.encode()}}}, nil)
	addNotice(raftpb.Message{From: 2, To: 3, Term: 6}, nil, NoticeTombstone)
	addNotice(raftpb.Message{From: 2, To: 3, Term: 6, Index: 1}, nil, NoticeLeaseRequest)
	addNotice(raftpb.Message{From: 2, To: 3, Term: 6, Commit: 4}, nil, NoticeHibernate)
	addNotice(raftpb.Message{From: 2, To: 3, Term: 6}, nil, maxNoticeKind+1)
	add(raftpb.Message{Type: raftpb.MsgVote, From: 2, To: 3, Term: 7, Index: 9, LogTerm: 6}, nil)
	f.Add([]byte{0xff, 0xff}, []byte(nil), byte(0))

	s, err := NewStore(Config{StoreID: 1, DataDir: f.TempDir(), InitialStores: []uint64{1}, NoSync: true}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.Stop() })
	p, ok := s.peer(1)
	if !ok {
		f.Fatal("region 1 not bootstrapped")
	}

	f.Fuzz(func(t *testing.T, msg, snapData []byte, kind byte) {
		var m raftpb.Message
		if err := m.Unmarshal(msg); err != nil {
			return // the server refuses it with InvalidArgument
		}
		if m.To == p.id {
			m.To++ // never step raft (see above)
		}
		if m.Snapshot != nil && len(snapData) > 0 {
			m.Snapshot.Data = snapData
		}
		in := &Message{RegionID: 1, FromStore: 2, ToStore: 1, Msg: m}
		if kind != 0 {
			n := &Notice{Kind: NoticeKind(kind), From: m.From, To: m.To, Term: m.Term, Commit: m.Commit}
			if n.Kind.isLease() {
				n.Lease = &LeaseMsg{Seq: m.Index, Commit: m.Commit, Duration: time.Duration(m.LogTerm)}
			}
			in = &Message{RegionID: 1, FromStore: 2, ToStore: 1, Notice: n}
		}
		err := s.HandleRaftMessage(in)
		if kind == 0 && m.Type == raftpb.MsgSnap && err == nil {
			t.Fatalf("MsgSnap to peer %d (the region's peer is %d) accepted", m.To, p.id)
		}
		if _, ok := s.peer(1); !ok {
			t.Fatal("a message to another peer destroyed region 1")
		}
	})
}

// FuzzLoadPeerStorage: whatever well-formed records a region's persisted
// state holds (any metadata bytes, hard state, apply state and log
// entries), a restarting store loads it (loadPeers, then newPeerStorage)
// or fails with an error; it never crashes. Records the engine cannot
// decode are the engine's FuzzLoadPeers.
func FuzzLoadPeerStorage(f *testing.F) {
	r := region.Region{ID: 7, StartKey: []byte("a"), Epoch: region.Epoch{ConfVer: 1, Version: 2}, Peers: []region.Peer{{ID: 1, StoreID: 1}, {ID: 2, StoreID: 2}}}
	meta, _ := json.Marshal(r)
	f.Add(meta, uint64(6), uint64(6), uint64(5), uint64(5), uint64(6), uint64(6), uint64(7))
	f.Add(meta, uint64(6), uint64(6), uint64(6), uint64(6), uint64(6), uint64(6), uint64(7))
	f.Add(meta, uint64(6), uint64(60), uint64(5), uint64(5), uint64(60), uint64(6), uint64(61)) // commit past the log
	f.Add(meta[:len(meta)/2], uint64(6), uint64(6), uint64(5), uint64(5), uint64(6), uint64(6), uint64(7))
	f.Add([]byte(`{"ID":7,"StartKey":"!!"}`), uint64(6), uint64(6), uint64(5), uint64(5), uint64(6), uint64(6), uint64(7))
	f.Add(meta, uint64(6), uint64(6), ^uint64(0), uint64(5), uint64(6), uint64(6), uint64(7)) // truncated index at the top
	f.Add(meta, uint64(2), uint64(6), uint64(5), uint64(5), uint64(6), uint64(7), uint64(8))  // entries of a later term than the hard state

	e := fuzzEngine(f)
	f.Fuzz(func(t *testing.T, meta []byte, term, commit, applied, truncated, first, entTerm, last uint64) {
		if last-first > 64 {
			last = first + 64 // a bounded log
		}
		err := e.Update(func(tx *engine.Tx) error {
			if err := tx.DeleteRegion(7); err != nil {
				return err
			}
			if err := tx.PutRegionMeta(7, meta); err != nil {
				return err
			}
			if err := tx.PutHardState(7, raftpb.HardState{Term: term, Vote: 1, Commit: commit}); err != nil {
				return err
			}
			if err := tx.PutApplyState(7, engine.ApplyState{AppliedIndex: applied, AppliedTerm: term, TruncatedIndex: truncated, TruncatedTerm: term}); err != nil {
				return err
			}
			var ents []raftpb.Entry
			for i := first; i <= last && i >= first; i++ {
				ents = append(ents, raftpb.Entry{Term: entTerm, Index: i})
			}
			return tx.AppendEntries(7, ents, 0)
		})
		if err != nil {
			t.Fatal(err)
		}
		pps, err := loadPeers(e)
		if err != nil {
			return
		}
		for _, pp := range pps {
			if _, err := newPeerStorage(e, pp, new(atomic.Uint64)); err != nil {
				t.Logf("newPeerStorage: %v", err)
			}
		}
	})
}
