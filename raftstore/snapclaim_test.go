package raftstore

import (
	"context"
	"sync"
	"testing"
	"time"
)

// regionGate holds the snapshot apply worker of one store at its first
// transaction for one region, until released.
type regionGate struct {
	store, region uint64
	once          sync.Once
	reached       chan struct{}
	release       chan struct{}
}

func newRegionGate(store, region uint64) *regionGate {
	return &regionGate{store: store, region: region, reached: make(chan struct{}), release: make(chan struct{})}
}

func (g *regionGate) config(cfg *Config) {
	if cfg.StoreID != g.store {
		return
	}
	cfg.applyBatchBytes, cfg.clearBatchKeys = 64<<10, 128
	cfg.Knobs.beforeApplyBatch = func(regionID uint64) {
		if regionID != g.region {
			return
		}
		g.once.Do(func() {
			close(g.reached)
			<-g.release
		})
	}
}

// A store that missed two splits in a row gets the first new region by a
// snapshot taken before that region split again. While that snapshot
// applies, the second new region's snapshot overlaps it, and must be
// refused: admitted beside it, the first region, whole, would apply its
// split and create the second region afresh over the snapshot its leader
// had already counted (at scale, the leader's next heartbeat panicked the
// store's raft: `tocommit(7) is out of range [lastIndex(5)]`).
func TestSnapshotOverlappingAnotherSnapshotUnderWayIsRefused(t *testing.T) {
	// The victim is store 3 unless it leads region 1 (then store 2).
	var gate *regionGate
	c := newMiniCluster(t, 3, func(cfg *Config) {
		cfg.LogGCThreshold = 20
		if gate != nil {
			gate.config(cfg)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leader := c.mustLeaderOf([]byte("a"))
	victim := uint64(3)
	if leader.ID() == victim {
		victim = 2
	}
	// The gate goes in at a restart of the victim: region 2 is the first
	// region a split makes (IDs are a sequence).
	c.stop(victim)
	gate = newRegionGate(victim, 2)
	var releaseOnce sync.Once
	releaseGate := func() { releaseOnce.Do(func() { close(gate.release) }) }
	defer releaseGate() // before the cluster's shutdown, which waits for the worker
	heal := c.net.AddFilter(IsolateFilter(victim))
	c.start(victim)

	split := func(key string) {
		t.Helper()
		if err := c.do(ctx, []byte(key), func(ctx context.Context, s *Store) error {
			_, _, err := s.Split(ctx, []byte(key))
			return err
		}); err != nil {
			t.Fatalf("split at %q: %v", key, err)
		}
	}
	split("m")
	c.load(ctx, "n", 300, 1000) // region 2's data: the snapshot takes several transactions
	c.load(ctx, "a", 40, 100)   // region 1's log compacted past the split
	for id, s := range c.all() {
		if id != victim {
			if err := s.eng.CheckpointIfDue(true); err != nil {
				t.Fatal(err)
			}
		}
	}
	vs := c.store(victim)
	heal()
	select {
	case <-gate.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("region 2's snapshot never began to apply on the victim")
	}
	refused := vs.stats.snapshotsRefusedOverlap.Load()
	// Region 2 splits while its snapshot (from before) applies on the
	// victim: region 3's leader sends the victim a snapshot of its own.
	split("t")
	c.load(ctx, "u", 50, 100)
	c.waitFor(20*time.Second, "the victim refuses region 3's snapshot", func() bool {
		if p, ok := vs.peer(3); ok {
			p.mu.Lock()
			held := p.holdsSnapshotLocked()
			p.mu.Unlock()
			if held {
				t.Fatal("region 3's snapshot was admitted while region 2's, which covers its range, applies")
			}
		}
		return vs.stats.snapshotsRefusedOverlap.Load() > refused
	})
	releaseGate()
	for id := uint64(1); id <= 3; id++ {
		c.agree(id, 3)
	}
	d, err := vs.RegionDigest(3)
	if err != nil || d.Keys != 50 {
		t.Fatalf("region 3 on the victim: %v, %v; want 50 keys", d, err)
	}
	t.Logf("store %d refused %d overlapping snapshots", victim, vs.stats.snapshotsRefusedOverlap.Load()-refused)
}
