package etcdmvcc

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// MemStore's View against the plainest model: a copy of the whole state
// after every revision. Every Get, Scan, GetAt and ScanAt (over random
// ranges, stopping early at random) must agree with it.
func TestMemStoreView(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	keys := []string{"a", "a/1", "a/2", "b", "c", "c\x00", "d"}
	ms := NewMemStore()
	ms.GrantLease(1)
	states := map[int64]map[string]Record{1: {}}
	rev := int64(1)
	for range 400 {
		k := []byte(keys[rnd.IntN(len(keys))])
		req := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k, Value: []byte{byte(rnd.IntN(256))}, Lease: rnd.Int64N(2)}}}
		if rnd.IntN(3) == 0 {
			end := []byte(keys[rnd.IntN(len(keys))])
			if rnd.IntN(3) == 0 {
				end = nil
			}
			req = &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: k, RangeEnd: end}}}
		}
		_, writes, _, err := Apply(ms, rev+1, req)
		if err != nil {
			t.Fatal(err)
		}
		if len(writes) == 0 {
			continue
		}
		rev++
		next := maps.Clone(states[rev-1])
		for _, w := range writes {
			if rec, ok := w.Current(); ok {
				next[string(w.Key)] = rec
			} else {
				delete(next, string(w.Key))
			}
		}
		states[rev] = next
		if err := Commit(ms, writes); err != nil {
			t.Fatal(err)
		}
	}

	type kr struct {
		key string
		rec Record
	}
	model := func(state map[string]Record, start, end []byte, limit int) []kr {
		var out []kr
		for _, k := range slices.Sorted(maps.Keys(state)) {
			if k >= string(start) && (end == nil || k < string(end)) && len(out) < limit {
				out = append(out, kr{k, state[k]})
			}
		}
		return out
	}
	collect := func(scan func(fn func([]byte, Record) bool) error, limit int) []kr {
		var out []kr
		if err := scan(func(k []byte, r Record) bool {
			out = append(out, kr{string(k), r})
			return len(out) < limit
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	same := func(a, b []kr) bool {
		return slices.EqualFunc(a, b, func(x, y kr) bool {
			return x.key == y.key && fmt.Sprint(x.rec) == fmt.Sprint(y.rec)
		})
	}
	bounds := append([]string{""}, keys...)
	for at := int64(1); at <= rev; at++ {
		for range 20 {
			start := []byte(bounds[rnd.IntN(len(bounds))])
			var end []byte
			if rnd.IntN(4) != 0 {
				end = []byte(bounds[rnd.IntN(len(bounds))])
			}
			limit := 1 + rnd.IntN(len(keys)+1)
			want := model(states[at], start, end, limit)
			got := collect(func(fn func([]byte, Record) bool) error { return ms.ScanAt(start, end, at, fn) }, limit)
			if !same(got, want) {
				t.Fatalf("ScanAt(%q, %q, %d) limit %d = %v, want %v", start, end, at, limit, got, want)
			}
			if at == rev {
				got := collect(func(fn func([]byte, Record) bool) error { return ms.Scan(start, end, fn) }, limit)
				if !same(got, want) {
					t.Fatalf("Scan(%q, %q) limit %d = %v, want %v", start, end, limit, got, want)
				}
			}
		}
		for _, k := range keys {
			want, wantOK := states[at][k]
			got, ok, err := ms.GetAt([]byte(k), at)
			if err != nil || ok != wantOK || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("GetAt(%q, %d) = %v %v %v, want %v %v", k, at, got, ok, err, want, wantOK)
			}
			if at == rev {
				got, ok, _ := ms.Get([]byte(k))
				if ok != wantOK || fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("Get(%q) = %v %v, want %v %v", k, got, ok, want, wantOK)
				}
			}
		}
	}
}

// MemStore keeps copies: a caller reusing its buffers changes nothing.
func TestMemStoreCopies(t *testing.T) {
	ms := NewMemStore()
	key, val := []byte("k"), []byte("v")
	if err := Commit(ms, []Write{{Key: key, Rev: Revision{2, 0}, Rec: HistRecord{Kind: KindPut, CreateRev: 2, Version: 1, Value: val}}}); err != nil {
		t.Fatal(err)
	}
	key[0], val[0] = 'X', 'X'
	rec, ok, _ := ms.Get([]byte("k"))
	hrec, hok, _ := ms.GetAt([]byte("k"), 2)
	if !ok || !hok || !bytes.Equal(rec.Value, []byte("v")) || !bytes.Equal(hrec.Value, []byte("v")) {
		t.Fatalf("after the caller's buffers changed: %v %v, %v %v", rec, ok, hrec, hok)
	}
}
