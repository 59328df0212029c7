package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"go.etcd.io/bbolt"
)

// Snapshot is a read view of the store's user data at one moment: the
// committed bbolt state and the overlay (overlay.go) as they were paired
// under the view lock, so it holds every round applied before it was
// taken and nothing of any after, however long it is read. (Not a
// region's snapshot, the replication format of snapshot.go.)
//
// It holds a bbolt read transaction open until Release: bbolt cannot
// reuse the pages a held reader still sees, so the file grows while one
// stays open under writes. Release it as soon as the reading is done. A
// Snapshot is for one goroutine at a time.
type Snapshot struct {
	tx *bbolt.Tx
	ov *overlay // a lazy clone: the engine's overlay goes on without it
	// lo, hi bound what may be read (Within); hi empty: no upper bound.
	lo, hi []byte
}

// ErrSnapshotReleased: a Snapshot was read after its Release.
var ErrSnapshotReleased = errors.New("engine: snapshot released")

// ErrOutOfBounds: a Snapshot was asked for a key outside the range it
// was bounded to (Within).
var ErrOutOfBounds = errors.New("engine: key outside the snapshot's range")

// Snapshot takes a read view of the user data as of now (see Snapshot).
// Taking it is cheap: a read transaction's start and a copy-on-write clone
// of the overlay, under the view lock's read side as Get takes it.
func (e *Engine) Snapshot() (*Snapshot, error) {
	e.view.RLock()
	defer e.view.RUnlock()
	tx, err := e.db.Begin(false)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return &Snapshot{tx: tx, ov: e.ov.clone()}, nil
}

// Within narrows what s may be read to [start, end) (end empty: no upper
// bound) and returns s: a Get outside fails with ErrOutOfBounds, a Scan is
// clamped to it. Bounds only narrow: the result lies within the earlier
// bounds too.
func (s *Snapshot) Within(start, end []byte) *Snapshot {
	if bytes.Compare(start, s.lo) > 0 {
		s.lo = bytes.Clone(start)
	}
	if len(end) > 0 && (len(s.hi) == 0 || bytes.Compare(end, s.hi) < 0) {
		s.hi = bytes.Clone(end)
	}
	return s
}

func (s *Snapshot) contains(key []byte) bool {
	return bytes.Compare(key, s.lo) >= 0 && (len(s.hi) == 0 || bytes.Compare(key, s.hi) < 0)
}

// Get reads key as of the snapshot; found is false for a missing or
// deleted key. The value is a copy.
func (s *Snapshot) Get(key []byte) (value []byte, found bool, err error) {
	if s.tx == nil {
		return nil, false, ErrSnapshotReleased
	}
	if !s.contains(key) {
		return nil, false, fmt.Errorf("get %q: %w", key, ErrOutOfBounds)
	}
	if v, del, ok := s.ov.get(key); ok {
		if del {
			return nil, false, nil
		}
		return bytes.Clone(v), true, nil
	}
	if v := s.tx.Bucket(bucketData).Get(key); v != nil {
		return bytes.Clone(v), true, nil
	}
	return nil, false, nil
}

// Scan calls fn for every pair of [start, end) (end empty: no upper
// bound; both clamped to the snapshot's bounds) as of the snapshot, in
// key order, deleted keys left out, until fn returns false. k and v are
// valid only until fn returns: copy what is kept. It stops with ctx's
// error once ctx ends (looked at every scanCheckEvery keys of the file).
func (s *Snapshot) Scan(ctx context.Context, start, end []byte, fn func(k, v []byte) bool) error {
	if s.tx == nil {
		return ErrSnapshotReleased
	}
	if bytes.Compare(start, s.lo) < 0 {
		start = s.lo
	}
	if len(s.hi) > 0 && (len(end) == 0 || bytes.Compare(end, s.hi) > 0) {
		end = s.hi
	}
	if len(end) > 0 && bytes.Compare(start, end) >= 0 {
		return nil
	}
	// The overlay's part of the range whole: it is small (a batch
	// interval's writes, at most batchMaxWrites keys) and shares its bytes.
	ov := s.ov.rangeFrom(start, end, int(^uint(0)>>1))
	var err error
	mergeEach(ov, dataCursor(ctx, s.tx, start, end, &err), func(k, v []byte) bool {
		// ctx ended: the file stopped early, so the overlay's items left
		// would skip its pairs. Nothing more is shown.
		return err == nil && fn(k, v)
	})
	return err
}

// Release ends the snapshot's read transaction; reads after it fail with
// ErrSnapshotReleased. It may be called more than once.
func (s *Snapshot) Release() {
	if s.tx != nil {
		_ = s.tx.Rollback()
		s.tx, s.ov = nil, nil
	}
}
