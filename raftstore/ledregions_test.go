package raftstore

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"
)

// ledRegions answers from a cache that is cloned and sorted again only
// when a region changed: every answer must still be the regions the store
// leads now, in key order, with their applied indexes as they are now,
// and an earlier answer must not change under its holder.
func TestLedRegionsFollowsSplitsMergesAndWrites(t *testing.T) {
	c := newMiniCluster(t, 1, nil)
	s := c.store(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check := func(what string) []ledRegion {
		t.Helper()
		// A region split off a moment ago is led once its first Ready
		// is published: wait for the two views to agree.
		var got []ledRegion
		var want, ids []uint64
		c.waitFor(5*time.Second, what+": ledRegions lists what the store leads", func() bool {
			got, want, ids = s.ledRegions(), nil, nil
			for _, st := range s.Regions() { // key order
				if st.IsLeader {
					want = append(want, st.Region.ID)
				}
			}
			for _, lr := range got {
				ids = append(ids, lr.region.ID)
			}
			return slices.Equal(ids, want)
		})
		ids = nil
		for i, lr := range got {
			ids = append(ids, lr.region.ID)
			p, _ := s.peer(lr.region.ID)
			p.mu.Lock()
			if lr.applied != p.applied || !reflect.DeepEqual(lr.region, p.region) {
				t.Errorf("%s: region %d listed at applied %d, %v; it is at %d, %v", what, lr.region.ID, lr.applied, lr.region, p.applied, p.region)
			}
			p.mu.Unlock()
			if i > 0 && string(got[i-1].region.StartKey) >= string(lr.region.StartKey) {
				t.Errorf("%s: not in key order at %d: %v", what, i, ids)
			}
		}
		return got
	}
	c.splitInto(ctx, 4)
	first := check("after three splits")
	firstEnd := string(first[1].region.EndKey)

	c.put(ctx, []byte("r01/a"), []byte("v"))
	c.waitFor(5*time.Second, "the write applied", func() bool {
		return s.ledRegions()[1].applied > first[1].applied
	})
	check("after a write")

	if err := c.do(ctx, []byte("r01/m"), func(ctx context.Context, s *Store) error {
		_, _, err := s.Split(ctx, []byte("r01/m"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	check("after a split of a listed region")
	if string(first[1].region.EndKey) != firstEnd {
		t.Fatalf("an earlier answer changed: region %d now ends at %q, was %q", first[1].region.ID, first[1].region.EndKey, firstEnd)
	}

	left := first[2].region.ID
	if err := c.do(ctx, []byte("r02"), func(ctx context.Context, s *Store) error {
		_, err := s.Merge(ctx, left)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.waitFor(10*time.Second, "the merged region gone", func() bool { return len(s.ledRegions()) == 4 })
	check("after a merge")
}
