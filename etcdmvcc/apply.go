package etcdmvcc

import (
	"bytes"
	"errors"
	"fmt"
	"sort"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// ErrEmptyRequest is Apply's answer to a RequestOp that holds no request.
var ErrEmptyRequest = errors.New("etcdmvcc: empty request")

// Apply evaluates req (a Put, DeleteRange or Txn; a Range is read as etcd's
// applier reads one) on v, as etcd's apply does (server/etcdserver/txn:
// put.go, delete.go, txn.go, over server/storage/mvcc/kvstore_txn.go), all
// its changes at revision rev, and returns:
//
//   - the response (a ResponseOp holding the PutResponse, DeleteRangeResponse,
//     TxnResponse or RangeResponse) without its header: the caller fills it,
//     with revision rev if writes is not empty, else rev-1 (etcd's current
//     revision). Responses nested in a Txn carry etcd's headers: a Range's
//     revision is rev-1 until the Txn's first change and rev after it, a
//     Put's is rev, a DeleteRange's rev once anything changed, a nested
//     Txn's header is empty.
//   - writes: every change, in order, for Commit; empty when nothing changed
//     (a Txn of Ranges, a DeleteRange that found nothing). Revision.Sub
//     counts them from 0, as etcd numbers a Txn's changes.
//   - events: one per write, for watchers (see Event).
//
// or an error and nothing else. Errors are the rpctypes.ErrGRPC* values
// etcd returns: ErrGRPCKeyNotFound for ignore_value or ignore_lease on a
// missing key, ErrGRPCLeaseNotFound (when v implements Leases),
// ErrGRPCCompacted and ErrGRPCFutureRev for a Range in a Txn whose revision
// is below v.CompactRev() or above rev-1; or an error of v's.
//
// A Txn's compares (nested ones included) and its checks read v as it was
// before the Txn; each of its operations reads the state the earlier ones
// left (a Range after a Put sees it), except a Range with a revision, which
// reads history. Nothing is written to v: the caller stores writes
// (Commit) if it keeps the result, and evaluation is deterministic, so
// every replica that applies the same req at the same rev on the same state
// gets the same writes.
//
// Apply does not do CheckRequest's validation: call that before proposing,
// as etcd's gRPC layer does. Where etcd's apply panics, Apply returns
// ErrGRPCKeyNotFound: a put with ignore_value or ignore_lease on a key that
// an earlier operation of the same Txn deleted, which etcd's checks let
// through when the delete's range_end is "\x00" or it is in an earlier
// nested Txn (etcd v3.7.3 panics in txn/put.go on every member). Writes,
// events and responses alias req's keys and values and v's records.
func Apply(v View, rev int64, req *pb.RequestOp) (*pb.ResponseOp, []Write, []Event, error) {
	a := &applier{base: v, rev: rev, dirty: map[string]*dirtyEntry{}}
	resp, err := a.apply(req)
	if err != nil {
		return nil, nil, nil, err
	}
	return resp, a.writes, a.events, nil
}

func (a *applier) apply(req *pb.RequestOp) (*pb.ResponseOp, error) {
	if a.rev <= 0 {
		return nil, fmt.Errorf("etcdmvcc: apply at revision %d", a.rev)
	}
	switch r := req.GetRequest().(type) {
	case *pb.RequestOp_RequestRange:
		rr := orEmptyRange(r.RequestRange)
		atRev, err := ReadRev(rr.Revision, a.base.CompactRev(), a.rev-1)
		if err != nil {
			return nil, err
		}
		out, err := Range(a.base, rr, atRev)
		if err != nil {
			return nil, err
		}
		return &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: out}}, nil
	case *pb.RequestOp_RequestPut:
		p := orEmptyPut(r.RequestPut)
		if err := a.checkPut(p); err != nil {
			return nil, err
		}
		out, err := a.put(p)
		if err != nil {
			return nil, err
		}
		out.Header = nil
		return &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: out}}, nil
	case *pb.RequestOp_RequestDeleteRange:
		out, err := a.deleteRange(orEmptyDelete(r.RequestDeleteRange))
		if err != nil {
			return nil, err
		}
		out.Header = nil
		return &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: out}}, nil
	case *pb.RequestOp_RequestTxn:
		plan, err := a.plan(orEmptyTxn(r.RequestTxn))
		if err != nil {
			return nil, err
		}
		out, err := a.execTxn(plan)
		if err != nil {
			return nil, err
		}
		out.Header = nil
		return &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: out}}, nil
	}
	return nil, ErrEmptyRequest
}

