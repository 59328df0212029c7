package etcdapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"

	bolt "go.etcd.io/bbolt"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hedgekv/hedgekv/etcdmvcc"
	"github.com/hedgekv/hedgekv/raftstore"
)

// Maintenance.Snapshot: the etcd keyspace at one revision, as a file in
// etcd's own backend format (a bbolt database with etcd's buckets,
// server/storage/schema), so that etcdctl snapshot save, etcdutl snapshot
// status and etcdutl snapshot restore take it as an etcd member's.
//
// The keyspace is one region, so one read view of that region is a
// consistent cut of all of it: the view is taken after the read barrier
// a linearizable Range takes (the session's read mode), at the keyspace's
// revision R then, and the file holds what etcd's backend would hold at R
// after the same compactions:
//
//	"key":  main(8) '_' sub(8) [ 't' ]  -> mvccpb.KeyValue   (etcd's revision keys; 't': a deletion,
//	                                       whose KeyValue holds the key only)
//	        every history record the keyspace keeps, from the compaction
//	        revision up to R (below it, each key's record the compaction
//	        kept: its state at the compaction)
//	"meta": consistent_index, term       -> the region's applied index and term (8, big-endian)
//	        finishedCompactRev,
//	        scheduledCompactRev          -> the compaction revision (etcd's revision bytes), if any
//	        storageVersion               -> snapshotStorageVersion
//	"lease", "alarm", "cluster", "members", "members_removed",
//	"auth", "authUsers", "authRoles": empty, as a new etcd member's
//
// The file is written to a temporary file while the view is held, then
// streamed as etcd streams its backend: chunks of SnapshotResponse
// {remaining_bytes, blob}, then one more whose blob is the file's sha256
// (so the saved file's size is a multiple of 512 plus 32, which is how
// etcdctl and etcdutl recognise the trailer). The first response also
// carries a header whose revision is R (etcd sends none; clientv3's
// SnapshotWithVersion returns it).

// snapshotStorageVersion is the storage version the file declares (meta
// "storageVersion", and SnapshotResponse.version): the one Status reports.
const snapshotStorageVersion = "3.6.0"

// snapshotChunk is the blob size of a SnapshotResponse: etcd's
// snapshotSendBufferSize.
const snapshotChunk = 32 * 1024

// etcd's bucket and meta key names (server/storage/schema/bucket.go).
var (
	etcdKeyBucket   = []byte("key")
	etcdMetaBucket  = []byte("meta")
	etcdLeaseBucket = []byte("lease")
	// Every bucket a new etcd backend has, created empty where there is
	// nothing to put: etcdutl snapshot restore writes the new cluster's
	// members into "members".
	etcdBuckets = [][]byte{etcdKeyBucket, etcdMetaBucket, etcdLeaseBucket, []byte("alarm"), []byte("cluster"),
		[]byte("members"), []byte("members_removed"), []byte("auth"), []byte("authUsers"), []byte("authRoles")}

	etcdConsistentIndexKey  = []byte("consistent_index")
	etcdTermKey             = []byte("term")
	etcdFinishedCompactKey  = []byte("finishedCompactRev")
	etcdScheduledCompactKey = []byte("scheduledCompactRev")
	etcdStorageVersionKey   = []byte("storageVersion")
)

// etcdRevBytes is etcd's revision key (server/storage/mvcc/revision.go):
// main(8) '_' sub(8), then 't' for a deletion (a tombstone).
func etcdRevBytes(r etcdmvcc.Revision, tombstone bool) []byte {
	b := make([]byte, 17, 18)
	binary.BigEndian.PutUint64(b, uint64(r.Main))
	b[8] = '_'
	binary.BigEndian.PutUint64(b[9:], uint64(r.Sub))
	if tombstone {
		b = append(b, 't')
	}
	return b
}

