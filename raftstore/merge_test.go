package raftstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/vfs"
)

func mergeKey(i int) []byte { return []byte(fmt.Sprintf("k%03d", i)) }

// splitFilled writes keys k000..k099, splits at k050 and returns the two
// regions.
func splitFilled(t *testing.T, ctx context.Context, c *raftstoretest.Cluster) (left, right region.Region) {
	t.Helper()
	for i := 0; i < 100; i++ {
		if err := c.Put(ctx, mergeKey(i), []byte(fmt.Sprint(i))); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if err := c.Split(ctx, mergeKey(50)); err != nil {
		t.Fatalf("split: %v", err)
	}
	left, _ = c.RegionOf(mergeKey(0))
	right, _ = c.RegionOf(mergeKey(50))
	if left.ID == right.ID {
		t.Fatal("the split made one region")
	}
	if _, err := c.WaitLeader(right.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return left, right
}

// checkMerged waits until every running store sees one region holding
// both halves (none frozen), reads every key back through the leader,
// writes to both halves, and checks that the replicas agree.
func checkMerged(t *testing.T, ctx context.Context, c *raftstoretest.Cluster, leftID, rightID uint64, want func(i int) string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok := true
		for _, id := range c.IDs() {
			s, running := c.Store(id)
			if !running {
				continue
			}
			for _, st := range s.Regions() {
				if st.Region.ID == rightID || st.Region.Merge != nil {
					ok = false
				}
				if st.Region.ID == leftID && (!st.Region.Contains(mergeKey(0)) || !st.Region.Contains(mergeKey(99))) {
					ok = false
				}
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stores never all saw region %d absorb region %d: %v", leftID, rightID, c.Regions())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := 0; i < 100; i++ {
		v, found, err := c.Get(ctx, mergeKey(i))
		if err != nil || !found || string(v) != want(i) {
			t.Fatalf("get %s = %q %v %v, want %q", mergeKey(i), v, found, err, want(i))
		}
	}
	for _, i := range []int{0, 49, 50, 99} {
		if err := c.Put(ctx, mergeKey(i), []byte("after")); err != nil {
			t.Fatalf("put %s after the merge: %v", mergeKey(i), err)
		}
	}
	if r, _ := c.RegionOf(mergeKey(99)); r.ID != leftID {
		t.Fatalf("k099 is in region %d, want %d", r.ID, leftID)
	}
	if err := c.CheckReplicas(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range c.IDs() {
		if s, ok := c.Store(id); ok && s.Stats().MergeViolations != 0 {
			t.Fatalf("store %d counted %d merge violations", id, s.Stats().MergeViolations)
		}
	}
}

func itoa(i int) string { return fmt.Sprint(i) }

func TestMergeBasic(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, right := splitFilled(t, ctx, c)
	merged, err := c.Merge(ctx, left.ID)
	if err != nil {
		t.Fatalf("merge: %v", err)
	}
	if merged.ID != left.ID || !bytes.Equal(merged.StartKey, left.StartKey) || !bytes.Equal(merged.EndKey, right.EndKey) {
		t.Fatalf("merged into %s, want region %d over both ranges", merged.String(), left.ID)
	}
	if merged.Epoch.Version <= max(left.Epoch.Version, right.Epoch.Version) {
		t.Fatalf("merged version %d not above both sides' (%d, %d)", merged.Epoch.Version, left.Epoch.Version, right.Epoch.Version)
	}
	checkMerged(t, ctx, c, left.ID, right.ID, itoa)
	// A request routed with either side's old epoch fails cleanly.
	for _, old := range []region.Region{left, right} {
		s, _ := c.Store(c.IDs()[0])
		_, _, _, err := s.Get(ctx, raftstore.ReadOptions{RegionID: old.ID, Epoch: old.Epoch}, old.StartKey)
		if !region.IsRegionError(err) {
			t.Fatalf("a read routed to region %d at its old epoch: %v, want a region error", old.ID, err)
		}
	}
}

// TestMergeRefusedWhenStoresDiffer: the source has a replica on a store
// where the target has none.
func TestMergeRefusedWhenStoresDiffer(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, right := splitFilled(t, ctx, c)
	id, err := c.AddStore()
	if err != nil {
		t.Fatal(err)
	}
	lead, _ := c.Leader(right.ID)
	s, _ := c.Store(lead)
	if err := s.AddPeer(ctx, right.ID, id); err != nil {
		t.Fatalf("add a replica of region %d on store %d: %v", right.ID, id, err)
	}
	_, err = c.Merge(ctx, left.ID)
	var refused *raftstore.MergeRefusedError
	if !errors.As(err, &refused) || !errors.Is(err, raftstore.ErrInvalidRequest) {
		t.Fatalf("merge of regions on different stores: %v, want a *MergeRefusedError", err)
	}
	// Nothing froze: both regions take writes.
	for _, i := range []int{0, 99} {
		if err := c.Put(ctx, mergeKey(i), []byte("x")); err != nil {
			t.Fatalf("put after the refused merge: %v", err)
		}
	}
	// The last region has no right neighbour.
	if _, err := c.Merge(ctx, right.ID); !errors.As(err, &refused) {
		t.Fatalf("merge of the last region: %v, want a *MergeRefusedError", err)
	}
}

// TestMergeRacingSplit: splits of both halves race the merge. Whatever
// wins, no region stays frozen, no write is lost and the replicas agree.
func TestMergeRacingSplit(t *testing.T) {
	for round := 0; round < 3; round++ {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			c := newCluster(t, raftstoretest.Options{})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			left, right := splitFilled(t, ctx, c)
			var wg sync.WaitGroup
			var mergeErr error
			wg.Add(2)
			go func() {
				defer wg.Done()
				mctx, mcancel := context.WithTimeout(ctx, 10*time.Second)
				defer mcancel()
				lead, _ := c.Leader(left.ID)
				s, _ := c.Store(lead)
				_, mergeErr = s.Merge(mctx, left.ID)
			}()
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(round) * 5 * time.Millisecond)
				at := mergeKey(25)
				if round == 1 {
					at = mergeKey(75)
				}
				_ = c.Split(ctx, at)
			}()
			wg.Wait()
			t.Logf("merge: %v; regions %v", mergeErr, c.Regions())
			waitNoneFrozen(t, c)
			for i := 0; i < 100; i++ {
				v, found, err := c.Get(ctx, mergeKey(i))
				if err != nil || !found || string(v) != itoa(i) {
					t.Fatalf("get %s = %q %v %v", mergeKey(i), v, found, err)
				}
			}
			for _, i := range []int{0, 30, 60, 99} {
				if err := c.Put(ctx, mergeKey(i), []byte("w")); err != nil {
					t.Fatalf("put %s: %v", mergeKey(i), err)
				}
			}
			if err := c.CheckReplicas(ctx); err != nil {
				t.Fatal(err)
			}
			_ = right
		})
	}
}

