package raftstore

import (
	"encoding/binary"
	"fmt"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3/raftpb"
)

// applyEntryTx applies one committed entry inside the round's transaction.
// What must happen outside the transaction (creating a split's new peer,
// telling raft about a conf change) is queued on rp for publish.
func (s *Store) applyEntryTx(tx *engine.Tx, rp *readyPeer, e *raftpb.Entry) error {
	switch e.Type {
	case raftpb.EntryNormal:
		if len(e.Data) == 0 {
			return nil // a new leader's empty entry
		}
		cmd, err := decodeCommand(e.Data)
		if err != nil {
			return err
		}
		if rp.p.region.Merge != nil && (cmd.op == opPut || cmd.op == opDelete || cmd.op == opSplit || cmd.op == opApply) {
			// Frozen for a merge: its state must stay as of the freeze on
			// every replica (merge.go), whatever was proposed before the
			// proposer saw the freeze.
			rp.ack(cmd.id, e.Term, &region.EpochNotMatchError{RegionID: rp.p.regionID})
			return nil
		}
		switch cmd.op {
		case opPrepareMerge:
			return s.applyPrepareMergeTx(tx, rp, e, cmd)
		case opCommitMerge:
			return s.applyCommitMergeTx(tx, rp, e, cmd)
		case opAbortMerge:
			return s.applyAbortMergeTx(tx, rp, e, cmd)
		case opRollbackMerge:
			return s.applyRollbackMergeTx(tx, rp, e, cmd)
		case opPut, opDelete:
			return s.applyWriteTx(tx, rp, e, cmd)
		case opSplit:
			return s.applySplitTx(tx, rp, e, cmd)
		case opApply:
			return s.applyCommandTx(tx, rp, e, cmd)
		case opAllocRegionID:
			return s.applyAllocRegionIDTx(tx, rp, e, cmd)
		}
		return nil
	case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
		return s.applyConfChangeTx(tx, rp, e)
	}
	return nil
}

// applyWriteTx applies a put or delete. A key outside the region (a split
// was ordered before it in the log) is refused, and a request the region
// applied within the dedup window (a client's retry; see dedup.go) is
// acknowledged again but not re-applied.
func (s *Store) applyWriteTx(tx *engine.Tx, rp *readyPeer, e *raftpb.Entry, cmd command) error {
	p := rp.p
	if !p.region.Contains(cmd.key) {
		rp.ack(cmd.id, e.Term, &region.KeyNotInRegionError{Key: cmd.key, RegionID: p.regionID, StartKey: p.region.StartKey, EndKey: p.region.EndKey})
		return nil
	}
	clock := tx.DedupClock(p.regionID, e.Index)
	if !tx.DedupSeen(cmd.key, cmd.id, clock, s.cfg.DedupWindow) {
		if err := tx.DedupRemember(cmd.key, cmd.id, clock); err != nil {
			return err
		}
		value, del := cmd.value, cmd.op != opPut
		if filter := s.cfg.Knobs.ApplyFilter; filter != nil {
			value, del = filter(p.regionID, cmd.key, value, del)
		}
		var err error
		if del {
			err = tx.Delete(cmd.key)
		} else {
			err = tx.Put(cmd.key, value)
		}
		if err != nil {
			return err
		}
	}
	rp.ack(cmd.id, e.Term, nil)
	return nil
}

// A split command's value: newRegionID(8) | confVer(8) | version(8), the
// epoch the proposer saw. A split whose epoch no longer matches (a
// duplicate, or one raced by another split) is refused, so every replica
// applies the same splits.
func encodeSplit(newID uint64, ep region.Epoch) []byte {
	b := make([]byte, 24)
	binary.BigEndian.PutUint64(b, newID)
	binary.BigEndian.PutUint64(b[8:], ep.ConfVer)
	binary.BigEndian.PutUint64(b[16:], ep.Version)
	return b
}

func (s *Store) applySplitTx(tx *engine.Tx, rp *readyPeer, e *raftpb.Entry, cmd command) error {
	p := rp.p
	if len(cmd.value) != 24 {
		return fmt.Errorf("split command: %w", errCorrupt)
	}
	newID := binary.BigEndian.Uint64(cmd.value)
	ep := region.Epoch{ConfVer: binary.BigEndian.Uint64(cmd.value[8:]), Version: binary.BigEndian.Uint64(cmd.value[16:])}
	if ep != p.region.Epoch {
		rp.ack(cmd.id, e.Term, &region.EpochNotMatchError{RegionID: p.regionID, Current: []region.Region{p.region.Clone()}})
		return nil
	}
	ids := make([]uint64, len(p.region.Peers))
	for i, pr := range p.region.Peers {
		ids[i] = pr.ID // peer IDs are scoped to their group: the new one reuses them
	}
	left, right, err := region.Split(p.region, cmd.key, newID, ids)
	if err != nil {
		rp.ack(cmd.id, e.Term, fmt.Errorf("%w: %v", ErrInvalidRequest, err))
		return nil
	}
	if err := putRegion(tx, left); err != nil {
		return err
	}
	p.setRegion(left)
	rp.regionChanged = true
	// The new region may exist here already, initialized by a snapshot
	// from its own leader when this replica lagged: then it is ahead of
	// this split and must be left alone (its table came with the snapshot).
	np, ok := s.peer(newID)
	create := !ok
	if ok {
		np.mu.Lock()
		held := np.holdsSnapshotLocked()
		create = !np.initialized && !held
		np.mu.Unlock()
		if held {
			// Snapshot claims (snapclaim.go) keep this from happening:
			// creating the region here would reset a log its leader has
			// counted on. Left to the snapshot, as an initialized one is.
			s.log.Error("a split found its new region's snapshot under way: left to the snapshot", "region", p.regionID, "new_region", newID)
			s.stats.splitsOverSnapshot.Add(1)
		}
	}
	// No data and no dedup record moves: the new region owns the keys of
	// its range and their records (dedup.go). The split costs the same
	// whatever the region holds.
	if create {
		if err := tx.SplitDedup(p.regionID, newID, e.Index, raftInitIndex); err != nil {
			return err
		}
		hs := raftpb.HardState{Term: raftInitTerm, Commit: raftInitIndex}
		// An uninitialized placeholder may have voted in a later term; that
		// vote still binds the new peer.
		if old, ok, err := tx.HardState(newID); err == nil && ok && old.Term > hs.Term {
			hs.Term, hs.Vote = old.Term, old.Vote
		}
		if err := putRegion(tx, right); err != nil {
			return err
		}
		if err := tx.PutHardState(newID, hs); err != nil {
			return err
		}
		if err := tx.PutApplyState(newID, initApplyState); err != nil {
			return err
		}
		rp.created = append(rp.created, createdRegion{region: right, hard: hs})
	}
	rp.ack(cmd.id, e.Term, nil)
	return nil
}

