package raftstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// Fuzz targets for what a store reads from its peers and its disk: region
// snapshots (the HKVS4 format of snapshot.go), raft messages as
// HandleRaftMessage receives them from the transport, and the persisted
// state a restarting store loads.

// fuzzEngine opens a scratch engine for one fuzz target; inputs share it.
func fuzzEngine(f *testing.F) *engine {
	e, err := openEngine(f.TempDir(), true)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = e.close() })
	return e
}

// fuzzSnapshot builds a real snapshot of region r holding kvs (alternating
// keys and values) and dedup records, with the engine's own encoder.
func fuzzSnapshot(tb testing.TB, e *engine, r region.Region, dedup []dedupRecord, kvs ...string) []byte {
	tb.Helper()
	err := e.db.Update(func(tx *bbolt.Tx) error {
		if err := putRegion(tx, r); err != nil {
			return err
		}
		if err := putApplyState(tx, r.ID, applyState{AppliedIndex: 10, AppliedTerm: 6, TruncatedIndex: 5, TruncatedTerm: 5}); err != nil {
			return err
		}
		if err := replaceDedupTx(tx, r, dedup); err != nil {
			return err
		}
		if err := putDedupBaseTx(tx, r.ID, 1000+r.ID); err != nil {
			return err
		}
		for i := 0; i+1 < len(kvs); i += 2 {
			if err := tx.Bucket(bucketData).Put([]byte(kvs[i]), []byte(kvs[i+1])); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	snap, err := e.buildSnapshot(r.ID)
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
		[]dedupRecord{{clock: 1008, id: 77, key: []byte("c")}, {clock: 1009, id: 78, key: []byte("k")}, {clock: 1009, id: 79, key: []byte("k")}},
		"a", "outside", "b", "1", "c", "", "l\xff", "big", "m", "outside")
	empty := fuzzSnapshot(f, e, region.Region{ID: 4, StartKey: []byte("x"), Epoch: region.Epoch{ConfVer: 1, Version: 1}}, nil)
	unbounded := fuzzSnapshot(f, e, region.Region{ID: 5, Peers: peers[:1]}, []dedupRecord{{clock: 6, id: 1, key: []byte("zz")}}, "zz", "top")
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
	if len(b) < len(snapMagic)+4 {
		return b
	}
	body := bytes.Clone(b[:len(b)-4])
	return binary.BigEndian.AppendUint32(body, crc32.Checksum(body, snapCRC))
}

// checkDecodedSnapshot checks what decodeSnapshotData says about data: an
// error wrapping errCorrupt, or a snapshot whose every key lies in its
// region. It returns whether data was accepted.
func checkDecodedSnapshot(t *testing.T, data []byte) (snapshotData, bool) {
	t.Helper()
	sd, err := decodeSnapshotData(data)
	if err != nil {
		if !errors.Is(err, errCorrupt) {
			t.Fatalf("decodeSnapshotData error %v does not wrap errCorrupt", err)
		}
		return sd, false
	}
	r, kvs, err := decodeSnapshotRegion(data)
	if err != nil || r.ID != sd.region.ID || !bytes.Equal(kvs, sd.kvs) {
		t.Fatalf("decodeSnapshotRegion disagrees with decodeSnapshotData: %v", err)
	}
	for _, d := range sd.dedup {
		if !sd.region.Contains(d.key) {
			t.Fatalf("accepted dedup record %v outside %s", d, sd.region.String())
		}
	}
	n := 0
	if err := forEachKV(sd.kvs, func(k, v []byte) error {
		if !sd.region.Contains(k) {
			return fmt.Errorf("accepted key %q outside %s", k, sd.region.String())
		}
		n++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if 2*n+17*len(sd.dedup) > len(data) {
		t.Fatalf("%d pairs and %d dedup records from %d bytes", n, len(sd.dedup), len(data))
	}
	return sd, true
}

// FuzzDecodeSnapshot: snapshot data as it arrives from a leader, checked by
// HandleRaftMessage and decoded again by the apply. Every input is tried as
// is and with its checksum fixed, so mutations reach the structure.
func FuzzDecodeSnapshot(f *testing.F) {
	for _, s := range snapshotSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecodedSnapshot(t, data)
		checkDecodedSnapshot(t, fixCRC(data))
	})
}

// FuzzSnapshotApply: a snapshot the decoder accepts must apply (an apply
// error stops the store: HandleRaftMessage decodes every snapshot first so
// that a bad one never reaches the Ready loop), and the state it leaves must
// build the same snapshot again: decode(build(apply(x))) == decode(x), with
// repeated data keys resolved as the apply resolves them (the later one
// wins; dedup records come in strict order, so they cannot repeat).
func FuzzSnapshotApply(f *testing.F) {
	for _, s := range snapshotSeeds(f) {
		f.Add(s, uint64(10), uint64(6))
	}
	e := fuzzEngine(f)
	f.Fuzz(func(t *testing.T, data []byte, index, term uint64) {
		data = fixCRC(data)
		sd, ok := checkDecodedSnapshot(t, data)
		if !ok {
			return
		}
		snap := raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: index, Term: term}}
		var applied region.Region
		err := e.db.Update(func(tx *bbolt.Tx) error {
			var err error
			applied, err = applySnapshotTx(tx, snap)
			return err
		})
		if err != nil {
			t.Fatalf("a snapshot the decoder accepted does not apply: %v", err)
		}
		if !sameRegion(applied, sd.region) {
			t.Fatalf("applied region %s, snapshot has %s", applied.String(), sd.region.String())
		}
		again, err := e.buildSnapshot(sd.region.ID)
		if err != nil {
			t.Fatal(err)
		}
		if again.Metadata.Index != index || again.Metadata.Term != term {
			t.Fatalf("rebuilt snapshot at %d/%d, applied at %d/%d", again.Metadata.Index, again.Metadata.Term, index, term)
		}
		sd2, err := decodeSnapshotData(again.Data)
		if err != nil {
			t.Fatalf("the rebuilt snapshot does not decode: %v", err)
		}
		if !sameRegion(sd2.region, sd.region) {
			t.Fatalf("region %s rebuilt as %s", sd.region.String(), sd2.region.String())
		}
		if got, want := kvMap(t, sd2.kvs), kvMap(t, sd.kvs); !equalKV(got, want) {
			t.Fatalf("pairs %q rebuilt as %q", want, got)
		}
		if got, want := sd2.dedup, sd.dedup; !slices.EqualFunc(got, want, func(a, b dedupRecord) bool {
			return a.clock == b.clock && a.id == b.id && bytes.Equal(a.key, b.key)
		}) {
			t.Fatalf("dedup table %v rebuilt as %v", want, got)
		}
		if sd2.dedupBase != sd.dedupBase {
			t.Fatalf("dedup clock base %d rebuilt as %d", sd.dedupBase, sd2.dedupBase)
		}
	})
}

