package etcdapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hedgekv/hedgekv/etcdmvcc"
)

// RestoreOptions tune RestoreSnapshot.
type RestoreOptions struct {
	// SkipHashCheck restores a file without the sha256 trailer
	// Maintenance.Snapshot appends (an etcd data directory's member/snap/db),
	// as etcdutl snapshot restore --skip-hash-check does. A file with a
	// trailer is always checked.
	SkipHashCheck bool
	// DropLeases restores keys attached to leases without their leases.
	// Without it a snapshot that holds leases, or keys attached to one, is
	// refused: the restore does not carry leases.
	DropLeases bool
	// BatchBytes and BatchEntries bound one restore step (one raft log
	// entry): 1 MiB and 10000 by default. An entry larger than BatchBytes
	// goes alone.
	BatchBytes, BatchEntries int
	// CallTimeout bounds each step's call (30s by default); a step that
	// fails with Unavailable or DeadlineExceeded is sent again, to the next
	// connection, up to 20 times: steps are idempotent.
	CallTimeout time.Duration
	// Progress, if set, is called after each step with the entries sent and
	// their total.
	Progress func(sent, total int)
}

// RestoreResult is what RestoreSnapshot restored.
type RestoreResult struct {
	// Revision is the keyspace's revision after the restore: the
	// snapshot's.
	Revision int64
	// CompactRevision is the snapshot's compaction revision (-1: none).
	CompactRevision int64
	// Entries is the number of history records restored; Keys the number
	// of keys that exist at Revision.
	Entries, Keys int
	// LeasedKeys counts the restored records detached from a lease
	// (DropLeases).
	LeasedKeys int
	// AlreadyRestored: this snapshot had been restored into the keyspace
	// already (a run again after one that finished); nothing was sent.
	AlreadyRestored bool
	// SHA256 is the snapshot's database digest: the restore's identity.
	SHA256 []byte
}

// SnapshotInfo is what ReadSnapshotInfo finds in a snapshot file.
type SnapshotInfo struct {
	// Revision is the keyspace's revision the file holds (etcd's: the
	// newest key bucket revision, or the compaction's if later; 1 for an
	// empty one); CompactRevision its compaction revision (-1: none).
	Revision, CompactRevision int64
	// Entries is the key bucket's entry count, Leases the lease bucket's;
	// LeasedEntries the puts attached to a lease.
	Entries, Leases, LeasedEntries int
	// HasHash: the file ends with the sha256 trailer, which matched.
	HasHash bool
	SHA256  []byte
}

// snapshotFile is an open snapshot: its bbolt database and what was
// learnt of it.
type snapshotFile struct {
	db   *bolt.DB
	info SnapshotInfo
	// drop are the revisions a compaction at info.CompactRevision removes
	// and the file still holds (an etcd member's snapshot taken while a
	// compaction was under way): restored, a compacted keyspace holds none.
	drop map[etcdmvcc.Revision]bool
}

// ErrSnapshotFile is wrapped by every error of a snapshot file that
// cannot be restored as it is: unreadable, damaged, not an etcd backend,
// or holding what a restore does not carry (leases) without the option
// that lets it go.
var ErrSnapshotFile = errors.New("snapshot file")

// openSnapshot checks the file's sha256 trailer (as etcdutl snapshot
// restore does: a file whose size is 32 more than a multiple of 512 has
// one) and opens it read-only.
func openSnapshot(path string, skipHashCheck bool) (*snapshotFile, error) {
	s, err := openSnapshotFile(path, skipHashCheck)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrSnapshotFile, path, err)
	}
	return s, nil
}

