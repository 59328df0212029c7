package raftstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/replica"
	"github.com/hedgekv/hedgekv/storage/engine"
)

// Replica agreement: the store's side. RegionDigest summarizes one
// replica at its applied index (package replica says what a digest is and
// compares them); it is read in ONE bbolt read transaction, and the apply
// transaction writes the data and the applied index together, so the two
// always agree. RegionDump lists a replica's pairs, to name the first
// differing key once two replicas disagree.
//
// The data hash is SHA-256 over every key-value pair of the region's range,
// in key order, each written as uvarint(len(key)) | key | uvarint(len(value))
// | value (the pair encoding of a snapshot). The dedup table (dedup.go) is
// hashed separately: only its live records (clock + DedupWindow > the clock
// at applied), which every replica holds alike, since trimming a little per
// apply round may leave different dead records on different replicas. A replica
// that decided a retried write differently from its peers keeps a
// different table long after the key's data has been overwritten.

// ReplicaNotFoundError: the store does not host an initialized replica of
// the region (it never had one, it was removed, or its peer still waits for
// its first snapshot: Uninitialized).
type ReplicaNotFoundError struct {
	StoreID       uint64
	RegionID      uint64
	Uninitialized bool
}

func (e *ReplicaNotFoundError) Error() string {
	if e.Uninitialized {
		return fmt.Sprintf("store %d: replica of region %d is not initialized", e.StoreID, e.RegionID)
	}
	return fmt.Sprintf("store %d hosts no replica of region %d", e.StoreID, e.RegionID)
}

// RegionDigest returns this store's digest of its replica of regionID.
func (s *Store) RegionDigest(regionID uint64) (replica.Digest, error) {
	d := replica.Digest{StoreID: s.cfg.StoreID}
	err := s.viewReplica(regionID, func(tx *engine.Tx, r region.Region, as engine.ApplyState) error {
		d.Region, d.AppliedIndex, d.AppliedTerm = r, as.AppliedIndex, as.AppliedTerm
		self, _ := r.PeerOnStore(s.cfg.StoreID)
		d.PeerID = self.ID
		h := sha256.New()
		forEachInRange(tx, r, func(k, v []byte) {
			writeHashChunk(h, k)
			writeHashChunk(h, v)
			d.Keys++
			d.Bytes += uint64(len(k) + len(v))
		})
		h.Sum(d.Hash[:0])
		dh := sha256.New()
		now := tx.DedupClock(r.ID, as.AppliedIndex)
		if err := tx.ForEachDedup(r.StartKey, r.EndKey, func(rec engine.DedupRecord) error {
			if rec.Clock+s.cfg.DedupWindow <= now {
				return nil // dead: no later entry can see it; trimmed at leisure
			}
			var b [16]byte
			binary.BigEndian.PutUint64(b[:], rec.Clock)
			binary.BigEndian.PutUint64(b[8:], rec.ID)
			dh.Write(b[:])
			writeHashChunk(dh, rec.Key)
			d.DedupRecords++
			return nil
		}); err != nil {
			return err
		}
		dh.Sum(d.DedupHash[:0])
		return nil
	})
	return d, err
}

// RegionDump returns every key-value pair of this store's replica of
// regionID and the applied index they are as of. It exists to name the
// first differing key once digests differ: it copies the whole range.
func (s *Store) RegionDump(regionID uint64) (applied uint64, kvs []replica.KV, err error) {
	err = s.viewReplica(regionID, func(tx *engine.Tx, r region.Region, as engine.ApplyState) error {
		applied = as.AppliedIndex
		forEachInRange(tx, r, func(k, v []byte) {
			kvs = append(kvs, replica.KV{Key: bytes.Clone(k), Value: bytes.Clone(v)})
		})
		return nil
	})
	return applied, kvs, err
}

// viewReplica runs fn in one read transaction with the replica's metadata
// and apply state as persisted, if this store hosts an initialized replica
// of regionID that has not been removed.
func (s *Store) viewReplica(regionID uint64, fn func(tx *engine.Tx, r region.Region, as engine.ApplyState) error) error {
	if s.stopped() {
		return ErrStopped
	}
	notFound := &ReplicaNotFoundError{StoreID: s.cfg.StoreID, RegionID: regionID}
	p, ok := s.peer(regionID)
	if !ok {
		return notFound
	}
	p.mu.Lock()
	initialized, removed := p.initialized && !p.applyingSnapshotLocked(), p.removed
	p.mu.Unlock()
	if removed {
		return notFound
	}
	if !initialized {
		notFound.Uninitialized = true
		return notFound
	}
	return s.eng.ViewCommitted(func(tx *engine.Tx) error {
		meta := tx.RegionMeta(regionID)
		if meta == nil {
			return notFound // destroyed since the lookup
		}
		r, err := decodeRegion(meta)
		if err != nil {
			return fmt.Errorf("region %d: %w", regionID, err)
		}
		if _, ok := r.PeerOnStore(s.cfg.StoreID); !ok {
			return notFound // applied its own removal; being destroyed
		}
		as, err := tx.ApplyState(regionID)
		if err != nil {
			return err
		}
		return fn(tx, r, as)
	})
}

// forEachInRange calls fn for every pair of r's range in key order. k and v
// are the transaction's memory: valid only inside it.
func forEachInRange(tx *engine.Tx, r region.Region, fn func(k, v []byte)) {
	tx.ForEachData(r.StartKey, r.EndKey, func(k, v []byte) bool {
		fn(k, v)
		return true
	})
}

func writeHashChunk(h hash.Hash, b []byte) {
	var l [binary.MaxVarintLen64]byte
	h.Write(l[:binary.PutUvarint(l[:], uint64(len(b)))])
	h.Write(b)
}

// IsReplicaNotFound reports whether err says the store hosts no
// initialized replica of the region.
func IsReplicaNotFound(err error) bool {
	var nf *ReplicaNotFoundError
	return errors.As(err, &nf)
}
