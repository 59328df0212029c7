package region

import (
	"bytes"
	"slices"
	"sort"
)

// Tree is an ordered set of non-overlapping regions, searchable by key in
// O(log n). It is not safe for concurrent use; callers hold their own lock.
type Tree struct {
	byStart []Region // sorted by StartKey
}

// Insert adds r, first removing every region whose range overlaps it (the
// newer metadata wins, as after a split). It returns the removed regions.
func (t *Tree) Insert(r Region) (removed []Region) {
	// The regions are sorted and disjoint, so those r overlaps are
	// contiguous, from the last one starting at or before r's start; the
	// rest stay where they are (a store with thousands of regions inserts
	// one per split, so no insert copies them all).
	i := sort.Search(len(t.byStart), func(i int) bool { return bytes.Compare(t.byStart[i].StartKey, r.StartKey) > 0 })
	lo := i
	if lo > 0 && t.byStart[lo-1].Overlaps(r) {
		lo--
	}
	hi := lo
	for hi < len(t.byStart) && t.byStart[hi].Overlaps(r) {
		hi++
	}
	removed = append(removed, t.byStart[lo:hi]...)
	t.byStart = slices.Replace(t.byStart, lo, hi, r)
	return removed
}

// Lookup returns the region containing key.
func (t *Tree) Lookup(key []byte) (Region, bool) {
	i := sort.Search(len(t.byStart), func(i int) bool { return bytes.Compare(t.byStart[i].StartKey, key) > 0 })
	if i == 0 {
		return Region{}, false
	}
	r := t.byStart[i-1]
	if !r.Contains(key) {
		return Region{}, false
	}
	return r, true
}

// Remove deletes the region with id, reporting whether it was present.
func (t *Tree) Remove(id uint64) bool {
	for i, r := range t.byStart {
		if r.ID == id {
			t.byStart = append(t.byStart[:i:i], t.byStart[i+1:]...)
			return true
		}
	}
	return false
}

// From returns, in key order, at most limit regions (every one if limit is
// 0) from the one containing start, or the first after start; more is
// set if regions are left after them. The slice is a copy.
func (t *Tree) From(start []byte, limit int) (out []Region, more bool) {
	i := sort.Search(len(t.byStart), func(i int) bool { return bytes.Compare(t.byStart[i].StartKey, start) > 0 })
	if i > 0 && t.byStart[i-1].Contains(start) {
		i--
	}
	end := len(t.byStart)
	if limit > 0 && i+limit < end {
		end, more = i+limit, true
	}
	return append([]Region(nil), t.byStart[i:end]...), more
}

// Len is the number of regions.
func (t *Tree) Len() int { return len(t.byStart) }

// All returns the regions in key order. The slice is a copy.
func (t *Tree) All() []Region {
	return append([]Region(nil), t.byStart...)
}
