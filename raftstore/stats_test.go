package raftstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/readmode"
)

// The metrics hook sees every write transaction and every ReadIndex round
// trip, and the gauges and CaughtUp describe a settled cluster.
func TestMetricsHookAndGauges(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var txs, rtts atomic.Int64
	for _, id := range c.IDs() {
		s, _ := c.Store(id)
		s.SetMetricsHook(raftstore.MetricsHook{
			ReadIndexRTT: func(d time.Duration) {
				if d >= 0 {
					rtts.Add(1)
				}
			},
			WriteTx: func(d time.Duration) {
				if d > 0 {
					txs.Add(1)
				}
			},
		})
	}
	leader, err := c.WaitLeader(1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	// A follower read goes through a ReadIndex round trip to the leader.
	var follower *raftstore.Store
	for _, id := range c.IDs() {
		if id != leader {
			follower, _ = c.Store(id)
			break
		}
	}
	if _, _, info, err := follower.Get(ctx, raftstore.ReadOptions{ReplicaRead: true}, []byte("k")); err != nil || info.Mode != readmode.ReadIndex {
		t.Fatalf("follower read: %v, mode %v", err, info.Mode)
	}
	if txs.Load() == 0 || rtts.Load() == 0 {
		t.Fatalf("hook saw %d write transactions, %d read-index round trips; want both > 0", txs.Load(), rtts.Load())
	}

	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, why := follower.CaughtUp()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower not caught up: %s", why)
		}
		time.Sleep(10 * time.Millisecond)
	}
	g := follower.Gauges()
	if g.Regions != 1 || g.Leaders != 0 || g.DBFileBytes <= 0 || g.ApplyLagMax > g.ApplyLagSum {
		t.Fatalf("follower gauges = %+v", g)
	}
	ls, _ := c.Store(leader)
	if g := ls.Gauges(); g.Leaders != 1 {
		t.Fatalf("leader gauges = %+v", g)
	}
	if err := follower.DiskError(); err != nil {
		t.Fatalf("DiskError = %v on a healthy disk", err)
	}
}

// Each store counts the leaderships its peers take, by cause: the first
// leader is elected, one handed over by TransferLeader is a transfer, and
// the one that follows a crashed leader (no handover) is elected.
func TestLeadershipsCountedByCause(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stores := map[uint64]*raftstore.Store{}
	for _, id := range c.IDs() {
		stores[id], _ = c.Store(id)
	}
	count := func() (transfer, election uint64) {
		for _, s := range stores {
			st := s.Stats()
			transfer += st.LeadershipsByTransfer
			election += st.LeadershipsByElection
		}
		return transfer, election
	}
	// The count follows the Ready that reports the leadership, shortly
	// after raft's own state says so.
	waitCount := func(what string, ok func(transfer, election uint64) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			tr, el := count()
			if ok(tr, el) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d leaderships by transfer, %d by election", what, tr, el)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	leader, err := c.WaitLeader(1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitCount("first leader", func(tr, el uint64) bool { return tr == 0 && el >= 1 })
	_, elected := count()

	target := leader%3 + 1
	if err := stores[leader].TransferLeader(ctx, 1, target); err != nil {
		t.Fatal(err)
	}
	waitCount("after a transfer", func(tr, el uint64) bool { return tr == 1 && el == elected })
	if err := c.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}

	// A crash hands nothing over: the next leader is elected.
	if err := c.StopStore(target); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitCount("after the leader crashed", func(tr, el uint64) bool { return tr == 1 && el > elected })
}
