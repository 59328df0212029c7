package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.etcd.io/bbolt"
)

// The Ready loop's rounds write into ONE bbolt write transaction, the
// batch, committed once it is Config.BatchInterval old, at checkpoints,
// and at once after a round that changes a region's shape or compacts a
// log: not once per round. A per-round commit was most of a write's CPU: the
// commit rewrote the same data, dedup, log and state leaves, and their
// branches, every round (38% of the write path's profile, 14% more in its
// pwrites). Durability does not change: a round's commit was never synced
// nor trusted past the last checkpoint (open restores that and replays the
// WAL), and a checkpoint still commits, syncs and pins as before.
//
// What does change is visibility: bbolt's readers see only committed
// state, so the user writes a round applies are also put in the overlay
// (overlay.go), which every read of user data consults first. Everything
// else read outside the loop reads committed state, which is a consistent
// apply point (the apply state commits with the data it covers), at most
// one interval old: the digest and snapshots (at that point's applied
// index), the split check (an estimate), and raft's log below its
// in-memory mirror, which is why the mirror keeps every entry the open
// batch wrote (logFloor).

// batchLocked is the open batch, begun if none is. e.mu is held.
func (e *Engine) batchLocked() (*bbolt.Tx, error) {
	if e.batch == nil {
		tx, err := e.db.Begin(true)
		if err != nil {
			return nil, fmt.Errorf("begin batch: %w", err)
		}
		e.batch, e.batchAt = tx, time.Now()
	}
	return e.batch, nil
}

// roundTxLocked runs one round's fn in the batch and, if it succeeds,
// shows the user writes it staged (putData, deleteData) to readers. A
// round that fails leaves the batch unusable: it is rolled back with every
// round since the last commit, and the store (frozen by the failure)
// replays them from the WAL before it goes on (recoverLost). e.mu is held.
func (e *Engine) roundTxLocked(fn func(*Tx) error, seq uint64) error {
	if e.lost {
		return errBatchLost
	}
	tx, err := e.batchLocked()
	if err != nil {
		return err
	}
	e.staged = e.staged[:0]
	err = fn(&Tx{e: e, tx: tx, round: true})
	if err == nil && seq > 0 {
		err = tx.Bucket(bucketMeta).Put(keyWALSeq, uint64Bytes(seq))
	}
	if err != nil {
		e.abandonBatchLocked()
		return err
	}
	e.sinceCkpt = true
	if len(e.staged) > 0 {
		e.view.Lock()
		e.ov.add(e.staged)
		e.view.Unlock()
	}
	if e.commitNow || e.syncMode || e.ov.len() >= batchMaxWrites || time.Since(e.batchAt) >= e.batchInterval {
		return e.commitBatchLocked()
	}
	return nil
}

// batchMaxWrites bounds the overlay (and the batch) when checkpoints fall
// behind (a slow disk holds one in its sync): a batch that wrote this many
// keys commits at its round's end, checkpoint or not (etcd's backend
// commits every 100 ms or 10,000 writes).
const batchMaxWrites = 10000

// DefaultBatchInterval (Options.BatchInterval): a batch that has been open
// this long commits at its round's end. A commit holds the loop for as
// long as it writes the batch's pages, and with random keys over a 2 GB store nearly every
// write dirties its own data and dedup leaves: a 100 ms batch held every
// write of the store 10-20 ms at each checkpoint (the 2,000,000-record
// scale run's p99.9 rose 29% over per-round commits), a 20 ms one a
// fifth of that, while rounds still share the commit of the log, state
// and branch pages they all rewrite.
const DefaultBatchInterval = 20 * time.Millisecond

