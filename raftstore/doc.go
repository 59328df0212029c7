// Package raftstore is one process's Store: the region Peers it hosts, each
// an etcd-io/raft RawNode; the Ready loop; apply; snapshots; ReadIndex,
// the leader lease and follower read; typed notices beside raft messages
// (notice.go); and the Transport that carries both between stores
// (message.go routes what arrives). It reaches disk only through one
// storage engine per store (package storage/engine: bbolt, the round log,
// the batch and its overlay, checkpoints, snapshot files), whose
// transactions have a method per kind of record; no file here sees
// bbolt. Regions split by hand or when the split check finds them too big
// (split.go), never inside a range Config.KeepWhole keeps whole, which
// EnsureBoundaries makes a region of its own (keepwhole.go).
//
// # The Ready loop
//
// One goroutine per store drives every peer. Requests and inbound messages
// are stepped into a peer's RawNode by the caller's goroutine under the
// peer's mutex and mark the peer dirty; the loop wakes on that or on a tick
// and runs one round over the dirty peers:
//
//  1. collectReady: issue each peer's queued reads as one ReadIndex batch
//     (reads never join a batch already in flight: its index may predate
//     them), step the writes proposed since the last round into raft as
//     ONE proposal (Store.propose only queues them: a round's writes then
//     travel in one MsgApp per follower and come back in one ack each),
//     then take the peer's Ready. sendEarly then sends a leader's appends
//     and heartbeats (see 5).
//  2. persistAndApply: persist, for all peers at once, ONE record of the
//     round log (storage/wal: new entries, hard state, a snapshot mark),
//     fdatasynced when it holds what a promise rests on (entries, a vote or
//     term change, a snapshot: raft's Ready.MustSync; a record of commit
//     indexes alone is only written): group commit, at most one fsync per
//     round however many regions and requests it carries. Beside that write, in the batch, ONE bbolt
//     write transaction that the rounds share, committed every 20 ms and
//     at checkpoints (storage/engine, batch.go; user writes show through the overlay until
//     then): snapshot (the region's log and state; its
//     data was written before, outside the loop, which held that peer's
//     Ready meanwhile: snapapply.go), new log entries (dropping any
//     conflicting tail) and the hard state. bbolt is committed and made
//     durable by checkpoints (storage/engine, checkpoint.go: every 100 ms, and after any
//     round that changes a region's shape, before it sends); a restart
//     restores the last one and replays the round log. A failed write
//     freezes the store (diskfail.go); a lost batch is rebuilt from the
//     round log before it goes on.
//  3. In the same transaction, apply committed entries (they are durable on
//     a quorum already; raft only hands out entries this peer persisted:
//     puts and deletes, splits, conf changes, and the commands of another
//     layer, which its Config.Applier applies: applier.go) and
//     record the applied index with the data it covers, and compact the log
//     once it grows past the GC threshold. The round's user writes join
//     the overlay when it ends, all at once.
//  4. After the round's write, publish: update the in-memory log mirror raft reads
//     from, the peer's term/leader/applied index; revoke the lease on any
//     leader or term change; with follower leases on, record the keys the
//     new entries write (before 5 acknowledges them); wake proposers whose
//     entries were applied, ReadIndex waiters whose ReadState arrived, and
//     readers waiting for the applied index to reach their read index.
//  5. sendHeld: send the round's remaining raft messages and Flush the
//     transport. A leader's appends and heartbeats went out already, before
//     step 2: a leader may persist in parallel with its followers (raft's
//     own doc.go), and it counts itself toward a commit only once its own
//     write is done. A follower's messages (acks, votes, ReadIndex
//     requests) went out as soon as step 2's WAL record was synced, while
//     the bbolt transaction may still run (sendDurable): they promise only
//     raft's entries and hard state, which that record holds. Everything
//     else (a leader's other messages, a snapshot's ack) is sent only now,
//     so nothing a message promises can be lost in a crash.
//  6. advance: advance each RawNode; a peer with more to do stays dirty.
//
// Reads never wait for the loop when the leader holds a valid lease, nor,
// with follower leases on, when a follower holds a valid read lease and has
// applied what the read needs: they read the applied state (the overlay
// over bbolt) directly (see lease.go, followerlease.go and docs/design.md
// for the rules). With follower leases on, step 4 also records the keys the new
// log entries write before step 5 acknowledges them, and the leader caps
// followers' acknowledgements before raft sees them.
// Writes are acknowledged in step 4, after the entry is applied, so an
// acknowledged write is durable on a quorum and visible to every later read.
package raftstore
