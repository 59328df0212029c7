package raftstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"go.etcd.io/raft/v3/raftpb"
)

// TestNoticeKindFilter: notices travel beside raft messages, so a filter
// drops one kind of notice and nothing else. With every lease grant lost,
// no follower holds a lease while heartbeats, their responses and the
// lease requests still flow; healed, a follower takes one.
func TestNoticeKindFilter(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{FollowerLeases: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var requests, heartbeatResps, grantsSeen atomic.Int64
	c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		switch {
		case m.Notice != nil && m.Notice.Kind == raftstore.NoticeLeaseRequest:
			requests.Add(1)
		case m.Notice != nil && m.Notice.Kind == raftstore.NoticeLeaseGrant:
			grantsSeen.Add(1)
		case m.Notice == nil && m.Msg.Type == raftpb.MsgHeartbeatResp:
			heartbeatResps.Add(1)
		}
		return false, 0
	}))
	heal := c.Net.AddFilter(raftstore.NoticeKindFilter(raftstore.DropFilter(1), raftstore.NoticeLeaseGrant))
	if err := c.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	grants := func() (n uint64) {
		for _, id := range c.IDs() {
			if s, ok := c.Store(id); ok {
				n += s.Stats().FollowerLeaseGrants
			}
		}
		return n
	}
	deadline := time.Now().Add(10 * time.Second)
	for grantsSeen.Load() < 3 || heartbeatResps.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d grants, %d heartbeat responses sent in 10s", grantsSeen.Load(), heartbeatResps.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := grants(); n != 0 {
		t.Fatalf("%d leases taken with every grant dropped", n)
	}
	if requests.Load() == 0 {
		t.Fatal("no lease request sent")
	}
	heal()
	for grants() == 0 {
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatal("no lease taken after the grants were let through")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
