// Package etcdmvcc evaluates etcd v3 KV requests (Put, DeleteRange, Txn,
// Range) exactly as etcd v3.7 does, over a small storage interface, so that
// a Raft state machine can apply them deterministically at a given
// revision: server/etcdapi applies them in the etcd keyspace's region
// (docs/design.md, "etcd's v3 API").
//
// It is pure: no I/O, no clocks, no goroutines; it imports the standard
// library, etcd's API protobufs (go.etcd.io/etcd/api/v3) and google/btree.
//
// # Model
//
// A key has a current Record (create_revision, mod_revision, version, lease,
// value) while it exists, and a history: one HistRecord per change (a put
// or a deletion), named by the key and the change's Revision {Main, Sub}.
// Main is the revision of the request that made the change, Sub its
// position among that request's changes. The byte layout of storage keys
// is the caller's (AppendHistoryKey is one that keeps a key's history
// contiguous and in revision order); records have compact, strict codecs
// (Record.Encode, DecodeRecord, HistRecord.Encode, DecodeHistRecord).
//
// Evaluation reads a View (current records, the state as of a revision,
// the compaction revision) and never writes it:
//
//   - CheckRequest: etcd's validation before proposing (v3rpc/key.go).
//   - Apply(v, rev, req): the response, the Writes (for Commit into a
//     Writer) and the Events (for watchers) of one request applied at rev.
//   - Range(v, req, atRev): a read, current or as of atRev; ReadRev makes
//     etcd's ErrCompacted/ErrFutureRev decision that picks atRev.
//   - CompactPrefix: which of a key's history records a compaction removes;
//     CheckCompact: whether it may run.
//
// MemStore implements View, Writer and Leases in memory. The differential
// test holds MemStore to a real etcd's answers, and package etcdmvcctest
// holds a stored View and Writer (bbolt, to come) to MemStore's.
//
// # Revisions
//
// etcd counts revisions 1, 2, 3, ...: the store starts at 1, each request
// that changes something takes the next, one that changes nothing (a Txn of
// Ranges, a DeleteRange of nothing, a Txn whose branch writes nothing)
// takes none, and a response's header carries the revision after it.
// Apply takes rev, the revision the request's changes get, and reports
// whether it used it (len(writes) > 0); everything revision-dependent in
// its answer is computed from rev and rev-1 ("the state before"), so the
// caller may hand out sparse revisions (hedgekv's timestamp oracle) as long
// as they rise per store: the state at rev-1 is then the state before the
// request.
//
// What etcd does that this package does not: lease expiry and revocation
// (a revocation is a DeleteRange the caller builds from its lease index),
// auth, the request size limit, and the Compact request's effect beyond
// CheckCompact and CompactPrefix (the caller records the revision and
// sweeps). What etcd would panic on, Apply refuses with an error.
package etcdmvcc
