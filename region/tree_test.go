package region

import (
	"bytes"
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

func rg(id uint64, start, end string) Region {
	return Region{ID: id, StartKey: b(start), EndKey: b(end)}
}

func ids(rs []Region) []uint64 {
	out := make([]uint64, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func eqIDs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// checkTree asserts the tree's structural invariants: All is sorted by start
// key, ranges do not overlap, Len agrees, and every region's start key looks
// up to that region.
func checkTree(t *testing.T, tr *Tree) {
	t.Helper()
	all := tr.All()
	if len(all) != tr.Len() {
		t.Fatalf("len(All()) = %d, Len() = %d", len(all), tr.Len())
	}
	for i, r := range all {
		if i > 0 {
			prev := all[i-1]
			if len(prev.EndKey) == 0 {
				t.Fatalf("region %d has +inf end but is followed by region %d", prev.ID, r.ID)
			}
			if bytes.Compare(prev.EndKey, r.StartKey) > 0 {
				t.Fatalf("regions %d [%q,%q) and %d [%q,%q) overlap or are out of order", prev.ID, prev.StartKey, prev.EndKey, r.ID, r.StartKey, r.EndKey)
			}
		}
		got, ok := tr.Lookup(r.StartKey)
		if !ok || got.ID != r.ID {
			t.Fatalf("Lookup(start of %d = %q) = %d, %v", r.ID, r.StartKey, got.ID, ok)
		}
	}
}

func TestTreeEmpty(t *testing.T) {
	var tr Tree
	if tr.Len() != 0 || len(tr.All()) != 0 {
		t.Fatal("zero Tree not empty")
	}
	for _, k := range []string{"", "a", "\xff"} {
		if r, ok := tr.Lookup(b(k)); ok {
			t.Fatalf("Lookup(%q) on empty tree = %v", k, r.String())
		}
	}
	if tr.Remove(1) {
		t.Fatal("Remove on empty tree reported true")
	}
}

func TestTreeLookup(t *testing.T) {
	// Regions with gaps: (-inf, b) missing, [b, d), [d, f), gap [f, h), [h, +inf).
	var tr Tree
	for _, r := range []Region{rg(3, "h", ""), rg(1, "b", "d"), rg(2, "d", "f")} {
		if removed := tr.Insert(r); len(removed) != 0 {
			t.Fatalf("Insert(%d) removed %v", r.ID, ids(removed))
		}
	}
	checkTree(t, &tr)
	tests := []struct {
		key    string
		wantID uint64
		ok     bool
	}{
		{"", 0, false},
		{"a", 0, false},
		{"a\xff\xff", 0, false},
		{"b", 1, true},
		{"b\x00", 1, true},
		{"c", 1, true},
		{"c\xff", 1, true},
		{"d", 2, true},
		{"e", 2, true},
		{"f", 0, false},
		{"g", 0, false},
		{"g\xff", 0, false},
		{"h", 3, true},
		{"h\x00", 3, true},
		{"zzzz", 3, true},
		{"\xff\xff\xff", 3, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q", tt.key), func(t *testing.T) {
			got, ok := tr.Lookup(b(tt.key))
			if ok != tt.ok || got.ID != tt.wantID {
				t.Fatalf("Lookup(%q) = %d, %v; want %d, %v", tt.key, got.ID, ok, tt.wantID, tt.ok)
			}
			if ok && !got.Contains(b(tt.key)) {
				t.Fatalf("Lookup(%q) returned region %v that does not contain it", tt.key, got.String())
			}
		})
	}
}

func TestTreeLookupFullRange(t *testing.T) {
	var tr Tree
	tr.Insert(rg(1, "", ""))
	for _, k := range []string{"", "\x00", "m", "\xff\xff"} {
		if r, ok := tr.Lookup(b(k)); !ok || r.ID != 1 {
			t.Fatalf("Lookup(%q) = %d, %v", k, r.ID, ok)
		}
	}
}

func TestTreeInsert(t *testing.T) {
	base := func() []Region {
		return []Region{rg(1, "", "c"), rg(2, "c", "e"), rg(3, "e", "g"), rg(4, "g", "")}
	}
	tests := []struct {
		name        string
		insert      Region
		wantRemoved []uint64
		wantIDs     []uint64 // All() order after insert
	}{
		{"replace identical range", rg(9, "c", "e"), []uint64{2}, []uint64{1, 9, 3, 4}},
		{"merge two (c..g)", rg(9, "c", "g"), []uint64{2, 3}, []uint64{1, 9, 4}},
		{"straddle two", rg(9, "d", "f"), []uint64{2, 3}, []uint64{1, 9, 4}},
		{"straddle three", rg(9, "b", "h"), []uint64{1, 2, 3, 4}, []uint64{9}},
		{"sub range of one", rg(9, "c", "d"), []uint64{2}, []uint64{1, 9, 3, 4}},
		{"full range replaces all", rg(9, "", ""), []uint64{1, 2, 3, 4}, []uint64{9}},
		{"-inf start to middle", rg(9, "", "d"), []uint64{1, 2}, []uint64{9, 3, 4}},
		{"middle to +inf", rg(9, "f", ""), []uint64{3, 4}, []uint64{1, 2, 9}},
		{"ending exactly at a start does not overlap it", rg(9, "c", "e"), []uint64{2}, []uint64{1, 9, 3, 4}},
		{"single-key region at a boundary", rg(9, "e", "e\x00"), []uint64{3}, []uint64{1, 2, 9, 4}},
		{"single-key region ending at a start", rg(9, "d\xff", "e"), []uint64{2}, []uint64{1, 9, 3, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tr Tree
			for _, r := range base() {
				tr.Insert(r)
			}
			removed := tr.Insert(tt.insert)
			if !eqIDs(ids(removed), tt.wantRemoved) {
				t.Fatalf("removed %v, want %v (in key order)", ids(removed), tt.wantRemoved)
			}
			if got := ids(tr.All()); !eqIDs(got, tt.wantIDs) {
				t.Fatalf("All() = %v, want %v", got, tt.wantIDs)
			}
			checkTree(t, &tr)
			if r, ok := tr.Lookup(tt.insert.StartKey); !ok || r.ID != 9 {
				t.Fatalf("Lookup(new start) = %d, %v", r.ID, ok)
			}
		})
	}
}

func TestTreeInsertAdjacentKeepsNeighbours(t *testing.T) {
	var tr Tree
	tr.Insert(rg(1, "a", "c"))
	tr.Insert(rg(3, "e", "g"))
	// Fills the gap exactly; touches both neighbours but overlaps neither.
	if removed := tr.Insert(rg(2, "c", "e")); len(removed) != 0 {
		t.Fatalf("adjacent insert removed %v", ids(removed))
	}
	if got := ids(tr.All()); !eqIDs(got, []uint64{1, 2, 3}) {
		t.Fatalf("All() = %v", got)
	}
	// Before the first and after the last.
	if removed := tr.Insert(rg(0, "", "a")); len(removed) != 0 {
		t.Fatalf("removed %v", ids(removed))
	}
	if removed := tr.Insert(rg(4, "g", "")); len(removed) != 0 {
		t.Fatalf("removed %v", ids(removed))
	}
	if got := ids(tr.All()); !eqIDs(got, []uint64{0, 1, 2, 3, 4}) {
		t.Fatalf("All() = %v", got)
	}
	checkTree(t, &tr)
}

func TestTreeInsertAfterSplit(t *testing.T) {
	// The way the stores use it: insert the two halves of a split; the first
	// insert replaces the parent, the second overlaps nothing.
	var tr Tree
	parent := Region{ID: 1, Peers: testPeers()}
	tr.Insert(parent)
	left, right, err := Split(parent, []byte("m"), 2, []uint64{21, 22, 23})
	if err != nil {
		t.Fatal(err)
	}
	if removed := tr.Insert(left); !eqIDs(ids(removed), []uint64{1}) || removed[0].Epoch.Version != 0 {
		t.Fatalf("insert left removed %v", removed)
	}
	if removed := tr.Insert(right); len(removed) != 0 {
		t.Fatalf("insert right removed %v", ids(removed))
	}
	checkTree(t, &tr)
	if r, _ := tr.Lookup([]byte("a")); r.ID != 1 || r.Epoch.Version != 1 {
		t.Fatalf("Lookup(a) = %v", r.String())
	}
	if r, _ := tr.Lookup([]byte("m")); r.ID != 2 {
		t.Fatalf("Lookup(m) = %v", r.String())
	}

	// Inserting them the other way round gives the same tree.
	var tr2 Tree
	tr2.Insert(parent)
	if removed := tr2.Insert(right); !eqIDs(ids(removed), []uint64{1}) {
		t.Fatalf("insert right first removed %v", ids(removed))
	}
	if removed := tr2.Insert(left); len(removed) != 0 {
		t.Fatalf("insert left second removed %v", ids(removed))
	}
	if !eqIDs(ids(tr.All()), ids(tr2.All())) {
		t.Fatalf("order-dependent result: %v vs %v", ids(tr.All()), ids(tr2.All()))
	}
}

func TestTreeRemove(t *testing.T) {
	var tr Tree
	for _, r := range []Region{rg(1, "", "c"), rg(2, "c", "e"), rg(3, "e", "")} {
		tr.Insert(r)
	}
	snapshot := tr.All()
	if tr.Remove(9) {
		t.Fatal("Remove(9) reported true")
	}
	if !tr.Remove(2) {
		t.Fatal("Remove(2) reported false")
	}
	if tr.Remove(2) {
		t.Fatal("second Remove(2) reported true")
	}
	if got := ids(tr.All()); !eqIDs(got, []uint64{1, 3}) {
		t.Fatalf("All() = %v", got)
	}
	if r, ok := tr.Lookup([]byte("d")); ok {
		t.Fatalf("Lookup in removed range = %v", r.String())
	}
	if r, ok := tr.Lookup([]byte("b")); !ok || r.ID != 1 {
		t.Fatalf("Lookup(b) = %d %v", r.ID, ok)
	}
	if r, ok := tr.Lookup([]byte("e")); !ok || r.ID != 3 {
		t.Fatalf("Lookup(e) = %d %v", r.ID, ok)
	}
	// An earlier All() snapshot is unaffected by Remove.
	if got := ids(snapshot); !eqIDs(got, []uint64{1, 2, 3}) {
		t.Fatalf("snapshot changed to %v", got)
	}
	// Remove first and last.
	if !tr.Remove(1) || !tr.Remove(3) || tr.Len() != 0 {
		t.Fatalf("remove first/last: len %d", tr.Len())
	}
	// The emptied tree is reusable.
	tr.Insert(rg(5, "x", ""))
	if r, ok := tr.Lookup([]byte("y")); !ok || r.ID != 5 {
		t.Fatalf("Lookup after reuse = %d %v", r.ID, ok)
	}
}

func TestTreeAllIsCopy(t *testing.T) {
	var tr Tree
	tr.Insert(rg(1, "a", "c"))
	tr.Insert(rg(2, "c", "e"))
	all := tr.All()
	all[0] = rg(99, "zz", "")
	all = append(all[:1], rg(100, "q", "r"))
	_ = all
	if got := ids(tr.All()); !eqIDs(got, []uint64{1, 2}) {
		t.Fatalf("mutating All() result changed tree: %v", got)
	}
	// Insert after taking a snapshot must not write through into it.
	snap := tr.All()
	tr.Insert(rg(0, "", "a"))
	if !eqIDs(ids(snap), []uint64{1, 2}) {
		t.Fatalf("Insert changed earlier snapshot: %v", ids(snap))
	}
}

func TestTreeManyRegionsOutOfOrder(t *testing.T) {
	const n = 1000
	// Boundaries k0000..k0999 define n+1 regions: (-inf,k0000), [k0000,k0001), ... [k0999,+inf).
	bound := func(i int) []byte { return []byte(fmt.Sprintf("k%04d", i)) }
	var regions []Region
	for i := 0; i <= n; i++ {
		r := Region{ID: uint64(i + 1)}
		if i > 0 {
			r.StartKey = bound(i - 1)
		}
		if i < n {
			r.EndKey = bound(i)
		}
		regions = append(regions, r)
	}
	rnd := rand.New(rand.NewSource(1))
	var tr Tree
	for _, j := range rnd.Perm(len(regions)) {
		if removed := tr.Insert(regions[j]); len(removed) != 0 {
			t.Fatalf("Insert(%d) removed %v", regions[j].ID, ids(removed))
		}
	}
	if tr.Len() != n+1 {
		t.Fatalf("Len = %d", tr.Len())
	}
	all := tr.All()
	for i, r := range all {
		if r.ID != uint64(i+1) {
			t.Fatalf("All()[%d].ID = %d, want key order", i, r.ID)
		}
	}
	checkTree(t, &tr)
	// Every boundary, a key just below it and one just above.
	for i := 0; i < n; i++ {
		k := bound(i)
		if r, ok := tr.Lookup(k); !ok || r.ID != uint64(i+2) {
			t.Fatalf("Lookup(%q) = %d %v, want %d", k, r.ID, ok, i+2)
		}
		above := append(append([]byte(nil), k...), 0)
		if r, ok := tr.Lookup(above); !ok || r.ID != uint64(i+2) {
			t.Fatalf("Lookup(%q) = %d %v, want %d", above, r.ID, ok, i+2)
		}
		if i == 0 {
			continue
		}
		below := append(bound(i-1), 0xff) // just below bound(i), still in region i+1
		if r, ok := tr.Lookup(below); !ok || r.ID != uint64(i+1) {
			t.Fatalf("Lookup(%q) = %d %v, want %d", below, r.ID, ok, i+1)
		}
	}
	if r, ok := tr.Lookup(nil); !ok || r.ID != 1 {
		t.Fatalf("Lookup(nil) = %d %v", r.ID, ok)
	}

	// Remove every other region: lookups in the holes now miss.
	for i := 1; i <= n+1; i += 2 {
		if !tr.Remove(uint64(i)) {
			t.Fatalf("Remove(%d) = false", i)
		}
	}
	checkTree(t, &tr)
	for i := 0; i < n; i++ {
		_, ok := tr.Lookup(bound(i))
		if want := (i+2)%2 == 0; ok != want {
			t.Fatalf("after removals Lookup(%q) ok = %v, want %v", bound(i), ok, want)
		}
	}

	// One wide insert swallows a run of regions in the middle.
	removed := tr.Insert(Region{ID: 5000, StartKey: bound(100), EndKey: bound(200)})
	for _, r := range removed {
		if bytes.Compare(r.StartKey, bound(100)) < 0 || bytes.Compare(r.EndKey, bound(200)) > 0 {
			t.Fatalf("removed region outside the inserted range: %v", r.String())
		}
	}
	if len(removed) != 50 {
		t.Fatalf("wide insert removed %d regions, want 50", len(removed))
	}
	checkTree(t, &tr)
}

// TestTreeRandomAgainstLinear inserts random ranges and compares every lookup
// to a brute-force scan of All() with Contains.
func TestTreeRandomAgainstLinear(t *testing.T) {
	rnd := rand.New(rand.NewSource(42))
	key := func() []byte {
		if rnd.Intn(8) == 0 {
			return nil
		}
		return []byte{byte('a' + rnd.Intn(8)), byte('a' + rnd.Intn(8))}
	}
	var tr Tree
	for step := 0; step < 2000; step++ {
		s, e := key(), key()
		if len(e) > 0 && bytes.Compare(s, e) >= 0 {
			s, e = e, s
		}
		if len(e) > 0 && bytes.Compare(s, e) >= 0 {
			continue
		}
		before := tr.All()
		removed := tr.Insert(Region{ID: uint64(step + 1), StartKey: s, EndKey: e})
		// removed is exactly the set of prior regions overlapping [s, e).
		var want []uint64
		for _, r := range before {
			if r.Overlaps(Region{StartKey: s, EndKey: e}) {
				want = append(want, r.ID)
			}
		}
		if !eqIDs(ids(removed), want) {
			t.Fatalf("step %d: removed %v, want %v", step, ids(removed), want)
		}
		checkTree(t, &tr)
		all := tr.All()
		for i := 0; i < 20; i++ {
			k := key()
			var lin []Region
			for _, r := range all {
				if r.Contains(k) {
					lin = append(lin, r)
				}
			}
			if len(lin) > 1 {
				t.Fatalf("key %q in %d regions", k, len(lin))
			}
			got, ok := tr.Lookup(k)
			if ok != (len(lin) == 1) || (ok && got.ID != lin[0].ID) {
				t.Fatalf("step %d: Lookup(%q) = %d %v, linear %v", step, k, got.ID, ok, ids(lin))
			}
		}
		if rnd.Intn(5) == 0 && len(all) > 0 {
			victim := all[rnd.Intn(len(all))].ID
			if !tr.Remove(victim) {
				t.Fatalf("Remove(%d) = false", victim)
			}
		}
	}
}

func TestOverlaps(t *testing.T) {
	tests := []struct {
		a, b Region
		want bool
	}{
		{rg(0, "a", "c"), rg(0, "c", "e"), false},
		{rg(0, "a", "c"), rg(0, "b", "e"), true},
		{rg(0, "a", "c"), rg(0, "d", "e"), false},
		{rg(0, "", ""), rg(0, "x", "y"), true},
		{rg(0, "", "c"), rg(0, "c", ""), false},
		{rg(0, "", "c"), rg(0, "b", ""), true},
		{rg(0, "a", ""), rg(0, "z", ""), true},
		{rg(0, "", "a"), rg(0, "", "z"), true},
		{rg(0, "b", "c"), rg(0, "a", "d"), true},
	}
	for _, tt := range tests {
		if got := tt.a.Overlaps(tt.b); got != tt.want {
			t.Errorf("Overlaps(%v, %v) = %v, want %v", tt.a.String(), tt.b.String(), got, tt.want)
		}
		if got := tt.b.Overlaps(tt.a); got != tt.want {
			t.Errorf("Overlaps(%v, %v) (swapped) = %v, want %v", tt.b.String(), tt.a.String(), got, tt.want)
		}
	}
}

// TestTreeFrom: a page starts at the region holding start, or the first
// after it, and says whether regions are left.
func TestTreeFrom(t *testing.T) {
	var tr Tree
	for i, r := range [][2]string{{"", "b"}, {"b", "d"}, {"f", "h"}, {"h", ""}} {
		tr.Insert(Region{ID: uint64(i + 1), StartKey: []byte(r[0]), EndKey: []byte(r[1])})
	}
	ids := func(rs []Region) (out []uint64) {
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	for _, c := range []struct {
		start string
		limit int
		want  []uint64
		more  bool
	}{
		{"", 0, []uint64{1, 2, 3, 4}, false},
		{"", 2, []uint64{1, 2}, true},
		{"c", 1, []uint64{2}, true},
		{"e", 2, []uint64{3, 4}, false}, // in a gap: the first after it
		{"z", 5, []uint64{4}, false},
	} {
		got, more := tr.From([]byte(c.start), c.limit)
		if !slices.Equal(ids(got), c.want) || more != c.more {
			t.Errorf("From(%q, %d) = %v, %v; want %v, %v", c.start, c.limit, ids(got), more, c.want, c.more)
		}
	}
}