// applier is one Apply: the base View, and the changes made so far, which
// it reads through (an overlay).
type applier struct {
	base   View
	rev    int64
	dirty  map[string]*dirtyEntry
	sorted []*dirtyEntry // dirty by key; nil when stale
	writes []Write
	events []Event
	// etcdPanics is set when Apply refused a put that etcd's apply would
	// have panicked on (see put).
	etcdPanics bool
}

type dirtyEntry struct {
	key    []byte
	rec    Record // the key's state now, if live
	live   bool
	base   Record // the key's state in base (at rev-1), if baseOK
	baseOK bool
}

// curRev is the revision a read in this request reports: etcd's
// storeTxnWrite.Range, beginRev+1 once the request changed something.
func (a *applier) curRev() int64 {
	if len(a.writes) > 0 {
		return a.rev
	}
	return a.rev - 1
}

func (a *applier) get(key []byte) (Record, bool, error) {
	if e, ok := a.dirty[string(key)]; ok {
		return e.rec, e.live, nil
	}
	return a.base.Get(key)
}

// scan merges base's records with the changes made so far.
func (a *applier) scan(start, end []byte, fn func([]byte, Record) bool) error {
	if len(a.dirty) == 0 {
		return a.base.Scan(start, end, fn)
	}
	if a.sorted == nil {
		for _, e := range a.dirty {
			a.sorted = append(a.sorted, e)
		}
		sort.Slice(a.sorted, func(i, j int) bool { return bytes.Compare(a.sorted[i].key, a.sorted[j].key) < 0 })
	}
	ds := a.sorted
	i := sort.Search(len(ds), func(i int) bool { return bytes.Compare(ds[i].key, start) >= 0 })
	emit := func(e *dirtyEntry) bool { return !e.live || fn(e.key, e.rec) }
	stopped := false
	err := a.base.Scan(start, end, func(key []byte, rec Record) bool {
		for ; i < len(ds) && bytes.Compare(ds[i].key, key) < 0; i++ {
			if !emit(ds[i]) {
				stopped = true
				return false
			}
		}
		if i < len(ds) && bytes.Equal(ds[i].key, key) {
			i++
			stopped = !emit(ds[i-1])
			return !stopped
		}
		stopped = !fn(key, rec)
		return !stopped
	})
	if err != nil || stopped {
		return err
	}
	for ; i < len(ds) && (end == nil || bytes.Compare(ds[i].key, end) < 0); i++ {
		if !emit(ds[i]) {
			return nil
		}
	}
	return nil
}

// change records key's next state (live: rec; else deleted) given its
// state now (cur, curOK), appending the Write and the Event.
func (a *applier) change(key []byte, cur Record, curOK bool, rec Record, live bool) {
	e, ok := a.dirty[string(key)]
	if !ok {
		e = &dirtyEntry{key: key, base: cur, baseOK: curOK}
		a.dirty[string(key)] = e
		a.sorted = nil
	}
	e.rec, e.live = rec, live
	rev := Revision{Main: a.rev, Sub: int64(len(a.writes))}
	ev := &mvccpb.Event{}
	w := Write{Key: key, Rev: rev}
	if live {
		w.Rec = HistRecord{Kind: KindPut, CreateRev: rec.CreateRev, Version: rec.Version, Lease: rec.Lease, Value: rec.Value}
		ev.Type = mvccpb.Event_PUT
		ev.Kv = rec.KeyValue(key)
		if rec.CreateRev != rec.ModRev && e.baseOK { // not a creation: what was there at rev-1
			ev.PrevKv = e.base.KeyValue(key)
		}
	} else {
		w.Rec = HistRecord{Kind: KindDelete}
		ev.Type = mvccpb.Event_DELETE
		ev.Kv = &mvccpb.KeyValue{Key: key, ModRevision: a.rev}
		if e.baseOK {
			ev.PrevKv = e.base.KeyValue(key)
		}
	}
	a.writes = append(a.writes, w)
	a.events = append(a.events, Event{Rev: rev, Event: ev})
}

// checkPut is etcd's checkPut (server/etcdserver/txn/put.go), on the state
// before the request: the lease must exist, and a key whose value or lease
// is kept must exist.
func (a *applier) checkPut(p *pb.PutRequest) error {
	if p.Lease != 0 {
		if ls, ok := a.base.(Leases); ok && !ls.LeaseExists(p.Lease) {
			return rpctypes.ErrGRPCLeaseNotFound
		}
	}
	if p.IgnoreValue || p.IgnoreLease {
		_, ok, err := a.base.Get(p.Key)
		if err != nil {
			return err
		}
		if !ok {
			return rpctypes.ErrGRPCKeyNotFound
		}
	}
	return nil
}