func waitNoneFrozen(t *testing.T, c *raftstoretest.Cluster) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		frozen := false
		for _, r := range c.Regions() {
			frozen = frozen || r.Merge != nil
		}
		if !frozen {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a region stayed frozen: %v", c.Regions())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// moveLeader moves regionID's leadership to store to, bounded.
func moveLeader(t *testing.T, ctx context.Context, c *raftstoretest.Cluster, regionID, to uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		lead, ok := c.Leader(regionID)
		if ok && lead == to {
			return
		}
		if ok {
			s, _ := c.Store(lead)
			tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_ = s.TransferLeader(tctx, regionID, to)
			cancel()
		}
		if time.Now().After(deadline) {
			t.Fatalf("region %d: leadership never moved to store %d", regionID, to)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMergeLeadersOnDifferentStores: the coordinator leads the target but
// not the source; its freeze is forwarded.
func TestMergeLeadersOnDifferentStores(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, right := splitFilled(t, ctx, c)
	moveLeader(t, ctx, c, left.ID, 1)
	moveLeader(t, ctx, c, right.ID, 2)
	s, _ := c.Store(1)
	if _, err := s.Merge(ctx, left.ID); err != nil {
		t.Fatalf("merge: %v", err)
	}
	checkMerged(t, ctx, c, left.ID, right.ID, itoa)
}

// TestMergeWithLeaderTransfer: both regions' leaderships move while the
// merge runs.
func TestMergeWithLeaderTransfer(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, right := splitFilled(t, ctx, c)
	moveLeader(t, ctx, c, left.ID, 1)
	moveLeader(t, ctx, c, right.ID, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, r := range []uint64{right.ID, left.ID} {
			if s, ok := c.Store(1); ok {
				tctx, tcancel := context.WithTimeout(ctx, 2*time.Second)
				_ = s.TransferLeader(tctx, r, 3)
				tcancel()
			}
		}
	}()
	if _, err := c.Merge(ctx, left.ID); err != nil {
		t.Fatalf("merge: %v", err)
	}
	wg.Wait()
	checkMerged(t, ctx, c, left.ID, right.ID, itoa)
}

// TestMergeSurvivesRestart: every store restarts after the merge; the
// merged region, and no trace of the source, is what each loads.
func TestMergeSurvivesRestart(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, right := splitFilled(t, ctx, c)
	if _, err := c.Merge(ctx, left.ID); err != nil {
		t.Fatalf("merge: %v", err)
	}
	for _, id := range c.IDs() {
		if err := c.StopStore(id); err != nil {
			t.Fatal(err)
		}
		if err := c.StartStore(id); err != nil {
			t.Fatalf("restart store %d: %v", id, err)
		}
		st, ok := c.Status(id, left.ID)
		if !ok || !st.Region.Contains(mergeKey(99)) || st.Region.Merge != nil {
			t.Fatalf("store %d loaded %v, want the merged region", id, st.Region.String())
		}
		if _, ok := c.Status(id, right.ID); ok {
			t.Fatalf("store %d loaded the merged source region %d", id, right.ID)
		}
	}
	if _, err := c.WaitLeader(left.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	checkMerged(t, ctx, c, left.ID, right.ID, itoa)
}

// mergeWithStore3Lagging splits, leads both halves from store 1 and
// merges them there while store 3 hears nothing of the target region;
// remove ends the cut.
func mergeWithStore3Lagging(t *testing.T, ctx context.Context, c *raftstoretest.Cluster) (left, right region.Region, remove func()) {
	t.Helper()
	left, right = splitFilled(t, ctx, c)
	moveLeader(t, ctx, c, left.ID, 1)
	moveLeader(t, ctx, c, right.ID, 1)
	remove = c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		return m.RegionID == left.ID && (m.ToStore == 3 || m.FromStore == 3), 0
	}))
	s, _ := c.Store(1)
	if _, err := s.Merge(ctx, left.ID); err != nil {
		remove()
		t.Fatalf("merge: %v", err)
	}
	return left, right, remove
}

// TestMergeSnapshotToLaggingReplica: store 3 hears nothing of the target
// region from the freeze on, so it misses the commit; the log moves on
// past it, and store 3 gets the merged region by snapshot, which replaces
// its frozen replica of the source.
func TestMergeSnapshotToLaggingReplica(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{LogGCThreshold: 20})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, right, remove := mergeWithStore3Lagging(t, ctx, c)
	for i := 0; i < 60; i++ {
		if err := c.Put(ctx, mergeKey(i%100), []byte(itoa(i%100))); err != nil {
			remove()
			t.Fatalf("put: %v", err)
		}
	}
	if st, ok := c.Status(3, right.ID); !ok || st.Region.Merge == nil {
		remove()
		t.Fatalf("store 3's replica of the source: %v %v, want it frozen", st.Region.String(), ok)
	}
	s3, _ := c.Store(3)
	before := s3.Stats().SnapshotsApplied
	remove()
	checkMerged(t, ctx, c, left.ID, right.ID, itoa)
	if after := s3.Stats().SnapshotsApplied; after == before {
		t.Fatalf("store 3 caught up without a snapshot (%d applied)", after)
	}
}

