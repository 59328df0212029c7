package server

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWithStoreRemoveStore: four balancing stores hold four regions; store
// 4 is removed. Every store learns it (here from another's Status, the
// call reaching store 1 alone), the balancers move store 4's replicas and
// leaderships to stores 1-3, the view reports store 4 removed, the data
// is all there, and store 4's id cannot join again. Removing store 3 too
// is refused: two stores cannot hold three replicas. The leaders' split
// checks meanwhile report each region's size.
func TestWithStoreRemoveStore(t *testing.T) {
	c := newClusterWith(t, 4, nil, func(cfg *raftstore.Config) {
		cfg.BalanceInterval = 100 * time.Millisecond
		cfg.MaxStoreDownTime = time.Minute // only the removal moves replicas
		cfg.SplitCheckInterval = 100 * time.Millisecond
	}, nil)
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	// Not waitLeader: the balancer may trim region 1 (on all four stores
	// at first) before every store has heard of its leader.
	c.leaderOf(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	const numKeys = 40
	for i := range numKeys {
		put(ctx, t, c, 1, fmt.Sprintf("k%02d", i), fmt.Sprintf("v%02d", i))
	}
	for _, k := range []string{"k10", "k20", "k30"} {
		c.splitAt(ctx, t, k)
	}
	waitFor(t, 30*time.Second, "four regions of three voters, some on store 4", func() bool {
		return c.fourRegionsOfThree() && c.onStore(4) > 0
	})

	removeStore4(ctx, t, c)
	waitFor(t, 60*time.Second, "no replica or leadership on store 4", func() bool {
		return c.fourRegionsOfThree() && c.onStore(4) == 0 && len(c.server(4).Store().Regions()) == 0
	})
	waitFor(t, 10*time.Second, "store 1's view to list store 4 removed", func() bool {
		st, err := c.admin(t, 1).Stores(ctx, &kvpb.StoresRequest{})
		if err != nil {
			return false
		}
		for _, s := range st.GetStores() {
			if (s.GetId() == 4) != (s.GetRemoving() && s.GetRemoved()) {
				return false
			}
		}
		return true
	})
	for i := range numKeys {
		c.checkValue(ctx, t, fmt.Sprintf("k%02d", i), fmt.Sprintf("v%02d", i))
	}
	if _, err := c.admin(t, 1).Join(ctx, &kvpb.JoinRequest{StoreId: 4, Address: deadAddr(t)}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("join as removed store 4: %v, want FailedPrecondition", err)
	}

	// Each leader reports its region's size once it has counted it:
	// ten keys of three bytes with values of three.
	waitFor(t, 10*time.Second, "every leader to report its region's size", func() bool {
		n := 0
		for _, s := range c.servers {
			for _, rs := range s.Store().Regions() {
				if rs.IsLeader && rs.SizeKnown && rs.ApproximateKeys == 10 && rs.ApproximateBytes == 60 {
					n++
				}
			}
		}
		return n == 4
	})
}

// splitAt splits the region holding k at k, on its leader, whichever
// store that is.
func (c *testCluster) splitAt(ctx context.Context, t *testing.T, k string) {
	t.Helper()
	waitFor(t, 15*time.Second, "split at "+k, func() bool {
		for _, srv := range c.servers {
			for _, rs := range srv.Store().Regions() {
				if rs.IsLeader && rs.Region.Contains([]byte(k)) {
					if string(rs.Region.StartKey) == k {
						return true // an earlier attempt split it
					}
					_, err := c.admin(t, srv.Store().ID()).Split(ctx, &kvpb.SplitRequest{Key: []byte(k)})
					return err == nil
				}
			}
		}
		return false
	})
}

// placement is what the leaders see: region id -> the stores of its
// voters, and which store leads it.
func (c *testCluster) placement() (map[uint64][]uint64, map[uint64]uint64) {
	voters, leaders := map[uint64][]uint64{}, map[uint64]uint64{}
	for _, s := range c.servers {
		for _, rs := range s.Store().Regions() {
			if rs.IsLeader {
				v, _ := peerStores(rs.Region)
				voters[rs.Region.ID], leaders[rs.Region.ID] = v, s.Store().ID()
			}
		}
	}
	return voters, leaders
}

// onStore counts the voters and leaderships the leaders place on store.
func (c *testCluster) onStore(store uint64) int {
	voters, leaders := c.placement()
	n := 0
	for id, v := range voters {
		if slices.Contains(v, store) {
			n++
		}
		if leaders[id] == store {
			n++
		}
	}
	return n
}

// fourRegionsOfThree: the leaders lead four regions, of three voters each.
func (c *testCluster) fourRegionsOfThree() bool {
	voters, _ := c.placement()
	if len(voters) != 4 {
		return false
	}
	for _, v := range voters {
		if len(v) != 3 {
			return false
		}
	}
	return true
}

// removeStore4 removes store 4 through store 1 alone (forwarded: it does
// not pass it on), waits until the others have learnt it from store 1's
// Status, and checks the removals that must be refused or are done.
func removeStore4(ctx context.Context, t *testing.T, c *testCluster) {
	t.Helper()
	if _, err := c.admin(t, 1).RemoveStore(ctx, &kvpb.RemoveStoreRequest{StoreId: 4, Forwarded: true}); err != nil {
		t.Fatalf("remove store 4 on store 1: %v", err)
	}
	waitFor(t, 10*time.Second, "every store to know store 4 is being removed", func() bool {
		for _, s := range c.servers {
			if !s.cp.IsRemoving(4) {
				return false
			}
		}
		return true
	})
	resp, err := c.admin(t, 2).RemoveStore(ctx, &kvpb.RemoveStoreRequest{StoreId: 4})
	if err != nil || !resp.GetAlready() {
		t.Errorf("remove store 4 again: %v, %v; want already", resp, err)
	}
	_, err = c.admin(t, 2).RemoveStore(ctx, &kvpb.RemoveStoreRequest{StoreId: 3})
	if status.Code(err) != codes.FailedPrecondition || c.server(1).cp.IsRemoving(3) {
		t.Errorf("remove store 3 with store 4 being removed: %v, want FailedPrecondition and no change", err)
	}
	if _, err := c.admin(t, 2).RemoveStore(ctx, &kvpb.RemoveStoreRequest{StoreId: 9}); status.Code(err) != codes.NotFound {
		t.Errorf("remove unknown store 9: %v, want NotFound", err)
	}
}

// checkValue reads k at the leader of its region (as store 1 routes it)
// and wants value.
func (c *testCluster) checkValue(ctx context.Context, t *testing.T, k, value string) {
	t.Helper()
	id := uint64(0)
	for _, rs := range c.server(1).Store().Regions() {
		if rs.Region.Contains([]byte(k)) {
			id = rs.Region.ID
		}
	}
	var got *kvpb.GetResponse
	waitFor(t, 10*time.Second, "read "+k, func() bool {
		var err error
		got, err = c.kv(t, c.leaderOf(t, id)).Get(ctx, &kvpb.GetRequest{Key: []byte(k)})
		return err == nil
	})
	if string(got.GetValue()) != value {
		t.Errorf("%s = %q after the removal", k, got.GetValue())
	}
}

// TestWithStoreRemoveDeadStore: removing a store that is down (the usual
// reason to remove one) is accepted at once and its replicas move to the
// live stores without waiting out MaxStoreDownTime.
func TestWithStoreRemoveDeadStore(t *testing.T) {
	c := newClusterWith(t, 4, nil, func(cfg *raftstore.Config) {
		cfg.BalanceInterval = 100 * time.Millisecond
		cfg.MaxStoreDownTime = time.Hour // only the removal may move the dead store's replica
	}, nil)
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	ctx := testCtx(t)
	put(ctx, t, c, 1, "k", "v")
	var victim uint64
	waitFor(t, 20*time.Second, "region 1 trimmed to three voters", func() bool {
		leader := c.leaderOf(t, 1)
		rs, _ := regionOn(c.server(leader), 1)
		voters, learners := peerStores(rs.Region)
		if len(voters) != 3 || len(learners) != 0 {
			return false
		}
		for _, v := range voters {
			if v != leader {
				victim = v
			}
		}
		return true
	})
	c.server(victim).Stop()
	var live uint64 = 1
	for live == victim {
		live++
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("store %d's view to list store %d down", live, victim), func() bool {
		st, err := c.admin(t, live).Stores(ctx, &kvpb.StoresRequest{})
		if err != nil {
			return false
		}
		for _, s := range st.GetStores() {
			if s.GetId() == victim {
				return !s.GetUp()
			}
		}
		return false
	})
	if _, err := c.admin(t, live).RemoveStore(ctx, &kvpb.RemoveStoreRequest{StoreId: victim}); err != nil {
		t.Fatalf("remove dead store %d: %v", victim, err)
	}
	waitFor(t, 20*time.Second, fmt.Sprintf("region 1 off store %d, three voters", victim), func() bool {
		leader := c.leaderOf(t, 1)
		rs, _ := regionOn(c.server(leader), 1)
		voters, learners := peerStores(rs.Region)
		return len(voters) == 3 && len(learners) == 0 && !slices.Contains(voters, victim)
	})
	waitFor(t, 10*time.Second, fmt.Sprintf("store %d listed removed", victim), func() bool {
		st, err := c.admin(t, live).Stores(ctx, &kvpb.StoresRequest{})
		if err != nil {
			return false
		}
		for _, s := range st.GetStores() {
			if s.GetId() == victim {
				return s.GetRemoving() && s.GetRemoved() && !s.GetUp()
			}
		}
		return false
	})
}
