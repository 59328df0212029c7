package engine

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"go.etcd.io/bbolt"
)

// The dedup table: the records of exactly-once writes (what they decide
// is raftstore's; here is how they are kept).
//
//	dedup3     esc(user key) | id(8) -> clock(8)
//	raftstate  regionID(8) | 'd' -> clock base(8)   (absent: 0)
//
// esc is an order-preserving, prefix-free escape of the user key (every
// 0x00 becomes 0x00 0xff, and 0x00 0x01 ends it), so the records of the
// user keys in [start, end) are exactly the bucket's keys in
// [esc(start), esc(end)): the records of a region are a key range of the
// bucket, the way its data is a key range of the data bucket. Whatever
// region holds a key on this store holds its records, and moving a key
// range between regions moves nothing: a split writes one value (the new
// region's clock base), a snapshot carries the records of its region's
// range in key order and its apply replaces that range of the bucket, and
// destroying a replica deletes its range of the bucket with its data.
//
// A region's clock at its entry e is e + base: the base counts the
// entries of its ancestors' logs before the split that made it (SplitDedup).

// Older layouts (storage/layout): the first (bucketsDedupV1), one global
// table keyed by request ID alone and with no user keys, cannot be
// converted, and the engine drops it on open; the second (bucketDedupV2),
// per region and keyed by request ID, converts exactly (convertDedupV2):
// every region of it counted its own log, which is the clock with base 0.

// DedupRecord is one remembered request, as carried in a snapshot.
type DedupRecord struct {
	Clock uint64 // the region's clock at the entry it was applied at
	ID    uint64
	Key   []byte // the user key it wrote
}

func (d DedupRecord) String() string { return fmt.Sprintf("%d@%d(%q)", d.ID, d.Clock, d.Key) }

// compareDedup orders records as the bucket does: by key, then ID.
func compareDedup(a, b DedupRecord) int {
	if c := bytes.Compare(a.Key, b.Key); c != 0 {
		return c
	}
	switch {
	case a.ID < b.ID:
		return -1
	case a.ID > b.ID:
		return 1
	}
	return 0
}

// appendEscaped appends esc(key): every 0x00 as 0x00 0xff, then 0x00 0x01.
func appendEscaped(dst, key []byte) []byte {
	for _, b := range key {
		if b == 0 {
			dst = append(dst, 0, 0xff)
		} else {
			dst = append(dst, b)
		}
	}
	return append(dst, 0, 1)
}

// dedupKey is a record's key in the bucket.
func dedupKey(key []byte, id uint64) []byte {
	return binary.BigEndian.AppendUint64(appendEscaped(make([]byte, 0, len(key)+10), key), id)
}

// dedupKeyFits reports whether key's record fits bbolt's key size. Keys that
// do not (over 16 KiB; the server refuses keys over 8 KiB) are never
// remembered, on any replica alike, so their writes are not deduplicated.
func dedupKeyFits(key []byte) bool {
	n := len(key) + 10
	if n <= bbolt.MaxKeySize/2 {
		return true
	}
	return n+bytes.Count(key, []byte{0}) <= bbolt.MaxKeySize
}

// parseDedupKey splits a bucket key into the user key and request ID.
func parseDedupKey(k []byte) (key []byte, id uint64, err error) {
	if len(k) < 10 {
		return nil, 0, fmt.Errorf("dedup record key %x: %w", k, ErrCorrupt)
	}
	esc, id := k[:len(k)-8], binary.BigEndian.Uint64(k[len(k)-8:])
	key = make([]byte, 0, len(esc)-2)
	for i := 0; i < len(esc); i++ {
		switch {
		case esc[i] != 0:
			key = append(key, esc[i])
		case i+1 < len(esc) && esc[i+1] == 0xff:
			key = append(key, 0)
			i++
		case i+2 == len(esc) && esc[i+1] == 1:
			return key, id, nil
		default:
			i = len(esc) // a bad escape
		}
	}
	return nil, 0, fmt.Errorf("dedup record key %x: bad escape: %w", k, ErrCorrupt)
}

// dedupRange is the bucket's key range holding the records of user keys in
// [start, end) (end empty: +inf; hi nil: +inf).
func dedupRange(start, end []byte) (lo, hi []byte) {
	lo = appendEscaped(nil, start)
	if len(end) > 0 {
		hi = appendEscaped(nil, end)
	}
	return lo, hi
}

func dedupBaseKey(regionID uint64) []byte { return stateKey(regionID, suffixDedupBase) }