// TestMergeSnapshotToLaggingReplicaClearsDeleted: keys of the source's
// range deleted after the merge, while store 3 lagged behind the commit,
// are gone on store 3 too once the merged region's snapshot caught it up:
// the snapshot replaces the frozen source's pairs, it does not add to them.
func TestMergeSnapshotToLaggingReplicaClearsDeleted(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{LogGCThreshold: 20})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, _, remove := mergeWithStore3Lagging(t, ctx, c)
	defer remove()
	// Deletes of half the source's keys, and enough writes that the
	// log is compacted past what store 3 has.
	for i := 50; i < 100; i += 2 {
		if err := c.Delete(ctx, mergeKey(i)); err != nil {
			t.Fatalf("delete: %v", err)
		}
	}
	for i := 0; i < 40; i++ {
		if err := c.Put(ctx, mergeKey(i%50), []byte("w")); err != nil {
			t.Fatalf("put: %v", err)
		}
	}
	s3, _ := c.Store(3)
	before := s3.Stats().SnapshotsApplied
	remove()
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, ok := c.Status(3, left.ID)
		if ok && st.Region.Contains(mergeKey(99)) && s3.Stats().SnapshotsApplied > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store 3 never caught up by snapshot: %v %v", st.Region.String(), ok)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.CheckReplicas(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMergeEndsLeases: the target's leader lease ends when the merge
