package etcdapi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hedgekv/hedgekv/etcdmvcc"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
)

// An etcd write travels through the etcd region's raft log as a command
// for the Applier (raftstore.Store.Propose):
//
//	kind(1) | protobuf
//
// kindRequest: a RequestOp (Put, DeleteRange or Txn); kindCompact: a
// CompactionRequest; kindLeaseGrant: a LeaseGrantRequest (ID 0: the
// applier chooses one), its TTL already raised to the minimum by the
// proposer; kindLeaseRevoke: a LeaseRevokeRequest. Every replica applies
// it at the same log position with etcdmvcc: a request that changes
// anything gets the revision after the keyspace's current one, as on etcd,
// whose revision is one raft group's count of its writes; here the whole
// etcd keyspace is one region. A grant makes no revision; a revoke makes
// one if it deletes keys (etcd's lessor: one write txn of deletes).
//
// The result, the same on every replica, reaches the proposer:
//
//	0 | revision(8) | protobuf: a ResponseOp (kindRequest), nothing
//	                  (kindCompact, kindLeaseRevoke), a LeaseGrantResponse
//	                  (kindLeaseGrant: ID and TTL)
//	1 | gRPC code(4) | message  (etcd's refusal, e.g. ErrGRPCKeyNotFound)
const (
	kindRequest     byte = 1
	kindCompact     byte = 2
	kindLeaseGrant  byte = 3
	kindLeaseRevoke byte = 4
)

// maxLeaseTTL is etcd's lease.MaxLeaseTTL (seconds): a longer grant is
// refused with ErrGRPCLeaseTTLTooLarge.
const maxLeaseTTL = 9000000000

func encodeCommand(kind byte, msg proto.Message) ([]byte, error) {
	b, err := proto.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("encode etcd command %d: %w", kind, err)
	}
	return append([]byte{kind}, b...), nil
}

func encodeRequest(req *pb.RequestOp) ([]byte, error) { return encodeCommand(kindRequest, req) }

func encodeCompact(req *pb.CompactionRequest) ([]byte, error) {
	return encodeCommand(kindCompact, req)
}

func okResult(rev int64, resp proto.Message) ([]byte, error) {
	out := binary.BigEndian.AppendUint64([]byte{0}, uint64(rev))
	if resp == nil {
		return out, nil
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		return nil, fmt.Errorf("encode etcd response: %w", err)
	}
	return append(out, b...), nil
}

func errResult(err error) []byte {
	st, _ := status.FromError(err)
	out := binary.BigEndian.AppendUint32([]byte{1}, uint32(st.Code()))
	return append(out, st.Message()...)
}

// decodeResult returns the revision and response of a result, or the
// refusal it carries as a gRPC status error.
func decodeResult(b []byte) (int64, *pb.ResponseOp, error) {
	resp := &pb.ResponseOp{}
	rev, err := decodeResultInto(b, resp)
	if err != nil {
		return 0, nil, err
	}
	return rev, resp, nil
}

// decodeResultInto returns the revision of a result and decodes its
// response into resp (nil: a result with none), or returns the refusal it
// carries as a gRPC status error.
func decodeResultInto(b []byte, resp proto.Message) (int64, error) {
	switch {
	case len(b) >= 9 && b[0] == 0:
		rev := int64(binary.BigEndian.Uint64(b[1:9]))
		if resp != nil {
			if err := proto.Unmarshal(b[9:], resp); err != nil {
				return 0, fmt.Errorf("decode etcd response: %w", err)
			}
		}
		return rev, nil
	case len(b) >= 5 && b[0] == 1:
		return 0, status.Error(codes.Code(binary.BigEndian.Uint32(b[1:5])), string(b[5:]))
	}
	return 0, fmt.Errorf("etcd result of %d bytes: %w", len(b), etcdmvcc.ErrCorrupt)
}

// Applier applies etcd writes in the etcd region (raftstore.Applier). Every
// store must run it (server.New sets it): a replica without it would skip
// the keyspace's writes. It tells the store's watchers of each revision it
// applies, and the store's lessor of each lease it grants or revokes.
type Applier struct {
	hub *hub
	// woken is the revision applied in the running round, for the hub once
	// the round has ended (RoundApplied): 0 if none.
	woken atomic.Int64
	// leases is told of the grants and revokes applied here (the
	// Service's lessor, once registered).
	leases atomic.Pointer[lessor]
	// inUse, once the Service is registered, is called when a command
	// applies in a region larger than the keyspace: the keyspace is in
	// use, and whichever store leads that region splits it off
	// (KeepRegion). Every replica calls it, so the leader's store learns
	// of the first write even if a follower took it (WriteOptions.Forward).
	inUse atomic.Pointer[func()]
}

// NewApplier returns the Applier of one store; give the same one to
// Register.
func NewApplier() *Applier { return &Applier{hub: newHub()} }

