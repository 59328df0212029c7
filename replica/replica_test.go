package replica

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/region"
)

func TestFirstDifference(t *testing.T) {
	kvs := func(pairs ...string) []KV {
		var out []KV
		for i := 0; i+1 < len(pairs); i += 2 {
			out = append(out, KV{Key: []byte(pairs[i]), Value: []byte(pairs[i+1])})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		a, b []KV
		key  string
		ok   bool
	}{
		{"both empty", nil, nil, "", false},
		{"equal", kvs("a", "1", "b", "2"), kvs("a", "1", "b", "2"), "", false},
		{"value differs", kvs("a", "1", "b", "2", "c", "3"), kvs("a", "1", "b", "x", "c", "3"), "b", true},
		{"only in a, middle", kvs("a", "1", "b", "2", "c", "3"), kvs("a", "1", "c", "3"), "b", true},
		{"only in b, middle", kvs("a", "1", "c", "3"), kvs("a", "1", "b", "2", "c", "3"), "b", true},
		{"only in a, tail", kvs("a", "1", "b", "2"), kvs("a", "1"), "b", true},
		{"only in b, tail", kvs("a", "1"), kvs("a", "1", "b", "2"), "b", true},
		{"a empty", nil, kvs("a", "1"), "a", true},
		{"empty value vs none", kvs("a", ""), nil, "a", true},
	} {
		key, ok := FirstDifference(tc.a, tc.b)
		if ok != tc.ok || string(key) != tc.key {
			t.Errorf("%s: FirstDifference = %q %v, want %q %v", tc.name, key, ok, tc.key, tc.ok)
		}
	}
}

// TestPollReplicas: a region is compared again until its replicas are at
// one index, then counted once; a region without digests yet stays
// pending; a mismatch ends the poll at once.
func TestPollReplicas(t *testing.T) {
	r1, r2 := region.Region{ID: 1}, region.Region{ID: 2}
	at := func(store, index uint64, hash byte) Digest {
		d := Digest{StoreID: store, PeerID: store, Region: r1, AppliedIndex: index, AppliedTerm: 1}
		d.Hash[0] = hash
		return d
	}
	list := func(context.Context) ([]region.Region, error) { return []region.Region{r1, r2}, nil }
	round := 0
	var agreed int
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pending, err := Poll(ctx, time.Millisecond, list, func(_ context.Context, r region.Region) ([]Digest, string) {
		if r.ID == 2 {
			round++
			if round < 3 {
				return nil, "store 2 has no replica yet"
			}
			return nil, ""
		}
		if round < 2 {
			return []Digest{at(1, 5, 0), at(2, 4, 0)}, ""
		}
		return []Digest{at(1, 5, 0), at(2, 5, 0)}, ""
	}, func(region.Region, []Digest) { agreed++ })
	if err != nil || len(pending) != 0 || agreed != 2 {
		t.Errorf("agreeing replicas: pending %v, err %v, %d agreed; want none pending, 2 agreed", pending, err, agreed)
	}

	_, err = Poll(ctx, time.Millisecond, list, func(_ context.Context, r region.Region) ([]Digest, string) {
		return []Digest{at(1, 5, 0), at(2, 5, 1)}, ""
	}, nil)
	var mismatch *MismatchError
	if !errors.As(err, &mismatch) {
		t.Errorf("disagreeing replicas: %v, want a *MismatchError", err)
	}

	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	pending, err = Poll(short, time.Millisecond, list, func(_ context.Context, r region.Region) ([]Digest, string) {
		return []Digest{at(1, 5, 0), at(2, 4, 0)}, ""
	}, nil)
	if !errors.Is(err, context.DeadlineExceeded) || len(pending) != 2 || !strings.Contains(pending[1], "no quiet moment") {
		t.Errorf("never at one index: pending %v, err %v", pending, err)
	}
}
