package region

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func b(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

func TestContains(t *testing.T) {
	tests := []struct {
		name       string
		start, end string
		key        string
		want       bool
	}{
		{"full range, empty key", "", "", "", true},
		{"full range, some key", "", "", "m", true},
		{"full range, 0xff key", "", "", "\xff\xff", true},
		{"-inf start, key below end", "", "m", "a", true},
		{"-inf start, empty key", "", "m", "", true},
		{"-inf start, key at end", "", "m", "m", false},
		{"-inf start, key above end", "", "m", "z", false},
		{"-inf start, prefix of end", "", "mm", "m", true},
		{"+inf end, key at start", "m", "", "m", true},
		{"+inf end, key below start", "m", "", "a", false},
		{"+inf end, empty key", "m", "", "", false},
		{"+inf end, key above start", "m", "", "zzz", true},
		{"+inf end, extension of start", "m", "", "m\x00", true},
		{"bounded, at start", "c", "f", "c", true},
		{"bounded, inside", "c", "f", "d", true},
		{"bounded, just below end", "c", "f", "e\xff\xff", true},
		{"bounded, at end", "c", "f", "f", false},
		{"bounded, after end", "c", "f", "f\x00", false},
		{"bounded, before start", "c", "f", "b\xff", false},
		{"bounded, empty key", "c", "f", "", false},
		{"single key range, at start", "c", "c\x00", "c", true},
		{"single key range, next key", "c", "c\x00", "c\x00", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Region{StartKey: b(tt.start), EndKey: b(tt.end)}
			if got := r.Contains(b(tt.key)); got != tt.want {
				t.Fatalf("[%q,%q).Contains(%q) = %v, want %v", tt.start, tt.end, tt.key, got, tt.want)
			}
			// nil and empty non-nil keys mean the same thing.
			if tt.key == "" {
				if got := r.Contains([]byte{}); got != tt.want {
					t.Fatalf("Contains([]byte{}) = %v, want %v", got, tt.want)
				}
			}
			r2 := &Region{StartKey: []byte(tt.start), EndKey: []byte(tt.end)}
			if got := r2.Contains([]byte(tt.key)); got != tt.want {
				t.Fatalf("non-nil empty bounds: Contains(%q) = %v, want %v", tt.key, got, tt.want)
			}
		})
	}
}

func testPeers() []Peer {
	return []Peer{{ID: 11, StoreID: 1}, {ID: 12, StoreID: 2}, {ID: 13, StoreID: 3}}
}

func TestPeerOnStoreAndByID(t *testing.T) {
	r := &Region{ID: 1, Peers: testPeers()}
	tests := []struct {
		name    string
		r       *Region
		storeID uint64
		want    Peer
		ok      bool
	}{
		{"first", r, 1, Peer{ID: 11, StoreID: 1}, true},
		{"middle", r, 2, Peer{ID: 12, StoreID: 2}, true},
		{"last", r, 3, Peer{ID: 13, StoreID: 3}, true},
		{"missing", r, 4, Peer{}, false},
		{"zero store", r, 0, Peer{}, false},
		{"no peers", &Region{ID: 2}, 1, Peer{}, false},
	}
	for _, tt := range tests {
		t.Run("store/"+tt.name, func(t *testing.T) {
			got, ok := tt.r.PeerOnStore(tt.storeID)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("PeerOnStore(%d) = %v, %v; want %v, %v", tt.storeID, got, ok, tt.want, tt.ok)
			}
		})
	}

	idTests := []struct {
		name string
		r    *Region
		id   uint64
		want Peer
		ok   bool
	}{
		{"first", r, 11, Peer{ID: 11, StoreID: 1}, true},
		{"last", r, 13, Peer{ID: 13, StoreID: 3}, true},
		{"store id is not peer id", r, 1, Peer{}, false},
		{"missing", r, 14, Peer{}, false},
		{"no peers", &Region{ID: 2}, 11, Peer{}, false},
	}
	for _, tt := range idTests {
		t.Run("id/"+tt.name, func(t *testing.T) {
			got, ok := tt.r.PeerByID(tt.id)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("PeerByID(%d) = %v, %v; want %v, %v", tt.id, got, ok, tt.want, tt.ok)
			}
		})
	}

	// With duplicates (not expected in practice) the first match wins.
	dup := &Region{Peers: []Peer{{ID: 1, StoreID: 9}, {ID: 2, StoreID: 9}}}
	if p, _ := dup.PeerOnStore(9); p.ID != 1 {
		t.Fatalf("PeerOnStore with duplicates = %v, want first", p)
	}
}