// put is etcd's put (txn/put.go) and storeTxnWrite.put (kvstore_txn.go).
func (a *applier) put(p *pb.PutRequest) (*pb.PutResponse, error) {
	cur, ok, err := a.get(p.Key)
	if err != nil {
		return nil, err
	}
	if (p.IgnoreValue || p.IgnoreLease) && !ok {
		// checkPut found the key before the Txn, and an earlier operation
		// of it deleted the key: etcd v3.5-3.7 indexes the empty prevKV
		// (txn/put.go: prevKV.KVs[0]) and panics, on every member, which
		// checkIntervals does not prevent (a DeleteRange to "\x00", or in
		// an earlier nested Txn). Refuse, as for a key missing outright.
		a.etcdPanics = true
		return nil, rpctypes.ErrGRPCKeyNotFound
	}
	val, lease := p.Value, p.Lease
	if p.IgnoreValue {
		val = cur.Value
	}
	if p.IgnoreLease {
		lease = cur.Lease
	}
	resp := &pb.PutResponse{Header: &pb.ResponseHeader{Revision: a.rev}}
	if p.PrevKv && ok {
		resp.PrevKv = cur.KeyValue(p.Key)
	}
	rec := Record{CreateRev: a.rev, ModRev: a.rev, Version: 1, Lease: lease, Value: val}
	if ok {
		rec.CreateRev, rec.Version = cur.CreateRev, cur.Version+1
	}
	a.change(p.Key, cur, ok, rec, true)
	return resp, nil
}

// deleteRange is etcd's deleteRange (txn/delete.go) and
// storeTxnWrite.deleteRange: every key of the range, in key order.
func (a *applier) deleteRange(dr *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	type kr struct {
		key []byte
		rec Record
	}
	var found []kr
	err := visit(a, spanOf(dr.Key, dr.RangeEnd), func(key []byte, rec Record) bool {
		found = append(found, kr{key, rec})
		return true
	})
	if err != nil {
		return nil, err
	}
	resp := &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{}, Deleted: int64(len(found))}
	if dr.PrevKv {
		resp.PrevKvs = make([]*mvccpb.KeyValue, len(found))
		for i, f := range found {
			resp.PrevKvs[i] = f.rec.KeyValue(f.key)
		}
	}
	for _, f := range found {
		a.change(f.key, f.rec, true, Record{}, false)
	}
	resp.Header.Revision = a.curRev()
	return resp, nil
}

// rangeOp is a Range inside a Txn (etcd's executeRange on the write txn).
func (a *applier) rangeOp(rr *pb.RangeRequest) (*pb.RangeResponse, error) {
	var resp *pb.RangeResponse
	var err error
	if rr.Revision > 0 { // checked by plan: compactRev ≤ Revision ≤ rev-1
		resp, err = rangeKVs(atReader{a.base, rr.Revision}, rr)
	} else {
		resp, err = rangeKVs(a, rr)
	}
	if err != nil {
		return nil, err
	}
	resp.Header = &pb.ResponseHeader{Revision: a.curRev()}
	return resp, nil
}

// txnPlan is a Txn's path: which branch each Txn takes, decided before any
// of it runs (etcd's compareToPath).
type txnPlan struct {
	succeeded bool
	ops       []*pb.RequestOp
	nested    []*txnPlan // by op index, for nested Txns
}