// parseEtcdRevBytes decodes etcdRevBytes.
func parseEtcdRevBytes(b []byte) (r etcdmvcc.Revision, tombstone bool, err error) {
	if (len(b) != 17 && len(b) != 18) || b[8] != '_' || (len(b) == 18 && b[17] != 't') {
		return etcdmvcc.Revision{}, false, fmt.Errorf("etcd revision key %x: not main(8) '_' sub(8) ['t']", b)
	}
	r = etcdmvcc.Revision{Main: int64(binary.BigEndian.Uint64(b)), Sub: int64(binary.BigEndian.Uint64(b[9:]))}
	if r.Main < 0 || r.Sub < 0 {
		return etcdmvcc.Revision{}, false, fmt.Errorf("etcd revision key %x: negative revision", b)
	}
	return r, len(b) == 18, nil
}

// etcdKeyValue is the key bucket's value for key's history record h at r:
// the KeyValue etcd stores (a deletion: the key alone).
func etcdKeyValue(key []byte, r etcdmvcc.Revision, h etcdmvcc.HistRecord) ([]byte, error) {
	kv := &mvccpb.KeyValue{Key: key}
	if h.Kind == etcdmvcc.KindPut {
		kv = h.Record(r.Main).KeyValue(key)
	}
	return proto.Marshal(kv)
}

// Snapshot implements etcd's Maintenance.Snapshot (etcdctl snapshot save).
func (s *Service) Snapshot(req *pb.SnapshotRequest, srv pb.Maintenance_SnapshotServer) error {
	ctx := srv.Context()
	opts, err := s.readOptions(ctx, false)
	if err != nil {
		return err
	}
	path, rev, err := s.snapshotFile(ctx, opts)
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return err
		}
		if leader := s.leaderFor(ctx, err); leader != 0 {
			return s.forwardSnapshot(ctx, leader, toStatus(err), req, srv)
		}
		return toStatus(err)
	}
	defer os.Remove(path)
	return s.sendSnapshot(srv, path, rev)
}

// snapshotFile writes the keyspace, as of one linearizable read view, into
// a new temporary file in etcd's backend format, and returns its path and
// the revision it holds. On an error the file is gone.
func (s *Service) snapshotFile(ctx context.Context, opts raftstore.ReadOptions) (path string, rev int64, err error) {
	f, err := os.CreateTemp("", "hedgekv-etcd-snapshot-*.db")
	if err != nil {
		return "", 0, status.Errorf(codes.Internal, "etcdserver: hedgekv: snapshot file: %v", err)
	}
	path = f.Name()
	f.Close()
	defer func() {
		if err != nil {
			os.Remove(path)
		}
	}()
	_, err = s.cfg.Store.ReadView(ctx, opts, []byte(Prefix), func(sv raftstore.StateView) error {
		v := readView(ctx, sv)
		cur, err := v.currentRev()
		if err != nil {
			return err
		}
		compacted, err := v.compactRev()
		if err != nil {
			return err
		}
		var index, term uint64
		if st, ok := s.regionStatus(); ok {
			index, term = st.AppliedIndex, st.Term
		}
		rev = cur
		return writeBackend(ctx, path, v, cur, compacted, index, term, s.knobs().BackendBatch)
	})
	return path, rev, err
}

// backendBatch is how many key bucket entries (or bytes of them) one bbolt
// transaction of writeBackend holds (TestingKnobs.BackendBatch makes it
// small).
const (
	backendBatch      = 10000
	backendBatchBytes = 16 << 20
)