func TestClone(t *testing.T) {
	orig := Region{
		ID:       7,
		StartKey: []byte("a"),
		EndKey:   []byte("z"),
		Epoch:    Epoch{ConfVer: 3, Version: 4},
		Peers:    testPeers(),
	}
	c := orig.Clone()
	if !reflect.DeepEqual(c, orig) {
		t.Fatalf("Clone = %v, want %v", c.String(), orig.String())
	}

	// Mutating the clone must not touch the original, and vice versa.
	c.StartKey[0] = 'X'
	c.EndKey[0] = 'Y'
	c.Peers[0].ID = 999
	c.Peers = append(c.Peers, Peer{ID: 100, StoreID: 100})
	c.Epoch.Version = 100
	if string(orig.StartKey) != "a" || string(orig.EndKey) != "z" || orig.Peers[0].ID != 11 || len(orig.Peers) != 3 || orig.Epoch.Version != 4 {
		t.Fatalf("mutating clone changed original: %v", orig.String())
	}
	c2 := orig.Clone()
	orig.StartKey[0] = 'Q'
	orig.Peers[1].StoreID = 42
	if string(c2.StartKey) != "a" || c2.Peers[1].StoreID != 2 {
		t.Fatalf("mutating original changed clone: %v", c2.String())
	}

	// Appending to the clone's key slices must not write into the original's
	// backing array either.
	base := []byte("abcdef")
	r := Region{StartKey: base[:1], EndKey: base[3:4]}
	rc := r.Clone()
	rc.StartKey = append(rc.StartKey, 'Z')
	rc.EndKey = append(rc.EndKey, 'Z')
	if string(base) != "abcdef" {
		t.Fatalf("append on clone wrote into original backing array: %q", base)
	}

	// Empty/unbounded region clones to an equivalent empty/unbounded region.
	var empty Region
	ec := empty.Clone()
	if len(ec.StartKey) != 0 || len(ec.EndKey) != 0 || len(ec.Peers) != 0 || ec.ID != 0 {
		t.Fatalf("Clone of zero region = %v", ec.String())
	}
	if !ec.Contains(nil) || !ec.Contains([]byte("anything")) {
		t.Fatal("clone of full-range region lost its +inf end")
	}
}