// sameRegion compares regions as their JSON encoding does (nil and empty
// keys are both "no bound").
func sameRegion(a, b region.Region) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return a.ID == b.ID && bytes.Equal(a.StartKey, b.StartKey) && bytes.Equal(a.EndKey, b.EndKey) &&
		a.Epoch == b.Epoch && slices.Equal(a.Peers, b.Peers) || bytes.Equal(ja, jb)
}

func kvMap(t *testing.T, kvs []byte) map[string]string {
	m := map[string]string{}
	if err := forEachKV(kvs, func(k, v []byte) error {
		m[string(k)] = string(v)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return m
}

func equalKV(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
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

// FuzzLoadPeers: the persisted state of one region as a restarting store
// reads it (engine.loadPeers, then newPeerStorage): region meta (JSON),
// hard state and log entries (raft protobuf), apply state. A corrupt record
// must fail the load with an error, not crash the store.
func FuzzLoadPeers(f *testing.F) {
	r := region.Region{ID: 7, StartKey: []byte("a"), Epoch: region.Epoch{ConfVer: 1, Version: 2}, Peers: []region.Peer{{ID: 1, StoreID: 1}, {ID: 2, StoreID: 2}}}
	meta, _ := json.Marshal(r)
	hs, _ := (&raftpb.HardState{Term: 6, Vote: 1, Commit: 6}).Marshal()
	ent := func(e raftpb.Entry) []byte {
		b, _ := e.Marshal()
		return b
	}
	e6 := ent(raftpb.Entry{Term: 6, Index: 6, Data: command{op: opPut, id: 1, key: []byte("k")}.encode()})
	e7 := ent(raftpb.Entry{Term: 6, Index: 7})
	f.Add(meta, hs, initApplyState.encode(), e6, e7)
	f.Add(meta, hs, initApplyState.encode(), e7, e6) // entries out of order
	f.Add(meta, hs, applyState{AppliedIndex: 6, AppliedTerm: 6, TruncatedIndex: 6, TruncatedTerm: 6}.encode(), []byte(nil), e7)
	f.Add(meta, hs, initApplyState.encode(), ent(raftpb.Entry{Term: 6, Index: 60}), []byte(nil)) // a gap
	f.Add(meta[:len(meta)/2], hs, initApplyState.encode(), e6, e7)                               // truncated meta
	f.Add([]byte(`{"ID":7,"StartKey":"!!"}`), hs, initApplyState.encode(), e6, e7)               // bad base64
	f.Add(meta, hs[:1], initApplyState.encode(), e6, e7)                                         // truncated hard state
	f.Add(meta, hs, initApplyState.encode()[:31], e6, e7)                                        // short apply state
	f.Add(meta, hs, initApplyState.encode(), e6[:len(e6)-1], e7)                                 // truncated entry
	f.Add(meta, hs, applyState{TruncatedIndex: ^uint64(0)}.encode(), e6, e7)                     // truncated index at the top

	e := fuzzEngine(f)
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
			first := uint64(raftInitIndex + 1)
			if as, err := decodeApplyState(apply); err == nil {
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
		pps, err := e.loadPeers()
		if err != nil {
			return
		}
		for _, pp := range pps {
			for i, ent := range pp.entries {
				if want := pp.apply.TruncatedIndex + 1 + uint64(i); ent.Index != want {
					t.Fatalf("loaded entry %d holds index %d, want %d", i, ent.Index, want)
				}
			}
			if _, err := newPeerStorage(e, pp, new(atomic.Uint64)); err != nil {
				t.Logf("newPeerStorage: %v", err)
			}
		}
	})
}