var _ raftstore.RoundApplier = (*Applier)(nil)

// RoundApplied implements raftstore.RoundApplier: the watchers are woken
// once the round that applied a revision has ended, when they can read
// it; woken from Apply, inside the round, one could read the state before
// it and sleep until the next revision or its poll.
func (a *Applier) RoundApplied() {
	if rev := a.woken.Swap(0); rev > 0 {
		a.hub.applied(rev)
	}
}

// Apply implements raftstore.Applier. A request etcd refuses is a result;
// only a storage failure (a record that does not decode) is an error.
func (a *Applier) Apply(tx raftstore.StateTx, r region.Region, index uint64, payload []byte) ([]byte, error) {
	if !holdsKeyspace(r) {
		return errResult(status.Errorf(codes.FailedPrecondition, "etcdserver: hedgekv: region %d does not hold the whole etcd keyspace", r.ID)), nil
	}
	if len(payload) == 0 {
		return errResult(status.Error(codes.InvalidArgument, "etcdserver: hedgekv: empty command")), nil
	}
	if !isKeyspace(r) {
		if f := a.inUse.Load(); f != nil {
			(*f)()
		}
	}
	if res, ok, err := a.applyRestore(tx, payload); ok {
		return res, err // a restore step, or a command refused while one runs (restore.go)
	}
	v := txView(tx)
	cur, err := v.currentRev()
	if err != nil {
		return nil, err
	}
	switch payload[0] {
	case kindRequest:
		req := &pb.RequestOp{}
		if err := proto.Unmarshal(payload[1:], req); err != nil {
			return errResult(status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: bad request: %v", err)), nil
		}
		resp, writes, _, err := etcdmvcc.Apply(v, cur+1, req)
		if err != nil {
			if isRefusal(err) {
				return errResult(err), nil
			}
			return nil, fmt.Errorf("etcd apply at index %d: %w", index, err)
		}
		if len(writes) == 0 {
			return okResult(cur, resp)
		}
		if err := etcdmvcc.Commit(txWriter{tx}, writes); err != nil {
			return nil, err
		}
		if err := putInt(tx, revKey, cur+1); err != nil {
			return nil, err
		}
		a.woken.Store(cur + 1)
		return okResult(cur+1, resp)
	case kindCompact:
		req := &pb.CompactionRequest{}
		if err := proto.Unmarshal(payload[1:], req); err != nil {
			return errResult(status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: bad compaction: %v", err)), nil
		}
		compacted, err := v.compactRev()
		if err != nil {
			return nil, err
		}
		if err := etcdmvcc.CheckCompact(req.Revision, compacted, cur); err != nil {
			return errResult(err), nil
		}
		if err := compactTx(tx, req.Revision); err != nil {
			return nil, err
		}
		if err := putInt(tx, compactKey, req.Revision); err != nil {
			return nil, err
		}
		return okResult(cur, nil)
	case kindLeaseGrant:
		req := &pb.LeaseGrantRequest{}
		if err := proto.Unmarshal(payload[1:], req); err != nil {
			return errResult(status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: bad lease grant: %v", err)), nil
		}
		return a.grant(tx, v, cur, index, req)
	case kindLeaseRevoke:
		req := &pb.LeaseRevokeRequest{}
		if err := proto.Unmarshal(payload[1:], req); err != nil {
			return errResult(status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: bad lease revoke: %v", err)), nil
		}
		return a.revoke(tx, v, cur, index, req.ID)
	}
	return errResult(status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: unknown command kind %d", payload[0])), nil
}

// grant is etcd's lessor.Grant, applied: a TTL over maxLeaseTTL is
// refused, an ID in use is ErrGRPCLeaseExist, and ID 0 takes the next
// free ID after the last one chosen (Prefix "m/lease-id"): positive,
// never reused, the same on every replica. It makes no revision.
func (a *Applier) grant(tx raftstore.StateTx, v view, cur int64, index uint64, req *pb.LeaseGrantRequest) ([]byte, error) {
	if req.TTL > maxLeaseTTL {
		return errResult(rpctypes.ErrGRPCLeaseTTLTooLarge), nil
	}
	ttl := max(req.TTL, 1) // the proposer raised it to the minimum already
	id := req.ID
	if id == 0 {
		last, err := getInt(v.r.get, leaseIDKey, 0)
		if err != nil {
			return nil, err
		}
		for id = nextLeaseID(last); ; id = nextLeaseID(id) {
			_, used, err := v.lease(id)
			if err != nil {
				return nil, err
			}
			if !used {
				break
			}
		}
		if err := putInt(tx, leaseIDKey, id); err != nil {
			return nil, err
		}
	} else if _, ok, err := v.lease(id); err != nil {
		return nil, fmt.Errorf("etcd lease grant at index %d: %w", index, err)
	} else if ok {
		return errResult(rpctypes.ErrGRPCLeaseExist), nil
	}
	rec := leaseRecord{ID: id, TTL: ttl, GrantedRev: cur}
	if err := tx.Put(leaseKey(id), rec.encode()); err != nil {
		return nil, err
	}
	if l := a.leases.Load(); l != nil {
		l.applyGrant(id, ttl)
	}
	return okResult(cur, &pb.LeaseGrantResponse{ID: id, TTL: ttl})
}

// nextLeaseID is the ID after id among the positive int64s.
func nextLeaseID(id int64) int64 {
	if id <= 0 || id == math.MaxInt64 {
		return 1
	}
	return id + 1
}

// revoke is etcd's lessor.Revoke, applied: every key attached to the lease
// is deleted, in key order, by one Txn of deletes (one revision, if there
// is any such key), and the lease record with them; an unknown lease is
// ErrGRPCLeaseNotFound.
func (a *Applier) revoke(tx raftstore.StateTx, v view, cur int64, index uint64, id int64) ([]byte, error) {
	_, ok, err := v.lease(id)
	if err != nil {
		return nil, fmt.Errorf("etcd lease revoke at index %d: %w", index, err)
	}
	if !ok {
		return errResult(rpctypes.ErrGRPCLeaseNotFound), nil
	}
	keys, err := v.leaseKeys(id)
	if err != nil {
		return nil, fmt.Errorf("etcd lease revoke at index %d: %w", index, err)
	}
	if err := tx.Delete(leaseKey(id)); err != nil {
		return nil, err
	}
	if l := a.leases.Load(); l != nil {
		l.applyRevoke(id)
	}
	if len(keys) == 0 {
		return okResult(cur, nil)
	}
	txn := &pb.TxnRequest{Success: make([]*pb.RequestOp, len(keys))}
	for i, k := range keys {
		txn.Success[i] = &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: k}}}
	}
	_, writes, _, err := etcdmvcc.Apply(v, cur+1, &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: txn}})
	if err != nil {
		return nil, fmt.Errorf("etcd lease revoke at index %d: delete its keys: %w", index, err)
	}
	if len(writes) == 0 {
		return okResult(cur, nil)
	}
	if err := etcdmvcc.Commit(txWriter{tx}, writes); err != nil {
		return nil, err
	}
	if err := putInt(tx, revKey, cur+1); err != nil {
		return nil, err
	}
	a.woken.Store(cur + 1)
	return okResult(cur+1, nil)
}