// writeBackend writes v's history up to cur, compacted at compacted (-1:
// never), into a new bbolt file at path in etcd's schema; index and term
// are the meta's consistent index and term. It reads v in revision order
// and appends, so the key bucket is written sequentially as etcd writes it.
// Errors that are not the view's (the file's) are status errors: they are
// this store's, and no other store would do better.
func writeBackend(ctx context.Context, path string, v view, cur, compacted int64, index, term uint64, batch int) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true, NoGrowSync: true})
	if err != nil {
		return status.Errorf(codes.Internal, "etcdserver: hedgekv: snapshot file: %v", err)
	}
	fileErr := func(err error) error {
		if err == nil {
			return nil
		}
		if _, ok := status.FromError(err); ok {
			return err
		}
		return status.Errorf(codes.Internal, "etcdserver: hedgekv: snapshot file: %v", err)
	}
	if batch <= 0 {
		batch = backendBatch
	}
	w := &backendWriter{db: db, batch: batch}
	err = w.history(ctx, v, cur, compacted)
	if err == nil {
		err = fileErr(w.flush())
	}
	if err == nil {
		err = fileErr(db.Update(func(tx *bolt.Tx) error {
			for _, name := range etcdBuckets {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return err
				}
			}
			meta := tx.Bucket(etcdMetaBucket)
			puts := [][2][]byte{{etcdStorageVersionKey, []byte(snapshotStorageVersion)}}
			if index > 0 {
				puts = append(puts, [2][]byte{etcdConsistentIndexKey, binary.BigEndian.AppendUint64(nil, index)})
			}
			if term > 0 {
				puts = append(puts, [2][]byte{etcdTermKey, binary.BigEndian.AppendUint64(nil, term)})
			}
			if compacted >= 0 {
				c := etcdRevBytes(etcdmvcc.Revision{Main: compacted}, false)
				puts = append(puts, [2][]byte{etcdFinishedCompactKey, c}, [2][]byte{etcdScheduledCompactKey, c})
			}
			for _, p := range puts {
				if err := meta.Put(p[0], p[1]); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	if cerr := db.Close(); err == nil {
		err = fileErr(cerr)
	}
	return err
}

// backendWriter appends key bucket entries in revision order, a bbolt
// transaction per backendBatch of them.
type backendWriter struct {
	db      *bolt.DB
	batch   int // entries per transaction
	keys    [][]byte
	vals    [][]byte
	bytes   int
	last    etcdmvcc.Revision
	started bool
}

func (w *backendWriter) put(ctx context.Context, key []byte, r etcdmvcc.Revision, h etcdmvcc.HistRecord) error {
	if w.started && r.Compare(w.last) <= 0 {
		return fmt.Errorf("etcd history: revision %v after %v: %w", r, w.last, etcdmvcc.ErrCorrupt)
	}
	w.started, w.last = true, r
	val, err := etcdKeyValue(key, r, h)
	if err != nil {
		return status.Errorf(codes.Internal, "etcdserver: hedgekv: snapshot: %v", err)
	}
	w.keys = append(w.keys, etcdRevBytes(r, h.Kind == etcdmvcc.KindDelete))
	w.vals = append(w.vals, val)
	w.bytes += len(val) + 18
	if len(w.keys) >= w.batch || w.bytes >= backendBatchBytes {
		if err := ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		if err := w.flush(); err != nil {
			return status.Errorf(codes.Internal, "etcdserver: hedgekv: snapshot file: %v", err)
		}
	}
	return nil
}

func (w *backendWriter) flush() error {
	err := w.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(etcdKeyBucket)
		if err != nil {
			return err
		}
		b.FillPercent = 0.9 // etcd's UnsafeSeqPut
		for i, k := range w.keys {
			if err := b.Put(k, w.vals[i]); err != nil {
				return err
			}
		}
		return nil
	})
	w.keys, w.vals, w.bytes = w.keys[:0], w.vals[:0], 0
	return err
}

// history writes v's history records in revision order: first the records
// below the compaction revision (one per key at most: its state at the
// compaction, which compactTx kept but whose revision index entry it
// dropped), found in the history itself, then every record from the
// compaction on, in the revision index's order.
func (w *backendWriter) history(ctx context.Context, v view, cur, compacted int64) error {
	get := func(key []byte, r etcdmvcc.Revision) error {
		b, ok, err := v.r.get(histKey(key, r))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("etcd history of %q at %v: indexed but missing: %w", key, r, etcdmvcc.ErrCorrupt)
		}
		h, err := etcdmvcc.DecodeHistRecord(bytes.Clone(b))
		if err != nil {
			return err
		}
		return w.put(ctx, key, r, h)
	}
	if compacted > 0 {
		type ref struct {
			key []byte
			rev etcdmvcc.Revision
		}
		var base []ref
		var derr error
		err := v.r.scan(histPrefix, histEnd, func(k, _ []byte) bool {
			key, r, err := parseHistKey(k)
			if err != nil {
				derr = err
				return false
			}
			if r.Main < compacted {
				base = append(base, ref{key, r})
			}
			return true
		})
		if derr != nil {
			return derr
		}
		if err != nil {
			return err
		}
		sort.Slice(base, func(i, j int) bool { return base[i].rev.Compare(base[j].rev) < 0 })
		for _, b := range base {
			if err := get(b.key, b.rev); err != nil {
				return err
			}
		}
	}
	var derr error
	err := v.r.scan(revIndexKey(etcdmvcc.Revision{Main: max(compacted, 0)}), revEnd, func(k, key []byte) bool {
		r, err := etcdmvcc.ParseRevision(k[len(revPrefix):])
		if err != nil {
			derr = err
			return false
		}
		if r.Main > cur {
			return false
		}
		if err := get(bytes.Clone(key), r); err != nil {
			derr = err
			return false
		}
		return true
	})
	if derr != nil {
		return derr
	}
	return err
}