// plan evaluates t's compares and, down the branch they choose, its nested
// Txns' compares, and makes etcd's checks (checkTxn in txn/txn.go), all on
// the state before the Txn.
func (a *applier) plan(t *pb.TxnRequest) (*txnPlan, error) {
	ok, err := a.compares(t.Compare)
	if err != nil {
		return nil, err
	}
	p := &txnPlan{succeeded: ok, ops: t.Success}
	if !ok {
		p.ops = t.Failure
	}
	p.nested = make([]*txnPlan, len(p.ops))
	for i, op := range p.ops {
		switch r := op.GetRequest().(type) {
		case *pb.RequestOp_RequestRange:
			// checkRange: against the store before the Txn.
			switch rev := r.RequestRange.GetRevision(); {
			case rev == 0:
			case rev > a.rev-1:
				return nil, rpctypes.ErrGRPCFutureRev
			case rev < a.base.CompactRev():
				return nil, rpctypes.ErrGRPCCompacted
			}
		case *pb.RequestOp_RequestPut:
			if err := a.checkPut(orEmptyPut(r.RequestPut)); err != nil {
				return nil, err
			}
		case *pb.RequestOp_RequestTxn:
			if p.nested[i], err = a.plan(orEmptyTxn(r.RequestTxn)); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// execTxn runs a planned Txn (etcd's executeTxn).
func (a *applier) execTxn(p *txnPlan) (*pb.TxnResponse, error) {
	resp := &pb.TxnResponse{
		Header:    &pb.ResponseHeader{},
		Succeeded: p.succeeded,
		Responses: make([]*pb.ResponseOp, len(p.ops)),
	}
	for i, op := range p.ops {
		out := &pb.ResponseOp{}
		switch r := op.GetRequest().(type) {
		case *pb.RequestOp_RequestRange:
			rr, err := a.rangeOp(orEmptyRange(r.RequestRange))
			if err != nil {
				return nil, err
			}
			out.Response = &pb.ResponseOp_ResponseRange{ResponseRange: rr}
		case *pb.RequestOp_RequestPut:
			pr, err := a.put(orEmptyPut(r.RequestPut))
			if err != nil {
				return nil, err
			}
			out.Response = &pb.ResponseOp_ResponsePut{ResponsePut: pr}
		case *pb.RequestOp_RequestDeleteRange:
			dr, err := a.deleteRange(orEmptyDelete(r.RequestDeleteRange))
			if err != nil {
				return nil, err
			}
			out.Response = &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: dr}
		case *pb.RequestOp_RequestTxn:
			tr, err := a.execTxn(p.nested[i])
			if err != nil {
				return nil, err
			}
			out.Response = &pb.ResponseOp_ResponseTxn{ResponseTxn: tr}
		}
		resp.Responses[i] = out
	}
	return resp, nil
}

// compares is etcd's applyCompares: all must hold.
func (a *applier) compares(cs []*pb.Compare) (bool, error) {
	for _, c := range cs {
		if c == nil {
			c = &pb.Compare{}
		}
		ok, err := a.compare(c)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// compare is etcd's applyCompare: every key of the compare's range must
// satisfy it; with none, a VALUE compare fails and the others compare
// against zeros (a missing key has version 0, ...).
func (a *applier) compare(c *pb.Compare) (bool, error) {
	found, ok := false, true
	err := visit(currentReader{a.base}, spanOf(c.Key, c.RangeEnd), func(_ []byte, rec Record) bool {
		found = true
		ok = compareRecord(c, rec)
		return ok
	})
	if err != nil {
		return false, err
	}
	if !found {
		if c.Target == pb.Compare_VALUE {
			return false, nil
		}
		return compareRecord(c, Record{}), nil
	}
	return ok, nil
}

// compareRecord is etcd's compareKV. A target whose union member is not the
// one set compares against zero; an unknown result holds.
func compareRecord(c *pb.Compare, rec Record) bool {
	var result int
	switch c.Target {
	case pb.Compare_VALUE:
		var v []byte
		if tv, _ := c.TargetUnion.(*pb.Compare_Value); tv != nil {
			v = tv.Value
		}
		result = bytes.Compare(rec.Value, v)
	case pb.Compare_CREATE:
		result = compareInt64(rec.CreateRev, c.GetCreateRevision())
	case pb.Compare_MOD:
		result = compareInt64(rec.ModRev, c.GetModRevision())
	case pb.Compare_VERSION:
		result = compareInt64(rec.Version, c.GetVersion())
	case pb.Compare_LEASE:
		result = compareInt64(rec.Lease, c.GetLease())
	}
	switch c.Result {
	case pb.Compare_EQUAL:
		return result == 0
	case pb.Compare_NOT_EQUAL:
		return result != 0
	case pb.Compare_GREATER:
		return result > 0
	case pb.Compare_LESS:
		return result < 0
	}
	return true
}

func compareInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// gRPC never hands a server a nil message inside a set oneof; a Go caller
// can. It reads as the empty message.

func orEmptyRange(r *pb.RangeRequest) *pb.RangeRequest {
	if r == nil {
		return &pb.RangeRequest{}
	}
	return r
}

func orEmptyPut(r *pb.PutRequest) *pb.PutRequest {
	if r == nil {
		return &pb.PutRequest{}
	}
	return r
}

func orEmptyDelete(r *pb.DeleteRangeRequest) *pb.DeleteRangeRequest {
	if r == nil {
		return &pb.DeleteRangeRequest{}
	}
	return r
}

func orEmptyTxn(r *pb.TxnRequest) *pb.TxnRequest {
	if r == nil {
		return &pb.TxnRequest{}
	}
	return r
}