func TestClampRange(t *testing.T) {
	const inf = ""
	tests := []struct {
		name         string
		rStart, rEnd string
		start, end   string
		wantS, wantE string
		wantOK       bool
	}{
		// Full-range region: the request comes back untouched.
		{"full region, full request", inf, inf, inf, inf, inf, inf, true},
		{"full region, bounded request", inf, inf, "b", "d", "b", "d", true},
		{"full region, open request", inf, inf, "b", inf, "b", inf, true},
		{"full region, empty request", inf, inf, "d", "d", "", "", false},
		{"full region, inverted request", inf, inf, "d", "b", "", "", false},

		// Bounded region [c, f).
		{"request covers region", "c", "f", "a", "z", "c", "f", true},
		{"full request", "c", "f", inf, inf, "c", "f", true},
		{"request inside region", "c", "f", "d", "e", "d", "e", true},
		{"same range", "c", "f", "c", "f", "c", "f", true},
		{"overlap left", "c", "f", "a", "d", "c", "d", true},
		{"overlap right", "c", "f", "d", "z", "d", "f", true},
		{"overlap right, open end", "c", "f", "d", inf, "d", "f", true},
		{"request ends at region start", "c", "f", "a", "c", "", "", false},
		{"request ends just after region start", "c", "f", "a", "c\x00", "c", "c\x00", true},
		{"request starts at region end", "c", "f", "f", "z", "", "", false},
		{"request starts at region end, open", "c", "f", "f", inf, "", "", false},
		{"request starts just before region end", "c", "f", "e\xff", inf, "e\xff", "f", true},
		{"request wholly before", "c", "f", "a", "b", "", "", false},
		{"request wholly after", "c", "f", "x", "y", "", "", false},
		{"empty request inside", "c", "f", "d", "d", "", "", false},
		{"inverted request inside", "c", "f", "e", "d", "", "", false},

		// Region with +inf end [m, +inf).
		{"open region, request below", "m", inf, "a", "c", "", "", false},
		{"open region, request up to start", "m", inf, "a", "m", "", "", false},
		{"open region, straddling", "m", inf, "a", "p", "m", "p", true},
		{"open region, open request", "m", inf, "a", inf, "m", inf, true},
		{"open region, full request", "m", inf, inf, inf, "m", inf, true},
		{"open region, inside", "m", inf, "n", "o", "n", "o", true},

		// Region with -inf start [-inf, m).
		{"-inf region, full request", inf, "m", inf, inf, inf, "m", true},
		{"-inf region, request after", inf, "m", "m", "z", "", "", false},
		{"-inf region, straddling", inf, "m", "a", "z", "a", "m", true},
		{"-inf region, request from -inf", inf, "m", inf, "c", inf, "c", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Region{StartKey: b(tt.rStart), EndKey: b(tt.rEnd)}
			s, e, ok := r.ClampRange(b(tt.start), b(tt.end))
			if ok != tt.wantOK {
				t.Fatalf("ClampRange(%q,%q) on [%q,%q) ok = %v, want %v (s=%q e=%q)", tt.start, tt.end, tt.rStart, tt.rEnd, ok, tt.wantOK, s, e)
			}
			if !ok {
				if s != nil || e != nil {
					t.Fatalf("empty intersection returned non-nil bounds %q, %q", s, e)
				}
				return
			}
			if string(s) != tt.wantS || string(e) != tt.wantE {
				t.Fatalf("ClampRange(%q,%q) on [%q,%q) = [%q,%q), want [%q,%q)", tt.start, tt.end, tt.rStart, tt.rEnd, s, e, tt.wantS, tt.wantE)
			}
		})
	}
}

func TestEpochIsStale(t *testing.T) {
	tests := []struct {
		name   string
		e, cur Epoch
		want   bool
	}{
		{"equal", Epoch{1, 1}, Epoch{1, 1}, false},
		{"zero equal", Epoch{}, Epoch{}, false},
		{"older conf", Epoch{1, 5}, Epoch{2, 5}, true},
		{"older version", Epoch{2, 4}, Epoch{2, 5}, true},
		{"older both", Epoch{1, 1}, Epoch{2, 2}, true},
		{"newer conf", Epoch{3, 5}, Epoch{2, 5}, false},
		{"newer version", Epoch{2, 6}, Epoch{2, 5}, false},
		{"newer both", Epoch{3, 6}, Epoch{2, 5}, false},
		{"older conf newer version", Epoch{1, 9}, Epoch{2, 5}, true},
		{"newer conf older version", Epoch{9, 1}, Epoch{2, 5}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.e.IsStale(tt.cur); got != tt.want {
				t.Fatalf("%+v.IsStale(%+v) = %v, want %v", tt.e, tt.cur, got, tt.want)
			}
		})
	}
}

