package etcdapi

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestWatchIndexMatchesBruteForce: after random joins and leaves of
// watchers on single keys, ranges and open ranges, the index finds, for
// every key, exactly the watchers a scan of all of them finds.
func TestWatchIndexMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	key := func() []byte { return fmt.Appendf(nil, "k%03d", rng.IntN(200)) }
	x := newWatchIndex()
	var in []*watcher
	seq := uint64(0)
	for step := range 5000 {
		if len(in) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(in))
			x.remove(in[i])
			in = slices.Delete(in, i, i+1)
		} else {
			seq++
			w := &watcher{seq: seq}
			switch rng.IntN(3) {
			case 0:
				w.start, w.single = key(), true
				w.end = append(bytes.Clone(w.start), 0)
			case 1:
				a, b := key(), key()
				if bytes.Compare(a, b) > 0 {
					a, b = b, a
				}
				w.start, w.end = a, b
			default:
				w.start = key() // no end
			}
			x.add(w)
			in = append(in, w)
		}
		if step%50 != 0 {
			continue
		}
		if x.n != len(in) {
			t.Fatalf("step %d: index holds %d, want %d", step, x.n, len(in))
		}
		for k := range 201 {
			probe := fmt.Appendf(nil, "k%03d", k)
			var want []uint64
			for _, w := range in {
				if bytes.Compare(probe, w.start) >= 0 && (w.end == nil || bytes.Compare(probe, w.end) < 0) {
					want = append(want, w.seq)
				}
			}
			var got []uint64
			for _, w := range x.match(probe, nil) {
				got = append(got, w.seq)
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("step %d, key %s: matched %v, want %v", step, probe, got, want)
			}
		}
	}
}
