package raftstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/bbolt"
)

// Exactly-once writes.
//
// A client retries a write whose outcome it never learned (a timeout, a
// leader that stepped down after proposing). Re-applying it would not be
// harmless even for a put: put(x,1), put(x,2), then the retried put(x,1)
// applied again lets readers see 1, 2, 1 — not linearizable. So every write
// carries a request ID that the client keeps across retries (with the same
// key: a retry is the same write), and the state machine remembers the
// (key, ID) pairs it applied: a repeat within DedupWindow entries of the
// original is acknowledged without being applied again.
//
// # Records live in the key space, like the data
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
// range between regions moves nothing:
//
//   - a split writes one value (the new region's clock base) and touches no
//     record: the new region owns the records of its range because it owns
//     the range (splits cost the same whatever the region holds; issue 18
//     measured 11.8 s for moving 100,000 records);
//   - a snapshot carries the records of its region's range, in key order
//     (so the receiver inserts them sorted), and its apply replaces that
//     range of the bucket, as it replaces that range of the data;
//   - destroying a replica deletes its range of the bucket with its data.
//
// # The clock: counted in the region's lineage log
//
// A record holds the clock of the entry it was applied at. A region's
// clock at its entry e is e + base. Region 1 starts with base 0. A split
// applied at the parent's entry at gives the new region the base
// clock(at) - raftInitIndex, so its clock goes on from the parent's clock
// at the split: the clock counts the entries of the region's log and of its
// ancestors' logs before the split that made it. Both halves share the
// records' clocks up to the split, which is why nothing is re-based.
//
// # Every replica decides the same
//
// The write at entry e of a region (clock c = e + base) with request ID id
// and key k is a duplicate iff there is a record (k, id) at clock r with
//
//	r < c and c - r <= DedupWindow
//
// That is a function of the log alone: records are written only by
// applying entries (same entries, same clocks on every replica), a base
// only by a split entry or a snapshot, and a snapshot carries its region's
// base and records as of its index. Trimming never decides anything: it
// removes only records with r + DedupWindow <= clock(applied), which no
// entry after applied could judge seen, so how a replica batches entries
// into apply rounds, how far its bounded trimming got, or whether it
// trimmed at all, never changes an answer.
//
// Trimming sweeps: each apply round of a region looks at the next few
// records of its range (a budget growing with the entries the round
// applied), deletes the dead ones, and remembers where it stopped (in
// memory: it decides nothing); at the end of the range it starts over. A
// region that applies E entries a round sweeps at least 4E records, so
// dead records are found within about a quarter of the table's size in
// entries and the table stays within a small factor of the live records.

// Older layouts (storage/layout): the first (bucketsDedupV1), one global
// table keyed by request ID alone and with no user keys, cannot be
// converted, and the engine drops it on open; the second (bucketDedupV2),
// per region and keyed by request ID, converts exactly (convertDedupV2):
// every region of it counted its own log, which is the clock with base 0.

// Sweep budget per apply round: dedupSweepMin plus dedupSweepPerEntry for
// every entry the round applied, at most dedupSweepMax records.
const (
	dedupSweepMin      = 32
	dedupSweepPerEntry = 4
	dedupSweepMax      = 4096
)

// dedupRecord is one remembered request, as carried in a snapshot.
type dedupRecord struct {
	clock uint64 // the region's clock at the entry it was applied at
	id    uint64
	key   []byte // the user key it wrote
}

func (d dedupRecord) String() string { return fmt.Sprintf("%d@%d(%q)", d.id, d.clock, d.key) }

