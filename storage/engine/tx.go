package engine

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"

	"go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// Tx is a transaction on the engine: a round's (Engine.Round), an update
// outside the loop (Engine.Update), or a read (Engine.View and friends).
// Its methods are one per kind of record, named for what they hold; the
// buckets and keys behind them are the engine's (storage/layout). A Tx is
// valid only inside the function it was given to, and bytes it returns
// are copies unless a method says otherwise.
type Tx struct {
	e     *Engine
	tx    *bbolt.Tx
	round bool // a round's: user writes are staged for the overlay
}

func (e *Engine) wrap(tx *bbolt.Tx) *Tx { return &Tx{e: e, tx: tx} }

func (e *Engine) wrapFn(fn func(*Tx) error) func(*bbolt.Tx) error {
	return func(tx *bbolt.Tx) error { return fn(e.wrap(tx)) }
}

// ---- the store's own records --------------------------------------------------

func (t *Tx) metaUint(key []byte) uint64 {
	if v := t.tx.Bucket(bucketMeta).Get(key); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (t *Tx) putMetaUint(key []byte, v uint64) error {
	return t.tx.Bucket(bucketMeta).Put(key, uint64Bytes(v))
}

// StoreID is the store ID recorded in the engine, 0 if none.
func (t *Tx) StoreID() uint64 { return t.metaUint(keyStoreID) }

// PutStoreID records the store's ID.
func (t *Tx) PutStoreID(id uint64) error { return t.putMetaUint(keyStoreID, id) }

// ClusterID is the ID of the cluster the store belongs to, 0 if none was
// recorded.
func (t *Tx) ClusterID() uint64 { return t.metaUint(keyClusterID) }

// PutClusterID records the ID of the store's cluster.
func (t *Tx) PutClusterID(id uint64) error { return t.putMetaUint(keyClusterID, id) }

// Incarnation is the store's incarnation, 0 if none was recorded.
func (t *Tx) Incarnation() uint64 { return t.metaUint(keyIncarnation) }

// PutIncarnation records the store's incarnation.
func (t *Tx) PutIncarnation(n uint64) error { return t.putMetaUint(keyIncarnation, n) }

// NextID is the store's ID counter (the last ID it allocated).
func (t *Tx) NextID() uint64 { return t.metaUint(keyNextID) }

// PutNextID records the store's ID counter.
func (t *Tx) PutNextID(n uint64) error { return t.putMetaUint(keyNextID, n) }

// ---- a region's raft state ----------------------------------------------------

// RegionMeta is the region's metadata as last written, nil if none.
func (t *Tx) RegionMeta(regionID uint64) []byte {
	return bytes.Clone(t.tx.Bucket(bucketRaftState).Get(stateKey(regionID, suffixRegion)))
}

// PutRegionMeta writes the region's metadata (JSON: see Span).
func (t *Tx) PutRegionMeta(regionID uint64, meta []byte) error {
	return putRegionMeta(t.tx, regionID, meta)
}

// HardState is the region's raft hard state; ok is false if none was
// written.
func (t *Tx) HardState(regionID uint64) (hs raftpb.HardState, ok bool, err error) {
	v := t.tx.Bucket(bucketRaftState).Get(stateKey(regionID, suffixHardState))
	if v == nil {
		return hs, false, nil
	}
	if err := hs.Unmarshal(v); err != nil {
		return hs, false, fmt.Errorf("region %d: decode hard state: %v: %w", regionID, err, ErrCorrupt)
	}
	return hs, true, nil
}

// PutHardState writes the region's raft hard state.
func (t *Tx) PutHardState(regionID uint64, hs raftpb.HardState) error {
	return putHardState(t.tx, regionID, hs)
}

// ApplyState is the region's apply state; an error if none was written.
func (t *Tx) ApplyState(regionID uint64) (ApplyState, error) {
	as, err := DecodeApplyState(t.tx.Bucket(bucketRaftState).Get(stateKey(regionID, suffixApplyState)))
	if err != nil {
		return ApplyState{}, fmt.Errorf("region %d: %w", regionID, err)
	}
	return as, nil
}

// PutApplyState writes the region's apply state.
func (t *Tx) PutApplyState(regionID uint64, as ApplyState) error {
	return putApplyState(t.tx, regionID, as)
}

// DeleteRegion removes the region's metadata, hard state, apply state,
// log and dedup clock base: what a replica leaves when it is destroyed
// (its range's data and dedup records are another matter: ClearRange).
func (t *Tx) DeleteRegion(regionID uint64) error {
	st := t.tx.Bucket(bucketRaftState)
	for _, suf := range []byte{suffixRegion, suffixHardState, suffixApplyState, suffixDedupBase} {
		if err := st.Delete(stateKey(regionID, suf)); err != nil {
			return err
		}
	}
	return deleteLog(t.tx, regionID, 0, ^uint64(0))
}

// Tombstoned reports whether the region's peer peerID was removed here.
func (t *Tx) Tombstoned(regionID, peerID uint64) bool {
	return t.tx.Bucket(bucketRaftState).Get(tombstoneKey(regionID, peerID)) != nil
}

// PutTombstone records that the region's peer peerID was removed here.
func (t *Tx) PutTombstone(regionID, peerID uint64) error {
	return t.tx.Bucket(bucketRaftState).Put(tombstoneKey(regionID, peerID), []byte{})
}

// PutMergedTombstone records that the region's peer peerID was absorbed
// here by a merge into region into.
func (t *Tx) PutMergedTombstone(regionID, peerID, into uint64) error {
	return t.tx.Bucket(bucketRaftState).Put(tombstoneKey(regionID, peerID), binary.BigEndian.AppendUint64(nil, into))
}

// MergedInto returns the region that absorbed regionID here, if a merge
// did (PutMergedTombstone).
func (t *Tx) MergedInto(regionID uint64) (into uint64, ok bool) {
	prefix := stateKey(regionID, suffixTombstone)
	c := t.tx.Bucket(bucketRaftState).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		if len(v) == 8 {
			return binary.BigEndian.Uint64(v), true
		}
	}
	return 0, false
}