func TestSplit(t *testing.T) {
	mk := func(start, end string) Region {
		return Region{ID: 1, StartKey: b(start), EndKey: b(end), Epoch: Epoch{ConfVer: 5, Version: 7}, Peers: testPeers()}
	}
	newPeers := []uint64{21, 22, 23}
	tests := []struct {
		name       string
		r          Region
		key        string
		newPeerIDs []uint64
		wantErr    string // substring; "" means success
	}{
		{"middle of bounded", mk("c", "f"), "d", newPeers, ""},
		{"just after start", mk("c", "f"), "c\x00", newPeers, ""},
		{"just before end", mk("c", "f"), "e\xff", newPeers, ""},
		{"full range", mk("", ""), "m", newPeers, ""},
		{"-inf start", mk("", "m"), "a", newPeers, ""},
		{"+inf end", mk("m", ""), "z", newPeers, ""},
		{"lowest non-empty key in full range", mk("", ""), "\x00", newPeers, ""},
		{"at start key", mk("c", "f"), "c", newPeers, "not strictly inside"},
		{"at end key", mk("c", "f"), "f", newPeers, "not strictly inside"},
		{"before start", mk("c", "f"), "a", newPeers, "not strictly inside"},
		{"after end", mk("c", "f"), "z", newPeers, "not strictly inside"},
		{"empty key, full range", mk("", ""), "", newPeers, "not strictly inside"},
		{"empty key, -inf start", mk("", "m"), "", newPeers, "not strictly inside"},
		{"empty key, bounded", mk("c", "f"), "", newPeers, "not strictly inside"},
		{"below start of +inf region", mk("m", ""), "a", newPeers, "not strictly inside"},
		{"too few peer ids", mk("c", "f"), "d", []uint64{21, 22}, "needs 3 peer ids, got 2"},
		{"too many peer ids", mk("c", "f"), "d", []uint64{21, 22, 23, 24}, "needs 3 peer ids, got 4"},
		{"nil peer ids", mk("c", "f"), "d", nil, "needs 3 peer ids, got 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.r.Clone()
			left, right, err := Split(tt.r, b(tt.key), 2, tt.newPeerIDs)
			if !reflect.DeepEqual(tt.r, before) {
				t.Fatalf("Split mutated its input: %v -> %v", before.String(), tt.r.String())
			}
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Split at %q of %v succeeded: %v | %v", tt.key, tt.r.String(), left.String(), right.String())
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %q does not contain %q", err, tt.wantErr)
				}
				if IsRegionError(err) {
					t.Fatalf("split error must not be a routing error: %v", err)
				}
				if left.ID != 0 || right.ID != 0 || left.Peers != nil || right.Peers != nil {
					t.Fatalf("failed split returned non-zero regions: %v | %v", left.String(), right.String())
				}
				return
			}
			if err != nil {
				t.Fatalf("Split at %q: %v", tt.key, err)
			}
			checkSplit(t, tt.r, []byte(tt.key), 2, tt.newPeerIDs, left, right)
		})
	}
}