var initApplyState = engine.ApplyState{AppliedIndex: raftInitIndex, AppliedTerm: raftInitTerm, TruncatedIndex: raftInitIndex, TruncatedTerm: raftInitTerm}

// A conf change entry's Context: requestID(8) | n | n × (peerID(8) | storeID(8)),
// the placement of the peers it adds (raft knows only their IDs).
func encodeConfContext(reqID uint64, peers []region.Peer) []byte {
	b := binary.BigEndian.AppendUint64(nil, reqID)
	b = binary.AppendUvarint(b, uint64(len(peers)))
	for _, p := range peers {
		b = binary.BigEndian.AppendUint64(b, p.ID)
		b = binary.BigEndian.AppendUint64(b, p.StoreID)
	}
	return b
}

func decodeConfContext(b []byte) (reqID uint64, stores map[uint64]uint64, err error) {
	if len(b) < 8 {
		return 0, nil, fmt.Errorf("conf change context: %w", errCorrupt)
	}
	reqID = binary.BigEndian.Uint64(b)
	n, w := binary.Uvarint(b[8:])
	rest := b[8+max(w, 0):]
	if w <= 0 || uint64(len(rest)) != n*16 {
		return 0, nil, fmt.Errorf("conf change context: %w", errCorrupt)
	}
	stores = make(map[uint64]uint64, n)
	for i := uint64(0); i < n; i++ {
		stores[binary.BigEndian.Uint64(rest)] = binary.BigEndian.Uint64(rest[8:])
		rest = rest[16:]
	}
	return reqID, stores, nil
}

// applyConfChangeTx records a membership change in the region's metadata;
// publish hands it to raft. Leaving a joint configuration changes no peer.
func (s *Store) applyConfChangeTx(tx *engine.Tx, rp *readyPeer, e *raftpb.Entry) error {
	p := rp.p
	var cc raftpb.ConfChangeV2
	if e.Type == raftpb.EntryConfChange {
		var v1 raftpb.ConfChange
		if err := v1.Unmarshal(e.Data); err != nil {
			return fmt.Errorf("conf change: %w", err)
		}
		cc = v1.AsV2()
	} else if err := cc.Unmarshal(e.Data); err != nil {
		return fmt.Errorf("conf change: %w", err)
	}
	if p.region.Merge != nil {
		// Frozen for a merge: its membership is what the merge checked
		// (every store of the target holds a replica of it). Every replica
		// skips the change alike; raft is not told, so its configuration
		// stays the region's.
		rp.confSkipped = true
		if reqID, _, err := decodeConfContext(cc.Context); err == nil && reqID != 0 {
			rp.ack(reqID, e.Term, fmt.Errorf("region %d is frozen for a merge: %w", p.regionID, ErrInvalidRequest))
		}
		return nil
	}
	rp.confChanges = append(rp.confChanges, cc)
	var reqID uint64
	stores := map[uint64]uint64{}
	if len(cc.Context) > 0 {
		var err error
		if reqID, stores, err = decodeConfContext(cc.Context); err != nil {
			return err
		}
	}
	r := p.region.Clone()
	for _, ch := range cc.Changes {
		switch ch.Type {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			learner := ch.Type == raftpb.ConfChangeAddLearnerNode
			found := false
			for i := range r.Peers {
				if r.Peers[i].ID == ch.NodeID {
					r.Peers[i].IsLearner, found = learner, true
				}
			}
			if !found {
				r.Peers = append(r.Peers, region.Peer{ID: ch.NodeID, StoreID: stores[ch.NodeID], IsLearner: learner})
			}
		case raftpb.ConfChangeRemoveNode:
			kept := r.Peers[:0]
			for _, pr := range r.Peers {
				if pr.ID != ch.NodeID {
					kept = append(kept, pr)
				} else if pr.ID != p.id {
					rp.removedPeers = append(rp.removedPeers, pr)
				}
			}
			r.Peers = kept
			if ch.NodeID == p.id {
				rp.removed = true
			}
		}
	}
	if len(cc.Changes) > 0 {
		r.Epoch.ConfVer++
		if err := putRegion(tx, r); err != nil {
			return err
		}
		p.setRegion(r)
		rp.regionChanged = true
	}
	if reqID != 0 {
		rp.ack(reqID, e.Term, nil)
	}
	return nil
}

// setRegion replaces the peer's metadata.
func (p *Peer) setRegion(r region.Region) {
	p.mu.Lock()
	p.region = r
	p.mu.Unlock()
	if p.store != nil { // a test's bare peer has none
		p.store.summaryChanged()
	}
}

func (p *Peer) isInitialized() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.initialized
}
