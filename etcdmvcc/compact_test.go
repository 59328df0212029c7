package etcdmvcc

import (
	"math/rand/v2"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// The keyIndex example of etcd's server/storage/mvcc/key_index.go:
// put(1.0); put(2.0); tombstone(3.0); put(4.0); tombstone(5.0), compacted
// at 2, 4, 5 and 6, plus the revisions between.
func TestCompactPrefixEtcdExample(t *testing.T) {
	hist := []HistRef{{Rev: Revision{1, 0}}, {Rev: Revision{2, 0}}, {Rev: Revision{3, 0}, Delete: true}, {Rev: Revision{4, 0}}, {Rev: Revision{5, 0}, Delete: true}}
	for _, tc := range []struct {
		at   int64
		keep []int64 // the Main of what stays
	}{
		{0, []int64{1, 2, 3, 4, 5}},
		{1, []int64{1, 2, 3, 4, 5}},
		{2, []int64{2, 3, 4, 5}}, // etcd: {2.0, 3.0(t)}, {4.0, 5.0(t)}
		{3, []int64{3, 4, 5}},    // the tombstone at exactly 3 stays
		{4, []int64{4, 5}},       // etcd: {4.0, 5.0(t)}
		{5, []int64{5}},          // etcd: {5.0(t)}
		{6, nil},                 // etcd: the key index goes
		{100, nil},
	} {
		n := CompactPrefix(hist, tc.at)
		var keep []int64
		for _, h := range hist[n:] {
			keep = append(keep, h.Rev.Main)
		}
		if len(keep) != len(tc.keep) || (len(keep) > 0 && keep[0] != tc.keep[0]) {
			t.Errorf("compact at %d keeps %v, want %v", tc.at, keep, tc.keep)
		}
	}
	if n := CompactPrefix(nil, 10); n != 0 {
		t.Errorf("empty history: %d", n)
	}
}

// A put and a deletion of one key at one revision (sibling nested Txns):
// two records; compaction at that revision keeps the deletion only.
func TestCompactPrefixSameRevision(t *testing.T) {
	hist := []HistRef{{Rev: Revision{2, 0}}, {Rev: Revision{7, 0}}, {Rev: Revision{7, 1}, Delete: true}}
	if n := CompactPrefix(hist, 7); n != 2 {
		t.Errorf("compact at 7 removes %d, want 2", n)
	}
	if n := CompactPrefix(hist, 8); n != 3 {
		t.Errorf("compact at 8 removes %d, want 3", n)
	}
	// A deletion then a put at one revision (a DeleteRange to "\x00", then
	// a put, which checkIntervals lets through): the put stays.
	hist = []HistRef{{Rev: Revision{2, 0}}, {Rev: Revision{7, 0}, Delete: true}, {Rev: Revision{7, 1}}}
	if n := CompactPrefix(hist, 9); n != 2 {
		t.Errorf("compact at 9 removes %d, want 2", n)
	}
}

// Compaction changes no answer at or above its revision: random requests
// on two MemStores, one compacted from time to time, read alike at every
// revision still held.
func TestCompactKeepsReads(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 7))
	keys := []string{"a", "b", "c", "d", "e"}
	full, compacted := NewMemStore(), NewMemStore()
	rev := int64(1)
	for step := range 3000 {
		k := keys[rnd.IntN(len(keys))]
		var req *pb.RequestOp
		switch rnd.IntN(4) {
		case 0:
			req = &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(k), RangeEnd: []byte(keys[rnd.IntN(len(keys))])}}}
		case 1:
			// A put and a delete of one key at one revision, now and then.
			req = &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: []*pb.RequestOp{
				{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k)}}}}}}},
				{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(k)}}}}}}},
			}}}}
		default:
			req = &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k), Value: []byte{byte(step)}}}}
		}
		_, writes, _, err := Apply(full, rev+1, req)
		if err != nil {
			t.Fatal(err)
		}
		if len(writes) == 0 {
			continue
		}
		rev++
		if err := Commit(full, writes); err != nil {
			t.Fatal(err)
		}
		if err := Commit(compacted, writes); err != nil {
			t.Fatal(err)
		}
		if rnd.IntN(50) == 0 {
			if err := compacted.Compact(rev - rnd.Int64N(10)); err != nil {
				t.Fatal(err)
			}
		}
		if step%100 != 0 {
			continue
		}
		for at := max(compacted.CompactRev(), 1); at <= rev; at++ {
			for _, r := range []*pb.RangeRequest{{Key: []byte("a"), RangeEnd: []byte{0}}, {Key: []byte(k)}} {
				want, _ := Range(full, r, at)
				got, _ := Range(compacted, r, at)
				if !rangeEqual(want, got) {
					t.Fatalf("at %d after compaction at %d: %v, want %v", at, compacted.CompactRev(), got, want)
				}
			}
		}
	}
	if compacted.HistoryLen() >= full.HistoryLen() {
		t.Fatalf("compaction removed nothing: %d records, %d uncompacted", compacted.HistoryLen(), full.HistoryLen())
	}
}

func rangeEqual(a, b *pb.RangeResponse) bool {
	if a.Count != b.Count || a.More != b.More || len(a.Kvs) != len(b.Kvs) {
		return false
	}
	for i := range a.Kvs {
		if fmtKV(a.Kvs[i]) != fmtKV(b.Kvs[i]) {
			return false
		}
	}
	return true
}