// commitBatchLocked commits the open batch, if any, and empties the
// overlay once the file shows what it held. Readers go on during the
// commit (they see the old file and the overlay, or the new file and the
// overlay, the same data) unless the batch holds writes the overlay does
// not show (a snapshot's data, written whole in its round): then they
// wait, so that none sees part of the change. e.mu is held.
func (e *Engine) commitBatchLocked() error {
	if e.batch == nil {
		return nil
	}
	tx := e.batch
	e.batch = nil
	exclusive := e.rangeWrites
	e.rangeWrites, e.commitNow = false, false
	if exclusive {
		e.view.Lock()
	}
	var err error
	if e.failCommit != nil {
		err = e.failCommit()
	}
	if err != nil {
		_ = tx.Rollback()
	} else {
		err = tx.Commit()
		st := tx.Stats()
		e.stats.pagesWritten.Add(uint64(st.GetWrite()))
	}
	if !exclusive {
		e.view.Lock()
	}
	if err != nil {
		// bbolt rolled the batch back; the overlay still shows it.
		e.lost = true
		e.view.Unlock()
		return fmt.Errorf("commit batch: %w", err)
	}
	e.ov = newOverlay()
	e.view.Unlock()
	e.forgetBatchLog()
	e.stats.batchCommits.Add(1)
	return nil
}