func openSnapshotFile(path string, skipHashCheck bool) (*snapshotFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	size := st.Size()
	hasHash := size%512 == sha256.Size
	dbSize := size
	if hasHash {
		dbSize -= sha256.Size
	}
	h := sha256.New()
	_, err = io.Copy(h, io.LimitReader(f, dbSize))
	var trailer []byte
	if err == nil && hasHash {
		trailer = make([]byte, sha256.Size)
		_, err = io.ReadFull(f, trailer)
	}
	f.Close()
	if err != nil {
		return nil, err
	}
	sum := h.Sum(nil)
	switch {
	case hasHash && !bytes.Equal(sum, trailer):
		return nil, fmt.Errorf("sha256 trailer %x does not match the database's %x: the file is damaged", trailer, sum)
	case !hasHash && !skipHashCheck:
		return nil, fmt.Errorf("no sha256 trailer (%d bytes; a snapshot is 32 more than a multiple of 512): not a snapshot from Maintenance.Snapshot (a data directory's db restores with the hash check skipped)", size)
	}
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	s := &snapshotFile{db: db, info: SnapshotInfo{HasHash: hasHash, SHA256: sum, CompactRevision: -1}}
	if err := s.scan(); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// scan reads the file's meta and key bucket once: revisions, counts, and
// the records a finished compaction would have removed.
func (s *snapshotFile) scan() error {
	return s.db.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(etcdMetaBucket); meta != nil {
			for _, k := range [][]byte{etcdFinishedCompactKey, etcdScheduledCompactKey} {
				if v := meta.Get(k); v != nil {
					r, _, err := parseEtcdRevBytes(v)
					if err != nil {
						return fmt.Errorf("meta %s: %w", k, err)
					}
					s.info.CompactRevision = max(s.info.CompactRevision, r.Main)
				}
			}
		}
		if lb := tx.Bucket(etcdLeaseBucket); lb != nil {
			s.info.Leases = lb.Stats().KeyN
		}
		kb := tx.Bucket(etcdKeyBucket)
		if kb == nil {
			return errors.New(`no "key" bucket: not an etcd backend`)
		}
		compact := s.info.CompactRevision
		base := map[string][]etcdmvcc.HistRef{} // records at or below the compaction
		var last int64
		err := kb.ForEach(func(k, v []byte) error {
			r, tombstone, err := parseEtcdRevBytes(k)
			if err != nil {
				return err
			}
			last = r.Main
			s.info.Entries++
			if !tombstone || r.Main <= compact {
				kv := &mvccpb.KeyValue{}
				if err := proto.Unmarshal(v, kv); err != nil {
					return fmt.Errorf("revision %v: KeyValue: %w", r, err)
				}
				if !tombstone && kv.Lease != 0 {
					s.info.LeasedEntries++
				}
				if r.Main <= compact {
					base[string(kv.Key)] = append(base[string(kv.Key)], etcdmvcc.HistRef{Rev: r, Delete: tombstone})
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		s.info.Revision = max(last, s.info.CompactRevision, 1)
		for _, refs := range base {
			for _, ref := range refs[:etcdmvcc.CompactPrefix(refs, compact)] {
				if s.drop == nil {
					s.drop = map[etcdmvcc.Revision]bool{}
				}
				s.drop[ref.Rev] = true
			}
		}
		return nil
	})
}

// ReadSnapshotInfo checks a snapshot file (its sha256 trailer unless
// skipHashCheck and it has none) and says what it holds.
func ReadSnapshotInfo(path string, skipHashCheck bool) (SnapshotInfo, error) {
	s, err := openSnapshot(path, skipHashCheck)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer s.db.Close()
	return s.info, nil
}

// RestoreSnapshot loads the etcd snapshot file at path into the etcd
// keyspace of the cluster conns reach (any of its stores: they forward to
// the keyspace's leader), which must be empty: every key with its value,
// create and mod revisions and version, the history from the snapshot's
// compaction revision on, and the revision itself. An interrupted restore
// resumes when run again with the same file.
func RestoreSnapshot(ctx context.Context, conns []grpc.ClientConnInterface, path string, opts RestoreOptions) (RestoreResult, error) {
	if len(conns) == 0 {
		return RestoreResult{}, errors.New("restore: no connection")
	}
	if opts.BatchBytes <= 0 {
		opts.BatchBytes = 1 << 20
	}
	if opts.BatchEntries <= 0 {
		opts.BatchEntries = 10000
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 30 * time.Second
	}
	s, err := openSnapshot(path, opts.SkipHashCheck)
	if err != nil {
		return RestoreResult{}, err
	}
	defer s.db.Close()
	info := s.info
	if (info.Leases > 0 || info.LeasedEntries > 0) && !opts.DropLeases {
		return RestoreResult{}, fmt.Errorf("%w %s: %d leases and %d records of keys attached to one: a restore does not carry leases (restore the keys without them, with DropLeases: hedgekv etcd-restore --drop-leases)",
			ErrSnapshotFile, path, info.Leases, info.LeasedEntries)
	}
	res := RestoreResult{Revision: info.Revision, CompactRevision: info.CompactRevision, SHA256: info.SHA256}
	id := info.SHA256
	next := 0
	// call sends a step; it answers the snapshot's revision, or 0 if the
	// snapshot was restored already.
	call := func(c *restoreCmd) (int64, error) {
		c.id, c.rev, c.compact = id, info.Revision, info.CompactRevision
		in := wrapperspb.Bytes(c.encode())
		for attempt := 0; ; attempt++ {
			cctx, cancel := context.WithTimeout(ctx, opts.CallTimeout)
			out := new(wrapperspb.Int64Value)
			err := conns[next%len(conns)].Invoke(cctx, restoreMethod, in, out)
			cancel()
			if err == nil {
				return out.Value, nil
			}
			code := status.Code(err)
			if ctx.Err() != nil || (code != codes.Unavailable && code != codes.DeadlineExceeded) || attempt >= 20 {
				return 0, err
			}
			next++
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(time.Duration(min(attempt+1, 10)) * 100 * time.Millisecond):
			}
		}
	}
	if rev, err := call(&restoreCmd{op: restoreBegin}); err != nil {
		return res, &stepError{"begin", err}
	} else if rev == 0 {
		res.AlreadyRestored = true
		return res, nil
	}
	live := map[string]bool{}
	batch := &restoreCmd{op: restoreBatch}
	var last etcdmvcc.Revision
	size := 0
	flush := func() error {
		if len(batch.entries) == 0 {
			return nil
		}
		if _, err := call(batch); err != nil {
			return &stepError{fmt.Sprintf("records after revision %v", batch.mark), err}
		}
		res.Entries += len(batch.entries)
		if opts.Progress != nil {
			opts.Progress(res.Entries, info.Entries-len(s.drop))
		}
		batch = &restoreCmd{op: restoreBatch, mark: last}
		size = 0
		return nil
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		err := tx.Bucket(etcdKeyBucket).ForEach(func(k, v []byte) error {
			r, tombstone, err := parseEtcdRevBytes(k)
			if err != nil {
				return err
			}
			if s.drop[r] {
				return nil
			}
			kv := &mvccpb.KeyValue{}
			if err := proto.Unmarshal(v, kv); err != nil {
				return fmt.Errorf("revision %v: KeyValue: %w", r, err)
			}
			live[string(kv.Key)] = !tombstone
			if !tombstone && kv.Lease != 0 {
				kv.Lease = 0
				if v, err = proto.Marshal(kv); err != nil {
					return err
				}
				res.LeasedKeys++
			}
			if len(batch.entries) > 0 && (len(batch.entries) >= opts.BatchEntries || size+len(k)+len(v) > opts.BatchBytes) {
				if err := flush(); err != nil {
					return err
				}
			}
			// bbolt's bytes live as long as the transaction: the batch
			// is sent within it.
			batch.entries = append(batch.entries, restoreEntry{revKey: k, kv: v})
			size += len(k) + len(v) + 8
			last = r
			return nil
		})
		if err != nil {
			return err
		}
		return flush()
	})
	if err != nil {
		return res, err
	}
	if _, err := call(&restoreCmd{op: restoreCommit, mark: last}); err != nil {
		return res, &stepError{"commit", err}
	}
	for _, ok := range live {
		if ok {
			res.Keys++
		}
	}
	return res, nil
}

// stepError is a restore step's failure: a gRPC status error keeps its
// code (status.Code finds it) and reads as "restore: STEP: CODE: message".
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string {
	if st, ok := status.FromError(e.err); ok {
		return fmt.Sprintf("restore: %s: %s: %s", e.step, st.Code(), st.Message())
	}
	return fmt.Sprintf("restore: %s: %v", e.step, e.err)
}

func (e *stepError) Unwrap() error { return e.err }
