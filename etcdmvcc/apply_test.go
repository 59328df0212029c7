package etcdmvcc

import (
	"errors"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"
)

func put(key, value string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: []byte(value)}}}
}

func txn(cmps []*pb.Compare, then, els []*pb.RequestOp) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Compare: cmps, Success: then, Failure: els}}}
}

func rangeOp(key, end string, rev int64) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(key), RangeEnd: []byte(end), Revision: rev}}}
}

// mustApply applies and commits req at rev.
func mustApply(t *testing.T, ms *MemStore, rev int64, req *pb.RequestOp) *pb.ResponseOp {
	t.Helper()
	resp, writes, _, err := Apply(ms, rev, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := Commit(ms, writes); err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestApplyArguments(t *testing.T) {
	ms := NewMemStore()
	if _, _, _, err := Apply(ms, 0, put("a", "1")); err == nil {
		t.Error("Apply at revision 0 succeeded")
	}
	for _, req := range []*pb.RequestOp{nil, {}} {
		if _, _, _, err := Apply(ms, 2, req); err != ErrEmptyRequest {
			t.Errorf("Apply(%v) = %v, want ErrEmptyRequest", req, err)
		}
	}
	// Messages gRPC would never leave nil read as empty: no panic.
	for _, req := range []*pb.RequestOp{
		{Request: &pb.RequestOp_RequestPut{}},
		{Request: &pb.RequestOp_RequestDeleteRange{}},
		{Request: &pb.RequestOp_RequestRange{}},
		{Request: &pb.RequestOp_RequestTxn{}},
		txn([]*pb.Compare{nil}, nil, []*pb.RequestOp{nil, {}, {Request: &pb.RequestOp_RequestTxn{}}}),
	} {
		if _, _, _, err := Apply(ms, 2, req); err != nil {
			t.Errorf("Apply(%v): %v", req, err)
		}
	}
}

// Apply reads and never writes; the same request on the same state gives
// the same answer, writes and events.
func TestApplyPureAndDeterministic(t *testing.T) {
	ms := NewMemStore()
	mustApply(t, ms, 2, put("a", "1"))
	mustApply(t, ms, 3, put("b", "1"))
	req := txn([]*pb.Compare{{Key: []byte("a"), Target: pb.Compare_VALUE, TargetUnion: &pb.Compare_Value{Value: []byte("1")}}},
		[]*pb.RequestOp{
			put("c", "1"),
			{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("a"), RangeEnd: []byte("c"), PrevKv: true}}},
			rangeOp("a", "\x00", 0),
		}, nil)
	r1, w1, e1, err1 := Apply(ms, 4, req)
	before := ms.HistoryLen()
	r2, w2, e2, err2 := Apply(ms, 4, req)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if ms.HistoryLen() != before || before != 2 {
		t.Fatalf("Apply wrote to the view: %d history records", ms.HistoryLen())
	}
	if rec, ok, _ := ms.Get([]byte("c")); ok {
		t.Fatalf("Apply wrote c: %v", rec)
	}
	if !proto.Equal(r1, r2) || len(w1) != 3 || len(w2) != 3 || len(e1) != 3 || len(e2) != 3 {
		t.Fatalf("two runs differ: %v / %v, %d/%d writes", r1, r2, len(w1), len(w2))
	}
	for i := range w1 {
		if string(w1[i].Key) != string(w2[i].Key) || w1[i].Rev != w2[i].Rev || w1[i].Rec.Kind != w2[i].Rec.Kind ||
			e1[i].Rev != e2[i].Rev || !proto.Equal(e1[i].Event, e2[i].Event) {
			t.Fatalf("write %d: %+v / %+v", i, w1[i], w2[i])
		}
	}
}

