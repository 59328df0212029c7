package etcdapi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
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
// CompactionRequest. Every replica applies it at the same log position with
// etcdmvcc: a request that changes anything gets the revision after the
// keyspace's current one, as on etcd, whose revision is one raft group's
// count of its writes; here the whole etcd keyspace is one region.
//
// The result, the same on every replica, reaches the proposer:
//
//	0 | revision(8) | ResponseOp protobuf (empty for a compaction)
//	1 | gRPC code(4) | message           (etcd's refusal, e.g. ErrGRPCKeyNotFound)
const (
	kindRequest byte = 1
	kindCompact byte = 2
)

func encodeRequest(req *pb.RequestOp) ([]byte, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode etcd request: %w", err)
	}
	return append([]byte{kindRequest}, b...), nil
}

func encodeCompact(req *pb.CompactionRequest) ([]byte, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode etcd compaction: %w", err)
	}
	return append([]byte{kindCompact}, b...), nil
}

func okResult(rev int64, resp *pb.ResponseOp) ([]byte, error) {
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
	switch {
	case len(b) >= 9 && b[0] == 0:
		rev := int64(binary.BigEndian.Uint64(b[1:9]))
		resp := &pb.ResponseOp{}
		if err := proto.Unmarshal(b[9:], resp); err != nil {
			return 0, nil, fmt.Errorf("decode etcd response: %w", err)
		}
		return rev, resp, nil
	case len(b) >= 5 && b[0] == 1:
		return 0, nil, status.Error(codes.Code(binary.BigEndian.Uint32(b[1:5])), string(b[5:]))
	}
	return 0, nil, fmt.Errorf("etcd result of %d bytes: %w", len(b), etcdmvcc.ErrCorrupt)
}

// Applier applies etcd writes in the etcd region (raftstore.Applier). Every
// store must run it (server.New sets it): a replica without it would skip
// the keyspace's writes. It tells the store's watchers of each revision it
// applies.
type Applier struct {
	hub *hub
}

// NewApplier returns the Applier of one store; give the same one to
// Register.
func NewApplier() *Applier { return &Applier{hub: newHub()} }

var _ raftstore.Applier = (*Applier)(nil)

// Apply implements raftstore.Applier. A request etcd refuses is a result;
// only a storage failure (a record that does not decode) is an error.
func (a *Applier) Apply(tx raftstore.StateTx, r region.Region, index uint64, payload []byte) ([]byte, error) {
	if !holdsKeyspace(r) {
		return errResult(status.Errorf(codes.FailedPrecondition, "etcdserver: hedgekv: region %d does not hold the whole etcd keyspace", r.ID)), nil
	}
	if len(payload) == 0 {
		return errResult(status.Error(codes.InvalidArgument, "etcdserver: hedgekv: empty command")), nil
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
		a.hub.applied(cur + 1)
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
	}
	return errResult(status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: unknown command kind %d", payload[0])), nil
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