// settleBatchLocked is a checkpoint's first step: the open batch
// committed, so that the file holds every round so far. A lost batch
// fails it: the checkpoint would drop the WAL records that are the only
// copy of the lost rounds, and only the store's rebuild of its peers
// (recoverLost, then recoverFromDisk) may bring them back, since the
// peers in memory have applied what the file no longer holds. e.mu and
// ckptMu are held.
func (e *Engine) settleBatchLocked() error {
	if e.lost {
		return fmt.Errorf("checkpoint: %w", errBatchLost)
	}
	if err := e.commitBatchLocked(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	e.sinceCkpt = false
	return nil
}

// abandonBatchLocked rolls the open batch back after a failed round.
func (e *Engine) abandonBatchLocked() {
	if e.batch != nil {
		_ = e.batch.Rollback()
		e.batch = nil
	}
	e.rangeWrites, e.commitNow = false, false
	e.lost = true
}

// recoverLostLocked, after a batch was lost (a failed round or commit),
// rebuilds what it held from the WAL, as an open after a crash does: the
// raft log and hard state of every round since the last commit, re-read
// from the WAL's segments and written again; raft re-applies the entries
// past the applied index once the peers are rebuilt (the store froze on
// the failure and rebuilds them right after: diskfail.go). The overlay is
// emptied: the file and the peers rebuilt from it agree again. e.mu and
// ckptMu are held.
func (e *Engine) recoverLostLocked() error {
	if !e.lost {
		return nil
	}
	e.abandonBatchLocked()
	e.wal.Close()
	w, recs, err := e.openWAL(e.wal.Dir())
	if err != nil {
		return fmt.Errorf("reopen wal: %w", err)
	}
	e.wal = w
	if _, err := e.replayWAL(recs); err != nil {
		return fmt.Errorf("replay wal: %w", err)
	}
	e.view.Lock()
	e.ov = newOverlay()
	e.view.Unlock()
	e.forgetBatchLog()
	e.lost = false
	e.stats.batchesRebuilt.Add(1)
	return nil
}

// WriteStats is what the engine wrote.
type WriteStats struct {
	// WALRecords and WALSyncs: round-log records written, and those
	// fdatasynced.
	WALRecords, WALSyncs uint64
	// BatchCommits: commits of the rounds' shared bbolt transaction;
	// PagesWritten: the pages those commits wrote (bbolt's TxStats.Write:
	// every dirty page and the meta page), which grow with how scattered
	// a batch's keys are over the B+tree's leaves.
	BatchCommits, PagesWritten uint64
	// BatchesRebuilt: lost batches rebuilt from the WAL.
	BatchesRebuilt uint64
}

// WriteStats returns what the engine wrote so far.
func (e *Engine) WriteStats() WriteStats {
	return WriteStats{
		WALRecords: e.stats.walRecords.Load(), WALSyncs: e.stats.walSyncs.Load(),
		BatchCommits: e.stats.batchCommits.Load(), PagesWritten: e.stats.pagesWritten.Load(),
		BatchesRebuilt: e.stats.batchesRebuilt.Load(),
	}
}

// recoverLost is recoverLostLocked and a checkpoint, if a batch was lost;
// the caller rebuilds the peers from the file next. retire, if a batch
// was lost, runs first, under the engine's lock: the rebuild takes the
// file back to its last commit and empties the overlay, and a peer that
// applied the lost rounds must serve no read from that (its applied index
// and safe points cover what the file no longer holds). It takes the
// peers' mutexes, as a round does under this lock.
func (e *Engine) RecoverLost(retire func()) error {
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.lost {
		return nil
	}
	if retire != nil {
		retire()
	}
	if err := e.recoverLostLocked(); err != nil {
		return err
	}
	return e.checkpointLocked()
}

// errBatchLost: a round after a lost batch, which only a checkpoint (and
// the rebuild of the peers that follows it) can bring back.
var errBatchLost = errors.New("the uncommitted rounds were lost; rebuilding from the WAL")

// putData and deleteData write user data in a round's transaction and
// stage the write for the overlay. The bytes are copied: bbolt keeps what
// it is given until the batch commits, and the overlay longer.
func (e *Engine) putData(tx *bbolt.Tx, key, value []byte) error {
	kv := make([]byte, len(key)+len(value))
	k, v := kv[:len(key):len(key)], kv[len(key):]
	copy(k, key)
	copy(v, value)
	if err := tx.Bucket(bucketData).Put(k, v); err != nil {
		return err
	}
	e.staged = append(e.staged, ovItem{key: k, val: v})
	return nil
}

func (e *Engine) deleteData(tx *bbolt.Tx, key []byte) error {
	k := bytes.Clone(key)
	if err := tx.Bucket(bucketData).Delete(k); err != nil {
		return err
	}
	e.staged = append(e.staged, ovItem{key: k, del: true})
	return nil
}

// wroteRange says the round wrote user data the overlay does not show (a
// snapshot's): the batch commits at the round's end, readers held off.
func (e *Engine) WroteRange() { e.rangeWrites, e.commitNow = true, true }

// commitAtRoundEnd asks for the batch to commit at the round's end (a log
// compaction: a snapshot built from the file must not predate the log's
// new first index).
func (e *Engine) CommitAtRoundEnd() { e.commitNow = true }

// wroteLog records that the open batch wrote regionID's log from index
// first on.
func (e *Engine) WroteLog(regionID, first uint64) {
	e.logMu.Lock()
	if f, ok := e.batchFirst[regionID]; !ok || first < f {
		e.batchFirst[regionID] = first
	}
	e.logMu.Unlock()
}

// forgetBatchLog: the file holds every log entry written so far (the
// batch committed, or was rebuilt).
func (e *Engine) forgetBatchLog() {
	e.logMu.Lock()
	clear(e.batchFirst)
	e.logMu.Unlock()
}

// logFloor is the last index of regionID's log that committed bbolt state
// holds as raft last wrote it: entries after it may be only in the open
// batch, so the mirror keeps them (storage.go). MaxUint64: the batch
// wrote none.
func (e *Engine) LogFloor(regionID uint64) uint64 {
	if e == nil {
		return math.MaxUint64 // a storage without an engine (tests)
	}
	e.logMu.Lock()
	defer e.logMu.Unlock()
	if f, ok := e.batchFirst[regionID]; ok {
		return f - 1
	}
	return math.MaxUint64
}

// viewCommitted runs fn in a read transaction of the current state: the
// open batch is committed first (a replica's digest must cover the writes
// it applied, not those of the last checkpoint). Not for a caller that
// holds a peer's mutex: a round holds e.mu while it takes those.
func (e *Engine) ViewCommitted(fn func(*Tx) error) error {
	e.mu.Lock()
	err := e.commitBatchLocked()
	var tx *bbolt.Tx
	if err == nil {
		tx, err = e.db.Begin(false)
	}
	e.mu.Unlock()
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	return fn(e.wrap(tx))
}

// ViewLatest runs fn on the engine's latest state: the open batch, which
// holds every round persisted so far (a round's hard state, a vote, is
// in it from the moment the round's messages may go out), or committed
// state if no batch is open. For what must never be read behind a round
// (maybeCreatePeer's hard state), and rare: it waits for a round under
// way, and fn runs under the engine's lock, so it must only read, and
// not take a peer's mutex (a round takes those under this lock). A lost
// batch is not read: the store is frozen until its rounds are rebuilt
// from the WAL into committed state, and nothing steps a peer meanwhile.
func (e *Engine) ViewLatest(fn func(*Tx) error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.batch != nil && !e.lost {
		return fn(e.wrap(e.batch))
	}
	return e.db.View(e.wrapFn(fn))
}

// View runs fn in a read transaction of committed state, which lags the
// open batch by up to its interval (see above): for what a consistent
// apply point is enough for.
func (e *Engine) View(fn func(*Tx) error) error { return e.db.View(e.wrapFn(fn)) }

// BeginRead opens a read transaction of committed state, held until
// Release: a snapshot's source, read while it is sent.
func (e *Engine) BeginRead() (*Tx, error) {
	tx, err := e.db.Begin(false)
	if err != nil {
		return nil, err
	}
	return e.wrap(tx), nil
}

// Release ends a transaction BeginRead opened.
func (t *Tx) Release() { _ = t.tx.Rollback() }

// Reads of user data: the overlay over committed bbolt state. Values are
// copied out: bbolt memory is valid only inside its transaction.

func (e *Engine) Get(key []byte) (val []byte, found bool, err error) {
	e.view.RLock()
	defer e.view.RUnlock()
	if v, del, ok := e.ov.get(key); ok {
		if del {
			return nil, false, nil
		}
		return bytes.Clone(v), true, nil
	}
	err = e.db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket(bucketData).Get(key); v != nil {
			val = bytes.Clone(v)
			found = true
		}
		return nil
	})
	return val, found, err
}

