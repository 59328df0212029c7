package etcdmvcc

import (
	"math/rand/v2"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Requests gRPC cannot carry (nil messages inside a set oneof) read as
// empty ones, and never panic.
func TestCheckRequestNil(t *testing.T) {
	for _, tc := range []struct {
		req  *pb.RequestOp
		want error
	}{
		{nil, ErrEmptyRequest},
		{&pb.RequestOp{}, ErrEmptyRequest},
		{&pb.RequestOp{Request: &pb.RequestOp_RequestPut{}}, rpctypes.ErrGRPCEmptyKey},
		{&pb.RequestOp{Request: &pb.RequestOp_RequestRange{}}, rpctypes.ErrGRPCEmptyKey},
		{&pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{}}, rpctypes.ErrGRPCEmptyKey},
		{&pb.RequestOp{Request: &pb.RequestOp_RequestTxn{}}, nil},
		{&pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
			Compare: []*pb.Compare{nil},
		}}}, rpctypes.ErrGRPCEmptyKey},
		{&pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
			Success: []*pb.RequestOp{nil},
		}}}, rpctypes.ErrGRPCKeyNotFound},
		{&pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
			Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{}}},
		}}}, nil},
	} {
		if got := CheckRequest(tc.req, DefaultMaxTxnOps); got != tc.want {
			t.Errorf("CheckRequest(%v) = %v, want %v", tc.req, got, tc.want)
		}
	}
}

// intervalSet answers "does any added range hold k" as a list of the
// ranges would, whatever the adds, unions and lookups.
func TestIntervalSet(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	keys := []string{"\x00", "a", "a\x00", "ab", "b", "b\x00", "c", "cc", "d", "z", "\xff"}
	type ivl struct{ b, e string }
	holds := func(list []ivl, k string) bool {
		for _, iv := range list {
			if iv.b <= k && k < iv.e {
				return true
			}
		}
		return false
	}
	for round := range 2000 {
		var sets [2]intervalSet
		var lists [2][]ivl
		for step := range 20 {
			i := rnd.IntN(2)
			switch rnd.IntN(4) {
			case 0, 1:
				b, e := keys[rnd.IntN(len(keys))], keys[rnd.IntN(len(keys))]
				sets[i].add(b, e)
				lists[i] = append(lists[i], ivl{b, e})
			case 2:
				sets[i].union(&sets[1-i])
				lists[i] = append(lists[i], lists[1-i]...)
			}
			for _, k := range keys {
				if got, want := sets[i].contains(k), holds(lists[i], k); got != want {
					t.Fatalf("round %d step %d: contains(%q) = %v, want %v; ranges %v", round, step, k, got, want, lists[i])
				}
			}
		}
	}
}

// A nested Txn can only use what its parent leaves of maxTxnOps, however
// deep: each level's budget shrinks by the largest of its three counts.
func TestCheckRequestNestedBudget(t *testing.T) {
	nest := func(depth, width int) *pb.TxnRequest {
		var txn *pb.TxnRequest
		for range depth {
			t := &pb.TxnRequest{}
			for range width {
				t.Success = append(t.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}})
			}
			if txn != nil {
				t.Success[0] = &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: txn}}
			}
			txn = t
		}
		return txn
	}
	for _, tc := range []struct{ depth, width, max int }{
		{1, 128, 128}, {1, 129, 128}, {2, 64, 128}, {2, 65, 128}, {4, 32, 128}, {5, 32, 128}, {128, 1, 128}, {129, 1, 128},
	} {
		err := CheckRequest(&pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: nest(tc.depth, tc.width)}}, tc.max)
		want := tc.depth*tc.width > tc.max
		if (err == rpctypes.ErrGRPCTooManyOps) != want || (err != nil && err != rpctypes.ErrGRPCTooManyOps) {
			t.Errorf("depth %d width %d max %d: %v", tc.depth, tc.width, tc.max, err)
		}
	}
}