func checkSplit(t *testing.T, r Region, key []byte, newID uint64, newPeerIDs []uint64, left, right Region) {
	t.Helper()
	if left.ID != r.ID || right.ID != newID {
		t.Fatalf("ids: left %d right %d, want %d, %d", left.ID, right.ID, r.ID, newID)
	}
	if !bytes.Equal(left.StartKey, r.StartKey) || !bytes.Equal(left.EndKey, key) {
		t.Fatalf("left = [%q,%q), want [%q,%q)", left.StartKey, left.EndKey, r.StartKey, key)
	}
	if !bytes.Equal(right.StartKey, key) || !bytes.Equal(right.EndKey, r.EndKey) {
		t.Fatalf("right = [%q,%q), want [%q,%q)", right.StartKey, right.EndKey, key, r.EndKey)
	}
	if (len(r.EndKey) == 0) != (len(right.EndKey) == 0) {
		t.Fatalf("right lost or gained +inf end: %q vs %q", right.EndKey, r.EndKey)
	}
	wantEpoch := Epoch{ConfVer: r.Epoch.ConfVer, Version: r.Epoch.Version + 1}
	if left.Epoch != wantEpoch || right.Epoch != wantEpoch {
		t.Fatalf("epochs left %+v right %+v, want %+v", left.Epoch, right.Epoch, wantEpoch)
	}
	if !r.Epoch.IsStale(left.Epoch) || !r.Epoch.IsStale(right.Epoch) {
		t.Fatal("parent epoch is not stale against children")
	}
	if !reflect.DeepEqual(left.Peers, r.Peers) {
		t.Fatalf("left peers %v, want %v", left.Peers, r.Peers)
	}
	if len(right.Peers) != len(r.Peers) {
		t.Fatalf("right has %d peers, want %d", len(right.Peers), len(r.Peers))
	}
	for i, p := range right.Peers {
		// Same placement (and every other field) as the parent's peer, new ID.
		want := r.Peers[i]
		want.ID = newPeerIDs[i]
		if p != want {
			t.Fatalf("right peer %d = %+v, want %+v", i, p, want)
		}
	}
	// Contiguity: the split key is in right, not in left; the parent's start
	// is in left.
	if left.Contains(key) || !right.Contains(key) || !left.Contains(r.StartKey) || right.Contains(r.StartKey) {
		t.Fatal("split key / start key on the wrong side")
	}
	// Independence: the halves share no memory with each other or the parent.
	if len(left.Peers) > 0 {
		saved := left.Peers[0].StoreID
		left.Peers[0].StoreID = saved + 12345
		shared := right.Peers[0].StoreID == saved+12345 || r.Peers[0].StoreID == saved+12345
		left.Peers[0].StoreID = saved
		if shared {
			t.Fatal("left and right/parent share a peers slice")
		}
		saved = right.Peers[0].ID
		right.Peers[0].ID = saved + 12345
		shared = r.Peers[0].ID == saved+12345 || left.Peers[0].ID == saved+12345
		right.Peers[0].ID = saved
		if shared {
			t.Fatal("right and left/parent share a peers slice")
		}
	}
	left.EndKey[0] ^= 0xff
	if right.StartKey[0] == left.EndKey[0] || key[0] == left.EndKey[0] {
		t.Fatal("left.EndKey shares memory with right.StartKey or the split key")
	}
	left.EndKey[0] ^= 0xff
}

func TestSplitDoesNotAliasKey(t *testing.T) {
	r := Region{ID: 1, Peers: []Peer{{ID: 1, StoreID: 1}}}
	key := []byte("m")
	left, right, err := Split(r, key, 2, []uint64{2})
	if err != nil {
		t.Fatal(err)
	}
	key[0] = 'z'
	if string(left.EndKey) != "m" || string(right.StartKey) != "m" {
		t.Fatalf("split regions alias the caller's key: [%q,%q) [%q,%q)", left.StartKey, left.EndKey, right.StartKey, right.EndKey)
	}
}

