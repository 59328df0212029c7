package region

import (
	"bytes"
	"testing"
)

// decodeKeys splits fuzz input into keys: each key is a length byte (mod 6,
// so short keys and many collisions) followed by that many bytes.
func decodeKeys(data []byte) [][]byte {
	var keys [][]byte
	for len(data) > 0 {
		n := int(data[0]) % 6
		data = data[1:]
		if n > len(data) {
			n = len(data)
		}
		keys = append(keys, append([]byte(nil), data[:n]...))
		data = data[n:]
	}
	return keys
}

// probesFor returns interesting keys around k: k itself, its successor
// (k+"\x00"), a key just below it when it has one, and its prefixes.
func probesFor(k []byte) [][]byte {
	out := [][]byte{k, append(append([]byte(nil), k...), 0)}
	if n := len(k); n > 0 {
		if k[n-1] > 0 {
			below := append([]byte(nil), k...)
			below[n-1]--
			out = append(out, below, append(below, 0xff))
		}
		out = append(out, append([]byte(nil), k[:n-1]...))
	}
	return out
}

// FuzzSplitThenLookup builds a region set by repeatedly splitting one
// full-range region at fuzzed keys and checks that the regions tile the key
// space and that Tree.Lookup agrees with a linear scan.
func FuzzSplitThenLookup(f *testing.F) {
	f.Add([]byte{1, 'm'}, []byte{1, 'a'})
	f.Add([]byte{1, 'm', 1, 'c', 1, 'x', 2, 'c', 0}, []byte{0, 1, 'c', 1, 'z'})
	f.Add([]byte{0, 1, 'a', 1, 'a', 2, 'a', 0, 2, 'a', 0xff}, []byte{1, 0xff})
	f.Add([]byte{1, 0, 1, 0xff, 5, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte{})
	f.Add([]byte("\x03abc\x02ab\x01a\x04abcd\x05abcde"), []byte("\x02aa\x03abb"))
	f.Add([]byte{}, []byte{1, 'q'})

	f.Fuzz(func(t *testing.T, splits []byte, probes []byte) {
		// Bound the work per input: the checks below are quadratic in the
		// number of regions, and long inputs add nothing new.
		const maxInput = 1024
		if len(splits) > maxInput {
			splits = splits[:maxInput]
		}
		if len(probes) > maxInput {
			probes = probes[:maxInput]
		}
		splitKeys := decodeKeys(splits)
		tr, splitsDone := splitAll(t, splitKeys)
		all := tr.All()
		checkTiling(t, all, splitsDone)

		// Every probe key lies in exactly one region, and Lookup finds it.
		var keys [][]byte
		keys = append(keys, nil, []byte{}, []byte{0}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		for _, k := range append(splitKeys, decodeKeys(probes)...) {
			keys = append(keys, probesFor(k)...)
		}
		for _, r := range all {
			keys = append(keys, probesFor(r.StartKey)...)
			keys = append(keys, probesFor(r.EndKey)...)
		}
		for _, k := range keys {
			checkLookup(t, &tr, all, k)
		}
	})
}

// splitAll splits one full-range region at each key in turn (in whichever
// region holds it), checking each split and the tree's bookkeeping, and
// returns the tree and how many splits succeeded.
func splitAll(t *testing.T, splitKeys [][]byte) (Tree, int) {
	var tr Tree
	root := Region{ID: 1, Epoch: Epoch{ConfVer: 1, Version: 1}, Peers: []Peer{{ID: 1, StoreID: 1}, {ID: 2, StoreID: 2}}}
	tr.Insert(root)
	nextID := uint64(2)
	nextPeer := uint64(100)
	splitsDone := 0
	for _, k := range splitKeys {
		parent, ok := tr.Lookup(k)
		if !ok {
			t.Fatalf("Lookup(%q) found nothing in a tree that should cover everything", k)
		}
		peerIDs := []uint64{nextPeer, nextPeer + 1}
		left, right, err := Split(parent, k, nextID, peerIDs)
		wantErr := len(k) == 0 || bytes.Equal(k, parent.StartKey)
		if (err != nil) != wantErr {
			t.Fatalf("Split(%v, %q) err = %v, want error %v", parent.String(), k, err, wantErr)
		}
		if err != nil {
			continue
		}
		checkSplit(t, parent, k, nextID, peerIDs, left, right)
		nextID++
		nextPeer += 2
		splitsDone++
		if removed := tr.Insert(left); len(removed) != 1 || removed[0].ID != parent.ID {
			t.Fatalf("Insert(left) removed %v, want [%d]", ids(removed), parent.ID)
		}
		if removed := tr.Insert(right); len(removed) != 0 {
			t.Fatalf("Insert(right) removed %v, want none", ids(removed))
		}
	}
	if tr.Len() != splitsDone+1 {
		t.Fatalf("%d regions after %d splits", tr.Len(), splitsDone)
	}
	return tr, splitsDone
}

// checkTiling: the regions, in order, cover (-inf, +inf) without a gap
// or an overlap, with distinct ids and versions a split count can reach.
func checkTiling(t *testing.T, all []Region, splitsDone int) {
	if len(all) != splitsDone+1 {
		t.Fatalf("%d regions after %d splits", len(all), splitsDone)
	}
	if len(all[0].StartKey) != 0 {
		t.Fatalf("first region starts at %q, want -inf", all[0].StartKey)
	}
	if len(all[len(all)-1].EndKey) != 0 {
		t.Fatalf("last region ends at %q, want +inf", all[len(all)-1].EndKey)
	}
	seen := map[uint64]bool{}
	for i, r := range all {
		if seen[r.ID] {
			t.Fatalf("duplicate region id %d", r.ID)
		}
		seen[r.ID] = true
		if len(r.EndKey) > 0 && bytes.Compare(r.StartKey, r.EndKey) >= 0 {
			t.Fatalf("empty or inverted region %v", r.String())
		}
		if i > 0 && !bytes.Equal(all[i-1].EndKey, r.StartKey) {
			t.Fatalf("gap or overlap between %v and %v", all[i-1].String(), r.String())
		}
		if int(r.Epoch.Version) < 1 || int(r.Epoch.Version) > 1+splitsDone {
			t.Fatalf("region %d has version %d after %d splits", r.ID, r.Epoch.Version, splitsDone)
		}
	}
}

// checkLookup: k lies in exactly one of the regions, and Lookup finds it.
func checkLookup(t *testing.T, tr *Tree, all []Region, k []byte) {
	var in []uint64
	for _, r := range all {
		if r.Contains(k) {
			in = append(in, r.ID)
		}
	}
	if len(in) != 1 {
		t.Fatalf("key %q is in %d regions %v, want exactly 1", k, len(in), in)
	}
	got, ok := tr.Lookup(k)
	if !ok || got.ID != in[0] {
		t.Fatalf("Lookup(%q) = %d, %v; linear scan says %d", k, got.ID, ok, in[0])
	}
}

// within reports whether k is in [start, end) with empty end = +inf.
func within(k, start, end []byte) bool {
	r := Region{StartKey: start, EndKey: end}
	return r.Contains(k)
}

// FuzzClampRange checks ClampRange against an independent oracle: two
// half-open ranges intersect iff the larger of the two start keys lies in
// both, and the intersection's bounds are the larger start and smaller end.
func FuzzClampRange(f *testing.F) {
	f.Add([]byte("c"), []byte("f"), []byte("a"), []byte("z"), []byte("d"))
	f.Add([]byte(""), []byte(""), []byte(""), []byte(""), []byte(""))
	f.Add([]byte("c"), []byte("f"), []byte("f"), []byte(""), []byte("f"))
	f.Add([]byte("c"), []byte("f"), []byte("a"), []byte("c"), []byte("c"))
	f.Add([]byte("m"), []byte(""), []byte("a"), []byte("m\x00"), []byte("m"))
	f.Add([]byte(""), []byte("m"), []byte("l\xff"), []byte(""), []byte("l\xff\x00"))
	f.Add([]byte("c"), []byte("f"), []byte("e"), []byte("d"), []byte("d"))
	f.Add([]byte("f"), []byte("c"), []byte(""), []byte(""), []byte("d"))
	f.Add([]byte("a"), []byte("a\x00"), []byte("a"), []byte("a\x00"), []byte("a"))

	f.Fuzz(func(t *testing.T, rs, re, start, end, probe []byte) {
		r := &Region{ID: 1, StartKey: rs, EndKey: re}
		s, e, ok := r.ClampRange(start, end)

		lo := start
		if bytes.Compare(rs, lo) > 0 {
			lo = rs
		}
		nonEmpty := within(lo, rs, re) && within(lo, start, end)
		if ok != nonEmpty {
			t.Fatalf("[%q,%q) ∩ [%q,%q): ok = %v, oracle says non-empty = %v", rs, re, start, end, ok, nonEmpty)
		}
		if !ok {
			if s != nil || e != nil {
				t.Fatalf("ok=false but bounds %q, %q", s, e)
			}
		} else {
			if !bytes.Equal(s, lo) {
				t.Fatalf("start = %q, want max(%q, %q)", s, rs, start)
			}
			var hi []byte
			switch {
			case len(re) == 0:
				hi = end
			case len(end) == 0:
				hi = re
			case bytes.Compare(re, end) < 0:
				hi = re
			default:
				hi = end
			}
			if !bytes.Equal(e, hi) {
				t.Fatalf("end = %q, want min(%q, %q)", e, re, end)
			}
			// The result is a non-empty range within both inputs.
			if len(e) > 0 && bytes.Compare(s, e) >= 0 {
				t.Fatalf("ok but result [%q,%q) is empty", s, e)
			}
			if !within(s, rs, re) || !within(s, start, end) {
				t.Fatalf("result start %q outside an input", s)
			}
			if len(e) == 0 && (len(re) > 0 || len(end) > 0) {
				t.Fatalf("result end +inf but an input is bounded")
			}
		}

		// Pointwise: a key is in the result iff it is in both inputs.
		keys := [][]byte{probe, rs, re, start, end, nil}
		for _, k := range [][]byte{probe, rs, re, start, end} {
			keys = append(keys, probesFor(k)...)
		}
		for _, k := range keys {
			inBoth := within(k, rs, re) && within(k, start, end)
			inResult := ok && within(k, s, e)
			if inBoth != inResult {
				t.Fatalf("key %q: in both inputs = %v, in result [%q,%q) ok=%v = %v (region [%q,%q), request [%q,%q))",
					k, inBoth, s, e, ok, inResult, rs, re, start, end)
			}
		}
	})
}
