package raftstore

import (
	"context"
	"fmt"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3/raftpb"
)

// Applier applies the commands of a layer above raftstore (Config.Applier),
// which proposes them with Store.Propose: opaque payloads that travel
// through a region's raft log like any write and are applied, at the same
// log position, on every replica. raftstore knows nothing of what they
// mean; it promises the order (the region's log), the transaction (the
// round's, with everything else applied in it), and the result's delivery
// to the proposer.
//
// Apply is called in the Ready loop, inside the round's transaction, once
// for each committed command entry of region r (the region as of the
// entry: its key range and epoch) at log index index, on every replica. It
// must:
//
//   - be deterministic: given the same log (the same payloads in the same
//     order over the same data), write the same keys and values and return
//     the same result on every replica and on every replay. It may read
//     only through tx (tx.Get sees every earlier entry's writes) and keep
//     no state of its own that a write depends on: a replica that catches
//     up from a region snapshot never sees the entries the snapshot covers,
//     and an entry is applied again, its earlier writes discarded, after a
//     crash or a lost batch (Apply may see an index twice).
//   - write only user keys inside r (tx.Put and tx.Delete), and nothing
//     else of tx's: the region's data is what snapshots carry, digests
//     compare and splits divide; other records are raftstore's.
//   - return quickly: the loop, and every region of the store, waits.
//
// An error from Apply is a storage failure: the round fails as a failed
// write of the engine does, and the store freezes until a write succeeds
// and rebuilds its peers from disk (diskfail.go), which applies the entry
// again. So a command the Applier refuses (a failed precondition, a bad
// payload) is not an error: the refusal belongs in result, which every
// replica computes alike and which reaches the proposer as is.
//
// There is no deduplication: a command proposed twice (a client's retry
// after a lost answer, a proposal that failed with NotLeader but was
// committed anyway) is applied twice. Making a retry harmless (a request
// ID in the payload, a revision to compare against) is the Applier's.
//
// payload is the entry's memory: read it, do not modify or keep it. result
// belongs to raftstore once returned.
type Applier interface {
	Apply(tx StateTx, r region.Region, index uint64, payload []byte) (result []byte, err error)
}

// RoundApplier is an Applier that is also told, on the Ready loop, when a
// round's transaction has ended well: what Apply wrote in it is then
// visible to reads (Store.ReadView), which it is not while Apply runs. A
// layer that wakes readers of what it applied (the etcd API's watchers)
// wakes them here: woken from Apply, a reader can look before the round
// ends, find nothing new, and sleep past the write.
type RoundApplier interface {
	Applier
	RoundApplied()
}

// StateTx is what an Applier sees of the round's transaction: the region's
// user data, read and written. (It is the engine's transaction, narrowed:
// a layer above raftstore reaches storage only through raftstore.)
type StateTx interface {
	// Get reads a key as the transaction sees it: with every earlier
	// entry's writes. The value is a copy.
	Get(key []byte) (value []byte, found bool)
	// Put and Delete write a key; readers see it once the round ends.
	Put(key, value []byte) error
	Delete(key []byte) error
	// ForEachData calls fn for the keys in [start, end) (end empty: no
	// bound) in order until it returns false; k and v are valid only
	// during the call.
	ForEachData(start, end []byte, fn func(k, v []byte) bool)
}

// StateView is a consistent read of the region's user data, as of the
// read's barrier (Store.ReadView), bounded to the region.
type StateView interface {
	// Get reads a key; an error for a key outside the region.
	Get(key []byte) (value []byte, found bool, err error)
	// Scan calls fn for the keys in [start, end) (clamped to the region)
	// in order until it returns false or ctx ends; k and v are valid only
	// during the call.
	Scan(ctx context.Context, start, end []byte, fn func(k, v []byte) bool) error
}

var (
	_ StateTx   = (*engine.Tx)(nil)
	_ StateView = (*engine.Snapshot)(nil)
)

// applyCommandTx applies an Applier's command: like a put, refused if its
// key left the region (a split ordered before it), then handed to the
// Applier, whose result answers the proposer. A store without an Applier
// acknowledges it with ErrNoApplier and writes nothing.
func (s *Store) applyCommandTx(tx *engine.Tx, rp *readyPeer, e *raftpb.Entry, cmd command) error {
	p := rp.p
	if !p.region.Contains(cmd.key) {
		rp.ack(cmd.id, e.Term, &region.KeyNotInRegionError{Key: cmd.key, RegionID: p.regionID, StartKey: p.region.StartKey, EndKey: p.region.EndKey})
		return nil
	}
	if s.cfg.Applier == nil {
		s.log.Error("a command for an Applier was applied as nothing: this store has none, and its data may now differ from its region's other replicas",
			"region", p.regionID, "index", e.Index)
		rp.ack(cmd.id, e.Term, fmt.Errorf("region %d: entry %d: %w", p.regionID, e.Index, ErrNoApplier))
		return nil
	}
	result, err := s.cfg.Applier.Apply(tx, p.region.Clone(), e.Index, cmd.value)
	if err != nil {
		return fmt.Errorf("applier: %w", err)
	}
	rp.ackResult(cmd.id, e.Term, result)
	return nil
}
