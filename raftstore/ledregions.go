package raftstore

import (
	"slices"
	"strings"
	"sync"

	"github.com/hedgekv/hedgekv/region"
)

// ledRegion is a region this store leads, as ledRegions lists it. Its
// region is shared with other answers of ledRegions: read it, never
// change it.
type ledRegion struct {
	region  region.Region
	applied uint64
}

// ledCache keeps what ledRegions answered last. The balancer (every 5 s)
// and the split check (every 10 s) each list the regions this store
// leads; at 10,000 idle regions, cloning and sorting them all each time
// was a third of the busiest store's CPU. A region is cloned again only
// when its descriptor changed (shape), and the list sorted again only when
// the set changed; the applied indexes are read fresh each time.
type ledCache struct {
	mu     sync.Mutex
	clones map[uint64]region.Region // by region ID, as of the last call
	order  []uint64                 // the last call's regions, in key order
}

// ledRegions lists the regions this store leads (as of their last Ready),
// in key order, for the balancer and the split check, which look at no
// other and need only the region and its applied index.
func (s *Store) ledRegions() []ledRegion {
	c := &s.led
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.clones == nil {
		c.clones = map[uint64]region.Region{}
	}
	applied := make(map[uint64]uint64, len(c.order))
	changed := false
	for _, p := range s.allPeers() {
		p.mu.Lock()
		if !p.initialized || p.removed || !p.leading {
			p.mu.Unlock()
			continue
		}
		id := p.region.ID
		applied[id] = p.applied
		if old, ok := c.clones[id]; !ok || !sameShape(&old, &p.region) {
			c.clones[id] = p.region.Clone()
			changed = true
		}
		p.mu.Unlock()
	}
	for id := range c.clones {
		if _, ok := applied[id]; !ok {
			delete(c.clones, id)
			changed = true
		}
	}
	if changed || len(c.order) != len(c.clones) {
		c.order = c.order[:0]
		for id := range c.clones {
			c.order = append(c.order, id)
		}
		slices.SortFunc(c.order, func(a, b uint64) int {
			return strings.Compare(string(c.clones[a].StartKey), string(c.clones[b].StartKey))
		})
	}
	out := make([]ledRegion, len(c.order))
	for i, id := range c.order {
		out[i] = ledRegion{region: c.clones[id], applied: applied[id]}
	}
	return out
}

// sameShape reports whether two descriptors of one region agree in all a
// clone would copy: a split, merge or membership change moves the epoch,
// and the rest is compared as it is.
func sameShape(a, b *region.Region) bool {
	return a.Epoch == b.Epoch && a.LastRegionID == b.LastRegionID &&
		string(a.StartKey) == string(b.StartKey) && string(a.EndKey) == string(b.EndKey) &&
		slices.Equal(a.Peers, b.Peers) && sameMerge(a.Merge, b.Merge) && sameMerge(a.AbortedMerge, b.AbortedMerge)
}

func sameMerge(a, b *region.MergeState) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}
