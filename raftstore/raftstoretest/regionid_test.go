package raftstoretest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/vfs"
)

// Region IDs come from one counter in the first region's descriptor
// (raftstore/regionid.go): these tests check that they read as a sequence,
// that concurrent splits never share one, that the counter survives every
// store losing its power, and that a store without a replica of the first
// region splits with an ID from it, which a snapshot then carries.

func newIDCluster(t *testing.T, opts Options) *Cluster {
	t.Helper()
	opts.Dir = t.TempDir()
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)
	return c
}

func mustSplit(t *testing.T, c *Cluster, key string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := c.Split(ctx, []byte(key)); err != nil {
		t.Fatalf("split at %q: %v", key, err)
	}
	r, ok := c.RegionOf([]byte(key))
	if !ok || string(r.StartKey) != key {
		t.Fatalf("split at %q: region %+v", key, r)
	}
	return r.ID
}

// counterOn is LastRegionID as store id's replica of region 1 holds it.
func counterOn(c *Cluster, id uint64) (uint64, bool) {
	st, ok := c.Status(id, 1)
	return st.Region.LastRegionID, ok
}

func TestRegionIDsAreASequence(t *testing.T) {
	c := newIDCluster(t, Options{})
	// A split asked of a follower is refused before it takes an ID.
	f := follower(t, c, mustLeader(t, c, 1))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var nl *region.NotLeaderError
	if _, _, err := c.mustStore(t, f).Split(ctx, []byte("zz")); !errors.As(err, &nl) {
		t.Fatalf("split on follower %d: %v, want NotLeader", f, err)
	}
	for i, key := range []string{"b", "d", "f", "h"} {
		if id, want := mustSplit(t, c, key), uint64(i+2); id != want {
			t.Fatalf("split %d (at %q) made region %d, want %d", i+1, key, id, want)
		}
	}
	// Five splits at once, each in another region: five IDs, none shared,
	// none skipped.
	keys := []string{"a1", "c", "e", "g", "i"}
	ids := make([]uint64, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() { ids[i] = mustSplit(t, c, key) })
	}
	wg.Wait()
	slices.Sort(ids)
	if want := []uint64{6, 7, 8, 9, 10}; !slices.Equal(ids, want) {
		t.Fatalf("concurrent splits made regions %v, want %v", ids, want)
	}
	waitCounters(t, c, 10)
	for _, r := range c.Regions() {
		if r.ID != 1 && r.LastRegionID != 0 {
			t.Fatalf("region %d holds a counter (%d): only the first region may", r.ID, r.LastRegionID)
		}
	}
}

// waitCounters waits until every running replica of region 1 holds the
// counter at want (a follower applies a moment after the leader).
func waitCounters(t *testing.T, c *Cluster, want uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, id := range c.IDs() {
		for {
			got, ok := counterOn(c, id)
			if ok && got == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("store %d: region 1's counter %d (replica here: %v), want %d", id, got, ok, want)
			}
			time.Sleep(10 * time.Millisecond) // a bounded poll
		}
	}
}

func TestRegionIDsSurvivePowerLoss(t *testing.T) {
	c := newIDCluster(t, Options{PowerLoss: true})
	mustSplit(t, c, "b")
	if id := mustSplit(t, c, "d"); id != 3 {
		t.Fatalf("second split made region %d, want 3", id)
	}
	// Every store at once, nothing unsynced kept: the counter comes back
	// from the raft log, not from a checkpoint.
	rng := rand.New(rand.NewPCG(7, 8))
	for _, id := range c.IDs() {
		if err := c.CutPower(id, vfs.CrashDropUnsynced, rng); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range c.IDs() {
		if err := c.StartStore(id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitLeader(1, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	if id := mustSplit(t, c, "f"); id != 4 {
		t.Fatalf("the split after the power loss made region %d, want 4 (ids must never repeat)", id)
	}
}

func TestRegionIDFromAStoreWithoutTheFirstRegion(t *testing.T) {
	c := newIDCluster(t, Options{})
	if id := mustSplit(t, c, "m"); id != 2 {
		t.Fatalf("split made region %d, want 2", id)
	}
	four, err := c.AddStore()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Region 2 gets a replica on the new store, which then leads it. The
	// split's new region may still be electing its first leader.
	leader, err := c.WaitLeader(2, 10*time.Second)
	if err != nil {
		t.Fatalf("region 2 has no leader: %v", err)
	}
	s := c.mustStore(t, leader)
	if err := s.AddPeer(ctx, 2, four); err != nil {
		t.Fatalf("add region 2 on store %d: %v", four, err)
	}
	if err := waitFor(ctx, func() bool { st, ok := c.Status(four, 2); return ok && st.AppliedIndex > 0 }); err != nil {
		t.Fatalf("store %d never caught up on region 2: %v", four, err)
	}
	if err := s.TransferLeader(ctx, 2, four); err != nil {
		t.Fatalf("transfer region 2 to store %d: %v", four, err)
	}
	if _, ok := c.Status(four, 1); ok {
		t.Fatalf("store %d holds region 1", four)
	}
	// The split is proposed by store 4, which asks another store for the
	// ID (Cluster.AllocRegionID, as the server asks its peers).
	s4 := c.mustStore(t, four)
	_, right, err := s4.Split(ctx, []byte("p"))
	if err != nil {
		t.Fatalf("split on store %d: %v", four, err)
	}
	if right.ID != 3 {
		t.Fatalf("store %d's split made region %d, want 3", four, right.ID)
	}
	// A replica of region 1 made from a snapshot carries the counter.
	if err := c.mustStore(t, mustLeader(t, c, 1)).AddPeer(ctx, 1, four); err != nil {
		t.Fatalf("add region 1 on store %d: %v", four, err)
	}
	if err := waitFor(ctx, func() bool { got, ok := counterOn(c, four); return ok && got == 3 }); err != nil {
		got, _ := counterOn(c, four)
		t.Fatalf("store %d's new replica of region 1 holds counter %d, want 3: %v", four, got, err)
	}
	if err := c.mustStore(t, mustLeader(t, c, 1)).TransferLeader(ctx, 1, four); err != nil {
		t.Fatalf("transfer region 1 to store %d: %v", four, err)
	}
	if id := mustSplit(t, c, "x"); id != 4 {
		t.Fatalf("split under store %d's leadership of region 1 made region %d, want 4", four, id)
	}
}

func mustLeader(t *testing.T, c *Cluster, regionID uint64) uint64 {
	t.Helper()
	id, err := c.WaitLeader(regionID, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(ctx context.Context, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("condition not met: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond): // a bounded poll
		}
	}
	return nil
}

// TestRegionIDsAfterAMerge: the first region absorbing its neighbour keeps
// the counter, and a merged-away ID is never handed out again.
func TestRegionIDsAfterAMerge(t *testing.T) {
	c := newIDCluster(t, Options{})
	mustSplit(t, c, "b")
	mustSplit(t, c, "d")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := waitFor(ctx, func() bool {
		_, err := c.mustStore(t, mustLeader(t, c, 1)).Merge(ctx, 1)
		return err == nil
	}); err != nil {
		t.Fatalf("merge region 1 with region 2: %v", err)
	}
	if r, ok := c.RegionOf([]byte("c")); !ok || r.ID != 1 {
		t.Fatalf("after the merge, c is in region %+v, want region 1", r)
	}
	if id := mustSplit(t, c, "c"); id != 4 {
		t.Fatalf("the split after the merge made region %d, want 4 (2 is merged away, 3 lives)", id)
	}
}
