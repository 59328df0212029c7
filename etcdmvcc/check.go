package etcdmvcc

import (
	"github.com/google/btree"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// DefaultMaxTxnOps is etcd's --max-txn-ops default.
const DefaultMaxTxnOps = 128

// CheckRequest is the validation etcd's gRPC layer makes before it proposes
// a request (server/etcdserver/api/v3rpc/key.go, v3.5 to v3.7), returning
// the same rpctypes errors in the same order:
//
//   - Range: an empty key is ErrGRPCEmptyKey; a sort order or target that is
//     not in the enum, ErrGRPCInvalidSortOption.
//   - Put: an empty key; ignore_value with a value, ErrGRPCValueProvided;
//     ignore_lease with a lease, ErrGRPCLeaseProvided.
//   - DeleteRange: an empty key.
//   - Txn: more compares, or more operations in a branch, than maxTxnOps
//     is ErrGRPCTooManyOps, and a nested Txn has maxTxnOps less the largest
//     of its parent's three counts; an empty compare key; each operation as
//     above, and an operation holding nothing is ErrGRPCKeyNotFound; then,
//     branch by branch, a key put twice or put inside a range deleted
//     (nested Txns included), ErrGRPCDuplicateKey (checkIntervals).
//
// A RequestOp holding nothing is ErrEmptyRequest. Checks that need state
// (a lease that does not exist, a missing key with ignore_value) are
// Apply's; request size is the transport's.
func CheckRequest(req *pb.RequestOp, maxTxnOps int) error {
	switch r := req.GetRequest().(type) {
	case *pb.RequestOp_RequestTxn:
		t := orEmptyTxn(r.RequestTxn)
		if err := checkTxn(t, maxTxnOps); err != nil {
			return err
		}
		// After checkTxn, as etcd: it bounds the work checkIntervals does.
		if _, _, err := checkIntervals(t.Success); err != nil {
			return err
		}
		_, _, err := checkIntervals(t.Failure)
		return err
	case nil:
		return ErrEmptyRequest
	}
	return checkOp(req, maxTxnOps)
}

func checkOp(op *pb.RequestOp, maxTxnOps int) error {
	switch r := op.GetRequest().(type) {
	case *pb.RequestOp_RequestRange:
		return checkRange(orEmptyRange(r.RequestRange))
	case *pb.RequestOp_RequestPut:
		return checkPut(orEmptyPut(r.RequestPut))
	case *pb.RequestOp_RequestDeleteRange:
		if len(r.RequestDeleteRange.GetKey()) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
		return nil
	case *pb.RequestOp_RequestTxn:
		return checkTxn(orEmptyTxn(r.RequestTxn), maxTxnOps)
	}
	return rpctypes.ErrGRPCKeyNotFound // etcd's answer to an empty union
}

func checkRange(r *pb.RangeRequest) error {
	if len(r.Key) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	if !validSort(r) {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	return nil
}

func checkPut(r *pb.PutRequest) error {
	switch {
	case len(r.Key) == 0:
		return rpctypes.ErrGRPCEmptyKey
	case r.IgnoreValue && len(r.Value) != 0:
		return rpctypes.ErrGRPCValueProvided
	case r.IgnoreLease && r.Lease != 0:
		return rpctypes.ErrGRPCLeaseProvided
	}
	return nil
}

// checkTxn is etcd's checkTxnRequest.
func checkTxn(t *pb.TxnRequest, maxTxnOps int) error {
	opc := max(len(t.Compare), len(t.Success), len(t.Failure))
	if opc > maxTxnOps {
		return rpctypes.ErrGRPCTooManyOps
	}
	for _, c := range t.Compare {
		if len(c.GetKey()) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
	}
	for _, ops := range [][]*pb.RequestOp{t.Success, t.Failure} {
		for _, op := range ops {
			if err := checkOp(op, maxTxnOps-opc); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkIntervals is etcd's: it returns the keys ops put and the ranges they
// delete, nested Txns included, or ErrGRPCDuplicateKey if a put meets a put
// or a delete it must not. The order of the checks is etcd's, and so is
// what passes: this level's deletes are gathered first; each nested Txn's
// puts are checked against them and against the deletes of the nested Txns
// before it (not after: a nested Txn that puts k followed by one that
// deletes k passes, and both happen), then their deletes join; a key put in
// both branches of one nested Txn is fine (only one runs); this level's
// puts come last, against everything.
func checkIntervals(ops []*pb.RequestOp) (map[string]struct{}, *intervalSet, error) {
	dels := &intervalSet{}
	for _, op := range ops {
		if dr := op.GetRequestDeleteRange(); dr != nil {
			if len(dr.RangeEnd) != 0 {
				dels.add(string(dr.Key), string(dr.RangeEnd))
			} else {
				dels.add(string(dr.Key), string(dr.Key)+"\x00")
			}
		}
	}
	puts := map[string]struct{}{}
	for _, op := range ops {
		t := op.GetRequestTxn()
		if t == nil {
			continue
		}
		putsThen, delsThen, err := checkIntervals(t.Success)
		if err != nil {
			return nil, nil, err
		}
		putsElse, delsElse, err := checkIntervals(t.Failure)
		if err != nil {
			return nil, nil, err
		}
		for k := range putsThen {
			if _, dup := puts[k]; dup || dels.contains(k) {
				return nil, nil, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		for k := range putsElse {
			if _, dup := puts[k]; dup {
				if _, inThen := putsThen[k]; !inThen {
					return nil, nil, rpctypes.ErrGRPCDuplicateKey
				}
			}
			if dels.contains(k) {
				return nil, nil, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		dels.union(delsThen)
		dels.union(delsElse)
	}
	for _, op := range ops {
		p := op.GetRequestPut()
		if p == nil {
			continue
		}
		k := string(p.Key)
		if _, dup := puts[k]; dup || dels.contains(k) {
			return nil, nil, rpctypes.ErrGRPCDuplicateKey
		}
		puts[k] = struct{}{}
	}
	return puts, dels, nil
}

// intervalSet is a union of half-open key ranges [b, e), kept as disjoint
// ranges by start. It answers what etcd's adt.IntervalTree answers in
// checkIntervals (any range holding a key), without its quadratic corner:
// an empty or inverted range ([k, "\x00") among them, range_end "\x00"
// compared as a plain string, as adt.StringAffineComparable does) holds
// nothing in either.
type intervalSet struct {
	t *btree.BTreeG[interval]
}

type interval struct{ b, e string }

func (s *intervalSet) add(b, e string) {
	if b >= e {
		return
	}
	if s.t == nil {
		s.t = btree.NewG(8, func(x, y interval) bool { return x.b < y.b })
	}
	if prev, ok := s.floor(b); ok && prev.e >= b {
		b, e = prev.b, max(e, prev.e)
		s.t.Delete(prev)
	}
	var joined []interval
	s.t.AscendGreaterOrEqual(interval{b: b}, func(it interval) bool {
		if it.b > e {
			return false
		}
		joined = append(joined, it)
		return true
	})
	for _, it := range joined {
		e = max(e, it.e)
		s.t.Delete(it)
	}
	s.t.ReplaceOrInsert(interval{b, e})
}

// floor is the range starting at or before k, the last one that may hold k.
func (s *intervalSet) floor(k string) (interval, bool) {
	var out interval
	found := false
	s.t.DescendLessOrEqual(interval{b: k}, func(it interval) bool {
		out, found = it, true
		return false
	})
	return out, found
}

func (s *intervalSet) contains(k string) bool {
	if s.t == nil {
		return false
	}
	it, ok := s.floor(k)
	return ok && k < it.e
}

func (s *intervalSet) union(o *intervalSet) {
	if o.t == nil {
		return
	}
	o.t.Ascend(func(it interval) bool {
		s.add(it.b, it.e)
		return true
	})
}
