package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/bbolt"

	"github.com/hedgekv/hedgekv/storage/vfs"
	"github.com/hedgekv/hedgekv/storage/wal"
)

// Checkpoints: how bbolt is committed without an fsync and still survives
// power loss (docs/design.md, "The write path").
//
// The Ready loop's rounds write into one bbolt transaction, the batch
// (batch.go), that a checkpoint commits with NoSync: its pages and meta
// page are written, then synced by the checkpoint. The rounds' raft state
// (entries, hard state) was synced in their WAL records, and what they
// applied is rebuilt by raft from the applied index, so no commit's own
// fsync is needed for any promise. What bbolt needs is to stay a
// consistent tree: an unsynced commit may reach the disk in part (a meta
// page without the pages it points to), and it may overwrite pages the
// last synced state still uses. So:
//
//   - A checkpoint syncs the file (DB.Sync), then copies its two meta pages
//     into store.ckpt (written, synced, renamed), and opens a read
//     transaction on that state: bbolt reuses no page a reader may see, so
//     no commit until the next checkpoint touches a page the checkpoint's
//     tree uses. The previous checkpoint's reader is closed only then.
//   - On open, store.ckpt's meta pages are written back over store.db's:
//     bbolt opens at the checkpoint, whatever later unsynced commits left
//     on disk, and every WAL record after the checkpoint's seq (meta
//     bucket, "wal_seq", written by each round) is replayed into bbolt's
//     raft log and hard state; raft then re-applies the committed entries
//     past the applied index, as after any restart.
//   - A checkpoint runs every Options.CheckpointInterval of rounds, after every
//     round that changes a region's shape (a snapshot, a split, a
//     membership change, a removal), after every write outside the Ready
//     loop (engine.update), and at close; it deletes the WAL segments it
//     covers.
//
// The pinned reader would deadlock a commit that must remap bbolt's file
// (a remap waits for every reader). Mapping initialMmapSize up front makes
// that happen only past 8 GiB; a store whose file comes within 1 GiB of
// its mapping (or one on a 32-bit platform) stops checkpointing this way
// and commits every transaction with bbolt's own fsyncs (sync mode).
// DefaultCheckpointInterval is Options.CheckpointInterval's default.
const DefaultCheckpointInterval = 100 * time.Millisecond

var ckptMagic = []byte("HKVCKPT1")

