// Package etcdmvcctest checks a stored etcdmvcc.View and Writer (hedgekv's
// bbolt one, to come) against etcdmvcc.MemStore, whose answers the
// differential test holds to a real etcd's.
package etcdmvcctest

import (
	"bytes"
	"fmt"
	"math/rand/v2"

	"github.com/hedgekv/hedgekv/etcdmvcc"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"
)

// Store is a View and a Writer over one state, and its compaction.
type Store interface {
	etcdmvcc.View
	etcdmvcc.Writer
	// Compact records rev as the compaction revision and removes the history
	// records etcdmvcc.CompactPrefix allows.
	Compact(rev int64) error
}

// Check applies n random requests (seeded) to s and to a new MemStore, at
// revisions 2, 3, ...: Apply on each must give the same response and
// writes, which are committed to both; now and then both are compacted.
// After every request it compares what the two answer: Get of every key,
// Scan and ScanAt over random ranges stopped at random points, GetAt at
// random held revisions, CompactRev, and Range requests. s must start
// empty and never compacted. Check returns the first difference.
func Check(s Store, seed uint64, n int) error {
	c := &checker{s: s, ref: etcdmvcc.NewMemStore(), rnd: rand.New(rand.NewPCG(seed, 0x657463)), rev: 1}
	for i := range n {
		if err := c.step(); err != nil {
			return fmt.Errorf("etcdmvcctest: request %d (seed %d, revision %d): %w", i, seed, c.rev, err)
		}
	}
	return nil
}

// viewOnly hides all but the View: leases are a lessor's, not storage's,
// and go unchecked here.
type viewOnly struct{ etcdmvcc.View }

type checker struct {
	s   Store
	ref *etcdmvcc.MemStore
	rnd *rand.Rand
	rev int64
}

var keys = []string{"a", "a/1", "a/2", "a\x00", "b", "b/1", "c", "d", "k", "k/1", "k/2", "z", "\xff"}

func (c *checker) key() []byte { return []byte(keys[c.rnd.IntN(len(keys))]) }

func (c *checker) end() []byte {
	switch c.rnd.IntN(4) {
	case 0:
		return nil
	case 1:
		return []byte{0}
	}
	return c.key()
}

func (c *checker) op(depth int) *pb.RequestOp {
	switch c.rnd.IntN(6) {
	case 0:
		return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: c.key(), RangeEnd: c.end(), PrevKv: true}}}
	case 1:
		if depth < 2 {
			t := &pb.TxnRequest{Compare: []*pb.Compare{{Key: c.key(), RangeEnd: c.end(), Target: pb.Compare_VERSION,
				Result: pb.Compare_CompareResult(c.rnd.IntN(4)), TargetUnion: &pb.Compare_Version{Version: c.rnd.Int64N(3)}}}}
			for range c.rnd.IntN(4) {
				t.Success = append(t.Success, c.op(depth+1))
			}
			for range c.rnd.IntN(3) {
				t.Failure = append(t.Failure, c.op(depth+1))
			}
			return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: t}}
		}
		fallthrough
	case 2:
		return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: c.rangeReq(true)}}
	}
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
		Key: c.key(), Value: []byte{byte(c.rnd.IntN(4))}, Lease: 5 * c.rnd.Int64N(2), PrevKv: true,
	}}}
}

func (c *checker) rangeReq(inTxn bool) *pb.RangeRequest {
	r := &pb.RangeRequest{Key: c.key(), RangeEnd: c.end(), Limit: c.rnd.Int64N(4),
		SortOrder: pb.RangeRequest_SortOrder(c.rnd.IntN(3)), SortTarget: pb.RangeRequest_SortTarget(c.rnd.IntN(5)),
		KeysOnly: c.rnd.IntN(4) == 0, CountOnly: c.rnd.IntN(6) == 0}
	if inTxn && c.rnd.IntN(3) == 0 {
		r.Revision = c.heldRev()
	}
	return r
}

// heldRev is a revision reads may ask for: compacted or later, not future.
func (c *checker) heldRev() int64 {
	low := max(c.ref.CompactRev(), 1)
	return low + c.rnd.Int64N(c.rev-low+1)
}