// compareDedup orders records as the bucket does: by key, then ID.
func compareDedup(a, b dedupRecord) int {
	if c := bytes.Compare(a.key, b.key); c != 0 {
		return c
	}
	switch {
	case a.id < b.id:
		return -1
	case a.id > b.id:
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
		return nil, 0, fmt.Errorf("dedup record key %x: %w", k, errCorrupt)
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
	return nil, 0, fmt.Errorf("dedup record key %x: bad escape: %w", k, errCorrupt)
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
func forEachDedupTx(tx *bbolt.Tx, start, end []byte, fn func(dedupRecord) error) error {
	lo, hi := dedupRange(start, end)
	c := tx.Bucket(bucketDedup).Cursor()
	for k, v := c.Seek(lo); k != nil && (hi == nil || bytes.Compare(k, hi) < 0); k, v = c.Next() {
		key, id, err := parseDedupKey(k)
		if err != nil {
			return err
		}
		if len(v) != 8 {
			return fmt.Errorf("dedup record %q/%d: %d-byte value: %w", key, id, len(v), errCorrupt)
		}
		if err := fn(dedupRecord{clock: binary.BigEndian.Uint64(v), id: id, key: key}); err != nil {
			return err
		}
	}
	return nil
}

// regionDedupTx returns the records of r's range, in key order.
func regionDedupTx(tx *bbolt.Tx, r region.Region) ([]dedupRecord, error) {
	var out []dedupRecord
	err := forEachDedupTx(tx, r.StartKey, r.EndKey, func(d dedupRecord) error {
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
func replaceDedupTx(tx *bbolt.Tx, r region.Region, records []dedupRecord) error {
	if err := deleteDedupRangeTx(tx, r.StartKey, r.EndKey); err != nil {
		return err
	}
	b := tx.Bucket(bucketDedup)
	for _, d := range records {
		if !dedupKeyFits(d.key) {
			continue
		}
		// bbolt keeps the key and value slices until commit: fresh ones each.
		if err := b.Put(dedupKey(d.key, d.id), binary.BigEndian.AppendUint64(nil, d.clock)); err != nil {
			return err
		}
	}
	return nil
}

// trimDedupTx is one apply round's trimming of region regionID, which
// applied n entries up to applied: it sweeps on from where the region's
// last sweep stopped and forgets the dead records it meets (clock + window
// <= the clock at applied). It decides nothing (see above).
func (s *Store) trimDedupTx(tx *bbolt.Tx, p *Peer, applied uint64, n int) error {
	p.mu.Lock()
	r := p.region
	p.mu.Unlock()
	window := s.cfg.DedupWindow
	now := dedupClockTx(tx, p.regionID, applied)
	if now < window {
		return nil
	}
	budget := min(dedupSweepMin+dedupSweepPerEntry*n, dedupSweepMax)
	from := s.eng.sweepFrom(p.regionID)
	next, err := sweepDedupTx(tx, r.StartKey, r.EndKey, from, now-window, budget)
	if err != nil {
		return err
	}
	s.eng.setSweepFrom(p.regionID, next)
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

// sweepFrom and setSweepFrom keep each region's sweep position between
// apply rounds (the Ready loop's, but guarded all the same).
func (e *engine) sweepFrom(regionID uint64) []byte {
	e.sweepMu.Lock()
	defer e.sweepMu.Unlock()
	return e.sweep[regionID]
}

func (e *engine) setSweepFrom(regionID uint64, next []byte) {
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

// splitDedupTx runs when the split entry at the parent's index at creates
// the new region child on this replica: the child's clock goes on from the
// parent's. No record moves: the child owns the records of its range.
func splitDedupTx(tx *bbolt.Tx, parent, child, at uint64) error {
	return putDedupBaseTx(tx, child, dedupClockTx(tx, parent, at)-raftInitIndex)
}

// destroyDedupTx forgets a destroyed replica's records (those of its range,
// if it held one) and its clock base.
func destroyDedupTx(tx *bbolt.Tx, r region.Region, initialized bool) error {
	if err := tx.Bucket(bucketRaftState).Delete(dedupBaseKey(r.ID)); err != nil {
		return err
	}
	if !initialized {
		return nil // a placeholder holds no range: the records there are another region's
	}
	return deleteDedupRangeTx(tx, r.StartKey, r.EndKey)
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
			regions := map[uint64]*region.Region{}
			regionOf := func(id uint64) (*region.Region, error) {
				if r, ok := regions[id]; ok {
					return r, nil
				}
				var r *region.Region
				if v := tx.Bucket(bucketRaftState).Get(stateKey(id, suffixRegion)); v != nil {
					r = new(region.Region)
					if err := json.Unmarshal(v, r); err != nil {
						return nil, fmt.Errorf("decode region %d meta: %w", id, err)
					}
				}
				regions[id] = r
				return r, nil
			}
			var moved []dedupRecord
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
				moved = append(moved, dedupRecord{clock: binary.BigEndian.Uint64(v), id: binary.BigEndian.Uint64(k[8:]), key: slices.Clone(key)})
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
				if !dedupKeyFits(d.key) {
					continue
				}
				if at, ok := lookupTx(tx, d.key, d.id); ok && at >= d.clock {
					continue
				}
				if err := b.Put(dedupKey(d.key, d.id), binary.BigEndian.AppendUint64(nil, d.clock)); err != nil {
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
