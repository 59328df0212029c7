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
	testHookPersisted = func(s *Store, batch []*readyPeer) {
		if s.cfg.StoreID != 4 {
			return
		}
		for _, rp := range batch {
			if rp.p.regionID == 1 && rp.snapApplied {
				once.Do(func() { fired.Store(true); _ = s.HandleRaftMessage(other) })
			}
		}
	}
	t.Cleanup(func() { testHookPersisted = nil }) // after the stores stop (cleanups run last first)
	c := newMiniCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.load(ctx, "k", 500, 1000)
	leader, _ := c.leaderOf([]byte("k"))
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
