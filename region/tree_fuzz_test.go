package region

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
)

// More property fuzz targets for the key-range math (see fuzz_test.go for
// split-then-lookup and ClampRange).

// FuzzTreeInsert inserts arbitrary regions in any order, as a client's
// region cache does with what servers tell it (overlapping, stale, out of
// order), interleaved with removals, and checks the tree against a plain
// list model after every step: the regions never overlap, stay sorted,
// Insert removes exactly the overlapping ones, and Lookup finds the one
// region holding a key or none.
//
// Each op is: kind byte (even insert, odd remove), id byte, then two keys
// as in decodeKeys. An inverted range is swapped so that every region is a
// well-formed [start, end); an empty end is +inf.
func FuzzTreeInsert(f *testing.F) {
	f.Add([]byte("\x00\x01\x00\x00"))                                     // (-inf, +inf)
	f.Add([]byte("\x00\x01\x00\x01m\x00\x02\x01m\x00\x02\x03\x01c\x01x")) // cover, then an overlap in the middle
	f.Add([]byte("\x00\x01\x01a\x01b\x00\x02\x01b\x01c\x00\x03\x01a\x01c\x01\x02"))
	f.Add([]byte("\x00\x01\x01z\x01a\x00\x01\x01a\x01a"))             // inverted, then empty: skipped
	f.Add([]byte("\x00\x05\x02a\x00\x02a\xff\x00\x06\x01a\x02a\x00")) // adjacent at a\x00
	f.Add([]byte("\x01\x01\x00\x00"))

	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 512 {
			ops = ops[:512]
		}
		var tr Tree
		var model []Region
		var probes [][]byte
		for len(ops) >= 2 {
			kind, id := ops[0], uint64(ops[1])
			ops = ops[2:]
			keys := decodeKeys2(&ops)
			if kind%2 == 1 {
				had := slices.ContainsFunc(model, func(r Region) bool { return r.ID == id })
				if got := tr.Remove(id); got != had {
					t.Fatalf("Remove(%d) = %v, model has it: %v", id, got, had)
				}
				model = slices.DeleteFunc(model, func(r Region) bool { return r.ID == id })
				continue
			}
			start, end := keys[0], keys[1]
			if len(end) > 0 && bytes.Compare(start, end) > 0 {
				start, end = end, start
			}
			if len(end) > 0 && bytes.Equal(start, end) {
				continue // an empty range is no region
			}
			r := Region{ID: id, StartKey: start, EndKey: end, Epoch: Epoch{ConfVer: uint64(kind), Version: id}}
			// Every version of a region keeps its start key (a split moves
			// the end), so two versions of one id always overlap: an
			// input that breaks this describes no cluster, and Remove
			// assumes ids are unique.
			if slices.ContainsFunc(model, func(m Region) bool { return m.ID == id && !rangesOverlap(m, r) }) {
				continue
			}
			probes = append(probes, probesFor(start)...)
			probes = append(probes, probesFor(end)...)

			var wantRemoved []uint64
			kept := model[:0:0]
			for _, old := range model {
				if rangesOverlap(old, r) {
					wantRemoved = append(wantRemoved, old.ID)
				} else {
					kept = append(kept, old)
				}
			}
			model = append(kept, r)
			removed := tr.Insert(r)
			if got := ids(removed); !slices.Equal(sortedIDs(got), sortedIDs(wantRemoved)) {
				t.Fatalf("Insert(%s) removed %v, want %v", r.String(), got, wantRemoved)
			}
			checkTreeModel(t, &tr, model, probes)
		}
		checkTreeModel(t, &tr, model, probes)
	})
}

// decodeKeys2 takes two keys off the front of *b (empty ones if it runs out).
func decodeKeys2(b *[]byte) [2][]byte {
	var out [2][]byte
	for i := range out {
		if len(*b) == 0 {
			break
		}
		n := min(int((*b)[0])%6, len(*b)-1)
		out[i] = append([]byte(nil), (*b)[1:1+n]...)
		*b = (*b)[1+n:]
	}
	return out
}

// rangesOverlap is the oracle for overlap: some key lies in both. The
// larger start lies in the other range iff the ranges intersect.
func rangesOverlap(a, b Region) bool {
	lo := a.StartKey
	if bytes.Compare(b.StartKey, lo) > 0 {
		lo = b.StartKey
	}
	return a.Contains(lo) && b.Contains(lo)
}

