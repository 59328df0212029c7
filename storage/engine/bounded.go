package engine

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/hedgekv/hedgekv/storage/vfs"
	"go.etcd.io/bbolt"
)

// Bounded writes for snapshot applies and range clears: at most a few
// MiB, or a few thousand deletes, per bbolt transaction (snapapply.go).

// lockedUpdate runs fn in a write transaction under the engine's lock,
// committed as the loop's rounds are (made durable by the next checkpoint).
func (e *Engine) LockedUpdate(fn func(*Tx) error) error { return e.lockedUpdate(e.wrapFn(fn)) }

func (e *Engine) lockedUpdate(fn func(*bbolt.Tx) error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.commitBatchLocked(); err != nil {
		return err
	}
	return e.db.Update(fn)
}

// ApplySnapshotFile writes the snapshot in the file at path into the
// engine in bounded transactions: it clears rg's range (but what claimed
// holds) and the region's log, then writes the dedup records and the
// pairs. stop is checked before each transaction. It returns the dedup
// clock base, which the caller writes with the region's state
// (Tx.FinishSnapshot).
func (e *Engine) ApplySnapshotFile(path string, rg Span, claimed []Span, stop func() error) (uint64, error) {
	for _, iv := range FreeRanges(rg.StartKey, rg.EndKey, claimed) {
		if err := e.ClearUserRange(iv[0], iv[1], stop); err != nil {
			return 0, err
		}
	}
	if err := e.clearKeys(bucketRaftLog, logKey(rg.ID, 0), logKey(rg.ID+1, 0), stop); err != nil {
		return 0, err
	}
	f, err := e.fs.Open(path)
	if err != nil {
		return 0, fmt.Errorf("open snapshot file: %w", err)
	}
	defer f.Close()
	w := &batchWriter{e: e, stop: stop}
	var base uint64
	err = decodeSnapshotStream(f, func(sd *snapshotData) error {
		if sd.span.ID != rg.ID || !bytes.Equal(sd.span.StartKey, rg.StartKey) || !bytes.Equal(sd.span.EndKey, rg.EndKey) {
			return fmt.Errorf("snapshot file holds %s, not %s: %w", sd.span, rg, ErrCorrupt)
		}
		base = sd.dedupBase
		for _, d := range sd.dedup {
			if !dedupKeyFits(d.Key) {
				continue
			}
			if err := w.put(bucketDedup, dedupKey(d.Key, d.ID), binary.BigEndian.AppendUint64(nil, d.Clock)); err != nil {
				return err
			}
		}
		return nil
	}, func(k, v []byte) error { return w.put(bucketData, k, v) })
	if err == nil {
		err = w.flush()
	}
	return base, err
}

// batchWriter puts pairs in transactions of at most Options.ApplyBatchBytes.
type batchWriter struct {
	e     *Engine
	stop  func() error
	arena []byte
	puts  []batchPut
}

type batchPut struct {
	bucket []byte
	k, v   []byte
}

func (w *batchWriter) put(bucket, k, v []byte) error {
	if len(w.arena)+len(k)+len(v) > cap(w.arena) && len(w.puts) > 0 {
		if err := w.flush(); err != nil {
			return err
		}
	}
	if w.arena == nil {
		w.arena = make([]byte, 0, max(w.e.applyBatch, len(k)+len(v)))
	}
	if len(k)+len(v) > cap(w.arena)-len(w.arena) {
		w.arena = make([]byte, 0, len(k)+len(v)) // one oversized pair
	}
	w.arena = append(w.arena, k...)
	kc := w.arena[len(w.arena)-len(k):]
	w.arena = append(w.arena, v...)
	vc := w.arena[len(w.arena)-len(v):]
	w.puts = append(w.puts, batchPut{bucket: bucket, k: kc, v: vc})
	return nil
}

// flush commits the pairs put so far; bbolt holds the slices until then,
// so the arena is reused only after.
func (w *batchWriter) flush() error {
	if len(w.puts) == 0 {
		return nil
	}
	if err := w.stop(); err != nil {
		return err
	}
	err := w.e.lockedUpdate(func(tx *bbolt.Tx) error {
		for _, p := range w.puts {
			if err := tx.Bucket(p.bucket).Put(p.k, p.v); err != nil {
				return err
			}
		}
		return nil
	})
	clear(w.puts)
	w.puts = w.puts[:0]
	if cap(w.arena) > w.e.applyBatch {
		w.arena = nil
	} else {
		w.arena = w.arena[:0]
	}
	return err
}

// ClearUserRange deletes the pairs of user keys in [start, end) (end
// empty: no bound) and their dedup records.
func (e *Engine) ClearUserRange(start, end []byte, stop func() error) error {
	var hi []byte
	if len(end) > 0 {
		hi = end
	}
	if err := e.clearKeys(bucketData, start, hi, stop); err != nil {
		return err
	}
	lo, dhi := dedupRange(start, end)
	return e.clearKeys(bucketDedup, lo, dhi, stop)
}

// clearKeys deletes bucket's keys in [lo, hi) (hi nil: no bound),
// Options.ClearBatchKeys a transaction. Each transaction collects its keys first
// and deletes them by key: deleting under a cursor and seeking the start
// again walks every leaf emptied so far, which is quadratic.
func (e *Engine) clearKeys(bucket, lo, hi []byte, stop func() error) error {
	for {
		if err := stop(); err != nil {
			return err
		}
		done := false
		err := e.lockedUpdate(func(tx *bbolt.Tx) error {
			b := tx.Bucket(bucket)
			keys := make([][]byte, 0, 256)
			c := b.Cursor()
			k, _ := c.Seek(lo)
			for ; k != nil && (hi == nil || bytes.Compare(k, hi) < 0) && len(keys) < e.clearBatch; k, _ = c.Next() {
				keys = append(keys, bytes.Clone(k))
			}
			done = k == nil || (hi != nil && bytes.Compare(k, hi) >= 0)
			for _, k := range keys {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
			if !done {
				lo = k // the first key not deleted: the next batch starts there
				lo = bytes.Clone(lo)
			}
			return nil
		})
		if err != nil || done {
			return err
		}
	}
}

// FreeRanges returns [start, end) (end empty: no bound) less the ranges of
// claimed, as [start, end) pairs in key order.
func FreeRanges(start, end []byte, claimed []Span) [][2][]byte {
	cs := slices.Clone(claimed)
	slices.SortFunc(cs, func(a, b Span) int { return bytes.Compare(a.StartKey, b.StartKey) })
	var out [][2][]byte
	cur := start
	for _, c := range cs {
		if len(end) > 0 && bytes.Compare(c.StartKey, end) >= 0 {
			break
		}
		if len(c.EndKey) > 0 && bytes.Compare(c.EndKey, cur) <= 0 {
			continue // before cur
		}
		if bytes.Compare(c.StartKey, cur) > 0 {
			out = append(out, [2][]byte{cur, c.StartKey})
		}
		if len(c.EndKey) == 0 {
			return out // claimed to the end
		}
		cur = c.EndKey
	}
	if len(end) == 0 || bytes.Compare(cur, end) < 0 {
		out = append(out, [2][]byte{cur, end})
	}
	return out
}

// SyncSnapshotFile makes a received snapshot file durable: a restart may
// apply it again.
func (e *Engine) SyncSnapshotFile(path string) error {
	if e.noSync {
		return nil
	}
	f, err := e.fs.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return vfs.SyncDir(e.fs, filepath.Dir(path))
}
