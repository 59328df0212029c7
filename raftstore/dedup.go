package raftstore

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"go.etcd.io/bbolt"
)

// Exactly-once writes.
//
// A client retries a write whose outcome it never learned (a timeout, a
// leader that stepped down after proposing). Re-applying it would not be
// harmless even for a put: put(x,1), put(x,2), then the retried put(x,1)
// applied again lets readers see 1, 2, 1 — not linearizable. So every write
// carries a request ID that the client keeps across retries, and the state
// machine remembers, per region, the IDs it applied: a repeat within
// DedupWindow entries of the original is acknowledged without being applied
// again.
//
//	dedup2     regionID(8) | id(8) -> index(8) | user key
//	dedup2idx  regionID(8) | index(8) | id(8) -> nil   (for trimming, splits and snapshots)
//
// index is the entry the request was applied at, in the region's own log.
//
// # Every replica decides the same
//
// The decision is a function of the region's log alone. The write at entry
// e with request ID id is a duplicate iff the region has a record (index,
// id) and
//
//	e - index <= DedupWindow
//
// Records are written only by applying entries (same entries, same indexes
// on every replica), replaced only by a snapshot (the leader's table as of
// the snapshot's index) and moved only by a split (an entry). Trimming
// never decides anything: it removes only records with index + DedupWindow
// <= applied, which no entry after applied could judge seen, so how a
// replica batches entries into apply rounds, how far its bounded per-round
// trimming (dedupGCBatch) got, or whether it trimmed at all, never changes
// an answer. For the same reason a snapshot at index A carries every record
// a later entry could see (those with index > A - DedupWindow): its sender
// cannot have trimmed them.
//
// Records are per region: a request ID found in another region means
// nothing here, because that region's trimming and log are not this one's.
// A key moves between regions only by a split, and the split moves its
// records with it: applying the split entry at parent index at moves the
// parent's records that are still live (index + DedupWindow > at) and whose
// key lies in the new region's range to the new region, re-based to index
// raftInitIndex, where the new region's log starts. Every replica of the
// new region starts from that same table (or from a snapshot of it), and
// the moved records stay live for one full window of the new region's log:
// a little longer than they would have in the parent, never shorter.
var (
	bucketDedup    = []byte("dedup2")
	bucketDedupIdx = []byte("dedup2idx")
)

// bucketsDedupV1 held the previous layout, one global table keyed by
// request ID alone and with no user keys, which cannot be converted: the
// engine drops it on open. (Stores are upgraded all at once, stopped: the
// snapshot format changed too, so every replica forgets the same IDs.)
var bucketsDedupV1 = [][]byte{[]byte("dedup"), []byte("dedupidx")}

// dedupGCBatch bounds the trimming work one apply round does.
const dedupGCBatch = 1024

// dedupRecord is one remembered request, as carried in a snapshot.
type dedupRecord struct {
	index uint64 // the entry it was applied at, in the region's log
	id    uint64
	key   []byte // the user key it wrote
}

func (d dedupRecord) String() string { return fmt.Sprintf("%d@%d(%q)", d.id, d.index, d.key) }

func dedupKey(regionID, id uint64) []byte {
	k := make([]byte, 16)
	binary.BigEndian.PutUint64(k, regionID)
	binary.BigEndian.PutUint64(k[8:], id)
	return k
}

func dedupIdxKey(regionID, index, id uint64) []byte {
	k := make([]byte, 24)
	binary.BigEndian.PutUint64(k, regionID)
	binary.BigEndian.PutUint64(k[8:], index)
	binary.BigEndian.PutUint64(k[16:], id)
	return k
}

// lookupTx returns the index request id was last applied at in regionID.
func lookupTx(tx *bbolt.Tx, regionID, id uint64) (uint64, bool) {
	v := tx.Bucket(bucketDedup).Get(dedupKey(regionID, id))
	if len(v) < 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(v), true
}

// seenTx reports whether the write with request id at entry index of
// regionID is a duplicate: applied in the region at most window entries
// before.
func seenTx(tx *bbolt.Tx, regionID, index, id, window uint64) bool {
	at, ok := lookupTx(tx, regionID, id)
	return ok && at < index && index-at <= window
}

