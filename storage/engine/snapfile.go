package engine

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"go.etcd.io/bbolt"

	"github.com/hedgekv/hedgekv/storage/wal"
)

// Snapshot files: a snapshot received whole (through the engine's file
// system) before raft sees it, in the data directory's snap/.

// SnapshotDir is the directory of received snapshot files.
func (e *Engine) SnapshotDir() string { return filepath.Join(e.dir, snapDir) }

// ResetSnapshotDir empties the directory of received snapshot files: what
// is there was received before a restart, and raft has forgotten it.
func (e *Engine) ResetSnapshotDir() error {
	dir := e.SnapshotDir()
	if err := e.fs.RemoveAll(dir); err != nil {
		return fmt.Errorf("clear %s: %w", dir, err)
	}
	if err := wal.MkdirAll(e.fs, dir, e.noSync); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return nil
}

// ReceiveSnapshotFile writes a snapshot stream to path, checking it as it
// goes (every rule of the format), and returns the region metadata it
// carries. The snapshot must be of region regionID.
func (e *Engine) ReceiveSnapshotFile(path string, regionID uint64, r io.Reader) ([]byte, error) {
	f, err := e.fs.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	bw := bufio.NewWriterSize(f, 256<<10)
	var meta []byte
	err = decodeSnapshotStream(io.TeeReader(r, bw), func(sd *snapshotData) error {
		meta = sd.meta
		if sd.span.ID != regionID {
			return fmt.Errorf("snapshot of region %d sent as region %d's: %w", sd.span.ID, regionID, ErrCorrupt)
		}
		return nil
	}, func(k, v []byte) error { return nil })
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("write %s: %w", path, cerr)
	}
	return meta, err
}

// RemoveSnapshotFile deletes a snapshot file; one already gone is no error.
func (e *Engine) RemoveSnapshotFile(path string) error {
	if err := e.fs.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// ApplySnapshotFile is ApplySnapshotFrom the snapshot file at path.
func (t *Tx) ApplySnapshotFile(path string, index, term uint64) ([]byte, error) {
	f, err := t.e.fs.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open snapshot file: %w", err)
	}
	defer f.Close()
	return t.ApplySnapshotFrom(f, index, term)
}

// PersistedRanges returns the ranges of the regions this store holds data
// of (applied something), as persisted, but region except's.
func (e *Engine) PersistedRanges(except uint64) ([]Span, error) {
	var out []Span
	err := e.db.View(func(tx *bbolt.Tx) error {
		st := tx.Bucket(bucketRaftState)
		c := st.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != 9 || k[8] != suffixRegion || binary.BigEndian.Uint64(k) == except {
				continue
			}
			as, err := DecodeApplyState(st.Get(stateKey(binary.BigEndian.Uint64(k), suffixApplyState)))
			if err != nil || as.AppliedIndex == 0 {
				continue
			}
			sp, err := DecodeSpan(v)
			if err != nil {
				return err
			}
			out = append(out, sp)
		}
		return nil
	})
	return out, err
}

// MarkerCount is for tests: the apply and clear markers on disk.
func (e *Engine) MarkerCount() (applies, clears int) {
	_ = e.View(func(tx *Tx) error {
		return tx.ForEachMarker(func(m Marker, _ []byte) error {
			if m.Kind == MarkerSnapApply {
				applies++
			} else {
				clears++
			}
			return nil
		})
	})
	return applies, clears
}

// StoreID returns the store ID recorded in the engine, 0 if none.
func (e *Engine) StoreID() (id uint64, err error) {
	err = e.View(func(tx *Tx) error {
		id = tx.StoreID()
		return nil
	})
	return id, err
}

// Replayed is how many round-log records the open replayed.
func (e *Engine) Replayed() int { return e.replayed }

// DBPath is the bbolt file's path.
func (e *Engine) DBPath() string { return e.db.Path() }
