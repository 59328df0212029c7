package etcdapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hedgekv/hedgekv/etcdmvcc"
	"github.com/hedgekv/hedgekv/raftstore"
)

// Restore: an etcd snapshot (Maintenance.Snapshot's file, hedgekv's or a
// real etcd member's) loaded into a new cluster's empty etcd keyspace with
// every history record at its own revision, so keys keep their values,
// create and mod revisions and versions, and the keyspace resumes at the
// snapshot's revision. Replaying the history through the etcd API would
// give every write a new revision; instead the records travel as they are
// through the region's raft log, as commands of their own kind
// (kindRestore), in batches small enough for one log entry each:
//
//	begin  {id, R, compaction}  refused unless the keyspace is empty (no raw
//	                            key under Prefix at all); records the restore
//	                            under way (Prefix "m/restore")
//	batch  {id, after, entries} etcd key bucket entries (revision key ->
//	                            KeyValue) in revision order, the first after
//	                            the revision `after`: written as history,
//	                            revision index and current records, exactly
//	                            what applying them one by one would have left
//	commit {id, last}           every entry up to `last` arrived: the
//	                            keyspace's revision becomes R, its compaction
//	                            revision the snapshot's; Prefix "m/restored"
//	                            keeps id
//
// Every step is idempotent (raftstore does not deduplicate, and the
// restoring client retries what may have been applied): a batch's entries
// at or before the last one restored are skipped, a begin or commit of the
// restore that already began or ended is acknowledged again (a step of one
// that ended, with revision 0: "restored already"), and a batch
// that would leave a gap (it starts after a revision not restored yet) is
// refused. id is the snapshot's sha256: the same file resumes an
// interrupted restore, another one is refused. While a restore is under
// way every other command of the keyspace is refused (Unavailable), and so
// are reads (currentRev): nobody sees a keyspace half restored.

// kindRestore is the Applier command kind of a restore step; far from the
// small kinds, which name the etcd API's own commands.
const kindRestore byte = 'R'

var (
	restoreKey  = []byte(Prefix + "m/restore")
	restoredKey = []byte(Prefix + "m/restored")
)

// errRestoring is the answer to anything but a restore step while one is
// under way.
var errRestoring = status.Error(codes.Unavailable, "etcdserver: hedgekv: the etcd keyspace is being restored from a snapshot (hedgekv etcd-restore)")

type restoreOp uint64

const (
	restoreBegin  restoreOp = 1
	restoreBatch  restoreOp = 2
	restoreCommit restoreOp = 3
)

// restoreCmd is one restore step. Its wire form (after kindRestore) is a
// protobuf message written by hand (protowire):
//
//	1 op (varint)   2 id (bytes)   3 revision R (varint)
//	4 compaction revision (varint; absent: never compacted)
//	5, 6 mark's main and sub (varint): a batch's "after", a commit's "last"
//	7 entry (bytes, repeated): 1 etcd revision key (bytes), 2 KeyValue (bytes)
type restoreCmd struct {
	op      restoreOp
	id      []byte
	rev     int64
	compact int64 // -1: never
	mark    etcdmvcc.Revision
	entries []restoreEntry
}

// restoreEntry is one entry of etcd's key bucket, as the file holds it.
type restoreEntry struct {
	revKey, kv []byte
}