func sortedIDs(ids []uint64) []uint64 {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

func checkTreeModel(t *testing.T, tr *Tree, model []Region, probes [][]byte) {
	t.Helper()
	all := tr.All()
	if len(all) != len(model) || tr.Len() != len(model) {
		t.Fatalf("tree holds %d regions (Len %d), model %d", len(all), tr.Len(), len(model))
	}
	for i, r := range all {
		if !slices.ContainsFunc(model, func(m Region) bool { return m.ID == r.ID && bytes.Equal(m.StartKey, r.StartKey) }) {
			t.Fatalf("tree holds %s, not in the model", r.String())
		}
		if i > 0 {
			prev := all[i-1]
			if bytes.Compare(prev.StartKey, r.StartKey) >= 0 || len(prev.EndKey) == 0 || bytes.Compare(prev.EndKey, r.StartKey) > 0 {
				t.Fatalf("regions out of order or overlapping: %s then %s", prev.String(), r.String())
			}
		}
	}
	for _, k := range append(probes, nil, []byte{0}, []byte{0xff, 0xff}) {
		var in []uint64
		for _, r := range model {
			if r.Contains(k) {
				in = append(in, r.ID)
			}
		}
		got, ok := tr.Lookup(k)
		switch {
		case len(in) > 1:
			t.Fatalf("key %q in %d regions %v", k, len(in), in)
		case len(in) == 0 && ok:
			t.Fatalf("Lookup(%q) = %s, but no region holds it", k, got.String())
		case len(in) == 1 && (!ok || got.ID != in[0]):
			t.Fatalf("Lookup(%q) = %d, %v; want %d", k, got.ID, ok, in[0])
		}
	}
}

// FuzzEpochSplit: a split's epochs. Split must refuse keys not strictly
// inside, and on success make two regions that tile the parent, both with
// an epoch newer than the parent's (so a request routed with the parent's
// epoch is refused by either) and no older than it in any dimension.
func FuzzEpochSplit(f *testing.F) {
	f.Add([]byte("a"), []byte("m"), []byte("c"), uint64(1), uint64(1), uint64(1), uint64(1))
	f.Add([]byte(""), []byte(""), []byte("x"), uint64(3), uint64(7), uint64(3), uint64(6))
	f.Add([]byte("a"), []byte("m"), []byte("a"), uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add([]byte("a"), []byte("m"), []byte("m"), uint64(1), uint64(1<<63), uint64(2), uint64(0))
	f.Add([]byte("a"), []byte(""), []byte("a\x00"), ^uint64(0), ^uint64(0)-1, uint64(5), uint64(5))

	f.Fuzz(func(t *testing.T, start, end, key []byte, confVer, version, otherConf, otherVer uint64) {
		if len(end) > 0 && bytes.Compare(start, end) >= 0 {
			return
		}
		parent := Region{ID: 1, StartKey: start, EndKey: end, Epoch: Epoch{ConfVer: confVer, Version: version},
			Peers: []Peer{{ID: 1, StoreID: 1}, {ID: 2, StoreID: 2}}}
		other := Epoch{ConfVer: otherConf, Version: otherVer}
		stale := other.ConfVer < parent.Epoch.ConfVer || other.Version < parent.Epoch.Version
		if got := other.IsStale(parent.Epoch); got != stale {
			t.Fatalf("%v.IsStale(%v) = %v", other, parent.Epoch, got)
		}
		if parent.Epoch.IsStale(parent.Epoch) {
			t.Fatalf("%v is stale against itself", parent.Epoch)
		}
		left, right, err := Split(parent, key, 2, []uint64{binary.BigEndian.Uint64(append(make([]byte, 8-min(8, len(key))), key[:min(8, len(key))]...)), 9})
		inside := len(key) > 0 && parent.Contains(key) && !bytes.Equal(key, start)
		if (err == nil) != inside {
			t.Fatalf("Split(%s, %q) = %v", parent.String(), key, err)
		}
		if err != nil {
			return
		}
		if !bytes.Equal(left.StartKey, start) || !bytes.Equal(left.EndKey, key) || !bytes.Equal(right.StartKey, key) || !bytes.Equal(right.EndKey, end) {
			t.Fatalf("split of %s at %q: %s and %s", parent.String(), key, left.String(), right.String())
		}
		for _, r := range []Region{left, right} {
			if r.Epoch.ConfVer != confVer || r.Epoch.Version != version+1 {
				t.Fatalf("child epoch %v of parent %v", r.Epoch, parent.Epoch)
			}
			if version != ^uint64(0) && !parent.Epoch.IsStale(r.Epoch) {
				t.Fatalf("parent epoch %v not stale against child %v", parent.Epoch, r.Epoch)
			}
		}
		// The children share no key and cover the parent's.
		for _, k := range [][]byte{start, key, end, append(bytes.Clone(key), 0)} {
			inL, inR := left.Contains(k), right.Contains(k)
			if inL && inR || (inL || inR) != parent.Contains(k) {
				t.Fatalf("key %q: left %v right %v parent %v", k, inL, inR, parent.Contains(k))
			}
		}
	})
}
