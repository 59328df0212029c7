package raftstoretest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"go.etcd.io/raft/v3/raftpb"
)

// TestManualClockHibernationManyRegions splits region 1 into many regions
// and lets them idle: every one hibernates within a bound of ticks, and
// from then on a tick visits no peer at all (TickVisits), for the loop
// ticks only the awake ones. A write wakes its own region only, which
// ticks until it sleeps again.
func TestManualClockHibernationManyRegions(t *testing.T) {
	const (
		regions    = 120
		quietTicks = 5
	)
	var mu sync.Mutex
	visits := map[uint64]int{} // store -> peers visited by its last tick
	c := newManualCluster(t, Options{
		HibernateAfter: quietTicks * tick,
		Knobs: func(id uint64) raftstore.TestingKnobs {
			return raftstore.TestingKnobs{TickVisits: func(n int) {
				mu.Lock()
				visits[id] = n
				mu.Unlock()
			}}
		},
	})
	lastVisits := func() map[uint64]int {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[uint64]int, len(visits))
		for id, n := range visits {
			out[id] = n
		}
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 1; i < regions; i++ {
		if err := c.Split(ctx, regionKey(i)); err != nil {
			t.Fatalf("split %d: %v", i, err)
		}
	}
	// Each split-born region elects its first leader by a campaign that
	// needs no tick; tick until every store hosts them all.
	allHosted := func() bool {
		for _, id := range c.IDs() {
			if g := c.mustStore(t, id).Gauges(); g.Regions != regions {
				return false
			}
		}
		return true
	}
	for n := 0; !allHosted(); n++ {
		if n > 100 {
			t.Fatal("the split-born regions are not on every store after 100 ticks")
		}
		c.mustTick(t, 1)
	}

	// Idle: a region hibernates quietTicks after its last traffic, and a
	// follower not caught up when told keeps its region awake a while
	// longer; 10 times that bounds it with room.
	const bound = 10 * quietTicks
	asleep := func() (bool, string) {
		for _, id := range c.IDs() {
			if g := c.mustStore(t, id).Gauges(); g.Hibernating != g.Regions {
				return false, fmt.Sprintf("store %d: %d of %d regions hibernating", id, g.Hibernating, g.Regions)
			}
		}
		return true, ""
	}
	for n := 1; ; n++ {
		c.mustTick(t, 1)
		ok, why := asleep()
		if ok {
			t.Logf("all %d regions hibernating %d ticks after the last split; store 1 wakes: %v",
				regions, n, c.mustStore(t, 1).Stats().Wakes)
			break
		}
		if n >= bound {
			st := c.mustStore(t, 1).Stats()
			t.Fatalf("%d ticks after the last split: %s (refusals %v, wakes %v)", n, why, st.HibernateRefusals, st.Wakes)
		}
	}

	// The summary every cluster view asks for, cached between changes,
	// counts what a fresh pass counts.
	leaders := 0
	for _, id := range c.IDs() {
		s := c.mustStore(t, id)
		sum, g := s.Summary(), s.Gauges()
		if sum.Regions != regions || sum.Leaders != g.Leaders {
			t.Fatalf("store %d's summary: %d regions, %d leaders; want %d, %d", id, sum.Regions, sum.Leaders, regions, g.Leaders)
		}
		leaders += sum.Leaders
	}
	if leaders != regions {
		t.Fatalf("the summaries count %d leaders of %d regions", leaders, regions)
	}

	// Asleep, a tick visits nobody, however many regions there are.
	for range 3 * electionTicks {
		c.mustTick(t, 1)
		for id, n := range lastVisits() {
			if n != 0 {
				t.Fatalf("store %d's tick visited %d peers with every region hibernating", id, n)
			}
		}
	}

	// A write wakes its region (one peer per store), not the others.
	put(t, c, string(regionKey(7))+"x", "v")
	c.mustTick(t, 1)
	for id, n := range lastVisits() {
		if n > 1 {
			t.Fatalf("after a write to one region, store %d's tick visited %d peers, want at most 1", id, n)
		}
	}
	for n := 1; ; n++ {
		c.mustTick(t, 1)
		if ok, _ := asleep(); ok {
			break
		}
		if n >= bound {
			_, why := asleep()
			t.Fatalf("the written region did not go back to sleep in %d ticks: %s", n, why)
		}
	}
}

// regionKey is the i-th split point: region i (from 1) starts there.
func regionKey(i int) []byte { return fmt.Appendf(nil, "r%06d", i) }

// TestManualClockHibernationThroughDrops loses every other heartbeat to
// one follower, as a full send queue does under load: each loss reports
// the follower unreachable, and raft probes it with an empty append on
// the next heartbeat's answer. Those probes are not traffic: the region
// hibernates all the same, where before their answers restarted the
// leader's idle count every few ticks and it never slept.
func TestManualClockHibernationThroughDrops(t *testing.T) {
	const quietTicks = 5
	c := newManualCluster(t, Options{HibernateAfter: quietTicks * tick})
	put(t, c, "k", "v")
	leader, _ := c.Leader(1)
	lossy := follower(t, c, leader)
	var mu sync.Mutex
	n := 0
	c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		if m.Notice != nil || m.Msg.Type != raftpb.MsgHeartbeat || m.ToStore != lossy {
			return false, 0
		}
		mu.Lock()
		defer mu.Unlock()
		n++
		return n%2 == 0, 0
	}))
	for i := 1; ; i++ {
		c.mustTick(t, 1)
		if s, _ := c.Status(leader, 1); s.Hibernating {
			break
		}
		if i >= 10*quietTicks {
			st := c.mustStore(t, leader).Stats()
			t.Fatalf("leader %d still awake %d ticks after the last write, losing heartbeats to store %d (refusals %v)", leader, i, lossy, st.HibernateRefusals)
		}
	}
}
