package raftstore

import (
	"encoding/binary"

	"go.etcd.io/bbolt"
)

// Exactly-once writes.
//
// A client retries a write whose outcome it never learned (a timeout, a
// leader that stepped down after proposing). Re-applying it would not be
// harmless even for a put: put(x,1), put(x,2), then the retried put(x,1)
// applied again lets readers see 1, 2, 1 — not linearizable. So every write
// carries a request ID that the client keeps across retries, and the state
// machine remembers, per region, the IDs applied within the last
// DedupWindow entries: a repeat is acknowledged without being applied again.
// The table is replicated state: written in the apply transaction, carried
// in snapshots, and trimmed by log index, so every replica agrees on it.
//
//	dedup     id(8) -> regionID(8) | index(8)
//	dedupidx  regionID(8) | index(8) | id(8) -> nil   (for trimming and snapshots)
var (
	bucketDedup    = []byte("dedup")
	bucketDedupIdx = []byte("dedupidx")
)

// dedupGCBatch bounds the trimming work one apply round does.
const dedupGCBatch = 1024

func dedupIdxKey(regionID, index, id uint64) []byte {
	k := make([]byte, 24)
	binary.BigEndian.PutUint64(k, regionID)
	binary.BigEndian.PutUint64(k[8:], index)
	binary.BigEndian.PutUint64(k[16:], id)
	return k
}

// seenTx reports whether request id was applied already.
func seenTx(tx *bbolt.Tx, id uint64) bool {
	return tx.Bucket(bucketDedup).Get(uint64Bytes(id)) != nil
}

// rememberTx records that id was applied at index in regionID.
func rememberTx(tx *bbolt.Tx, regionID, index, id uint64) error {
	v := make([]byte, 16)
	binary.BigEndian.PutUint64(v, regionID)
	binary.BigEndian.PutUint64(v[8:], index)
	if err := tx.Bucket(bucketDedup).Put(uint64Bytes(id), v); err != nil {
		return err
	}
	return tx.Bucket(bucketDedupIdx).Put(dedupIdxKey(regionID, index, id), nil)
}

// trimDedupTx forgets the region's request IDs applied before index below.
func trimDedupTx(tx *bbolt.Tx, regionID, below uint64) error {
	c := tx.Bucket(bucketDedupIdx).Cursor()
	d := tx.Bucket(bucketDedup)
	start := dedupIdxKey(regionID, 0, 0)
	for n := 0; n < dedupGCBatch; n++ {
		k, _ := c.Seek(start)
		if k == nil || binary.BigEndian.Uint64(k) != regionID || binary.BigEndian.Uint64(k[8:]) >= below {
			return nil
		}
		if err := d.Delete(k[16:24]); err != nil {
			return err
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// dedupEntry is one remembered request, as carried in a snapshot.
type dedupEntry struct{ index, id uint64 }

func regionDedupTx(tx *bbolt.Tx, regionID uint64) []dedupEntry {
	var out []dedupEntry
	c := tx.Bucket(bucketDedupIdx).Cursor()
	for k, _ := c.Seek(dedupIdxKey(regionID, 0, 0)); k != nil && binary.BigEndian.Uint64(k) == regionID; k, _ = c.Next() {
		out = append(out, dedupEntry{index: binary.BigEndian.Uint64(k[8:]), id: binary.BigEndian.Uint64(k[16:])})
	}
	return out
}

// replaceDedupTx swaps the region's table for a snapshot's.
func replaceDedupTx(tx *bbolt.Tx, regionID uint64, entries []dedupEntry) error {
	if err := trimDedupAllTx(tx, regionID); err != nil {
		return err
	}
	for _, e := range entries {
		if err := rememberTx(tx, regionID, e.index, e.id); err != nil {
			return err
		}
	}
	return nil
}

func trimDedupAllTx(tx *bbolt.Tx, regionID uint64) error {
	for _, e := range regionDedupTx(tx, regionID) {
		if err := tx.Bucket(bucketDedup).Delete(uint64Bytes(e.id)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketDedupIdx).Delete(dedupIdxKey(regionID, e.index, e.id)); err != nil {
			return err
		}
	}
	return nil
}