func tombstoneKey(regionID, peerID uint64) []byte {
	return binary.BigEndian.AppendUint64(stateKey(regionID, suffixTombstone), peerID)
}

// ---- markers of work in progress ----------------------------------------------

// MarkerKind tells a snapshot apply's marker from a range clear's.
type MarkerKind byte

const (
	MarkerSnapApply MarkerKind = MarkerKind(suffixSnapApply)
	MarkerClear     MarkerKind = MarkerKind(suffixClear)
)

// Marker names a marker: the work of one peer of one region.
type Marker struct {
	Kind     MarkerKind
	RegionID uint64
	PeerID   uint64
}

func (m Marker) key() []byte {
	return binary.BigEndian.AppendUint64(stateKey(m.RegionID, byte(m.Kind)), m.PeerID)
}

// PutMarker records work in progress (its value is the caller's), so that
// an open after a crash finds it.
func (t *Tx) PutMarker(m Marker, value []byte) error {
	return t.tx.Bucket(bucketRaftState).Put(m.key(), bytes.Clone(value))
}

// DeleteMarker forgets a marker: its work is done.
func (t *Tx) DeleteMarker(m Marker) error {
	return t.tx.Bucket(bucketRaftState).Delete(m.key())
}

// ForEachMarker calls fn for every marker, in key order (value aliases the
// transaction's memory).
func (t *Tx) ForEachMarker(fn func(m Marker, value []byte) error) error {
	c := t.tx.Bucket(bucketRaftState).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 17 || (k[8] != suffixSnapApply && k[8] != suffixClear) {
			continue
		}
		m := Marker{Kind: MarkerKind(k[8]), RegionID: binary.BigEndian.Uint64(k), PeerID: binary.BigEndian.Uint64(k[9:])}
		if err := fn(m, v); err != nil {
			return err
		}
	}
	return nil
}

// ---- a region's raft log ------------------------------------------------------

