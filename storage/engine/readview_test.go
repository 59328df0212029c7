package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hedgekv/hedgekv/storage/wal"
)

// round runs fn as one of the Ready loop's rounds (no WAL record).
func round(t testing.TB, e *Engine, fn func(tx *Tx) error) {
	t.Helper()
	if err := e.Round(func() []wal.Item { return nil }, nil, fn); err != nil {
		t.Fatal(err)
	}
}

// writes is a round's user writes: "k=v" puts, "-k" deletes.
func writes(ops ...string) func(tx *Tx) error {
	return func(tx *Tx) error {
		for _, op := range ops {
			var err error
			if k, ok := strings.CutPrefix(op, "-"); ok {
				err = tx.Delete([]byte(k))
			} else {
				k, v, _ := strings.Cut(op, "=")
				err = tx.Put([]byte(k), []byte(v))
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// snapScan is everything s shows in [start, end), as "k=v".
func snapScan(t testing.TB, s *Snapshot, start, end string) []string {
	t.Helper()
	var got []string
	if err := s.Scan(context.Background(), []byte(start), []byte(end), func(k, v []byte) bool {
		got = append(got, string(k)+"="+string(v))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// A snapshot shows exactly the rounds applied before it was taken, whether
// they are committed to the file or only in the overlay, and nothing of
// the rounds after it, across commits; deleted keys are hidden.
func TestSnapshotShowsRoundsBeforeIt(t *testing.T) {
	e := testEngine(t)
	snaps := map[string]*Snapshot{}
	take := func(name string) {
		s, err := e.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Release)
		snaps[name] = s
	}
	round(t, e, writes("a=1", "b=1", "c=1"))
	if err := e.CheckpointIfDue(true); err != nil { // a, b, c in the file
		t.Fatal(err)
	}
	take("committed")
	round(t, e, writes("-a", "b=2", "d=2")) // in the open batch and the overlay
	take("staged")
	round(t, e, writes("b=3", "-d", "e=3", "-zz"))
	take("staged twice")
	if err := e.CheckpointIfDue(true); err != nil {
		t.Fatal(err)
	}
	take("after commit")
	round(t, e, writes("a=4", "-c", "f=4"))
	take("staged after commit")

	tests := []struct {
		snap string
		want []string // every pair, in key order
	}{
		{"committed", []string{"a=1", "b=1", "c=1"}},
		{"staged", []string{"b=2", "c=1", "d=2"}},
		{"staged twice", []string{"b=3", "c=1", "e=3"}},
		{"after commit", []string{"b=3", "c=1", "e=3"}},
		{"staged after commit", []string{"a=4", "b=3", "e=3", "f=4"}},
	}
	for _, tt := range tests {
		t.Run(tt.snap, func(t *testing.T) {
			s := snaps[tt.snap]
			if got := snapScan(t, s, "", ""); !slices.Equal(got, tt.want) {
				t.Errorf("scan = %v, want %v", got, tt.want)
			}
			want := map[string]string{}
			for _, kv := range tt.want {
				k, v, _ := strings.Cut(kv, "=")
				want[k] = v
			}
			for _, k := range []string{"a", "b", "c", "d", "e", "f", "zz", ""} {
				v, found, err := s.Get([]byte(k))
				if err != nil {
					t.Fatal(err)
				}
				if wv, ok := want[k]; found != ok || string(v) != wv {
					t.Errorf("get %q = %q %v, want %q %v", k, v, found, wv, ok)
				}
			}
			// Sub-ranges: the merge starts and stops inside both sources.
			for _, r := range [][2]string{{"b", "e"}, {"c", ""}, {"a", "b"}, {"d", "d"}, {"e", "c"}} {
				var sub []string
				for _, kv := range tt.want {
					if kv[:1] >= r[0] && (r[1] == "" || kv[:1] < r[1]) {
						sub = append(sub, kv)
					}
				}
				if got := snapScan(t, s, r[0], r[1]); !slices.Equal(got, sub) {
					t.Errorf("scan [%q, %q) = %v, want %v", r[0], r[1], got, sub)
				}
			}
		})
	}
}

// A round's Tx.Get reads the open batch: the rounds since the last commit
// and its own writes so far; a read transaction's reads committed state.
func TestTxGetReadsTheBatch(t *testing.T) {
	e := testEngine(t)
	round(t, e, writes("a=1", "b=1"))
	if err := e.CheckpointIfDue(true); err != nil {
		t.Fatal(err)
	}
	round(t, e, writes("a=2", "-b"))
	read := func(tx *Tx, k string) string {
		v, found := tx.Get([]byte(k))
		if !found {
			return "-"
		}
		return string(v)
	}
	round(t, e, func(tx *Tx) error {
		for _, c := range []struct{ key, want string }{{"a", "2"}, {"b", "-"}, {"c", "-"}} {
			if got := read(tx, c.key); got != c.want {
				t.Errorf("round: get %s = %s, want %s (an earlier round's)", c.key, got, c.want)
			}
		}
		if err := tx.Put([]byte("c"), []byte("3")); err != nil {
			return err
		}
		if got := read(tx, "c"); got != "3" {
			t.Errorf("round: get c = %s after its own put, want 3", got)
		}
		return nil
	})
	if err := e.View(func(tx *Tx) error {
		if got := read(tx, "a"); got != "1" {
			t.Errorf("view: get a = %s, want the committed 1", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// Snapshots against a model: random rounds and commits, snapshots taken
// between them (some concurrently with each other and with the rounds),
// each read in full, in pieces and key by key after everything else was
// written, must show the model as of its taking.
func TestSnapshotMatchesModel(t *testing.T) {
	e := testEngine(t)
	rng := rand.New(rand.NewSource(1))
	model := map[string]string{}
	type taken struct {
		s    *Snapshot
		want map[string]string
	}
	var snaps []taken
	for i := range 200 {
		var ops []string
		for range 1 + rng.Intn(8) {
			k := fmt.Sprintf("k%02d", rng.Intn(40))
			if rng.Intn(3) == 0 {
				ops = append(ops, "-"+k)
				delete(model, k)
			} else {
				v := fmt.Sprint(i)
				ops = append(ops, k+"="+v)
				model[k] = v
			}
		}
		round(t, e, writes(ops...))
		if rng.Intn(5) == 0 {
			if err := e.CheckpointIfDue(true); err != nil {
				t.Fatal(err)
			}
		}
		if rng.Intn(4) == 0 {
			// Two at once: clones of one overlay must not race.
			var wg sync.WaitGroup
			got := make([]*Snapshot, 2)
			for j := range got {
				wg.Go(func() {
					s, err := e.Snapshot()
					if err != nil {
						t.Error(err)
						return
					}
					got[j] = s
				})
			}
			wg.Wait()
			for _, s := range got {
				if s != nil {
					snaps = append(snaps, taken{s, maps.Clone(model)})
				}
			}
		}
	}
	for i, sn := range snaps {
		var want []string
		for _, k := range slices.Sorted(maps.Keys(sn.want)) {
			want = append(want, k+"="+sn.want[k])
		}
		if got := snapScan(t, sn.s, "", ""); !slices.Equal(got, want) {
			t.Fatalf("snapshot %d: scan\n got %v\nwant %v", i, got, want)
		}
		// Stopping early: the first n pairs from a random start.
		start := fmt.Sprintf("k%02d", rng.Intn(40))
		n := 1 + rng.Intn(10)
		var got, wantN []string
		if err := sn.s.Scan(context.Background(), []byte(start), nil, func(k, v []byte) bool {
			got = append(got, string(k)+"="+string(v))
			return len(got) < n
		}); err != nil {
			t.Fatal(err)
		}
		for _, kv := range want {
			if kv >= start && len(wantN) < n {
				wantN = append(wantN, kv)
			}
		}
		if !slices.Equal(got, wantN) {
			t.Fatalf("snapshot %d: %d from %s: got %v, want %v", i, n, start, got, wantN)
		}
		for k := range 40 {
			key := fmt.Sprintf("k%02d", k)
			v, found, err := sn.s.Get([]byte(key))
			if wv, ok := sn.want[key]; err != nil || found != ok || string(v) != wv {
				t.Fatalf("snapshot %d: get %s = %q %v %v, want %q %v", i, key, v, found, err, wv, ok)
			}
		}
		sn.s.Release()
	}
}

// Within bounds a snapshot: a Get outside fails, a Scan is clamped;
// bounds only narrow. A released snapshot reads nothing, and a cancelled
// scan stops with ctx's error.
func TestSnapshotBoundsReleaseAndCancel(t *testing.T) {
	e := testEngine(t)
	round(t, e, writes("a=1", "b=1", "c=1", "d=1"))
	s, err := e.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	s.Within([]byte("b"), []byte("d")).Within([]byte("a"), nil) // the second widens nothing
	tests := []struct {
		key     string
		want    string
		outside bool
	}{
		{key: "a", outside: true},
		{key: "b", want: "1"},
		{key: "c", want: "1"},
		{key: "d", outside: true},
	}
	for _, tt := range tests {
		v, _, err := s.Get([]byte(tt.key))
		if tt.outside != errors.Is(err, ErrOutOfBounds) || string(v) != tt.want {
			t.Errorf("get %s = %q, %v; want %q, out of bounds %v", tt.key, v, err, tt.want, tt.outside)
		}
	}
	if got, want := snapScan(t, s, "", ""), []string{"b=1", "c=1"}; !slices.Equal(got, want) {
		t.Errorf("bounded scan = %v, want %v", got, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	if err := s.Scan(ctx, nil, nil, func(k, v []byte) bool { called = true; return true }); !errors.Is(err, context.Canceled) || called {
		t.Errorf("cancelled scan: %v, fn called %v; want context.Canceled and no call", err, called)
	}
	s.Release()
	s.Release()
	if _, _, err := s.Get([]byte("b")); !errors.Is(err, ErrSnapshotReleased) {
		t.Errorf("get after release: %v, want ErrSnapshotReleased", err)
	}
	if err := s.Scan(context.Background(), nil, nil, func(k, v []byte) bool { return true }); !errors.Is(err, ErrSnapshotReleased) {
		t.Errorf("scan after release: %v, want ErrSnapshotReleased", err)
	}
}