// etcd's compareKV: a union member that is not the target's compares the
// target against 0; an unknown result holds; an unknown target compares
// equal.
func TestCompareOddities(t *testing.T) {
	ms := NewMemStore()
	mustApply(t, ms, 2, put("a", "1"))
	for _, tc := range []struct {
		name string
		c    *pb.Compare
		want bool
	}{
		{"version with a value union", &pb.Compare{Key: []byte("a"), Target: pb.Compare_VERSION, Result: pb.Compare_GREATER, TargetUnion: &pb.Compare_Value{Value: []byte("9")}}, true},
		{"value with a version union", &pb.Compare{Key: []byte("a"), Target: pb.Compare_VALUE, Result: pb.Compare_GREATER, TargetUnion: &pb.Compare_Version{Version: 9}}, true},
		{"no union", &pb.Compare{Key: []byte("a"), Target: pb.Compare_MOD, Result: pb.Compare_GREATER}, true},
		{"unknown result", &pb.Compare{Key: []byte("a"), Target: pb.Compare_VERSION, Result: 9, TargetUnion: &pb.Compare_Version{Version: 5}}, true},
		{"unknown target", &pb.Compare{Key: []byte("a"), Target: 9, Result: pb.Compare_EQUAL}, true},
		{"unknown target, not equal", &pb.Compare{Key: []byte("a"), Target: 9, Result: pb.Compare_NOT_EQUAL}, false},
		{"missing key, value", &pb.Compare{Key: []byte("x"), Target: pb.Compare_VALUE, Result: pb.Compare_NOT_EQUAL, TargetUnion: &pb.Compare_Value{Value: []byte("1")}}, false},
		{"empty range, lease", &pb.Compare{Key: []byte("b"), RangeEnd: []byte("a"), Target: pb.Compare_LEASE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Lease{Lease: 0}}, true},
	} {
		resp, _, _, err := Apply(ms, 3, txn([]*pb.Compare{tc.c}, nil, nil))
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetResponseTxn().Succeeded; got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A View's errors come back from Apply and Range as they are.
type failingView struct {
	*MemStore
	err error
}

func (f failingView) Get([]byte) (Record, bool, error) { return Record{}, false, f.err }
func (f failingView) Scan([]byte, []byte, func([]byte, Record) bool) error {
	return f.err
}
func (f failingView) GetAt([]byte, int64) (Record, bool, error) { return Record{}, false, f.err }
func (f failingView) ScanAt([]byte, []byte, int64, func([]byte, Record) bool) error {
	return f.err
}

func TestViewErrors(t *testing.T) {
	boom := errors.New("boom")
	v := failingView{NewMemStore(), boom}
	for _, req := range []*pb.RequestOp{
		{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("a"), PrevKv: true}}},
		{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("a"), IgnoreValue: true}}},
		{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("a"), RangeEnd: []byte{0}}}},
		txn([]*pb.Compare{{Key: []byte("a")}}, nil, nil),
		txn(nil, []*pb.RequestOp{rangeOp("a", "", 0)}, nil),
		txn(nil, []*pb.RequestOp{rangeOp("a", "b", 1)}, nil),
		rangeOp("a", "\x00", 0),
	} {
		if _, writes, _, err := Apply(v, 2, req); err != boom || writes != nil {
			t.Errorf("Apply(%v) = %v, %d writes", req, err, len(writes))
		}
	}
	if _, err := Range(v, &pb.RangeRequest{Key: []byte("a")}, 1); err != boom {
		t.Errorf("Range at 1: %v", err)
	}
}

// Revisions need not be dense (hedgekv's come from a timestamp oracle):
// what Apply computes from rev and rev-1 holds for any rising sequence.
func TestSparseRevisions(t *testing.T) {
	ms := NewMemStore()
	mustApply(t, ms, 1000, put("a", "1"))
	mustApply(t, ms, 5000, put("a", "2"))
	resp := mustApply(t, ms, 9000, txn(nil, []*pb.RequestOp{
		rangeOp("a", "", 3000), // history: a as of 3000
		rangeOp("a", "", 0),    // now, before the put: header 8999
		put("b", "1"),
		rangeOp("b", "", 0), // after it: header 9000
	}, nil))
	rs := resp.GetResponseTxn().Responses
	if kv := rs[0].GetResponseRange().Kvs[0]; string(kv.Value) != "1" || kv.ModRevision != 1000 || kv.Version != 1 {
		t.Errorf("a at 3000: %v", kv)
	}
	if h := rs[1].GetResponseRange().Header.Revision; h != 8999 {
		t.Errorf("a range before the Txn's change: header %d", h)
	}
	if kv := rs[3].GetResponseRange(); kv.Header.Revision != 9000 || kv.Kvs[0].CreateRevision != 9000 {
		t.Errorf("b after its put: %v", kv)
	}
	if rec, ok, _ := ms.GetAt([]byte("a"), 4999); !ok || string(rec.Value) != "1" {
		t.Errorf("a at 4999: %v %v", rec, ok)
	}
	// A Range in a Txn at revision rev-1 is allowed, rev is in the future.
	if _, _, _, err := Apply(ms, 9500, txn(nil, []*pb.RequestOp{rangeOp("a", "", 9499)}, nil)); err != nil {
		t.Errorf("range at rev-1: %v", err)
	}
	if _, _, _, err := Apply(ms, 9500, txn(nil, []*pb.RequestOp{rangeOp("a", "", 9500)}, nil)); err == nil {
		t.Error("range at rev accepted")
	}
}