// isRefusal tells etcd's refusals (gRPC status errors: rpctypes) from
// storage failures.
func isRefusal(err error) bool {
	if errors.Is(err, etcdmvcc.ErrEmptyRequest) {
		return true
	}
	_, ok := status.FromError(err)
	return ok
}

// compactTx deletes the history a compaction at rev makes unreadable, key by
// key (etcdmvcc.CompactPrefix). It runs in the apply, on every replica
// alike.
func compactTx(tx raftstore.StateTx, rev int64) error {
	var dead [][]byte
	var key []byte
	var refs []etcdmvcc.HistRef
	var raws [][]byte
	flush := func() {
		for _, raw := range raws[:etcdmvcc.CompactPrefix(refs, rev)] {
			dead = append(dead, raw)
		}
		refs, raws = refs[:0], raws[:0]
	}
	var derr error
	tx.ForEachData(histPrefix, histEnd, func(k, b []byte) bool {
		hk, r, err := parseHistKey(k)
		if err != nil {
			derr = err
			return false
		}
		if key != nil && !bytes.Equal(hk, key) {
			flush()
		}
		key = bytes.Clone(hk)
		h, err := etcdmvcc.DecodeHistRecord(bytes.Clone(b))
		if err != nil {
			derr = err
			return false
		}
		refs = append(refs, etcdmvcc.HistRef{Rev: r, Delete: h.Kind == etcdmvcc.KindDelete})
		raws = append(raws, bytes.Clone(k))
		return true
	})
	if derr != nil {
		return derr
	}
	flush()
	// The revision index below the compaction: a watch from there is
	// refused (ErrCompacted), so nothing reads it.
	tx.ForEachData(revPrefix, revIndexKey(etcdmvcc.Revision{Main: rev}), func(k, _ []byte) bool {
		dead = append(dead, bytes.Clone(k))
		return true
	})
	for _, k := range dead {
		if err := tx.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// holdsKeyspace reports whether r holds the whole etcd keyspace
// [Prefix, End): the Applier writes only keys inside its region.
func holdsKeyspace(r region.Region) bool {
	return bytes.Compare(r.StartKey, []byte(Prefix)) <= 0 && (len(r.EndKey) == 0 || bytes.Compare(r.EndKey, []byte(End)) >= 0)
}

// isKeyspace reports whether r is exactly the etcd keyspace's region.
func isKeyspace(r region.Region) bool {
	return string(r.StartKey) == Prefix && string(r.EndKey) == End
}