// rememberTx records that id, a write of key, was applied at index in
// regionID, replacing an older record of it.
func rememberTx(tx *bbolt.Tx, regionID, index, id uint64, key []byte) error {
	idx := tx.Bucket(bucketDedupIdx)
	if old, ok := lookupTx(tx, regionID, id); ok {
		if err := idx.Delete(dedupIdxKey(regionID, old, id)); err != nil {
			return err
		}
	}
	v := make([]byte, 8, 8+len(key))
	binary.BigEndian.PutUint64(v, index)
	if err := tx.Bucket(bucketDedup).Put(dedupKey(regionID, id), append(v, key...)); err != nil {
		return err
	}
	return idx.Put(dedupIdxKey(regionID, index, id), nil)
}

// forgetTx deletes one record.
func forgetTx(tx *bbolt.Tx, regionID, index, id uint64) error {
	if at, ok := lookupTx(tx, regionID, id); ok && at == index {
		if err := tx.Bucket(bucketDedup).Delete(dedupKey(regionID, id)); err != nil {
			return err
		}
	}
	return tx.Bucket(bucketDedupIdx).Delete(dedupIdxKey(regionID, index, id))
}

// trimDedupTx forgets, at most dedupGCBatch at a time, the region's records
// that no entry after applied can see: those with index + window <= applied.
// What it leaves for a later round changes no decision (seenTx compares
// indexes).
func trimDedupTx(tx *bbolt.Tx, regionID, applied, window uint64) error {
	if applied < window {
		return nil
	}
	below := applied - window // trim index <= below
	c := tx.Bucket(bucketDedupIdx).Cursor()
	start := dedupIdxKey(regionID, 0, 0)
	for n := 0; n < dedupGCBatch; n++ {
		k, _ := c.Seek(start)
		if k == nil || binary.BigEndian.Uint64(k) != regionID || binary.BigEndian.Uint64(k[8:]) > below {
			return nil
		}
		if err := forgetTx(tx, regionID, binary.BigEndian.Uint64(k[8:]), binary.BigEndian.Uint64(k[16:])); err != nil {
			return err
		}
	}
	return nil
}

// regionDedupTx returns the region's records in (index, id) order. Keys
// are copied out of bbolt.
func regionDedupTx(tx *bbolt.Tx, regionID uint64) []dedupRecord {
	var out []dedupRecord
	d := tx.Bucket(bucketDedup)
	c := tx.Bucket(bucketDedupIdx).Cursor()
	for k, _ := c.Seek(dedupIdxKey(regionID, 0, 0)); k != nil && binary.BigEndian.Uint64(k) == regionID; k, _ = c.Next() {
		r := dedupRecord{index: binary.BigEndian.Uint64(k[8:]), id: binary.BigEndian.Uint64(k[16:])}
		if v := d.Get(dedupKey(regionID, r.id)); len(v) >= 8 && binary.BigEndian.Uint64(v) == r.index {
			r.key = append([]byte{}, v[8:]...)
		}
		out = append(out, r)
	}
	return out
}

// replaceDedupTx swaps the region's table for a snapshot's.
func replaceDedupTx(tx *bbolt.Tx, regionID uint64, records []dedupRecord) error {
	if err := trimDedupAllTx(tx, regionID); err != nil {
		return err
	}
	for _, r := range records {
		if err := rememberTx(tx, regionID, r.index, r.id, r.key); err != nil {
			return err
		}
	}
	return nil
}

// trimDedupAllTx forgets the region's whole table.
func trimDedupAllTx(tx *bbolt.Tx, regionID uint64) error {
	for _, r := range regionDedupTx(tx, regionID) {
		if err := forgetTx(tx, regionID, r.index, r.id); err != nil {
			return err
		}
	}
	return nil
}

// splitDedupTx runs when the split entry at parent index at hands the key
// range [start, end) (end empty: +inf) to the new region child. The
// parent forgets every record of that range: it no longer holds those
// keys. When intoChild (this replica creates the child from the split,
// rather than having it already, ahead, from a snapshot), the child's table
// becomes the records that were still live (index + window > at),
// re-based to raftInitIndex, the start of the child's log.
func splitDedupTx(tx *bbolt.Tx, parent, child, at, window uint64, start, end []byte, intoChild bool) error {
	var moved []dedupRecord
	for _, r := range regionDedupTx(tx, parent) {
		if bytes.Compare(r.key, start) < 0 || (len(end) > 0 && bytes.Compare(r.key, end) >= 0) {
			continue
		}
		if err := forgetTx(tx, parent, r.index, r.id); err != nil {
			return err
		}
		if r.index >= at || at-r.index < window { // live: index + window > at
			moved = append(moved, dedupRecord{index: raftInitIndex, id: r.id, key: r.key})
		}
	}
	if !intoChild {
		return nil
	}
	return replaceDedupTx(tx, child, moved)
}
