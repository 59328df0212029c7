package etcdmvcc

import (
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// A View is the storage evaluation reads: current records, history records
// and the compaction revision, all as of one moment (the caller holds it
// still, e.g. inside one read transaction, for the length of a call).
//
// Key ranges here are plain byte ranges [start, end), end nil meaning no
// upper bound; etcd's conventions (an empty range_end for one key, "\x00"
// for "to the end") are mapped by RangeSpan before a View sees them.
//
// Keys and records handed to fn, and records returned, may be retained by
// the caller and are never modified by it: a View backed by memory that
// changes (a bbolt transaction's pages) must copy them.
type View interface {
	// Get returns key's current record; ok is false if key does not exist
	// (never written, or deleted since its last put).
	Get(key []byte) (rec Record, ok bool, err error)

	// Scan calls fn with every existing key in [start, end) and its current
	// record, in ascending key order, until fn returns false.
	Scan(start, end []byte, fn func(key []byte, rec Record) bool) error

	// GetAt returns key's record as of revision rev: from the key's newest
	// history record whose Revision.Main ≤ rev (any Sub), a put made at
	// Main (HistRecord.Record). ok is false if there is no such record or
	// it is a deletion. rev is ≥ CompactRev (the caller checked); below it
	// the answer may be incomplete.
	GetAt(key []byte, rev int64) (rec Record, ok bool, err error)

	// ScanAt is Scan as of revision rev: every key in [start, end) that
	// GetAt(key, rev) finds, with that record, in ascending key order.
	ScanAt(start, end []byte, rev int64, fn func(key []byte, rec Record) bool) error

	// CompactRev is the revision of the last compaction: history before it
	// is gone. It is -1 if the store was never compacted, as etcd's
	// compactMainRev (server/storage/mvcc/kvstore.go), which decides
	// whether a Range with revision -1 inside a Txn is refused.
	CompactRev() int64
}

// Leases is implemented by a View that knows which leases exist. Apply then
// refuses a put that attaches a lease it does not know with
// rpctypes.ErrGRPCLeaseNotFound, where etcd's apply does
// (server/etcdserver/txn/put.go: checkLease). With a View that does not
// implement it, lease IDs are stored unchecked: the caller checked them.
type Leases interface {
	LeaseExists(id int64) bool
}

// A Write is one change Apply made: key's history record at Rev, and so
// its new current record (a put) or the end of it (a deletion). Apply
// returns them in Rev order; Commit stores them.
type Write struct {
	Key []byte
	Rev Revision
	Rec HistRecord
}

// Current is the current record w leaves; ok is false for a deletion.
func (w Write) Current() (rec Record, ok bool) {
	if w.Rec.Kind != KindPut {
		return Record{}, false
	}
	return w.Rec.Record(w.Rev.Main), true
}

// A Writer stores what Apply produced. Its methods are called in the order
// of the writes; a key may be written more than once in one revision (a
// put then a delete), the later call winning for its current record.
type Writer interface {
	PutRecord(key []byte, rec Record) error
	DeleteRecord(key []byte) error
	PutHistory(key []byte, rev Revision, rec HistRecord) error
}

// Commit stores writes in w: each one's history record and the current
// record it leaves.
func Commit(w Writer, writes []Write) error {
	for _, wr := range writes {
		if err := w.PutHistory(wr.Key, wr.Rev, wr.Rec); err != nil {
			return err
		}
		if rec, ok := wr.Current(); ok {
			if err := w.PutRecord(wr.Key, rec); err != nil {
				return err
			}
		} else if err := w.DeleteRecord(wr.Key); err != nil {
			return err
		}
	}
	return nil
}

// An Event is one change as a watcher sees it: etcd's mvccpb.Event and its
// Revision, whose Sub orders the events of one revision (etcd sends them
// in that order). Event.Kv is the key after the change (a deletion: the
// key and ModRevision only, as etcd's watchable_store_txn.go makes it);
// Event.PrevKv is the key before the request, at Rev.Main-1, nil for a
// creation, which is what etcd's watch server reads for a watcher with
// prev_kv (server/etcdserver/api/v3rpc/watch.go); a watcher without it
// drops it.
type Event struct {
	Rev   Revision
	Event *mvccpb.Event
}