// sendSnapshot streams the file at path as etcd's maintenance server
// streams its backend, then its sha256.
func (s *Service) sendSnapshot(srv pb.Maintenance_SnapshotServer, path string, rev int64) error {
	f, err := os.Open(path)
	if err != nil {
		return status.Errorf(codes.Internal, "etcdserver: hedgekv: snapshot file: %v", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return status.Errorf(codes.Internal, "etcdserver: hedgekv: snapshot file: %v", err)
	}
	total := st.Size()
	h := sha256.New()
	var sent int64
	header := s.header(rev)
	for first := true; first || sent < total; first = false {
		// A new buffer per message: Send may still hold the last one.
		buf := make([]byte, min(snapshotChunk, total-sent))
		n, err := io.ReadFull(f, buf)
		if err != nil && !errors.Is(err, io.EOF) {
			return status.Errorf(codes.Internal, "etcdserver: hedgekv: snapshot file: %v", err)
		}
		sent += int64(n)
		h.Write(buf[:n])
		resp := &pb.SnapshotResponse{RemainingBytes: uint64(total - sent), Blob: buf[:n], Version: snapshotStorageVersion}
		if first {
			resp.Header = header
		}
		if err := srv.Send(resp); err != nil {
			return err
		}
	}
	return srv.Send(&pb.SnapshotResponse{Blob: h.Sum(nil), Version: snapshotStorageVersion})
}

// forwardSnapshot relays store id's Snapshot stream (the leader's: this
// store could not take the read barrier), as forward does a unary call;
// err is what to return when it cannot.
func (s *Service) forwardSnapshot(ctx context.Context, id uint64, err error, req *pb.SnapshotRequest, srv pb.Maintenance_SnapshotServer) error {
	if id == s.cfg.Store.ID() || forwarded(ctx) || s.cfg.Conn == nil {
		return err
	}
	conn, cerr := s.cfg.Conn(id)
	if cerr != nil {
		return status.Errorf(codes.Unavailable, "etcdserver: hedgekv: forward to store %d: %v", id, cerr)
	}
	stream, err := pb.NewMaintenanceClient(conn).Snapshot(forwardContext(ctx), req)
	if err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := srv.Send(m); err != nil {
			return err
		}
	}
}

// forwardContext is the outgoing context of a request this store forwards
// (forward's): marked forwarded, with the session's read mode.
func forwardContext(ctx context.Context) context.Context {
	out := metadata.AppendToOutgoingContext(ctx, mdForwarded, "1")
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for _, k := range []string{MetadataReadMode, MetadataMaxStaleness} {
			for _, v := range md.Get(k) {
				out = metadata.AppendToOutgoingContext(out, k, v)
			}
		}
	}
	return out
}
