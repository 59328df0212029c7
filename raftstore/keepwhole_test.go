package raftstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
)

func keep(pairs ...string) []KeepRange {
	var out []KeepRange
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, KeepRange{Start: []byte(pairs[i]), End: []byte(pairs[i+1])})
	}
	return out
}

func TestKeepWholeConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		keep []KeepRange
		ok   bool
	}{
		{"none", nil, true},
		{"one", keep("k", "l"), true},
		{"from the key space's start", keep("", "b"), true},
		{"adjacent", keep("k", "l", "l", "m"), true},
		{"unsorted", keep("x", "y", "k", "l"), true},
		{"no end", keep("k", ""), false},
		{"empty", keep("k", "k"), false},
		{"reversed", keep("l", "k"), false},
		{"overlapping", keep("k", "m", "l", "n"), false},
		{"nested, unsorted", keep("l", "m", "k", "n"), false},
	} {
		cfg := Config{StoreID: 1, KeepWhole: tc.keep}
		err := cfg.Validate()
		var ce *ConfigError
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.ok && (!errors.As(err, &ce) || ce.Field != "KeepWhole"):
			t.Errorf("%s: Validate = %v, want a KeepWhole ConfigError", tc.name, err)
		}
	}

	// The store keeps a sorted copy of its own.
	given := keep("x", "y", "k", "l")
	s, err := NewStore(Config{StoreID: 1, InitialStores: []uint64{1}, DataDir: t.TempDir(), NoSync: true, KeepWhole: given}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	given[0].Start[0] = 'a'
	if got := fmt.Sprint(s.cfg.KeepWhole); got != "[[k, l) [x, y)]" {
		t.Fatalf("the store keeps %s", got)
	}
}

