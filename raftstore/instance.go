package raftstore

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hedgekv/hedgekv/storage/engine"
)

// Peer instances.
//
// A peer's in-memory state (its follower-lease requests, its ReadIndex
// batches) lives and dies with one instance of the peer: one call to
// createPeer. Every answer a peer matches to one of its own requests by a
// number must be impossible to match to a request of another instance of
// the same peer, or a late answer meant for an instance that restarted
// (or was rebuilt after a disk failure, or replaced by a split) would be
// taken by the next one: a lease grant would be timed from a later
// request than the leader granted, and a read index would be older than
// the read it resolves.
//
// So every instance has an identity no other instance of any peer of this
// store has, and requests carry it: the store's incarnation (a counter in
// the engine, bumped and committed on every open, before any peer exists)
// in the high 32 bits, and a per-process count of instances in the low 32.
// The identity is as durable as raft's own hard state, which lives in the
// same file: a store whose data dir is lost has lost its votes too, and
// must come back as a new store. A fresh data dir starts its incarnations
// at a random value, so even that case collides with nothing it is likely
// to meet.

// errInstancesExhausted: 2^32 peer instances in one process.
var errInstancesExhausted = errors.New("peer instance identities exhausted for this incarnation: restart the store")

// bumpIncarnation reads the store's incarnation, adds one and commits it
// (synced, as every engine commit is unless NoSync): no two opens of this
// data dir ever share one.
func (s *Store) bumpIncarnation() error {
	return s.eng.Update(func(tx *engine.Tx) error {
		inc := tx.Incarnation()
		if inc == 0 {
			var rb [4]byte
			if _, err := rand.Read(rb[:]); err != nil {
				return fmt.Errorf("incarnation seed: %w", err)
			}
			inc = uint64(binary.BigEndian.Uint32(rb[:]) >> 1) // below 2^31: room for 2^31 restarts
		}
		inc++
		if inc >= 1<<32 {
			return fmt.Errorf("store incarnation %d out of range", inc)
		}
		if err := tx.PutIncarnation(inc); err != nil {
			return fmt.Errorf("write incarnation: %w", err)
		}
		s.incarnation = inc
		return nil
	})
}

// nextInstance returns a new peer instance identity, never 0.
func (s *Store) nextInstance() (uint64, error) {
	n := s.instances.Add(1)
	if n >= 1<<32 || s.incarnation == 0 {
		return 0, errInstancesExhausted
	}
	return s.incarnation<<32 | n, nil
}