// restoreCheckpoint writes the checkpoint's meta pages back over the
// bbolt file's, if there is a checkpoint.
// The checkpoint file goes through fs; store.db is bbolt's, on the
// operating system's file system.
func restoreCheckpoint(fs vfs.FS, dir string) error {
	data, err := vfs.ReadFile(fs, filepath.Join(dir, ckptFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(data) < 16 || !bytes.Equal(data[:8], ckptMagic) {
		return fmt.Errorf("%s: bad header: %w", ckptFile, ErrCorrupt)
	}
	pageSize := binary.BigEndian.Uint32(data[8:])
	sum := binary.BigEndian.Uint32(data[12:])
	pages := data[16:]
	if uint64(len(pages)) != 2*uint64(pageSize) || crc32.Checksum(pages, wal.CRC) != sum {
		return fmt.Errorf("%s: bad checksum or size: %w", ckptFile, ErrCorrupt)
	}
	f, err := os.OpenFile(filepath.Join(dir, boltFile), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("restore checkpoint: %w", err)
	}
	defer f.Close()
	// A file shorter than the checkpoint's tree was damaged after it (its
	// size was synced with the tree): bbolt would fault reading past its
	// end, so it is refused here.
	if fi, err := f.Stat(); err != nil {
		return fmt.Errorf("restore checkpoint: %w", err)
	} else if need := metaHighWater(pages, pageSize); fi.Size() < need {
		return fmt.Errorf("store.db holds %d bytes, its checkpoint's tree %d: %w", fi.Size(), need, ErrCorrupt)
	}
	if _, err := f.WriteAt(pages, 0); err != nil {
		return fmt.Errorf("restore checkpoint: %w", err)
	}
	return fdatasyncFile(f)
}

// metaHighWater is the file size the newer of two bbolt meta pages needs:
// its high-water page id times the page size. (bbolt's meta page: a
// 16-byte page header, then magic, version, page size and flags (4 bytes
// each), the root bucket (16), the freelist page id (8), the high-water
// page id (8) and the txid (8), little-endian.)
func metaHighWater(pages []byte, pageSize uint32) int64 {
	var need int64
	var txid uint64
	for i := range 2 {
		m := pages[i*int(pageSize):]
		if len(m) < 72 {
			continue
		}
		if t := binary.LittleEndian.Uint64(m[64:]); i == 0 || t > txid {
			txid = t
			need = int64(binary.LittleEndian.Uint64(m[56:])) * int64(pageSize)
		}
	}
	return need
}

// readMetaPages returns the bbolt file's two meta pages as they are now.
func (e *Engine) readMetaPages() ([]byte, error) {
	pageSize := e.db.Info().PageSize
	f, err := os.Open(filepath.Join(e.dir, boltFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	pages := make([]byte, 2*pageSize)
	if _, err := f.ReadAt(pages, 0); err != nil {
		return nil, fmt.Errorf("checkpoint: read meta pages: %w", err)
	}
	return pages, nil
}

// writeCheckpointFile makes pages (two synced meta pages) store.ckpt.
func (e *Engine) writeCheckpointFile(pages []byte) error {
	out := append([]byte(nil), ckptMagic...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(pages)/2))
	out = binary.BigEndian.AppendUint32(out, crc32.Checksum(pages, wal.CRC))
	out = append(out, pages...)
	tmp := filepath.Join(e.dir, ckptFile+".tmp")
	tf, err := e.fs.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := tf.Write(out); err != nil {
		tf.Close()
		return err
	}
	if !e.noSync {
		if err := tf.Sync(); err != nil {
			tf.Close()
			return err
		}
	}
	if err := tf.Close(); err != nil {
		return err
	}
	if err := e.fs.Rename(tmp, filepath.Join(e.dir, ckptFile)); err != nil {
		return err
	}
	if e.noSync {
		return nil
	}
	return vfs.SyncDir(e.fs, e.dir)
}

// checkpointLocked makes everything committed so far durable and the new
// restore point (see above). e.mu is held.
func (e *Engine) checkpointLocked() error {
	if err := e.settleBatchLocked(); err != nil {
		return err
	}
	if !e.noSync {
		if err := e.db.Sync(); err != nil {
			return fmt.Errorf("checkpoint: sync: %w", err)
		}
		e.boltSynced()
	}
	if !e.syncMode && (mmapSize() == 0 || e.FileSize() > int64(mmapSize())-(1<<30)) {
		if err := e.enterSyncModeLocked(); err != nil {
			return err
		}
	}
	if !e.syncMode {
		pages, err := e.readMetaPages()
		if err != nil {
			return err
		}
		if err := e.writeCheckpointFile(pages); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		pin, err := e.db.Begin(false)
		if err != nil {
			return fmt.Errorf("checkpoint: pin: %w", err)
		}
		if e.pin != nil {
			e.pin.Rollback()
		}
		e.pin = pin
	}
	e.ckptAt = time.Now()
	e.stats.checkpoints++
	if e.wal != nil {
		return e.wal.Truncate(e.wal.Seq())
	}
	return nil
}

// checkpointAsync starts a checkpoint whose sync runs off the caller's
// goroutine (the Ready loop goes on meanwhile), if none is in flight. An
// error is kept for the next round.
func (e *Engine) checkpointAsync() error {
	if !e.ckptMu.TryLock() {
		return nil
	}
	e.mu.Lock()
	if err := e.ckptErr; err != nil {
		e.ckptErr = nil
		e.mu.Unlock()
		e.ckptMu.Unlock()
		return err
	}
	if !e.offLockCheckpointsLocked() {
		err := e.checkpointLocked()
		e.mu.Unlock()
		e.ckptMu.Unlock()
		return err
	}
	ck, err := e.beginCheckpointLocked()
	e.mu.Unlock()
	if err != nil {
		e.ckptMu.Unlock()
		return err
	}
	go func() {
		defer e.ckptMu.Unlock()
		if err := e.finishCheckpoint(ck); err != nil {
			e.mu.Lock()
			e.ckptErr = err
			e.mu.Unlock()
		}
	}()
	return nil
}

// offLockCheckpointsLocked reports whether a checkpoint may sync outside
// e.mu (beginCheckpointLocked): not in sync mode nor about to enter it.
func (e *Engine) offLockCheckpointsLocked() bool {
	return !e.syncMode && !e.noSync && e.wal != nil && mmapSize() > 0 && e.FileSize() <= int64(mmapSize())-(1<<30)
}

// pendingCheckpoint is a checkpoint begun under e.mu and finished outside.
type pendingCheckpoint struct {
	pin     *bbolt.Tx // a reader on the state T being checkpointed
	covered uint64    // T's wal_seq
	pages   []byte    // T's meta pages
}

// beginCheckpointLocked pins the current state T with a reader and copies
// its meta pages; finishCheckpoint, outside e.mu, makes T the restore
// point: DB.Sync makes T's pages durable (they were written before it
// started; later commits touch no page of T or of the checkpoint still in
// force, both pinned), store.ckpt gets T's meta pages, and only then does
// T's reader replace the old pin and the WAL lose the records T covers.
// e.mu and ckptMu are held.
func (e *Engine) beginCheckpointLocked() (pendingCheckpoint, error) {
	if err := e.settleBatchLocked(); err != nil {
		return pendingCheckpoint{}, err
	}
	pin, err := e.db.Begin(false)
	if err != nil {
		return pendingCheckpoint{}, fmt.Errorf("checkpoint: pin: %w", err)
	}
	ck := pendingCheckpoint{pin: pin}
	if v := pin.Bucket(bucketMeta).Get(keyWALSeq); len(v) == 8 {
		ck.covered = binary.BigEndian.Uint64(v)
	}
	if ck.pages, err = e.readMetaPages(); err != nil {
		pin.Rollback()
		return pendingCheckpoint{}, err
	}
	e.ckptAt = time.Now()
	return ck, nil
}

// finishCheckpoint: see beginCheckpointLocked. ckptMu is held, e.mu not.
func (e *Engine) finishCheckpoint(ck pendingCheckpoint) error {
	if e.beforeCheckpointSync != nil {
		e.beforeCheckpointSync()
	}
	err := e.db.Sync()
	if err == nil {
		e.boltSynced()
		err = e.writeCheckpointFile(ck.pages)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		ck.pin.Rollback()
		return fmt.Errorf("checkpoint: %w", err)
	}
	if e.pin != nil {
		e.pin.Rollback()
	}
	e.pin = ck.pin
	e.stats.checkpoints++
	if err := e.wal.Truncate(ck.covered); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// enterSyncModeLocked: from now on every commit runs bbolt's own fsyncs and
// nothing is restored on open (the file was just synced).
func (e *Engine) enterSyncModeLocked() error {
	e.db.NoSync = e.noSync
	if err := e.fs.Remove(filepath.Join(e.dir, ckptFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if !e.noSync {
		if err := vfs.SyncDir(e.fs, e.dir); err != nil {
			return err
		}
	}
	if e.pin != nil {
		e.pin.Rollback()
		e.pin = nil
	}
	e.syncMode = true
	return nil
}

func (e *Engine) FileSize() int64 {
	fi, err := os.Stat(filepath.Join(e.dir, boltFile))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// Probe writes and deletes a record and makes that durable: whether the
// disk takes writes again after a failure.
func (e *Engine) Probe() error {
	return e.Update(func(tx *Tx) error {
		b := tx.tx.Bucket(bucketMeta)
		if err := b.Put(keyDiskProbe, uint64Bytes(uint64(time.Now().UnixNano()))); err != nil {
			return err
		}
		return b.Delete(keyDiskProbe)
	})
}

// Update runs fn in a write transaction outside the Ready loop and returns
// once it is durable (a checkpoint). Only the commit holds e.mu: the
// checkpoint's sync runs outside it, as a background one's does, so the
// Ready loop's rounds go on meanwhile (a split's ID allocation held every
// region of its store for 8-23 ms under load).
func (e *Engine) Update(fn func(*Tx) error) error {
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	e.mu.Lock()
	err := errBatchLost // the store is frozen until its rebuild
	if !e.lost {
		err = e.commitBatchLocked()
	}
	if err == nil {
		err = e.db.Update(e.wrapFn(fn))
	}
	if err != nil {
		e.mu.Unlock()
		return err
	}
	if !e.offLockCheckpointsLocked() {
		defer e.mu.Unlock()
		return e.checkpointLocked()
	}
	ck, err := e.beginCheckpointLocked()
	e.mu.Unlock()
	if err != nil {
		return err
	}
	return e.finishCheckpoint(ck)
}

// round persists one Ready round: prepare's items as one synced WAL record
// (none: no record) and, meanwhile, fn in a bbolt transaction committed
// without an fsync that also records the record's seq. It returns once
// both are done. The WAL write runs beside the bbolt transaction, not
// before it: a bbolt commit is never trusted past the last checkpoint
// (open restores that), so a crash between the two loses only what
// nobody was promised. durable, if not nil, runs on the WAL's goroutine
// as soon as the record is synced (not at all without a record, or if the
// write failed), while fn may still run: what the round promises with
// the WAL alone (a follower's acks) may go then. It must not take the
// engine's lock, which round holds.
func (e *Engine) Round(prepare func() []wal.Item, durable func(), fn func(*Tx) error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var seq uint64
	var walDone chan error
	var sync bool
	if items := prepare(); len(items) > 0 {
		var err error
		if seq, err = e.wal.Encode(items); err != nil {
			return err
		}
		e.stats.walRecords.Add(1)
		for _, it := range items {
			sync = sync || it.MustSync
		}
		walDone = make(chan error, 1)
		go func() {
			err := e.wal.WriteEncoded(sync)
			if err == nil && durable != nil {
				durable()
			}
			walDone <- err
		}()
	}
	err := e.roundTxLocked(fn, seq)
	if walDone != nil {
		if werr := <-walDone; werr != nil {
			return werr
		}
		if sync {
			e.stats.walSyncs.Add(1)
		}
	}
	return err
}

// checkpointIfDue checkpoints if force is set or the last checkpoint is
// Options.CheckpointInterval old.
func (e *Engine) CheckpointIfDue(force bool) error {
	if !force {
		e.mu.Lock()
		due := e.sinceCkpt && time.Since(e.ckptAt) >= e.ckptInterval
		err := e.ckptErr
		e.ckptErr = nil
		if e.lost && err == nil {
			// A commit outside the loop (a digest's, an update's) lost
			// the batch: the loop freezes now, even with no round to run.
			err = errBatchLost
		}
		e.mu.Unlock()
		if err != nil {
			return err
		}
		if !due {
			return nil
		}
		return e.checkpointAsync()
	}
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.checkpointLocked()
}

// openWAL opens the round log in dir, handing out seqs after the last
// one bbolt's committed state covers (its wal_seq): a power loss may take
// WAL records a checkpoint covers (commit-only records are not synced),
// and a seq reused would be skipped by the next replay.
func (e *Engine) openWAL(dir string) (*wal.WAL, []wal.Record, error) {
	var covered uint64
	if err := e.db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyWALSeq); len(v) == 8 {
			covered = binary.BigEndian.Uint64(v)
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	return wal.Open(dir, wal.Options{FS: e.fs, NoSync: e.noSync, Covered: covered})
}

// replayWAL writes the raft state of every record after the bbolt file's
// wal_seq into its raft log and hard state, as the rounds did. A region's
// entries the apply state says are compacted are skipped; a region item
// that installs a snapshot is skipped whole: a round that installs one
// checkpoints before it sends anything, so a record of one found after the
// checkpoint is of a round that never completed (nothing of it was
// promised).
func (e *Engine) replayWAL(recs []wal.Record) (replayed int, err error) {
	err = e.db.Update(func(tx *bbolt.Tx) error {
		var walSeq uint64
		if v := tx.Bucket(bucketMeta).Get(keyWALSeq); len(v) == 8 {
			walSeq = binary.BigEndian.Uint64(v)
		}
		st := tx.Bucket(bucketRaftState)
		last := walSeq
		for _, r := range recs {
			if r.Seq <= walSeq {
				continue
			}
			replayed++
			last = r.Seq
			for _, it := range r.Items {
				if it.Snap {
					continue
				}
				var truncated uint64
				if v := st.Get(stateKey(it.RegionID, suffixApplyState)); v != nil {
					as, err := DecodeApplyState(v)
					if err != nil {
						return fmt.Errorf("region %d: %w", it.RegionID, err)
					}
					truncated = as.TruncatedIndex
				}
				ents := it.Entries
				for len(ents) > 0 && ents[0].Index <= truncated {
					ents = ents[1:]
				}
				if len(ents) > 0 {
					if err := appendEntries(tx, it.RegionID, ents, 0); err != nil {
						return err
					}
					if err := deleteLogAfter(tx, it.RegionID, ents[len(ents)-1].Index); err != nil {
						return err
					}
				}
				if it.Hard != nil {
					if err := putHardState(tx, it.RegionID, *it.Hard); err != nil {
						return err
					}
				}
			}
		}
		if last > walSeq {
			return tx.Bucket(bucketMeta).Put(keyWALSeq, uint64Bytes(last))
		}
		return nil
	})
	return replayed, err
}

// deleteLogAfter removes the region's log entries after index.
func deleteLogAfter(tx *bbolt.Tx, regionID, index uint64) error {
	b := tx.Bucket(bucketRaftLog)
	c := b.Cursor()
	prefix := logKey(regionID, 0)[:8]
	var keys [][]byte
	for k, _ := c.Seek(logKey(regionID, index+1)); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		keys = append(keys, append([]byte(nil), k...))
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
