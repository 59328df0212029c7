package raftstore

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// A store being removed is drained in one balance tick per store, not one
// region per tick: each leader carries out its repairs back to back (a
// store removal at 2,000,000 records moved two replicas every balance
// interval, 127 s for 51 regions). The ticks are driven by hand, once per
// store, store 1 (being removed) first so that it hands its leaderships
// over; the others then move every replica off it in their one tick.
func TestRemovalDrainsInOneTickPerStore(t *testing.T) {
	c := newMiniCluster(t, 3, nil) // the balance loops are off (BalanceInterval -1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const regions = 6
	c.splitInto(ctx, regions)
	for i := range regions {
		c.put(ctx, fmt.Appendf(nil, "r%02d/x", i), []byte("v"))
	}
	c.start(4)
	const victim = 1
	c.mu.Lock()
	c.removing[victim] = true
	c.mu.Unlock()
	for _, id := range []uint64{1, 2, 3, 4} {
		c.store(id).balanceTick(map[uint64]time.Time{})
	}
	var left []uint64
	for _, s := range c.all() {
		for _, st := range s.Regions() {
			if st.IsLeader {
				if _, on := st.Region.PeerOnStore(victim); on {
					left = append(left, st.Region.ID)
				}
			}
		}
	}
	if len(left) > 0 {
		t.Fatalf("after one balance tick per store, regions %v still have a replica on the store being removed", left)
	}
	for _, st := range c.store(2).Regions() {
		c.agree(st.Region.ID, 3) // store 1's replicas destroyed, the moved ones whole
	}
}