func (e *Engine) BatchGet(keys [][]byte) (out []KV, err error) {
	e.view.RLock()
	defer e.view.RUnlock()
	err = e.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketData)
		for _, k := range keys {
			v, del, ok := e.ov.get(k)
			if !ok {
				v = b.Get(k)
			}
			if !del && v != nil {
				out = append(out, KV{Key: bytes.Clone(k), Value: bytes.Clone(v)})
			}
		}
		return nil
	})
	return out, err
}

// scanCheckEvery is how many keys a scan reads between looks at its
// context: often enough that a cancelled scan (the losing attempt of a
// hedged read) stops within microseconds, rarely enough to cost nothing.
const scanCheckEvery = 256

// scan reads up to limit pairs of [start, end) in key order. It stops with
// ctx's error once ctx ends, so a caller that gave up does not keep a
// read transaction open over a long range. The view lock is held only to
// pair a read transaction with the overlay's part of the range.
func (e *Engine) Scan(ctx context.Context, start, end []byte, limit int) (out []KV, err error) {
	if limit <= 0 {
		return nil, nil
	}
	e.view.RLock()
	tx, err := e.db.Begin(false)
	if err != nil {
		e.view.RUnlock()
		return nil, err
	}
	ov := e.ov.rangeFrom(start, end, limit)
	e.view.RUnlock()
	defer func() { _ = tx.Rollback() }()
	out = mergeScan(ov, dataCursor(ctx, tx, start, end, &err), limit)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// dataCursor walks the data bucket's keys in [start, end) (end empty: no
// bound) in tx, as mergeScan and mergeEach take them. It looks at ctx
// before the first key and every scanCheckEvery, and stops with *errp set
// once ctx ended.
func dataCursor(ctx context.Context, tx *bbolt.Tx, start, end []byte, errp *error) func() ([]byte, []byte, bool) {
	c := tx.Bucket(bucketData).Cursor()
	k, v := c.Seek(start)
	n := 0
	return func() ([]byte, []byte, bool) {
		if n > 0 {
			k, v = c.Next()
		}
		n++
		if n%scanCheckEvery == 1 { // before the first key, then every scanCheckEvery
			if *errp = ctx.Err(); *errp != nil {
				return nil, nil, false
			}
		}
		if k == nil || (len(end) > 0 && bytes.Compare(k, end) >= 0) {
			return nil, nil, false
		}
		return k, v, true
	}
}