func (c *restoreCmd) encode() []byte {
	b := []byte{kindRestore}
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(c.op))
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, c.id)
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(c.rev))
	if c.compact >= 0 {
		b = protowire.AppendTag(b, 4, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(c.compact))
	}
	b = protowire.AppendTag(b, 5, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(c.mark.Main))
	b = protowire.AppendTag(b, 6, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(c.mark.Sub))
	for _, e := range c.entries {
		var m []byte
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendBytes(m, e.revKey)
		m = protowire.AppendTag(m, 2, protowire.BytesType)
		m = protowire.AppendBytes(m, e.kv)
		b = protowire.AppendTag(b, 7, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	return b
}

// decodeRestoreCmd decodes encode's form, without its kind byte. The
// entries alias b.
func decodeRestoreCmd(b []byte) (*restoreCmd, error) {
	c := &restoreCmd{compact: -1}
	err := walkFields(b, func(num protowire.Number, v uint64, bs []byte) error {
		switch num {
		case 1:
			c.op = restoreOp(v)
		case 2:
			c.id = bs
		case 3:
			c.rev = int64(v)
		case 4:
			c.compact = int64(v)
		case 5:
			c.mark.Main = int64(v)
		case 6:
			c.mark.Sub = int64(v)
		case 7:
			var e restoreEntry
			if err := walkFields(bs, func(num protowire.Number, _ uint64, bs []byte) error {
				switch num {
				case 1:
					e.revKey = bs
				case 2:
					e.kv = bs
				}
				return nil
			}); err != nil {
				return err
			}
			c.entries = append(c.entries, e)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if c.op < restoreBegin || c.op > restoreCommit || len(c.id) == 0 || len(c.id) > 64 || c.rev < 1 || c.compact > c.rev ||
		c.compact < -1 || c.mark.Main < 0 || c.mark.Sub < 0 {
		return nil, fmt.Errorf("restore step: op %d, id of %d bytes, revision %d, compaction %d, mark %v", c.op, len(c.id), c.rev, c.compact, c.mark)
	}
	return c, nil
}

// walkFields calls fn for each field of a protobuf message: a varint's
// value, or a bytes field's bytes. Other wire types are an error.
func walkFields(b []byte, fn func(num protowire.Number, v uint64, bs []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v uint64
		var bs []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			bs, n = protowire.ConsumeBytes(b)
		default:
			return fmt.Errorf("field %d: wire type %d", num, typ)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, v, bs); err != nil {
			return err
		}
	}
	return nil
}

// restoreState is what Prefix "m/restore" holds while a restore is under
// way: len(id) | id | R(8) | compaction(8, -1: never) | last main(8) | last sub(8).
type restoreState struct {
	id      []byte
	rev     int64
	compact int64
	last    etcdmvcc.Revision
}

func (st restoreState) encode() []byte {
	b := append([]byte{byte(len(st.id))}, st.id...)
	for _, v := range []int64{st.rev, st.compact, st.last.Main, st.last.Sub} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

func readRestoreState(tx raftstore.StateTx) (restoreState, bool, error) {
	b, ok := tx.Get(restoreKey)
	if !ok {
		return restoreState{}, false, nil
	}
	if len(b) < 1 || len(b) != 1+int(b[0])+32 {
		return restoreState{}, false, fmt.Errorf("%q holds %d bytes: %w", restoreKey, len(b), etcdmvcc.ErrCorrupt)
	}
	n := int(b[0])
	st := restoreState{id: bytes.Clone(b[1 : 1+n])}
	vs := make([]int64, 4)
	for i := range vs {
		vs[i] = int64(binary.BigEndian.Uint64(b[1+n+8*i:]))
	}
	st.rev, st.compact, st.last = vs[0], vs[1], etcdmvcc.Revision{Main: vs[2], Sub: vs[3]}
	return st, true, nil
}

// applyRestore is the Applier's hook for restores: it applies a restore
// step, and refuses every other command while a restore is under way;
// handled is false for a command it leaves to Apply.
func (a *Applier) applyRestore(tx raftstore.StateTx, payload []byte) (result []byte, handled bool, err error) {
	if payload[0] != kindRestore {
		if _, ok := tx.Get(restoreKey); ok {
			return errResult(errRestoring), true, nil
		}
		return nil, false, nil
	}
	result, err = a.restore(tx, payload[1:])
	return result, true, err
}

func restoreRefusal(format string, args ...any) []byte {
	return errResult(status.Errorf(codes.FailedPrecondition, "etcdserver: hedgekv: restore: "+format, args...))
}

func (a *Applier) restore(tx raftstore.StateTx, body []byte) ([]byte, error) {
	c, err := decodeRestoreCmd(body)
	if err != nil {
		return errResult(status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: bad restore step: %v", err)), nil
	}
	st, restoring, err := readRestoreState(tx)
	if err != nil {
		return nil, err
	}
	if !restoring {
		// A step of a restore that ended already (a retry, a duplicate)
		// is acknowledged, with revision 0 for "done already"; one of no
		// restore is refused.
		if done, ok := tx.Get(restoredKey); ok && bytes.Equal(done, c.id) {
			return okResult(0, nil)
		}
		if c.op != restoreBegin {
			return restoreRefusal("no restore of this snapshot is under way"), nil
		}
		empty := true
		tx.ForEachData([]byte(Prefix), []byte(End), func(_, _ []byte) bool {
			empty = false
			return false
		})
		if !empty {
			return restoreRefusal("the etcd keyspace is not empty: a snapshot is restored into a new cluster only"), nil
		}
		st = restoreState{id: c.id, rev: c.rev, compact: c.compact}
		if err := tx.Put(restoreKey, st.encode()); err != nil {
			return nil, err
		}
		return okResult(c.rev, nil)
	}
	if !bytes.Equal(st.id, c.id) || st.rev != c.rev || st.compact != c.compact {
		return restoreRefusal("the restore of another snapshot (revision %d) is under way", st.rev), nil
	}
	switch c.op {
	case restoreBegin:
		return okResult(c.rev, nil)
	case restoreCommit:
		if c.mark != st.last {
			return restoreRefusal("the snapshot's entries end at revision %v, but the restore reached %v", c.mark, st.last), nil
		}
		if err := putInt(tx, revKey, st.rev); err != nil {
			return nil, err
		}
		if st.compact >= 0 {
			if err := putInt(tx, compactKey, st.compact); err != nil {
				return nil, err
			}
		}
		if err := tx.Delete(restoreKey); err != nil {
			return nil, err
		}
		if err := tx.Put(restoredKey, st.id); err != nil {
			return nil, err
		}
		a.woken.Store(st.rev)
		return okResult(st.rev, nil)
	}
	// A batch.
	if c.mark.Compare(st.last) > 0 {
		return restoreRefusal("a batch after revision %v, but the restore reached %v only", c.mark, st.last), nil
	}
	writes := make([]etcdmvcc.Write, 0, len(c.entries))
	prev := c.mark
	for i, e := range c.entries {
		w, err := restoreWrite(e, st.rev)
		if err != nil {
			return errResult(status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: restore: entry %d: %v", i, err)), nil
		}
		if w.Rev.Compare(prev) <= 0 {
			return errResult(status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: restore: entry %d: revision %v after %v", i, w.Rev, prev)), nil
		}
		prev = w.Rev
		if w.Rev.Compare(st.last) > 0 { // not restored yet
			writes = append(writes, w)
		}
	}
	if len(writes) == 0 {
		return okResult(st.rev, nil)
	}
	if err := etcdmvcc.Commit(restoreWriter{txWriter{tx}, st.compact}, writes); err != nil {
		return nil, err
	}
	st.last = writes[len(writes)-1].Rev
	if err := tx.Put(restoreKey, st.encode()); err != nil {
		return nil, err
	}
	return okResult(st.rev, nil)
}

// restoreWrite is the history record an etcd key bucket entry holds.
func restoreWrite(e restoreEntry, rev int64) (etcdmvcc.Write, error) {
	r, tombstone, err := parseEtcdRevBytes(e.revKey)
	if err != nil {
		return etcdmvcc.Write{}, err
	}
	if r.Main < 1 || r.Main > rev {
		return etcdmvcc.Write{}, fmt.Errorf("revision %v outside the snapshot's [1, %d]", r, rev)
	}
	kv := &mvccpb.KeyValue{}
	if err := proto.Unmarshal(e.kv, kv); err != nil {
		return etcdmvcc.Write{}, fmt.Errorf("revision %v: KeyValue: %v", r, err)
	}
	if len(kv.Key) == 0 {
		return etcdmvcc.Write{}, fmt.Errorf("revision %v: empty key", r)
	}
	if tombstone {
		return etcdmvcc.Write{Key: kv.Key, Rev: r, Rec: etcdmvcc.HistRecord{Kind: etcdmvcc.KindDelete}}, nil
	}
	if kv.ModRevision != r.Main || kv.CreateRevision < 1 || kv.CreateRevision > r.Main || kv.Version < 1 {
		return etcdmvcc.Write{}, fmt.Errorf("revision %v: key %q with create_revision %d, mod_revision %d, version %d", r, kv.Key, kv.CreateRevision, kv.ModRevision, kv.Version)
	}
	return etcdmvcc.Write{Key: kv.Key, Rev: r, Rec: etcdmvcc.HistRecord{
		Kind: etcdmvcc.KindPut, CreateRev: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease, Value: kv.Value,
	}}, nil
}

// restoreWriter stores restored history as txWriter stores applied
// history, except that records below the compaction revision get no
// revision index entry: compactTx removes those, and a restored keyspace
// is laid out as the compacted one it was.
type restoreWriter struct {
	txWriter
	compact int64
}

func (w restoreWriter) PutHistory(key []byte, r etcdmvcc.Revision, rec etcdmvcc.HistRecord) error {
	if r.Main >= w.compact {
		return w.txWriter.PutHistory(key, r, rec)
	}
	return w.tx.Put(histKey(key, r), rec.Encode())
}

// ---- the restore RPC ------------------------------------------------------------------

// RestoreServiceName is the gRPC service a restoring client (hedgekv
// etcd-restore, RestoreSnapshot) sends its steps to: hedgekv's, not etcd's
// (etcd has no such call), served beside the etcd API and, like hedgekv's
// Admin service, refused on a store that runs with --disable-admin.
const RestoreServiceName = "hedgekv.etcdapi.Restore"

const restoreMethod = "/" + RestoreServiceName + "/Apply"

// restoreHandler is the service's handler type (grpc.ServiceDesc).
type restoreHandler interface {
	restoreRPC(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.Int64Value, error)
}

// registerRestore serves RestoreServiceName on g: Apply takes a restore
// step (restoreCmd's wire form, kind byte included) and answers the
// snapshot's revision; the step is proposed to the etcd region, through its
// leader.
func registerRestore(g *grpc.Server, s *Service) {
	g.RegisterService(&grpc.ServiceDesc{
		ServiceName: RestoreServiceName,
		HandlerType: (*restoreHandler)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Apply",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.BytesValue)
				if err := dec(in); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, req any) (any, error) {
					return srv.(restoreHandler).restoreRPC(ctx, req.(*wrapperspb.BytesValue))
				}
				if interceptor == nil {
					return h(ctx, in)
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: restoreMethod}, h)
			},
		}},
		Metadata: "server/etcdapi/restore.go",
	}, s)
}

func (s *Service) restoreRPC(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.Int64Value, error) {
	if len(in.Value) == 0 || in.Value[0] != kindRestore {
		return nil, status.Error(codes.InvalidArgument, "etcdserver: hedgekv: not a restore step")
	}
	if _, err := decodeRestoreCmd(in.Value[1:]); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: bad restore step: %v", err)
	}
	rev, _, leader, err := s.write(ctx, in.Value)
	if leader != 0 {
		if leader == s.cfg.Store.ID() || forwarded(ctx) || s.cfg.Conn == nil {
			return nil, err
		}
		conn, cerr := s.cfg.Conn(leader)
		if cerr != nil {
			return nil, status.Errorf(codes.Unavailable, "etcdserver: hedgekv: forward to store %d: %v", leader, cerr)
		}
		out := new(wrapperspb.Int64Value)
		if err := conn.Invoke(forwardContext(ctx), restoreMethod, in, out); err != nil {
			return nil, err
		}
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	return wrapperspb.Int64(rev), nil
}
