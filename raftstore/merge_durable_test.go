package raftstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/region"
)

// regionFields is what a test needs of a region to freeze it.
type regionFields struct {
	id    uint64
	start []byte
	epoch region.Epoch
}

// A replica confirms a freeze to the merge's coordinator only once the
// round that applied it is durable. Confirmed from memory (as it was),
// the target could absorb the source while a store's freeze sat in an
// unsynced batch: a power loss there took the freeze back, the source's
// leader was gone with the merge, and the store's copy of the source's
// range stayed as of its last checkpoint, short of the source's last
// writes (a replica divergence seen under make chaos with power losses).
// Here store 3's round that applies the freeze is held before its
// checkpoint: the merge must not commit while it is held.
func TestMergeWaitsForDurableFreeze(t *testing.T) {
	var (
		mu       sync.Mutex
		sourceID uint64
		held     = make(chan struct{})
		release  = make(chan struct{})
		once     sync.Once
	)
	hook := func(s *Store, shaped []uint64) {
		mu.Lock()
		id := sourceID
		mu.Unlock()
		if s.cfg.StoreID != 3 || id == 0 || !slices.Contains(shaped, id) {
			return
		}
		p, ok := s.peer(id)
		if !ok || p.regionClone().Merge == nil {
			return
		}
		once.Do(func() {
			close(held)
			<-release
		})
	}
	c := newMiniCluster(t, 3, func(cfg *Config) { cfg.Knobs.beforeShapeCheckpoint = hook })
	var releaseOnce sync.Once
	unhold := func() { releaseOnce.Do(func() { close(release) }) }
	defer unhold() // the store must stop in the end
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.load(ctx, "r", 40, 100)
	c.splitInto(ctx, 2) // [, r01) and [r01, )
	leftLeader := c.mustLeaderOf([]byte("r00"))
	c.mustLeaderOf([]byte("r01"))
	var leftID, rightID uint64
	for _, st := range leftLeader.Regions() {
		if st.Region.Contains([]byte("r00")) {
			leftID = st.Region.ID
		}
		if st.Region.Contains([]byte("r01")) {
			rightID = st.Region.ID
		}
	}
	if leftID == 0 || rightID == 0 || leftID == rightID {
		t.Fatalf("regions after the split: left %d, right %d", leftID, rightID)
	}
	mu.Lock()
	sourceID = rightID
	mu.Unlock()

	mctx, mcancel := context.WithTimeout(ctx, 3*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := leftLeader.Merge(mctx, leftID)
		done <- err
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		mcancel()
		t.Fatal("store 3 never applied the freeze")
	}
	err := <-done
	mcancel()
	if err == nil {
		t.Fatal("the merge committed while store 3's freeze was not durable")
	}
	if !errors.Is(err, ErrMergeRolledBack) && !errors.Is(err, context.DeadlineExceeded) {
		t.Logf("merge: %v", err)
	}
	for _, s := range []*Store{c.store(1), c.store(2)} {
		if p, ok := s.peer(leftID); ok && covers(p, "r01") {
			t.Fatalf("store %d's target took the source's range while store 3's freeze was not durable", s.cfg.StoreID)
		}
	}
	unhold()
	// Once durable, the merge (or the merge check's settling of it)
	// goes through.
	if err := c.do(ctx, []byte("r00"), func(ctx context.Context, s *Store) error {
		if p, ok := s.peer(leftID); ok && covers(p, "r01") {
			return nil
		}
		_, err := s.Merge(ctx, leftID)
		return err
	}); err != nil {
		t.Fatalf("merge after the freeze is durable: %v", err)
	}
	c.agree(leftID, 3)
	for _, s := range c.all() {
		if v := s.Stats().MergeViolations; v != 0 {
			t.Fatalf("store %d counted %d merge violations", s.cfg.StoreID, v)
		}
	}
}

func covers(p *Peer, key string) bool {
	r := p.regionClone()
	return r.Contains([]byte(key))
}

// Three adjacent regions A, B, C merged at once from two stores: C froze
// for B, then A absorbed B. C's commit can never apply (B is gone), and
// B's log, where an abort would go, is gone with it: the merge check
// rolls C back alone, from the record that a merge absorbed B here. Before,
// C stayed frozen for good, refusing every read and write of its range.
func TestMergeSourceOfAnAbsorbedTargetRollsBack(t *testing.T) {
	c := newMiniCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.load(ctx, "r", 30, 100)
	c.splitInto(ctx, 3) // [, r01) [r01, r02) [r02, )
	regionAt := func(key string) (*Store, regionFields) {
		s := c.mustLeaderOf([]byte(key))
		for _, st := range s.Regions() {
			if st.Region.Contains([]byte(key)) {
				return s, regionFields{id: st.Region.ID, start: st.Region.StartKey, epoch: st.Region.Epoch}
			}
		}
		t.Fatalf("no region holds %q", key)
		return nil, regionFields{}
	}
	_, a := regionAt("r00")
	sb, b := regionAt("r01")
	sc, cr := regionAt("r02")
	freeze := func(s *Store, src regionFields, target uint64) {
		t.Helper()
		p, _ := s.peer(src.id)
		cmd := command{op: opPrepareMerge, key: src.start, value: encodePrepareMerge(target, src.epoch)}
		if err := s.proposeMerge(ctx, p, cmd); err != nil {
			t.Fatalf("freeze region %d for %d: %v", src.id, target, err)
		}
	}
	// What two coordinators racing do: each checked that its source's
	// right neighbour was not frozen, then froze its source.
	freeze(sc, cr, b.id)
	freeze(sb, b, a.id)
	la := c.mustLeaderOf([]byte("r00"))
	if _, err := la.Merge(ctx, a.id); err != nil {
		t.Fatalf("merge of %d into %d: %v", b.id, a.id, err)
	}
	var frozen region.Region
	c.waitFor(10*time.Second, "every store's replica of C frozen and B gone", func() bool {
		for _, s := range c.all() {
			if _, ok := s.peer(b.id); ok {
				return false
			}
			p, ok := s.peer(cr.id)
			if !ok {
				return false
			}
			r := p.regionClone()
			if r.Merge == nil {
				return false
			}
			frozen = r
		}
		return true
	})
	lc := c.mustLeaderOf([]byte("r02"))
	if _, err := lc.settleMerge(ctx, frozen); !errors.Is(err, ErrMergeRolledBack) {
		t.Fatalf("settle region %d's merge into the absorbed %d: %v, want ErrMergeRolledBack", cr.id, b.id, err)
	}
	c.waitFor(10*time.Second, "every store's replica of C unfrozen", func() bool {
		for _, s := range c.all() {
			p, ok := s.peer(cr.id)
			if !ok || p.regionClone().Merge != nil {
				return false
			}
		}
		return true
	})
	c.put(ctx, []byte("r02/after"), []byte("v"))
	// And A, now C's neighbour, can absorb it.
	if err := c.do(ctx, []byte("r00"), func(ctx context.Context, s *Store) error {
		_, err := s.Merge(ctx, a.id)
		return err
	}); err != nil {
		t.Fatalf("merge of %d into %d after the rollback: %v", cr.id, a.id, err)
	}
	c.agree(a.id, 3)
}