func (c *checker) step() error {
	req := c.op(0)
	if etcdmvcc.CheckRequest(req, etcdmvcc.DefaultMaxTxnOps) != nil {
		return nil
	}
	wantResp, wantWrites, _, wantErr := etcdmvcc.Apply(viewOnly{c.ref}, c.rev+1, req)
	gotResp, gotWrites, _, gotErr := etcdmvcc.Apply(viewOnly{c.s}, c.rev+1, req)
	if (wantErr == nil) != (gotErr == nil) || !proto.Equal(wantResp, gotResp) || !sameWrites(wantWrites, gotWrites) {
		return fmt.Errorf("Apply(%v): %v %v %v, MemStore %v %v %v", req, gotResp, gotWrites, gotErr, wantResp, wantWrites, wantErr)
	}
	if len(wantWrites) > 0 {
		c.rev++
		if err := etcdmvcc.Commit(c.ref, wantWrites); err != nil {
			return err
		}
		if err := etcdmvcc.Commit(c.s, wantWrites); err != nil {
			return fmt.Errorf("Commit: %w", err)
		}
	}
	if c.rnd.IntN(40) == 0 && c.rev > 3 {
		at := c.rev - c.rnd.Int64N(3)
		if etcdmvcc.CheckCompact(at, c.ref.CompactRev(), c.rev) == nil {
			if err := c.ref.Compact(at); err != nil {
				return err
			}
			if err := c.s.Compact(at); err != nil {
				return fmt.Errorf("Compact(%d): %w", at, err)
			}
		}
	}
	return c.compare()
}

func sameWrites(a, b []etcdmvcc.Write) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i].Key, b[i].Key) || a[i].Rev != b[i].Rev || !bytes.Equal(a[i].Rec.Encode(), b[i].Rec.Encode()) {
			return false
		}
	}
	return true
}

type kr struct {
	key []byte
	rec etcdmvcc.Record
}

func (x kr) String() string { return fmt.Sprintf("%q:%+v", x.key, x.rec) }

func collect(scan func(fn func([]byte, etcdmvcc.Record) bool) error, limit int) ([]kr, error) {
	var out []kr
	err := scan(func(k []byte, r etcdmvcc.Record) bool {
		out = append(out, kr{bytes.Clone(k), r})
		return len(out) < limit
	})
	return out, err
}

func sameKR(a, b []kr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i].key, b[i].key) || !bytes.Equal(a[i].rec.Encode(), b[i].rec.Encode()) {
			return false
		}
	}
	return true
}

func (c *checker) compare() error {
	if got, want := c.s.CompactRev(), c.ref.CompactRev(); got != want {
		return fmt.Errorf("CompactRev() = %d, MemStore %d", got, want)
	}
	at := c.heldRev()
	for _, k := range keys {
		want, wantOK, _ := c.ref.Get([]byte(k))
		got, ok, err := c.s.Get([]byte(k))
		if err != nil || ok != wantOK || !bytes.Equal(got.Encode(), want.Encode()) && ok {
			return fmt.Errorf("Get(%q) = %+v %v %v, MemStore %+v %v", k, got, ok, err, want, wantOK)
		}
		want, wantOK, _ = c.ref.GetAt([]byte(k), at)
		got, ok, err = c.s.GetAt([]byte(k), at)
		if err != nil || ok != wantOK || !bytes.Equal(got.Encode(), want.Encode()) && ok {
			return fmt.Errorf("GetAt(%q, %d) = %+v %v %v, MemStore %+v %v", k, at, got, ok, err, want, wantOK)
		}
	}
	for range 4 {
		start, end := c.key(), c.end()
		if len(end) == 0 || end[0] == 0 {
			end = nil
		}
		limit := 1 + c.rnd.IntN(len(keys))
		want, _ := collect(func(fn func([]byte, etcdmvcc.Record) bool) error { return c.ref.Scan(start, end, fn) }, limit)
		got, err := collect(func(fn func([]byte, etcdmvcc.Record) bool) error { return c.s.Scan(start, end, fn) }, limit)
		if err != nil || !sameKR(got, want) {
			return fmt.Errorf("Scan(%q, %q) stopped after %d = %v %v, MemStore %v", start, end, limit, got, err, want)
		}
		want, _ = collect(func(fn func([]byte, etcdmvcc.Record) bool) error { return c.ref.ScanAt(start, end, at, fn) }, limit)
		got, err = collect(func(fn func([]byte, etcdmvcc.Record) bool) error { return c.s.ScanAt(start, end, at, fn) }, limit)
		if err != nil || !sameKR(got, want) {
			return fmt.Errorf("ScanAt(%q, %q, %d) stopped after %d = %v %v, MemStore %v", start, end, at, limit, got, err, want)
		}
		r := c.rangeReq(false)
		for _, rev := range []int64{0, at} {
			want, wantErr := etcdmvcc.Range(c.ref, r, rev)
			got, err := etcdmvcc.Range(c.s, r, rev)
			if (err == nil) != (wantErr == nil) || !proto.Equal(got, want) {
				return fmt.Errorf("Range(%v, %d) = %v %v, MemStore %v %v", r, rev, got, err, want, wantErr)
			}
		}
	}
	return nil
}