// AppendEntries writes ents to the region's log and drops the older
// entries after them up to prevLast: raft may overwrite a conflicting
// tail of the log.
func (t *Tx) AppendEntries(regionID uint64, ents []raftpb.Entry, prevLast uint64) error {
	return appendEntries(t.tx, regionID, ents, prevLast)
}

// DeleteLog removes the region's log entries with index in [lo, hi].
func (t *Tx) DeleteLog(regionID, lo, hi uint64) error {
	return deleteLog(t.tx, regionID, lo, hi)
}

// Term is the term of the region's log entry i; ok is false if the log
// does not hold it.
func (t *Tx) Term(regionID, i uint64) (term uint64, ok bool, err error) {
	v := t.tx.Bucket(bucketRaftLog).Get(logKey(regionID, i))
	if v == nil {
		return 0, false, nil
	}
	var ent raftpb.Entry
	if err := ent.Unmarshal(v); err != nil {
		return 0, false, fmt.Errorf("region %d: decode entry %d: %v: %w", regionID, i, err, ErrCorrupt)
	}
	return ent.Term, true, nil
}

// Entries reads the region's log entries in [lo, hi), stopping once their
// size passes maxSize (at least one entry is returned), or at the first
// index the log does not hold.
func (t *Tx) Entries(regionID, lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	var out []raftpb.Entry
	var size uint64
	c := t.tx.Bucket(bucketRaftLog).Cursor()
	for k, v := c.Seek(logKey(regionID, lo)); k != nil; k, v = c.Next() {
		want := lo + uint64(len(out))
		if want >= hi || len(k) != 16 || binary.BigEndian.Uint64(k) != regionID || binary.BigEndian.Uint64(k[8:]) != want {
			break
		}
		var ent raftpb.Entry
		if err := ent.Unmarshal(v); err != nil {
			return nil, fmt.Errorf("decode log entry %d: %v: %w", want, err, ErrCorrupt)
		}
		if ent.Index != want {
			return nil, fmt.Errorf("log entry holds index %d, want %d: %w", ent.Index, want, ErrCorrupt)
		}
		if size += uint64(ent.Size()); len(out) > 0 && size > maxSize {
			break
		}
		out = append(out, ent)
	}
	return out, nil
}

// ---- user data -----------------------------------------------------------------

// Put writes a user key. In a round it is also staged for the overlay, so
// that readers see it before the batch commits; outside one, readers see
// it once the transaction commits.
func (t *Tx) Put(key, value []byte) error {
	if t.round {
		return t.e.putData(t.tx, key, value)
	}
	return t.tx.Bucket(bucketData).Put(bytes.Clone(key), bytes.Clone(value))
}

// Delete removes a user key (see Put).
func (t *Tx) Delete(key []byte) error {
	if t.round {
		return t.e.deleteData(t.tx, key)
	}
	return t.tx.Bucket(bucketData).Delete(bytes.Clone(key))
}

// Get reads a user key as this transaction holds it (a copy; found is
// false if the key is missing). A round's transaction is the open batch,
// which holds the writes of every round since the last commit and of this
// round so far: what an apply reads to modify. A read transaction's is
// committed state only, not the overlay (Engine.Get and Snapshot read
// both).
func (t *Tx) Get(key []byte) (value []byte, found bool) {
	if v := t.tx.Bucket(bucketData).Get(key); v != nil {
		return bytes.Clone(v), true
	}
	return nil, false
}

// ForEachData calls fn for every user pair in [start, end) (end empty: no
// bound), in key order, until fn returns false. k and v alias the
// transaction's memory. Only what the transaction's file state holds is
// seen, not the overlay: for a committed view.
func (t *Tx) ForEachData(start, end []byte, fn func(k, v []byte) bool) {
	c := t.tx.Bucket(bucketData).Cursor()
	for k, v := c.Seek(start); k != nil && (len(end) == 0 || bytes.Compare(k, end) < 0); k, v = c.Next() {
		if !fn(k, v) {
			return
		}
	}
}

// ---- the dedup table (dedup.go) --------------------------------------------------