func TestSplitNoPeers(t *testing.T) {
	r := Region{ID: 1, StartKey: []byte("a"), EndKey: []byte("z")}
	left, right, err := Split(r, []byte("m"), 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(left.Peers) != 0 || len(right.Peers) != 0 {
		t.Fatalf("peers appeared: %v %v", left.Peers, right.Peers)
	}
	if left.Epoch.Version != 1 || right.Epoch.Version != 1 {
		t.Fatalf("versions %d %d, want 1", left.Epoch.Version, right.Epoch.Version)
	}
}

func TestSplitRepeated(t *testing.T) {
	// Split the right-hand side repeatedly and check versions keep climbing
	// and the pieces tile the original range.
	cur := Region{ID: 1, Peers: testPeers()}
	var pieces []Region
	for i, k := range []string{"b", "d", "f", "h"} {
		newID := uint64(2 + i)
		ids := []uint64{uint64(100 + 3*i), uint64(101 + 3*i), uint64(102 + 3*i)}
		left, right, err := Split(cur, []byte(k), newID, ids)
		if err != nil {
			t.Fatal(err)
		}
		if right.Epoch.Version != uint64(i+1) {
			t.Fatalf("after %d splits version = %d", i+1, right.Epoch.Version)
		}
		pieces = append(pieces, left)
		cur = right
	}
	pieces = append(pieces, cur)
	want := []string{"", "b", "d", "f", "h", ""}
	for i, p := range pieces {
		if string(p.StartKey) != want[i] || string(p.EndKey) != want[i+1] {
			t.Fatalf("piece %d = [%q,%q), want [%q,%q)", i, p.StartKey, p.EndKey, want[i], want[i+1])
		}
	}
	if pieces[0].ID != 1 || pieces[len(pieces)-1].ID != 5 {
		t.Fatalf("ids %d..%d", pieces[0].ID, pieces[len(pieces)-1].ID)
	}
}

func TestRegionString(t *testing.T) {
	r := &Region{ID: 3, StartKey: []byte("a"), EndKey: nil, Epoch: Epoch{ConfVer: 2, Version: 5}, Peers: []Peer{{ID: 7, StoreID: 1}}}
	// Only the prefix is pinned: the peer formatting follows Peer's fields.
	want := `region 3 ["a", "") epoch 2/5 peers [{7 1`
	if got := r.String(); !strings.HasPrefix(got, want) {
		t.Fatalf("String() = %q, want prefix %q", got, want)
	}
	bin := &Region{ID: 1, StartKey: []byte{0, 0xff}}
	if got := bin.String(); !strings.Contains(got, `"\x00\xff"`) {
		t.Fatalf("binary key not quoted: %q", got)
	}
}

func TestMerge(t *testing.T) {
	peers := []Peer{{ID: 1, StoreID: 1}, {ID: 2, StoreID: 2}, {ID: 3, StoreID: 3}}
	left := Region{ID: 1, EndKey: []byte("m"), Epoch: Epoch{ConfVer: 2, Version: 3}, Peers: peers,
		AbortedMerge: &MergeState{Target: 9, Index: 7}}
	right := Region{ID: 9, StartKey: []byte("m"), Epoch: Epoch{ConfVer: 5, Version: 8},
		Peers: []Peer{{ID: 93, StoreID: 3}, {ID: 91, StoreID: 1}, {ID: 92, StoreID: 2}}, Merge: &MergeState{Target: 1, Index: 40}}
	m, err := Merge(left, right)
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != 1 || len(m.StartKey) != 0 || len(m.EndKey) != 0 || m.Epoch != (Epoch{ConfVer: 2, Version: 9}) || m.Merge != nil || m.AbortedMerge != nil {
		t.Fatalf("merged %s (merge %v, aborted %v)", m.String(), m.Merge, m.AbortedMerge)
	}
	if !reflect.DeepEqual(m.Peers, peers) {
		t.Fatalf("merged peers %v, want the left's", m.Peers)
	}
	m.Peers[0].StoreID = 99
	if left.Peers[0].StoreID != 1 {
		t.Fatal("the merged region aliases the left's peers")
	}
	for name, bad := range map[string]Region{
		"not adjacent":   {ID: 9, StartKey: []byte("n"), Peers: right.Peers},
		"other stores":   {ID: 9, StartKey: []byte("m"), Peers: []Peer{{ID: 91, StoreID: 1}, {ID: 92, StoreID: 2}, {ID: 94, StoreID: 4}}},
		"fewer replicas": {ID: 9, StartKey: []byte("m"), Peers: peers[:2]},
		"learner role":   {ID: 9, StartKey: []byte("m"), Peers: []Peer{{ID: 91, StoreID: 1}, {ID: 92, StoreID: 2}, {ID: 93, StoreID: 3, IsLearner: true}}},
	} {
		if _, err := Merge(left, bad); err == nil {
			t.Errorf("%s: merged", name)
		}
	}
	last := Region{ID: 9, StartKey: []byte("m"), Peers: peers}
	if _, err := Merge(last, right); err == nil {
		t.Error("merged the last region with a region before it")
	}
}

func TestCloneCopiesMergeState(t *testing.T) {
	r := Region{ID: 1, Merge: &MergeState{Target: 2, Index: 3}, AbortedMerge: &MergeState{Target: 4, Index: 5}}
	c := r.Clone()
	c.Merge.Index, c.AbortedMerge.Index = 30, 50
	if r.Merge.Index != 3 || r.AbortedMerge.Index != 5 {
		t.Fatal("Clone shares the merge state")
	}
}
