package raftstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// A placeholder whose raft has taken a snapshot keeps its peer ID: a
// message for another peer ID of its region (a leader with an older or
// newer view of the membership) arriving while the snapshot's round is
// persisting it must not supersede it. Superseded there, the round still
// acked the snapshot, the leader counted on that peer ID holding its log,
// the next message to the ID created an empty placeholder, and the
// leader's heartbeat carried the acked commit index into it: raft panics
// (`tocommit(N) is out of range [lastIndex(0)]`), as one store did in a
// 2,000,000-record removal.
func TestPlaceholderHoldingASnapshotIsNotSuperseded(t *testing.T) {
	var once sync.Once
	var fired atomic.Bool
	var other *Message // the message for another peer ID, set before store 4 starts
	afterPersist := func(s *Store, batch []*readyPeer) {
		if s.cfg.StoreID != 4 {
			return
		}
		for _, rp := range batch {
			if rp.p.regionID == 1 && rp.snapApplied {
				once.Do(func() { fired.Store(true); _ = s.HandleRaftMessage(other) })
			}
		}
	}
	c := newMiniCluster(t, 3, func(cfg *Config) { cfg.Knobs.afterPersist = afterPersist })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.load(ctx, "k", 500, 1000)
	leader := c.mustLeaderOf([]byte("k"))
	lp, _ := leader.peer(1)
	lp.mu.Lock()
	term := lp.rn.BasicStatus().Term
	lp.mu.Unlock()
	const otherID = 999_999
	other = &Message{RegionID: 1, FromStore: leader.ID(), ToStore: 4,
		Msg: raftpb.Message{Type: raftpb.MsgHeartbeat, From: lp.id, To: otherID, Term: term}}
	s4 := c.start(4)
	if err := c.do(ctx, []byte("k"), func(ctx context.Context, s *Store) error { return s.AddPeer(ctx, 1, 4) }); err != nil {
		t.Fatalf("add a replica on store 4: %v", err)
	}
	c.put(ctx, []byte("after"), []byte("v"))
	c.agree(1, 4)
	p, ok := s4.peer(1)
	if !ok || p.id == otherID || !p.isInitialized() {
		t.Fatalf("store 4's replica of region 1: %v; want the added peer, initialized", p)
	}
	if !fired.Load() {
		t.Fatal("no round of store 4 applied a snapshot of region 1")
	}
}

// voteSink stands in for a store: it keeps the messages it is sent.
type voteSink struct {
	mu   sync.Mutex
	msgs []raftpb.Message
}

func (v *voteSink) HandleRaftMessage(m *Message) error {
	v.mu.Lock()
	v.msgs = append(v.msgs, m.Msg)
	v.mu.Unlock()
	return nil
}
func (v *voteSink) ReportUnreachable(uint64, uint64) {}
func (v *voteSink) ReportSnapshot(*Message, bool)    {}

// voteResp returns the vote answer from -> to, if one came.
func (v *voteSink) voteResp(from, to uint64) (raftpb.Message, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, m := range v.msgs {
		if m.Type == raftpb.MsgVoteResp && m.From == from && m.To == to {
			return m, true
		}
	}
	return raftpb.Message{}, false
}

// A placeholder's vote binds the placeholder the store creates again
// under the same peer ID, however soon: maybeCreatePeer seeds the new
// one's hard state from what the store persisted for the region, and the
// vote may still be only in the open batch (committed every
// BatchInterval and at checkpoints; here never during the test). A
// placeholder superseded by one for another peer ID of its region (two
// leaders that address this store by different peer IDs, during a
// membership change) and re-created by its own leader's next heartbeat
// must still refuse a second candidate of the term it voted in.
func TestRecreatedPlaceholderKeepsItsVote(t *testing.T) {
	// No periodic checkpoint: whatever the rounds below persist stays in
	// the open batch.
	c := newMiniCluster(t, 1, func(cfg *Config) { cfg.BatchInterval, cfg.checkpointInterval = time.Hour, time.Hour })
	s := c.store(1)
	sink := &voteSink{}
	c.net.Register(2, sink)
	c.net.Register(3, sink)
	const (
		regionID = 77
		self     = 101 // this store's peer of the region
		other    = 102 // another peer ID for it, of another leader's view
		leader   = 201 // on store 2
		cand1    = 301 // on store 3
		cand2    = 202 // on store 2
		term     = 11
	)
	send := func(from, fromStore uint64, m raftpb.Message) error {
		return s.HandleRaftMessage(&Message{RegionID: regionID, FromStore: fromStore, ToStore: 1, Msg: m})
	}
	// The leader's heartbeat creates the placeholder.
	if err := send(leader, 2, raftpb.Message{Type: raftpb.MsgHeartbeat, From: leader, To: self, Term: term - 1}); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	// It votes for cand1 in term 11 (a transfer's vote: raft and the store
	// let it through while a leader is heard).
	vote := func(cand, store uint64) {
		t.Helper()
		if err := send(cand, store, raftpb.Message{Type: raftpb.MsgVote, From: cand, To: self, Term: term, Context: campaignTransfer}); err != nil {
			t.Fatalf("vote request from %d: %v", cand, err)
		}
	}
	vote(cand1, 3)
	c.waitFor(5*time.Second, "the placeholder answers cand1", func() bool { _, ok := sink.voteResp(self, cand1); return ok })
	if m, _ := sink.voteResp(self, cand1); m.Reject || m.Term != term {
		t.Fatalf("the placeholder's answer to cand1: %+v; want a vote in term %d", m, term)
	}
	// Another leader's heartbeat to another peer ID supersedes it; its own
	// leader's next heartbeat creates it again.
	if err := send(leader, 2, raftpb.Message{Type: raftpb.MsgHeartbeat, From: leader, To: other, Term: term - 1}); err != nil {
		t.Fatalf("heartbeat to the other peer ID: %v", err)
	}
	if p, ok := s.peer(regionID); !ok || p.id != other {
		t.Fatalf("region %d's peer: %v; want the placeholder for peer %d", regionID, p, other)
	}
	if err := send(leader, 2, raftpb.Message{Type: raftpb.MsgHeartbeat, From: leader, To: self, Term: term - 1}); err != nil && !isRetryableRegionError(err) {
		t.Fatalf("heartbeat re-creating the placeholder: %v", err)
	}
	if p, ok := s.peer(regionID); !ok || p.id != self {
		t.Fatalf("region %d's peer: %v; want the placeholder for peer %d again", regionID, p, self)
	}
	// cand2 asks in the same term: the answer must be no.
	vote(cand2, 2)
	c.waitFor(5*time.Second, "the placeholder answers cand2", func() bool { _, ok := sink.voteResp(self, cand2); return ok })
	if m, _ := sink.voteResp(self, cand2); !m.Reject && m.Term == term {
		t.Fatalf("the re-created placeholder voted for %d in term %d after voting for %d in it: two votes in one term", cand2, term, cand1)
	}
}