// DedupClock is the region's dedup clock at its entry index.
func (t *Tx) DedupClock(regionID, index uint64) uint64 { return dedupClockTx(t.tx, regionID, index) }

// DedupSeen reports whether the write of key with request id at clock is a
// duplicate: applied at most window ticks of the clock before.
func (t *Tx) DedupSeen(key []byte, id, clock, window uint64) bool {
	return seenTx(t.tx, key, id, clock, window)
}

// DedupRemember records that the write of key with request id was applied
// at clock.
func (t *Tx) DedupRemember(key []byte, id, clock uint64) error {
	return rememberTx(t.tx, key, id, clock)
}

// ForEachDedup calls fn for every record of user keys in [start, end), in
// key order. Record keys alias the transaction's memory.
func (t *Tx) ForEachDedup(start, end []byte, fn func(DedupRecord) error) error {
	return forEachDedupTx(t.tx, start, end, fn)
}

// SweepDedup looks at up to budget records of user keys in [start, end),
// from record key from on (nil: the range's start), and deletes those at
// clock <= below. It returns where to go on from, nil at the range's end.
func (t *Tx) SweepDedup(start, end, from []byte, below uint64, budget int) ([]byte, error) {
	return sweepDedupTx(t.tx, start, end, from, below, budget)
}

// SplitDedup starts the clock of region child, made by a split entry at
// the parent's index at, where the parent's is; childFirst is the index
// of the child's first entry. No record moves: the child owns those of its
// range.
func (t *Tx) SplitDedup(parent, child, at, childFirst uint64) error {
	return putDedupBaseTx(t.tx, child, dedupClockTx(t.tx, parent, at)-childFirst)
}

// ClearDedupRange forgets the records of user keys in [start, end).
func (t *Tx) ClearDedupRange(start, end []byte) error { return deleteDedupRangeTx(t.tx, start, end) }

// ---- snapshots (snapshot.go) ------------------------------------------------------

// SnapshotState is what a snapshot of the region taken in this
// transaction is of: its apply state and its metadata.
func (t *Tx) SnapshotState(regionID uint64) (ApplyState, []byte, error) {
	as, err := t.ApplyState(regionID)
	if err != nil {
		return ApplyState{}, nil, err
	}
	meta := t.RegionMeta(regionID)
	if meta == nil {
		return ApplyState{}, nil, fmt.Errorf("region %d: no metadata: %w", regionID, ErrCorrupt)
	}
	return as, meta, nil
}

// WriteSnapshot writes the region's snapshot as of this transaction to w,
// a pair at a time.
func (t *Tx) WriteSnapshot(regionID uint64, w io.Writer) error {
	_, meta, err := t.SnapshotState(regionID)
	if err != nil {
		return err
	}
	return writeSnapshotTx(t.tx, meta, w)
}

// ApplySnapshot replaces a region's data, dedup records, log and state
// with those of the snapshot data, as of its index and term, and returns
// the region's metadata it carried.
func (t *Tx) ApplySnapshot(data []byte, index, term uint64) ([]byte, error) {
	return applySnapshotTx(t.tx, data, index, term)
}

// ApplySnapshotFrom is ApplySnapshot for a snapshot read from r, a pair at
// a time.
func (t *Tx) ApplySnapshotFrom(r io.Reader, index, term uint64) ([]byte, error) {
	return applySnapshotStreamTx(t.tx, r, index, term)
}

// FinishSnapshot is a snapshot apply's last step, after its data was
// written in bounded transactions (Engine.ApplySnapshotFile): the region's
// dedup clock base, an empty log, and its state as of the snapshot.
func (t *Tx) FinishSnapshot(meta []byte, index, term, dedupBase uint64) error {
	sp, err := DecodeSpan(meta)
	if err != nil {
		return err
	}
	if err := putDedupBaseTx(t.tx, sp.ID, dedupBase); err != nil {
		return err
	}
	return finishSnapshotTx(t.tx, sp.ID, meta, index, term)
}

func uint64Bytes(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
