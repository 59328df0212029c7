package raftstore

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/storage/engine"
)

// Destroying a replica commits its tombstone and returns; its range is
// cleared after, in bounded transactions: one transaction used to delete
// it, seeking the range's start after every delete, which walks every leaf
// emptied so far (32 s for 40,000 pairs of 1 KB, the store's loop waiting).
func TestDestroyClearsTheRangeOffTheLoop(t *testing.T) {
	c := newMiniCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.put(ctx, []byte("k"), []byte("v"))
	c.agree(1, 3)
	leader := c.mustLeaderOf([]byte("k"))
	var victim *Store
	for _, s := range c.all() {
		if s != leader {
			victim = s
		}
	}
	// 40,000 pairs of 1 KB in the replica's range, behind raft's back.
	val := bytes.Repeat([]byte("v"), 1000)
	for start := 0; start < 40000; start += 10000 {
		if err := victim.eng.LockedUpdate(func(tx *engine.Tx) error {
			for i := start; i < start+10000; i++ {
				if err := tx.Put(fmt.Appendf(nil, "x%08d", i), val); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	p, _ := victim.peer(1)
	begin := time.Now()
	if err := victim.destroyPeer(p); err != nil {
		t.Fatal(err)
	}
	destroyed := time.Since(begin)
	c.waitFor(60*time.Second, "the range cleared", func() bool {
		pairs, _ := countData(t, victim)
		a, cl := victim.eng.MarkerCount()
		return pairs == 0 && a == 0 && cl == 0
	})
	t.Logf("destroyPeer returned in %v; the range of 40,000 pairs was cleared %v after", destroyed, time.Since(begin))
	if destroyed > time.Second {
		t.Errorf("destroyPeer took %v", destroyed)
	}
}

// A store being removed whose 40 replicas were removed while nothing
// reached it (no commit, no tombstone), all of them asleep (hibernating):
// each learns of its removal from the stale checks its store sends every
// second, and all are destroyed within a few seconds.
func TestRemovedStoreLearnsOfEveryRemovalAtOnce(t *testing.T) {
	c := newMiniCluster(t, 3, func(cfg *Config) { cfg.HibernateAfter = 200 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const regions = 40
	c.splitInto(ctx, regions)
	for i := range regions {
		for j := range 20 {
			c.put(ctx, fmt.Appendf(nil, "r%02d/%02d", i, j), bytes.Repeat([]byte("v"), 1000))
		}
	}
	// The victim leads nothing.
	const victim = 3
	vs := c.store(victim)
	for _, st := range vs.Regions() {
		if st.IsLeader {
			if err := vs.TransferLeader(ctx, st.Region.ID, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.waitFor(30*time.Second, "every replica on the victim asleep", func() bool {
		sts := vs.Regions()
		n := 0
		for _, st := range sts {
			if st.Hibernating && !st.IsLeader {
				n++
			}
		}
		return len(sts) == regions && n == regions
	})
	c.mu.Lock()
	c.removing[victim] = true
	c.mu.Unlock()
	lost := c.net.AddFilter(FilterFunc(func(m *Message) (bool, time.Duration) { return m.ToStore == victim, 0 }))
	for _, st := range vs.Regions() {
		rid := st.Region.ID
		key := st.Region.StartKey
		if err := c.do(ctx, key, func(ctx context.Context, s *Store) error { return s.RemovePeer(ctx, rid, victim) }); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(vs.Regions()); n != regions {
		t.Fatalf("%d replicas left on the victim before it hears anything, want %d", n, regions)
	}
	lost()
	begin := time.Now()
	c.waitFor(10*time.Second, "every replica on the removed store destroyed", func() bool { return len(vs.Regions()) == 0 })
	took := time.Since(begin)
	t.Logf("%d replicas destroyed %v after the last removal", regions, took)
	if took > 3*time.Second {
		t.Errorf("the removed store's replicas took %v to go", took)
	}
	c.waitFor(30*time.Second, "the removed store's data cleared", func() bool {
		pairs, _ := countData(t, vs)
		a, cl := vs.eng.MarkerCount()
		return pairs == 0 && a == 0 && cl == 0
	})
}
