package etcdmvcc

import (
	"bytes"
	"math"
	"sort"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// RangeSpan maps etcd's key and range_end to the byte range [start, end)
// they name: an empty range_end is key alone ([key, key+"\x00")), "\x00"
// every key ≥ key (end nil), anything else [key, range_end), which is
// empty when range_end ≤ key.
func RangeSpan(key, rangeEnd []byte) (start, end []byte) {
	sp := spanOf(key, rangeEnd)
	if sp.single {
		return key, append(append(make([]byte, 0, len(key)+1), key...), 0)
	}
	return sp.start, sp.end
}

// span is a Range's keys: one key, or [start, end) with end nil for no
// upper bound (etcd's mkGteRange, server/etcdserver/txn/delete.go).
type span struct {
	start, end []byte
	single     bool
}

func spanOf(key, rangeEnd []byte) span {
	switch {
	case len(rangeEnd) == 0:
		return span{start: key, single: true}
	case len(rangeEnd) == 1 && rangeEnd[0] == 0:
		return span{start: key}
	}
	return span{start: key, end: rangeEnd}
}

// reader is what evaluation reads: a View's current records, a View at a
// revision, or a Txn's state so far (overlay).
type reader interface {
	get(key []byte) (Record, bool, error)
	scan(start, end []byte, fn func(key []byte, rec Record) bool) error
}

type currentReader struct{ v View }

func (r currentReader) get(key []byte) (Record, bool, error) { return r.v.Get(key) }
func (r currentReader) scan(start, end []byte, fn func([]byte, Record) bool) error {
	return r.v.Scan(start, end, fn)
}

type atReader struct {
	v   View
	rev int64
}

func (r atReader) get(key []byte) (Record, bool, error) { return r.v.GetAt(key, r.rev) }
func (r atReader) scan(start, end []byte, fn func([]byte, Record) bool) error {
	return r.v.ScanAt(start, end, r.rev, fn)
}

// visit calls fn for every key of sp that r has, in key order.
func visit(r reader, sp span, fn func(key []byte, rec Record) bool) error {
	if !sp.single {
		return r.scan(sp.start, sp.end, fn)
	}
	rec, ok, err := r.get(sp.start)
	if err != nil || !ok {
		return err
	}
	fn(sp.start, rec)
	return nil
}

// ReadRev decides, as etcd's storeTxnCommon.rangeKeys does
// (server/storage/mvcc/kvstore_txn.go), at which revision a Range request
// with revision reqRev reads, given the store's compaction revision
// (View.CompactRev) and current revision: reqRev > currentRev is
// ErrGRPCFutureRev; reqRev ≤ 0 means currentRev; a revision below
// compactRev is ErrGRPCCompacted (compactRev itself is readable). It
// returns 0 when the read is of the current state (reqRev ≤ 0 or
// reqRev == currentRev), for Range to read current records, else reqRev.
func ReadRev(reqRev, compactRev, currentRev int64) (int64, error) {
	if reqRev > currentRev {
		return 0, rpctypes.ErrGRPCFutureRev
	}
	rev := reqRev
	if rev <= 0 {
		rev = currentRev
	}
	if rev < compactRev {
		return 0, rpctypes.ErrGRPCCompacted
	}
	if reqRev <= 0 || reqRev == currentRev {
		return 0, nil
	}
	return reqRev, nil
}

// CheckCompact decides whether a Compact to rev may proceed, as etcd's
// store.updateCompactRev (server/storage/mvcc/kvstore.go): rev ≤ compactRev
// is ErrGRPCCompacted, rev > currentRev ErrGRPCFutureRev.
func CheckCompact(rev, compactRev, currentRev int64) error {
	if rev <= compactRev {
		return rpctypes.ErrGRPCCompacted
	}
	if rev > currentRev {
		return rpctypes.ErrGRPCFutureRev
	}
	return nil
}

// Range answers req from v as etcd's txn.Range (server/etcdserver/txn/range.go)
// does, reading the current records when atRev ≤ 0, else the state as of
// atRev. req.Revision and req.Serializable are not looked at: the caller
// picks atRev (ReadRev decides ErrGRPCCompacted and ErrGRPCFutureRev as
// etcd does) and the replica. The response has no header: the caller fills
// it (etcd's revision is the store's current one, whatever atRev was).
//
// What etcd does, and so Range: count is every key in the range at that
// revision, before the min/max revision filters and the limit; the limit is
// applied after the filters and the sort, and more says it cut; with the
// default order and no filters only limit+1 keys are read, which matters
// when sort_order is NONE but sort_target is not KEY (then those keys, in
// key order, are what is sorted); keys_only drops values, and also leases
// unless sorting by VALUE (etcd 3.7's FastKeysOnly); count_only returns no
// keys; unknown sort enums are ErrGRPCInvalidSortOption.
func Range(v View, req *pb.RangeRequest, atRev int64) (*pb.RangeResponse, error) {
	if atRev > 0 {
		return rangeKVs(atReader{v, atRev}, req)
	}
	return rangeKVs(currentReader{v}, req)
}

func rangeKVs(r reader, req *pb.RangeRequest) (*pb.RangeResponse, error) {
	if req == nil {
		req = &pb.RangeRequest{}
	}
	if !validSort(req) {
		return nil, rpctypes.ErrGRPCInvalidSortOption
	}
	limit := rangeLimit(req)
	fastKeysOnly := req.KeysOnly && req.SortTarget != pb.RangeRequest_VALUE
	var kvs []*mvccpb.KeyValue
	var count int64
	err := visit(r, spanOf(req.Key, req.RangeEnd), func(key []byte, rec Record) bool {
		if !req.CountOnly && (limit <= 0 || int64(len(kvs)) < limit) {
			kv := rec.KeyValue(key)
			if fastKeysOnly {
				kv.Value, kv.Lease = nil, 0
			}
			kvs = append(kvs, kv)
		}
		count++
		return true
	})
	if err != nil {
		return nil, err
	}
	kvs = filterKVs(kvs, req)
	sortKVs(kvs, req)

	resp := &pb.RangeResponse{Count: count}
	if req.Limit > 0 && int64(len(kvs)) > req.Limit {
		kvs = kvs[:req.Limit]
		resp.More = true
	}
	if req.KeysOnly {
		for _, kv := range kvs {
			kv.Value = nil
		}
	}
	resp.Kvs = kvs
	return resp, nil
}

func validSort(req *pb.RangeRequest) bool {
	_, okOrder := pb.RangeRequest_SortOrder_name[int32(req.SortOrder)]
	_, okTarget := pb.RangeRequest_SortTarget_name[int32(req.SortTarget)]
	return okOrder && okTarget
}

// rangeLimit is how many keys to read: etcd's rangeLimit.
func rangeLimit(r *pb.RangeRequest) int64 {
	limit := r.Limit
	if !isDefaultOrdering(r.SortTarget, r.SortOrder) || hasRevisionFilters(r) {
		limit = 0
	}
	if limit > 0 && limit < math.MaxInt64 {
		limit++
	}
	return limit
}

func isDefaultOrdering(target pb.RangeRequest_SortTarget, order pb.RangeRequest_SortOrder) bool {
	return order == pb.RangeRequest_NONE || (target == pb.RangeRequest_KEY && order == pb.RangeRequest_ASCEND)
}

func hasRevisionFilters(r *pb.RangeRequest) bool {
	return r.MinModRevision != 0 || r.MaxModRevision != 0 || r.MinCreateRevision != 0 || r.MaxCreateRevision != 0
}

// filterKVs drops what the min/max revision filters exclude, keeping order.
func filterKVs(kvs []*mvccpb.KeyValue, r *pb.RangeRequest) []*mvccpb.KeyValue {
	if !hasRevisionFilters(r) {
		return kvs
	}
	out := kvs[:0]
	for _, kv := range kvs {
		switch {
		case r.MaxModRevision != 0 && kv.ModRevision > r.MaxModRevision:
		case r.MinModRevision != 0 && kv.ModRevision < r.MinModRevision:
		case r.MaxCreateRevision != 0 && kv.CreateRevision > r.MaxCreateRevision:
		case r.MinCreateRevision != 0 && kv.CreateRevision < r.MinCreateRevision:
		default:
			out = append(out, kv)
		}
	}
	return out
}

// sortKVs is etcd's sortRangeResults. It uses sort.Sort, not a stable
// sort, with etcd's Less functions on keys in key order, because ties (same
// version, same value, ...) come out in the order that algorithm leaves
// them, and clients see that order.
func sortKVs(kvs []*mvccpb.KeyValue, r *pb.RangeRequest) {
	order := r.SortOrder
	if r.SortTarget != pb.RangeRequest_KEY && order == pb.RangeRequest_NONE {
		order = pb.RangeRequest_ASCEND
	}
	if isDefaultOrdering(r.SortTarget, order) {
		return
	}
	var s sort.Interface
	switch r.SortTarget {
	case pb.RangeRequest_KEY:
		s = &kvSortByKey{&kvSort{kvs}}
	case pb.RangeRequest_VERSION:
		s = &kvSortByVersion{&kvSort{kvs}}
	case pb.RangeRequest_CREATE:
		s = &kvSortByCreate{&kvSort{kvs}}
	case pb.RangeRequest_MOD:
		s = &kvSortByMod{&kvSort{kvs}}
	case pb.RangeRequest_VALUE:
		s = &kvSortByValue{&kvSort{kvs}}
	default:
		return // refused before
	}
	switch order {
	case pb.RangeRequest_ASCEND:
		sort.Sort(s)
	case pb.RangeRequest_DESCEND:
		sort.Sort(sort.Reverse(s))
	}
}

// The sorters of server/etcdserver/txn/range.go, Less for Less (the
// subtraction included).
type kvSort struct{ kvs []*mvccpb.KeyValue }

func (s *kvSort) Swap(i, j int) { s.kvs[i], s.kvs[j] = s.kvs[j], s.kvs[i] }
func (s *kvSort) Len() int      { return len(s.kvs) }

type kvSortByKey struct{ *kvSort }

func (s *kvSortByKey) Less(i, j int) bool { return bytes.Compare(s.kvs[i].Key, s.kvs[j].Key) < 0 }

type kvSortByVersion struct{ *kvSort }

func (s *kvSortByVersion) Less(i, j int) bool { return (s.kvs[i].Version - s.kvs[j].Version) < 0 }

type kvSortByCreate struct{ *kvSort }

func (s *kvSortByCreate) Less(i, j int) bool {
	return (s.kvs[i].CreateRevision - s.kvs[j].CreateRevision) < 0
}

type kvSortByMod struct{ *kvSort }

func (s *kvSortByMod) Less(i, j int) bool { return (s.kvs[i].ModRevision - s.kvs[j].ModRevision) < 0 }

type kvSortByValue struct{ *kvSort }

func (s *kvSortByValue) Less(i, j int) bool { return bytes.Compare(s.kvs[i].Value, s.kvs[j].Value) < 0 }