func TestKeptRangeAt(t *testing.T) {
	kw := sortedKeepRanges(keep("k", "l", "l", "m", "x", "y", "", "b"))
	for _, tc := range []struct {
		key, want string // want "": none cut
	}{
		{"", ""}, {"a", "[, b)"}, {"\x00", "[, b)"}, {"b", ""},
		{"j", ""}, {"k", ""}, {"k\x00", "[k, l)"}, {"kzzz", "[k, l)"},
		{"l", ""}, {"l5", "[l, m)"}, {"m", ""},
		{"w", ""}, {"x", ""}, {"x1", "[x, y)"}, {"y", ""}, {"z", ""},
	} {
		kr, ok := keptRangeAt(kw, []byte(tc.key))
		if got := ""; ok != (tc.want != "") || (ok && kr.String() != tc.want) {
			if ok {
				got = kr.String()
			}
			t.Errorf("keptRangeAt(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

// TestSplitKeyNeverCutsAKeptRange: the split check's key, by count and by
// size, for regions around, containing, ending and starting at, and
// inside kept ranges. A middle inside a kept range moves to the range's
// start or end nearer it that lies strictly inside the region; with
// neither, the region is not split.
func TestSplitKeyNeverCutsAKeptRange(t *testing.T) {
	e := testEngine(t)
	// a: 150 light keys; k: 200 keys of 104 bytes, kept; m: 10 heavy
	// keys; x: 20 light keys, kept.
	mustUpdate(t, e, func(tx *engine.Tx) error {
		for _, g := range []struct {
			prefix     string
			n, valSize int
		}{{"a", 150, 10}, {"k", 200, 100}, {"m", 10, 1000}, {"x", 20, 10}} {
			for i := range g.n {
				if err := tx.Put(fmt.Appendf(nil, "%s%03d", g.prefix, i), make([]byte, g.valSize)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	kw := sortedKeepRanges(keep("k", "l", "x", "y"))
	// want: the split key; "-" no split; "~p" any key with prefix p (a
	// middle outside every kept range stays where it is).
	cases := []struct {
		name         string
		start, end   string
		byKeys, size string
	}{
		{"the whole key space", "", "", "k", "l"},
		{"ends at the kept range's end", "", "l", "k", "k"},
		{"starts at the kept range's start", "k", "", "l", "l"},
		{"is the kept range", "k", "l", "-", "-"},
		{"inside the kept range", "k050", "k150", "-", "-"},
		{"starts inside the kept range", "k100", "", "l", "~m"},
		{"ends inside the kept range", "", "k100", "~a", "k"},
		{"around the other kept range", "m", "", "x", "~m"},
	}
	for _, tc := range cases {
		r := region.Region{ID: 1, StartKey: []byte(tc.start), EndKey: []byte(tc.end), Epoch: region.Epoch{Version: 2}}
		total, _, _ := splitKey(e, r, 1<<40, 0, kw, nil)
		for _, mode := range []struct {
			name              string
			maxKeys, maxBytes uint64
			want              string
		}{
			{"by count", total.keys - 1, 0, tc.byKeys},
			{"by size", 0, total.bytes - 1, tc.size},
		} {
			size, key, ok := splitKey(e, r, mode.maxKeys, mode.maxBytes, kw, nil)
			what := fmt.Sprintf("region %s %s (%d keys, %d bytes), %s", tc.name, r.String(), total.keys, total.bytes, mode.name)
			if !size.counted || size.keys != total.keys || size.bytes != total.bytes {
				t.Errorf("%s: size %+v", what, size)
			}
			switch want := mode.want; {
			case want == "-":
				if ok {
					t.Errorf("%s: split at %q, want none", what, key)
				}
			case !ok:
				t.Errorf("%s: no split, want %q", what, want)
			case strings.HasPrefix(want, "~"):
				if !bytes.HasPrefix(key, []byte(want[1:])) {
					t.Errorf("%s: split at %q, want a key of %q", what, key, want[1:])
				}
			case string(key) != want:
				t.Errorf("%s: split at %q, want %q", what, key, want)
			}
			if !ok {
				continue
			}
			if kr, in := keptRangeAt(kw, key); in {
				t.Errorf("%s: split key %q cuts %s", what, key, kr)
			}
			if bytes.Compare(key, r.StartKey) <= 0 || (len(r.EndKey) > 0 && bytes.Compare(key, r.EndKey) >= 0) {
				t.Errorf("%s: split key %q not strictly inside the region", what, key)
			}
		}
	}
	// Without kept ranges the whole key space's middle is inside [k, l):
	// the cases above test something.
	for _, limits := range [][2]uint64{{379, 0}, {0, 33219}} {
		if _, key, ok := splitKey(e, region.Region{ID: 1}, limits[0], limits[1], nil, nil); !ok || !bytes.HasPrefix(key, []byte("k")) || string(key) == "k" {
			t.Fatalf("without kept ranges (limits %v): split at %q, %v; want inside [k, l)", limits, key, ok)
		}
	}
}

// TestSplitRefusesAKeyInsideAKeptRange: Split (ctl split) refuses a key
// strictly inside a kept range with a typed error naming the range, and
// splits at its ends.
func TestSplitRefusesAKeyInsideAKeptRange(t *testing.T) {
	c := newMiniCluster(t, 3, func(cfg *Config) { cfg.KeepWhole = keep("k", "l") })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, key := range []string{"k\x00", "k5", "kzzzz"} {
		err := c.do(ctx, []byte(key), func(ctx context.Context, s *Store) error {
			_, _, err := s.Split(ctx, []byte(key))
			if err == nil {
				t.Fatalf("split at %q inside [k, l) succeeded", key)
			}
			var ke *KeptRangeError
			if !errors.As(err, &ke) || !errors.Is(err, ErrInvalidRequest) || ke.Range.String() != "[k, l)" || string(ke.Key) != key ||
				!strings.Contains(err.Error(), "[k, l)") {
				t.Fatalf("split at %q: %v (%T), want a KeptRangeError naming [k, l) that is an ErrInvalidRequest", key, err, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Any store refuses it, leader or not, before routing.
	for id, s := range c.all() {
		if _, _, err := s.Split(ctx, []byte("k5")); !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("store %d: split inside a kept range: %v", id, err)
		}
	}
	for _, key := range []string{"l", "k", "a"} {
		if err := c.do(ctx, []byte(key), func(ctx context.Context, s *Store) error { _, _, err := s.Split(ctx, []byte(key)); return err }); err != nil {
			t.Fatalf("split at %q: %v", key, err)
		}
	}
	s := c.mustLeaderOf([]byte("k"))
	for _, st := range s.Regions() {
		if st.Region.Contains([]byte("k")) && (string(st.Region.StartKey) != "k" || string(st.Region.EndKey) != "l") {
			t.Fatalf("region holding k: %s, want [k, l)", st.Region.String())
		}
	}
}

// regionsOf is every region store s hosts, as [start, end) strings.
func regionsOf(s *Store) []string {
	var out []string
	for _, st := range s.Regions() {
		out = append(out, fmt.Sprintf("[%q, %q)", st.Region.StartKey, st.Region.EndKey))
	}
	return out
}

// TestEnsureBoundariesMakesAKeptRangeItsOwnRegion: EnsureBoundaries
// called with a kept range's ends, concurrently on every store (several
// callers each, looping while the answer is retryable, as a layer's
// start-up does), makes the range a region of its own, once; called again
// it changes nothing.
func TestEnsureBoundariesMakesAKeptRangeItsOwnRegion(t *testing.T) {
	const start, end = "\xffetcd/", "\xffetcd0"
	c := newMiniCluster(t, 3, func(cfg *Config) { cfg.KeepWhole = keep(start, end) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, k := range []string{"a", start + "x", start + "y", end, "\xff\xff"} {
		c.put(ctx, []byte(k), []byte("v"))
	}

	ensure := func(s *Store) error {
		for {
			err := s.EnsureBoundaries(ctx, []byte(end), []byte(start), []byte(start)) // any order, duplicates
			var nl *region.NotLeaderError
			switch {
			case err == nil:
				return nil
			case errors.As(err, &nl), errors.Is(err, ErrProposalDropped):
			default:
				return fmt.Errorf("store %d: %w", s.ID(), err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("store %d: %w (last: %v)", s.ID(), ctx.Err(), err)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 9)
	for _, s := range c.all() {
		for range 3 {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- ensure(s) }()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := fmt.Sprintf("[[%q, %q) [%q, %q) [%q, %q)]", "", start, start, end, end, "")
	for id, s := range c.all() {
		// Every store returned nil: each has applied both splits.
		if got := fmt.Sprint(regionsOf(s)); got != want {
			t.Fatalf("store %d hosts %s, want %s", id, got, want)
		}
	}
	// Again, from every store: nothing changes.
	versions := map[uint64]uint64{}
	for _, st := range c.store(1).Regions() {
		versions[st.Region.ID] = st.Region.Epoch.Version
	}
	for _, s := range c.all() {
		if err := ensure(s); err != nil {
			t.Fatal(err)
		}
	}
	for id, s := range c.all() {
		if got := fmt.Sprint(regionsOf(s)); got != want {
			t.Fatalf("after a second call, store %d hosts %s, want %s", id, got, want)
		}
	}
	for _, st := range c.store(1).Regions() {
		if versions[st.Region.ID] != st.Region.Epoch.Version {
			t.Fatalf("a second call changed region %s (version %d before)", st.Region.String(), versions[st.Region.ID])
		}
	}
	// The data stayed: the kept range's keys are its region's.
	s, ok := c.leaderOf([]byte(start))
	if !ok {
		t.Fatal("the kept range's region has no leader")
	}
	kvs, r, _, err := s.Scan(ctx, ReadOptions{}, []byte(start), nil, 10)
	if err != nil || len(kvs) != 2 || string(r.StartKey) != start || string(r.EndKey) != end {
		t.Fatalf("scan of the kept range's region: %d pairs, region %s, %v", len(kvs), r.String(), err)
	}
	// Inside a kept range is refused; an empty key is a boundary already.
	var ke *KeptRangeError
	if err := s.EnsureBoundaries(ctx, []byte(start+"x")); !errors.As(err, &ke) {
		t.Fatalf("EnsureBoundaries inside a kept range: %v", err)
	}
	if err := s.EnsureBoundaries(ctx, nil); err != nil {
		t.Fatalf("EnsureBoundaries of the empty key: %v", err)
	}
}

// TestEnsureBoundariesOnAFollower: a store that does not lead the region
// answers NotLeader with the leader, and nil once the split it did not
// make has applied there.
func TestEnsureBoundariesOnAFollower(t *testing.T) {
	c := newMiniCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c.put(ctx, []byte("a"), []byte("v"))
	leader := c.mustLeaderOf([]byte("m"))
	var follower *Store
	c.waitFor(10*time.Second, "a follower knows the leader", func() bool {
		for _, s := range c.all() {
			if st := s.Regions(); s != leader && len(st) == 1 && st[0].LeaderStoreID == leader.ID() {
				follower = s
				return true
			}
		}
		return false
	})
	var nl *region.NotLeaderError
	if err := follower.EnsureBoundaries(ctx, []byte("m")); !errors.As(err, &nl) || nl.Leader == nil || nl.Leader.StoreID != leader.ID() {
		t.Fatalf("a follower: %v, want NotLeader naming store %d", err, leader.ID())
	}
	if err := leader.EnsureBoundaries(ctx, []byte("m")); err != nil {
		t.Fatalf("the leader: %v", err)
	}
	c.waitFor(10*time.Second, "the follower answers nil", func() bool { return follower.EnsureBoundaries(ctx, []byte("m")) == nil })
}

// TestSplitCheckKeepsARangeWhole: the automatic split check, on a running
// cluster, splits a region holding a big kept range around it, never
// inside.
func TestSplitCheckKeepsARangeWhole(t *testing.T) {
	c := newMiniCluster(t, 3, func(cfg *Config) {
		cfg.KeepWhole = keep("k", "l")
		cfg.SplitCheckInterval = 20 * time.Millisecond
		cfg.SplitMaxKeys = 100
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.load(ctx, "a", 120, 8)
	c.load(ctx, "k", 400, 8)
	c.load(ctx, "m", 120, 8)
	// isolated reports whether a leader holds [k, l) as a region, and
	// fails the test at once if any region cuts it.
	isolated := func() bool {
		found := false
		for _, s := range c.all() {
			for _, st := range s.Regions() {
				for _, b := range [][]byte{st.Region.StartKey, st.Region.EndKey} {
					if bytes.Compare(b, []byte("k")) > 0 && bytes.Compare(b, []byte("l")) < 0 {
						t.Fatalf("store %d: region %s cuts [k, l)", s.ID(), st.Region.String())
					}
				}
				found = found || (st.IsLeader && string(st.Region.StartKey) == "k" && string(st.Region.EndKey) == "l")
			}
		}
		return found
	}
	c.waitFor(30*time.Second, "the split check makes [k, l) a region", isolated)
	// Let it go on a while: nothing may ever cut [k, l).
	for range 30 {
		time.Sleep(10 * time.Millisecond) // a pace: the split check runs on
		isolated()
	}
	if n := len(c.store(1).Regions()); n < 4 {
		t.Fatalf("%d regions: the split check split too little for the test to mean much", n)
	}
}
