package raftstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"go.etcd.io/raft/v3/raftpb"
)

// TestSplitNewRegionTakesWritesBeforeAnElectionTimeout: the new region's
// peer on the parent leader's store campaigns as soon as its store applies
// the split, and its pre-vote reaches followers that have not applied the
// split yet (here they hear of its commit lag late), which refuse a vote
// for a region they do not know. The region must still take writes as soon
// as the followers apply the split, not an election timeout later (issue
// 18: 0.5-0.9 s stalls at every such split under load).
func TestSplitNewRegionTakesWritesBeforeAnElectionTimeout(t *testing.T) {
	const (
		tick          = 10 * time.Millisecond
		electionTicks = 100 // elections time out after 1-2 s
		lag           = 150 * time.Millisecond
	)
	c := newCluster(t, raftstoretest.Options{TickInterval: tick, ElectionTicks: electionTicks})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, k := range []string{"a", "k", "p", "x"} {
		if err := c.Put(ctx, []byte(k), []byte("v")); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	leader, ok := c.Leader(1)
	if !ok {
		t.Fatal("region 1 has no leader")
	}
	// Region 1's appends and heartbeats reach the followers lag late: the
	// split's entry, and then its commit.
	remove := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		if m.RegionID == 1 && m.FromStore == leader && m.Notice == nil && (m.Msg.Type == raftpb.MsgApp || m.Msg.Type == raftpb.MsgHeartbeat) {
			return false, lag
		}
		return false, 0
	}))
	defer remove()
	start := time.Now()
	if err := c.Split(ctx, []byte("m")); err != nil {
		t.Fatalf("split: %v", err)
	}
	split := time.Since(start)
	if err := c.Put(ctx, []byte("x"), []byte("w")); err != nil {
		t.Fatalf("put into the new region: %v", err)
	}
	took := time.Since(start)
	right, _ := c.RegionOf([]byte("x"))
	t.Logf("split applied on the leader after %v; first write into region %d after %v", split, right.ID, took)
	if right.ID == 1 {
		t.Fatal("x is still in region 1")
	}
	// The followers apply the split about 2×lag after it started; an
	// election timeout is at least 1 s.
	if limit := 2*lag + 400*time.Millisecond; took > limit {
		t.Errorf("the new region took its first write %v after the split started, want under %v (followers applied the split about %v in)", took, limit, 2*lag)
	}
}