// dedupBaseTx returns the region's clock base.
func dedupBaseTx(tx *bbolt.Tx, regionID uint64) uint64 {
	if v := tx.Bucket(bucketRaftState).Get(dedupBaseKey(regionID)); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func putDedupBaseTx(tx *bbolt.Tx, regionID, base uint64) error {
	if base == 0 {
		return tx.Bucket(bucketRaftState).Delete(dedupBaseKey(regionID))
	}
	return tx.Bucket(bucketRaftState).Put(dedupBaseKey(regionID), binary.BigEndian.AppendUint64(nil, base))
}

// dedupClockTx is the region's clock at its entry index.
func dedupClockTx(tx *bbolt.Tx, regionID, index uint64) uint64 {
	return index + dedupBaseTx(tx, regionID)
}

// lookupTx returns the clock the write of key with request id was applied at.
func lookupTx(tx *bbolt.Tx, key []byte, id uint64) (uint64, bool) {
	if !dedupKeyFits(key) {
		return 0, false
	}
	v := tx.Bucket(bucketDedup).Get(dedupKey(key, id))
	if len(v) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(v), true
}

// seenTx reports whether the write of key with request id at clock is a
// duplicate: applied at most window entries before.
func seenTx(tx *bbolt.Tx, key []byte, id, clock, window uint64) bool {
	at, ok := lookupTx(tx, key, id)
	return ok && at < clock && clock-at <= window
}

// rememberTx records that the write of key with request id was applied at
// clock, replacing an older record of it.
func rememberTx(tx *bbolt.Tx, key []byte, id, clock uint64) error {
	if !dedupKeyFits(key) {
		return nil
	}
	return tx.Bucket(bucketDedup).Put(dedupKey(key, id), binary.BigEndian.AppendUint64(nil, clock))
}

// forEachDedupTx calls fn for every record of user keys in [start, end), in
// key order. Record keys alias bbolt memory: valid inside tx only.
func forEachDedupTx(tx *bbolt.Tx, start, end []byte, fn func(DedupRecord) error) error {
	lo, hi := dedupRange(start, end)
	c := tx.Bucket(bucketDedup).Cursor()
	for k, v := c.Seek(lo); k != nil && (hi == nil || bytes.Compare(k, hi) < 0); k, v = c.Next() {
		key, id, err := parseDedupKey(k)
		if err != nil {
			return err
		}
		if len(v) != 8 {
			return fmt.Errorf("dedup record %q/%d: %d-byte value: %w", key, id, len(v), ErrCorrupt)
		}
		if err := fn(DedupRecord{Clock: binary.BigEndian.Uint64(v), ID: id, Key: key}); err != nil {
			return err
		}
	}
	return nil
}

// rangeDedupTx returns the records of user keys in [start, end), in key
// order.
func rangeDedupTx(tx *bbolt.Tx, start, end []byte) ([]DedupRecord, error) {
	var out []DedupRecord
	err := forEachDedupTx(tx, start, end, func(d DedupRecord) error {
		out = append(out, d)
		return nil
	})
	return out, err
}

// deleteDedupRangeTx forgets the records of user keys in [start, end). The
// range is contiguous in the bucket: a few leaves, however many records.
func deleteDedupRangeTx(tx *bbolt.Tx, start, end []byte) error {
	lo, hi := dedupRange(start, end)
	c := tx.Bucket(bucketDedup).Cursor()
	for k, _ := c.Seek(lo); k != nil && (hi == nil || bytes.Compare(k, hi) < 0); k, _ = c.Seek(lo) {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// replaceDedupTx swaps the records of r's range for a snapshot's, which are
// in strictly increasing key order (decodeSnapshotData checks it), so the
// inserts are sorted: bbolt piles unsorted inserts into one node until
// commit, which is quadratic.
func replaceDedupTx(tx *bbolt.Tx, r Span, records []DedupRecord) error {
	if err := deleteDedupRangeTx(tx, r.StartKey, r.EndKey); err != nil {
		return err
	}
	b := tx.Bucket(bucketDedup)
	for _, d := range records {
		if !dedupKeyFits(d.Key) {
			continue
		}
		// bbolt keeps the key and value slices until commit: fresh ones each.
		if err := b.Put(dedupKey(d.Key, d.ID), binary.BigEndian.AppendUint64(nil, d.Clock)); err != nil {
			return err
		}
	}
	return nil
}

// sweepDedupTx looks at up to budget records of user keys in [start, end),
// from bucket key from on (nil: the range's start), and deletes those with
// clock <= below. It returns the bucket key to go on from, nil once it has
// reached the end of the range.
func sweepDedupTx(tx *bbolt.Tx, start, end, from []byte, below uint64, budget int) (next []byte, err error) {
	lo, hi := dedupRange(start, end)
	if from == nil || bytes.Compare(from, lo) < 0 || (hi != nil && bytes.Compare(from, hi) >= 0) {
		from = lo
	}
	b := tx.Bucket(bucketDedup)
	c := b.Cursor()
	var dead [][]byte
	k, v := c.Seek(from)
	for n := 0; k != nil && (hi == nil || bytes.Compare(k, hi) < 0); k, v = c.Next() {
		if n == budget {
			next = slices.Clone(k)
			break
		}
		n++
		if len(v) == 8 && binary.BigEndian.Uint64(v) <= below {
			dead = append(dead, slices.Clone(k))
		}
	}
	// Deleting under a cursor makes its Next skip keys: delete afterwards.
	for _, k := range dead {
		if err := b.Delete(k); err != nil {
			return nil, err
		}
	}
	return next, nil
}

// SweepFrom and SetSweepFrom keep each region's sweep position between
// apply rounds (the Ready loop's, but guarded all the same).
func (e *Engine) SweepFrom(regionID uint64) []byte {
	e.sweepMu.Lock()
	defer e.sweepMu.Unlock()
	return e.sweep[regionID]
}

func (e *Engine) SetSweepFrom(regionID uint64, next []byte) {
	e.sweepMu.Lock()
	defer e.sweepMu.Unlock()
	if next == nil {
		delete(e.sweep, regionID)
		return
	}
	if e.sweep == nil {
		e.sweep = map[uint64][]byte{}
	}
	e.sweep[regionID] = next
}

// dedupConvertBatch is how many old records one conversion transaction
// moves.
const dedupConvertBatch = 50000

// convertDedupV2 moves the second layout's records into the current one,
// a batch per transaction (a crash between batches resumes where it
// stopped: each batch moves atomically), then drops the old buckets. It is
// exact: each old region counted its own log from index 0, which is the
// clock with base 0, and no region of the old layout has a base. A record
// whose region this store no longer holds, or whose key lies outside that
// region, belongs to no range and is dropped (the old layout never read
// it either).
func convertDedupV2(db *bbolt.DB) (converted int, err error) {
	for {
		done := false
		err := db.Update(func(tx *bbolt.Tx) error {
			old := tx.Bucket(bucketDedupV2)
			if old == nil {
				done = true
				if tx.Bucket(bucketDedupV2Idx) != nil {
					return tx.DeleteBucket(bucketDedupV2Idx)
				}
				return nil
			}
			regions := map[uint64]*Span{}
			regionOf := func(id uint64) (*Span, error) {
				if r, ok := regions[id]; ok {
					return r, nil
				}
				var r *Span
				if v := tx.Bucket(bucketRaftState).Get(stateKey(id, suffixRegion)); v != nil {
					sp, err := DecodeSpan(v)
					if err != nil {
						return nil, fmt.Errorf("region %d: %w", id, err)
					}
					r = &sp
				}
				regions[id] = r
				return r, nil
			}
			var moved []DedupRecord
			var seen [][]byte
			c := old.Cursor()
			for k, v := c.First(); k != nil && len(seen) < dedupConvertBatch; k, v = c.Next() {
				seen = append(seen, slices.Clone(k))
				if len(k) != 16 || len(v) < 8 {
					continue
				}
				r, err := regionOf(binary.BigEndian.Uint64(k))
				if err != nil {
					return err
				}
				key := v[8:]
				if r == nil || len(key) == 0 || !r.Contains(key) {
					continue
				}
				moved = append(moved, DedupRecord{Clock: binary.BigEndian.Uint64(v), ID: binary.BigEndian.Uint64(k[8:]), Key: slices.Clone(key)})
			}
			if len(seen) == 0 {
				done = true
				if err := tx.DeleteBucket(bucketDedupV2); err != nil {
					return err
				}
				return tx.DeleteBucket(bucketDedupV2Idx)
			}
			slices.SortFunc(moved, compareDedup)
			b := tx.Bucket(bucketDedup)
			for _, d := range moved {
				if !dedupKeyFits(d.Key) {
					continue
				}
				if at, ok := lookupTx(tx, d.Key, d.ID); ok && at >= d.Clock {
					continue
				}
				if err := b.Put(dedupKey(d.Key, d.ID), binary.BigEndian.AppendUint64(nil, d.Clock)); err != nil {
					return err
				}
			}
			for _, k := range seen { // a prefix of the bucket: a few leaves
				if err := old.Delete(k); err != nil {
					return err
				}
			}
			converted += len(moved)
			return nil
		})
		if err != nil {
			return converted, fmt.Errorf("convert dedup table: %w", err)
		}
		if done {
			return converted, nil
		}
	}
}