// applies, and the source serves no read from the freeze on, from a
// leader lease or a follower lease alike.
func TestMergeEndsLeases(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{FollowerLeases: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, right := splitFilled(t, ctx, c)
	moveLeader(t, ctx, c, left.ID, 1)
	moveLeader(t, ctx, c, right.ID, 1)
	// A follower lease read of the source on store 2, before.
	s2, _ := c.Store(2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, info, err := s2.Get(ctx, raftstore.ReadOptions{ReplicaRead: true}, mergeKey(60))
		if err == nil && info.Mode == readmode.FollowerLease {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store 2 never read from a follower lease: %v %v", info.Mode, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s1, _ := c.Store(1)
	if st, _ := c.Status(1, left.ID); st.LeaseExpiry.IsZero() {
		// Make sure the target's leader holds its lease before.
		if _, _, err := c.Get(ctx, mergeKey(0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s1.Merge(ctx, left.ID); err != nil {
		t.Fatalf("merge: %v", err)
	}
	// The source is gone here; on store 2 it is gone too once store 2
	// applied the commit, and frozen (serving nothing) until then.
	if _, _, _, err := s2.Get(ctx, raftstore.ReadOptions{RegionID: right.ID, ReplicaRead: true}, mergeKey(60)); !region.IsRegionError(err) {
		t.Fatalf("a read of the source on store 2 after the merge: %v, want a region error", err)
	}
	checkMerged(t, ctx, c, left.ID, right.ID, itoa)
}

// TestMergeRolledBackWhenAReplicaNeverConfirms: a replica of the source
// never says it applied the freeze (its answers are lost), so the merge
// gives up: the target's log aborts it and the source serves again.
func TestMergeRolledBackWhenAReplicaNeverConfirms(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, right := splitFilled(t, ctx, c)
	lead, _ := c.Leader(left.ID)
	silent := lead%3 + 1 // a store other than the coordinator
	remove := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		return m.Notice != nil && m.Notice.Kind == raftstore.NoticeMergeApplied && m.FromStore == silent, 0
	}))
	defer remove()
	s, _ := c.Store(lead)
	mctx, mcancel := context.WithTimeout(ctx, time.Second)
	_, err := s.Merge(mctx, left.ID)
	mcancel()
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("merge with a silent replica: %v, want it rolled back after its deadline", err)
	}
	waitNoneFrozen(t, c)
	checkSplitIntact(t, ctx, c, left, right)
}

// checkSplitIntact: both regions are there, unfrozen, and take reads and
// writes; the replicas agree.
func checkSplitIntact(t *testing.T, ctx context.Context, c *raftstoretest.Cluster, left, right region.Region) {
	t.Helper()
	if r, _ := c.RegionOf(mergeKey(99)); r.ID != right.ID || r.Merge != nil {
		t.Fatalf("k099 is in %v, want region %d unfrozen", r.String(), right.ID)
	}
	for i := 0; i < 100; i++ {
		v, found, err := c.Get(ctx, mergeKey(i))
		if err != nil || !found || string(v) != itoa(i) {
			t.Fatalf("get %s = %q %v %v", mergeKey(i), v, found, err)
		}
	}
	for _, i := range []int{0, 99} {
		if err := c.Put(ctx, mergeKey(i), []byte(itoa(i))); err != nil {
			t.Fatalf("put %s: %v", mergeKey(i), err)
		}
	}
	if err := c.CheckReplicas(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMergeLeftFrozenIsSettled: the coordinator gives up while the
// target's log is cut off, so it can neither commit nor abort, and the
// source stays frozen. Once the network heals, the merge check of the
// store leading the source settles it (here: commits it).
func TestMergeLeftFrozenIsSettled(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{MergeSettleAfter: 500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, right := splitFilled(t, ctx, c)
	var cut sync.Map
	remove := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		if _, on := cut.Load("on"); !on {
			return false, 0
		}
		return m.RegionID == left.ID || (m.Notice != nil && m.Notice.Kind == raftstore.NoticeMergeApplied), 0
	}))
	defer remove()
	cut.Store("on", true)
	lead, _ := c.Leader(left.ID)
	s, _ := c.Store(lead)
	mctx, mcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := s.Merge(mctx, left.ID)
	mcancel()
	if err == nil {
		t.Fatal("merge succeeded with the target cut off")
	}
	if r, _ := c.RegionOf(mergeKey(99)); r.Merge == nil {
		t.Fatalf("the source is not frozen after the coordinator gave up: %v (merge: %v)", r.String(), err)
	}
	// A frozen region's membership does not change: the merge checked it.
	srcLead, err := c.WaitLeader(right.ID, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ss, _ := c.Store(srcLead)
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	err = ss.RemovePeer(rctx, right.ID, srcLead%3+1)
	rcancel()
	if !errors.Is(err, raftstore.ErrInvalidRequest) {
		t.Fatalf("remove a replica of the frozen source: %v, want it refused", err)
	}
	if r, _ := c.RegionOf(mergeKey(99)); len(r.Peers) != 3 {
		t.Fatalf("the frozen source's replicas changed: %v", r.String())
	}
	cut.Delete("on")
	checkMerged(t, ctx, c, left.ID, right.ID, itoa)
}

// TestMergeAutomatic: small regions merge back into one once their shape
// has settled.
func TestMergeAutomatic(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{MergeMaxKeys: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	splitFilled(t, ctx, c)
	if err := c.Split(ctx, mergeKey(80)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(c.Regions()) > 1 {
		if time.Now().After(deadline) {
			t.Fatalf("regions never merged back: %v", c.Regions())
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitNoneFrozen(t, c)
	for i := 0; i < 100; i++ {
		v, found, err := c.Get(ctx, mergeKey(i))
		if err != nil || !found || string(v) != itoa(i) {
			t.Fatalf("get %s = %q %v %v", mergeKey(i), v, found, err)
		}
	}
	if err := c.CheckReplicas(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMergeKeepsDedup: a write the source applied, retried with its
// request ID after the merge, is not applied again by the target, though
// the source's log ran far ahead of the target's.
func TestMergeKeepsDedup(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, _ := splitFilled(t, ctx, c)
	for i := 0; i < 100; i++ {
		if err := c.Put(ctx, mergeKey(90), []byte("busy")); err != nil {
			t.Fatal(err)
		}
	}
	const id = 0xfeed1
	if err := c.PutWithID(ctx, id, mergeKey(99), []byte("old")); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, mergeKey(99), []byte("new")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Merge(ctx, left.ID); err != nil {
		t.Fatalf("merge: %v", err)
	}
	if err := c.PutWithID(ctx, id, mergeKey(99), []byte("old")); err != nil {
		t.Fatal(err)
	}
	if v, _, err := c.Get(ctx, mergeKey(99)); err != nil || string(v) != "new" {
		t.Fatalf("k099 = %q %v after a retry of an applied write, want %q", v, err, "new")
	}
	if err := c.CheckReplicas(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMergeSurvivesPowerLoss: each store loses its power in turn around
// a merge (kill -9, then what was never synced is gone): the merge's
// round was made durable before it was published, so what a store
// reloads is the merged region, or the two regions (the source frozen or
// not) that its log then merges again; either way the replicas agree
// and nothing acknowledged is lost.
func TestMergeSurvivesPowerLoss(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{PowerLoss: true})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	left, right := splitFilled(t, ctx, c)
	rng := rand.New(rand.NewPCG(5, 6))
	done := make(chan error, 1)
	go func() {
		_, err := c.Merge(ctx, left.ID)
		done <- err
	}()
	time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond) // where the cut lands
	if err := c.PowerLoss(c.IDs()[2], vfs.CrashMode(2), rng); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("merge: %v", err)
	}
	for i, id := range c.IDs() {
		if err := c.PowerLoss(id, vfs.CrashMode(i%3), rng); err != nil {
			t.Fatalf("power loss of store %d: %v", id, err)
		}
		if _, err := c.WaitLeader(left.ID, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	checkMerged(t, ctx, c, left.ID, right.ID, itoa)
}

// TestMergeLeftFrozenSettledByRollbackAfterTargetSplit: as above, the
// source stays frozen when its coordinator gives up, but the target then
// splits, so it is no longer the source's neighbour: the merge check
// aborts the freeze in the target's log and rolls the source back, and a
// merge of the target's new right half with the source is refused while
// the source is frozen for another region.
func TestMergeLeftFrozenSettledByRollbackAfterTargetSplit(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{MergeSettleAfter: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	left, right := splitFilled(t, ctx, c)
	var cut sync.Map
	remove := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		if _, on := cut.Load("on"); !on {
			return false, 0
		}
		return m.RegionID == left.ID || (m.Notice != nil && m.Notice.Kind == raftstore.NoticeMergeApplied), 0
	}))
	defer remove()
	cut.Store("on", true)
	lead, _ := c.Leader(left.ID)
	s, _ := c.Store(lead)
	mctx, mcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := s.Merge(mctx, left.ID)
	mcancel()
	if r, _ := c.RegionOf(mergeKey(99)); err == nil || r.Merge == nil {
		t.Fatalf("merge with the target cut off: %v, source %v; want it failed and the source frozen", err, r.String())
	}
	cut.Delete("on")
	if err := c.Split(ctx, mergeKey(40)); err != nil {
		t.Fatalf("split the target: %v", err)
	}
	mid, _ := c.RegionOf(mergeKey(40))
	if _, err := c.WaitLeader(mid.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if r, _ := c.RegionOf(mergeKey(99)); r.Merge != nil {
		ml, _ := c.Leader(mid.ID)
		ms, _ := c.Store(ml)
		var refused *raftstore.MergeRefusedError
		if _, err := ms.Merge(ctx, mid.ID); !errors.As(err, &refused) {
			t.Fatalf("merge into a region of a source frozen for another: %v, want a *MergeRefusedError", err)
		}
	}
	waitNoneFrozen(t, c)
	checkSplitIntact(t, ctx, c, left, right)
}

// TestDeleteEverythingMergesBack: a key space cut into 16 regions, then
// emptied by deletes, merges back to (nearly) the one region it started
// as, on its own, and keeps serving.
func TestDeleteEverythingMergesBack(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{MergeMaxKeys: 10})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const n, per = 400, 25
	for i := 0; i < n; i++ {
		if err := c.Put(ctx, mergeKey(i), []byte(itoa(i))); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	for i := per; i < n; i += per {
		if err := c.Split(ctx, mergeKey(i)); err != nil {
			t.Fatalf("split at %s: %v", mergeKey(i), err)
		}
	}
	full := len(c.Regions())
	if full < n/per {
		t.Fatalf("%d regions after the splits, want at least %d", full, n/per)
	}
	// Full regions (25 keys, over MergeMaxKeys) are not merged.
	time.Sleep(time.Second) // a pace: several merge checks pass
	if got := len(c.Regions()); got != full {
		t.Fatalf("%d regions of 25 keys each became %d: merged above MergeMaxKeys", full, got)
	}
	for i := 0; i < n; i++ {
		if err := c.Delete(ctx, mergeKey(i)); err != nil {
			t.Fatalf("delete %d: %v", i, err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(c.Regions()) > 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d regions a minute after every key was deleted, from %d: want the key space merged back", len(c.Regions()), full)
		}
		time.Sleep(50 * time.Millisecond) // a bounded poll
	}
	t.Logf("%d regions full, %d after the deletes", full, len(c.Regions()))
	waitNoneFrozen(t, c)
	if err := c.Put(ctx, mergeKey(7), []byte("again")); err != nil {
		t.Fatalf("put after the merges: %v", err)
	}
	if v, found, err := c.Get(ctx, mergeKey(7)); err != nil || !found || string(v) != "again" {
		t.Fatalf("get after the merges = %q %v %v", v, found, err)
	}
	if err := c.CheckReplicas(ctx); err != nil {
		t.Fatal(err)
	}
}
