package raftstore

import (
	"fmt"
	"slices"
	"time"

	"github.com/hedgekv/hedgekv/clock"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"github.com/hedgekv/hedgekv/storage/wal"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// readyPeer is one peer's Ready taken in this round.
type readyPeer struct {
	p      *Peer
	rd     raft.Ready
	leader bool             // the peer led when the Ready was taken
	held   []raftpb.Message // for a leader: the messages held until after persist
	// filled while persisting and applying, published after commit:
	snapApplied bool
	stagedSnap  uint64 // the received snapshot file applied, deleted after commit
	applied     uint64
	appliedTerm uint64
	compactTo   uint64
	compactTerm uint64 // the term at compactTo
	acked       []ackedProposal
	// membership and shape changes applied in this round:
	confChanges   []raftpb.ConfChangeV2
	created       []createdRegion // new regions from splits, to start peers for
	regionChanged bool
	removed       bool // this peer was removed from its region
	// skip: the peer was destroyed (a tombstone) since its Ready was
	// taken; nothing of this round is written, published or sent for it.
	skip         bool
	removedPeers []region.Peer // other peers this round removed
	// confSkipped: a conf change of a region frozen for a merge was
	// skipped (merge.go); mergedSources: the source regions' peers here
	// whose regions this round's commit merges absorbed, to forget.
	confSkipped   bool
	merged        bool
	mergedSources []*Peer
	// sentEarly: a follower's messages went as soon as the round's WAL
	// record was synced (sendDurable); pendingNoted: its entries were
	// recorded as pending writes then, before its acks.
	sentEarly, pendingNoted bool
}

type readyDirect struct {
	p *Peer
	m raftpb.Message
}

type createdRegion struct {
	region region.Region
	hard   raftpb.HardState
}

type ackedProposal struct {
	id     uint64
	term   uint64
	result []byte // an opApply's: what the Applier returned
	err    error
}

func (rp *readyPeer) ack(id, term uint64, err error) {
	rp.acked = append(rp.acked, ackedProposal{id: id, term: term, err: err})
}

// ackResult is ack for an entry that answers with a result (opApply).
func (rp *readyPeer) ackResult(id, term uint64, result []byte) {
	rp.acked = append(rp.acked, ackedProposal{id: id, term: term, result: result})
}

// run is the Ready loop; see doc.go for the contract it keeps.
func (s *Store) run(ticker clock.Ticker) {
	defer close(s.done)
	defer ticker.Stop()
	for {
		ticked := false
		select {
		case <-s.stopc:
			return
		case <-ticker.C():
			s.tick()
			ticked = true
		case <-s.wakec:
		}
		err := s.round()
		if ticked && s.cfg.Knobs.AfterTick != nil {
			s.cfg.Knobs.AfterTick()
		}
		if err != nil {
			// The engine failed under us: nothing that was not made durable
			// may be acknowledged or sent. Freeze until a write succeeds,
			// then start over from what is on disk (diskfail.go).
			s.onDiskFailed(err)
			if !s.waitForDisk() {
				return
			}
		}
	}
}

// waitForDisk probes the disk until a write succeeds and the peers are
// rebuilt from it (true), or the store stops (false).
func (s *Store) waitForDisk() bool {
	t := s.cfg.Clock.NewTicker(diskProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopc:
			return false
		case <-t.C():
		}
		if err := s.probeDisk(); err != nil {
			continue
		}
		if h := s.knobs.diskProbed.Load(); h != nil {
			(*h)()
		}
		if err := s.recoverFromDisk(); err != nil {
			s.log.Error("raft loop stopped: rebuilding peers from disk failed", "err", err)
			go s.Stop()
			return false
		}
		return true
	}
}

// tick advances the logical clock of every awake peer (hibernating ones
// are not visited: hibernate.go) and expires stuck reads.
func (s *Store) tick() {
	now := s.now()
	readTimeout := 2 * time.Duration(s.cfg.ElectionTicks) * s.cfg.TickInterval
	peers := s.awakePeers()
	if h := s.cfg.Knobs.TickVisits; h != nil {
		h(len(peers))
	}
	ticked, flush := peers[:0], false
	type notice struct {
		p *Peer
		n Notice
	}
	var leaseReqs, staleChecks []notice
	for _, p := range peers {
		p.mu.Lock()
		if p.removed {
			// Destroyed or superseded: it never ticks again.
			p.mu.Unlock()
			s.dropAwake(p)
			continue
		}
		if p.hibernating {
			p.mu.Unlock()
			continue
		}
		// Decide before ticking: a tick may emit heartbeats, and a heartbeat
		// arriving after the notice would wake the follower again.
		if hib := p.maybeHibernateLocked(); hib != nil {
			p.mu.Unlock()
			s.queueNotices(p, hib)
			flush = true
			continue
		}
		p.rn.Tick()
		p.idleTicks++
		for _, n := range p.staleChecksLocked(now) {
			staleChecks = append(staleChecks, notice{p, n})
		}
		p.expireReadsLocked(now, readTimeout)
		p.expireOrphansLocked(now)
		p.restepHeldPropsLocked(now)
		if s.cfg.FollowerLeases {
			// Follower: ask for (or renew) a lease. Leader: step the acks
			// a holder's expiry or the end of the deferral released.
			if n, ok := p.leaseRequestLocked(now); ok {
				leaseReqs = append(leaseReqs, notice{p, n})
			}
			p.restepAcksLocked(now)
		}
		p.mu.Unlock()
		ticked = append(ticked, p)
	}
	for _, r := range leaseReqs {
		s.sendNotice(r.p, r.n)
	}
	for _, r := range staleChecks {
		s.sendNotice(r.p, r.n)
	}
	if s.sweepAt.IsZero() || now.After(s.sweepAt) {
		s.sweepAt = now.Add(time.Second)
		s.sweepSnapshots()
	}
	if flush {
		s.trans.Flush()
	}
	s.dirtyMu.Lock()
	for _, p := range ticked {
		s.dirty[p.regionID] = p
	}
	s.dirtyMu.Unlock()
}

// round runs steps 1–6 of doc.go once for every dirty peer, one function
// per step.
func (s *Store) round() error {
	s.dirtyMu.Lock()
	dirty := s.dirty
	s.dirty = make(map[uint64]*Peer, len(dirty))
	s.dirtyMu.Unlock()

	batch := s.collectReadyApart(dirty) // snapshot applies held apart (snapapply.go)
	if len(batch) == 0 {
		// An idle store still commits (and checkpoints) its last rounds.
		return s.eng.CheckpointIfDue(false)
	}
	s.sendEarly(batch)
	if err := s.persistAndApply(batch); err != nil {
		return err
	}
	batch = slices.DeleteFunc(batch, func(rp *readyPeer) bool { return rp.skip })
	if hook := s.cfg.Knobs.afterPersist; hook != nil {
		hook(s, batch)
	}
	for _, rp := range batch {
		if err := s.publish(rp); err != nil {
			return err
		}
	}
	s.sendHeld(batch)
	return s.advance(batch)
}

// collectReady is step 1: issue each peer's queued reads as one ReadIndex
// batch (a follower's goes to its leader at once), step its queued writes
// as one proposal, and take the Readys.
func (s *Store) collectReady(dirty map[uint64]*Peer) []*readyPeer {
	now := s.now()
	var batch []*readyPeer
	var directs []readyDirect
	for _, p := range dirty {
		p.mu.Lock()
		if p.removed {
			// Destroyed, or a placeholder a split superseded: whatever its
			// raft holds must be neither persisted nor answered.
			p.mu.Unlock()
			continue
		}
		p.checkCommitLocked(now)
		renew := p.isLeaderLocked() && p.leaseNeedsRenewLocked(now) && len(p.reads.inflight) == 0 && p.readsSinceRenew
		p.readsSinceRenew = false
		if direct := p.issueReadsLocked(now, renew); direct != nil {
			directs = append(directs, readyDirect{p, *direct})
		}
		p.batchProposalsLocked()
		if p.rn.HasReady() {
			rp := &readyPeer{p: p, rd: p.rn.Ready(), leader: p.isLeaderLocked()}
			p.countLeadershipLocked(&rp.rd)
			batch = append(batch, rp)
		}
		p.mu.Unlock()
	}
	for _, d := range directs {
		s.send(d.p, []raftpb.Message{d.m})
	}
	if len(batch) == 0 && len(directs) > 0 {
		s.trans.Flush()
	}
	return batch
}

// sendEarly sends a leader's appends and heartbeats before its own write:
// it may persist in parallel with its followers (raft's doc.go), which
// takes one disk write off every commit's critical path. The rest of its
// messages are held for step 5. A follower's forwarded proposals go now
// too: they promise nothing about its own state.
func (s *Store) sendEarly(batch []*readyPeer) {
	for _, rp := range batch {
		if rp.leader {
			var early []raftpb.Message
			rp.held, early = splitEarly(rp.rd.Messages)
			s.send(rp.p, early)
			continue
		}
		var props []raftpb.Message
		rp.rd.Messages, props = splitProps(rp.rd.Messages)
		s.send(rp.p, props)
	}
	s.trans.Flush()
}

// splitProps separates a follower's forwarded proposals (MsgProp) from
// its other messages (rest: returned first, in their order).
func splitProps(msgs []raftpb.Message) (rest, props []raftpb.Message) {
	for i, m := range msgs {
		if m.Type != raftpb.MsgProp {
			continue
		}
		// Rare: copy only when there is a proposal to take out.
		rest = append([]raftpb.Message(nil), msgs[:i]...)
		for _, m := range msgs[i:] {
			if m.Type == raftpb.MsgProp {
				props = append(props, m)
			} else {
				rest = append(rest, m)
			}
		}
		return rest, props
	}
	return msgs, nil
}

// persistAndApply is steps 2–3: persist every peer's snapshot, entries and
// hard state, and apply committed entries, all in ONE bbolt transaction
// (group commit). A round with nothing to write (only messages or read
// states, as in a follower read) skips the transaction: a bbolt commit
// always fsyncs.
func (s *Store) persistAndApply(batch []*readyPeer) error {
	if !needsWrite(batch) {
		for _, rp := range batch {
			rp.p.mu.Lock()
			rp.skip = rp.p.removed
			rp.applied, rp.appliedTerm = rp.p.applied, rp.p.appliedTerm
			rp.p.mu.Unlock()
		}
		return nil
	}
	var early []*readyPeer
	prepare := func() []wal.Item {
		// Checked under the engine's lock: destroyPeer marks the peer
		// removed before its own transaction, which waits for this round,
		// so nothing written here outlives the destruction.
		var items []wal.Item
		for _, rp := range batch {
			if rp.skip = rp.p.isRemoved(); rp.skip {
				continue
			}
			if it, ok := walItemOf(rp); ok {
				items = append(items, it)
			}
			if sendsOnWAL(rp) {
				early = append(early, rp)
			}
		}
		return items
	}
	durable := func() { s.sendDurable(early) }
	err := s.writeTx(prepare, durable, func(tx *engine.Tx) error {
		// Every persist before any apply: a split applied here writes the
		// new region's state, which must win over (and carry the vote of)
		// a placeholder of that region persisting in the same round.
		for _, rp := range batch {
			if rp.skip {
				continue
			}
			if err := s.persistTx(tx, rp); err != nil {
				return fmt.Errorf("region %d: persist: %w", rp.p.regionID, err)
			}
		}
		for _, rp := range batch {
			if rp.skip {
				continue
			}
			if err := s.applyTx(tx, rp); err != nil {
				return fmt.Errorf("region %d: apply: %w", rp.p.regionID, err)
			}
		}
		// An injected failure strikes once the round has written, as a
		// failed write of the batch would: the batch is lost with it.
		return s.injectedDiskError()
	})
	if err != nil {
		return err
	}
	s.stats.readyRounds.Add(1)
	if ra, ok := s.cfg.Applier.(RoundApplier); ok {
		ra.RoundApplied()
	}
	// A round that changed a region's shape is made durable in bbolt
	// before anything of it is sent or published: the WAL replays only
	// raft log entries and hard states (storage/engine, checkpoint.go).
	var shaped []uint64
	for _, rp := range batch {
		if !rp.skip && (rp.snapApplied || rp.regionChanged || rp.removed || len(rp.created) > 0 || len(rp.confChanges) > 0) {
			shaped = append(shaped, rp.p.regionID)
		}
	}
	if len(shaped) == 0 {
		return s.eng.CheckpointIfDue(false)
	}
	// This checkpoint holds every region of the store (it runs in the
	// loop, and waits for a timed one in flight): say when it was long.
	if hook := s.cfg.Knobs.beforeShapeCheckpoint; hook != nil {
		hook(s, shaped)
	}
	start := time.Now()
	err = s.eng.CheckpointIfDue(true)
	if took := time.Since(start); took >= slowShapeCheckpoint {
		s.log.Info("a shape change's checkpoint held the loop", "took_ms", took.Milliseconds(), "regions", shaped)
	}
	return err
}

// slowShapeCheckpoint: a shape change's checkpoint that takes this long is
// logged (writes of every region on the store waited for it).
const slowShapeCheckpoint = 20 * time.Millisecond

// walItemOf is the raft state rp's round persists, for the WAL.
func walItemOf(rp *readyPeer) (wal.Item, bool) {
	rd := &rp.rd
	it := wal.Item{RegionID: rp.p.regionID, Entries: rd.Entries, MustSync: rd.MustSync}
	if !raft.IsEmptyHardState(rd.HardState) {
		it.Hard = &rd.HardState
	}
	if !raft.IsEmptySnap(rd.Snapshot) {
		it.Snap, it.SnapIndex, it.SnapTerm = true, rd.Snapshot.Metadata.Index, rd.Snapshot.Metadata.Term
		it.MustSync = true
	}
	return it, it.Snap || it.Hard != nil || len(it.Entries) > 0
}

// sendsOnWAL reports whether rp's messages may go as soon as the round's
// WAL record is synced, before its bbolt transaction (the apply) ends: a
// follower's messages (append and heartbeat acks, votes, ReadIndex
// requests) promise only raft's entries and hard state, which that record
// holds. Not a snapshot's ack: the snapshot's data is in bbolt alone, and
// its round checkpoints before it says anything. Not a leader's held
// messages either (a transfer's MsgTimeoutNow carries lease state the
// publish sets). A follower's ack no longer waits for the apply of the
// entries it commits: the apply was often the longer half of its round.
func sendsOnWAL(rp *readyPeer) bool {
	return !rp.leader && len(rp.rd.Messages) > 0 && raft.IsEmptySnap(rp.rd.Snapshot)
}

// sendDurable sends the messages of early (sendsOnWAL) on the WAL's
// goroutine, once the round's record is synced. With follower leases the
// entries' keys are recorded as pending writes first: a leader counts an
// ack only once the follower knows which keys the acked entries write
// (publish would have recorded them before its acks; recording them
// earlier, with the applied index before this round's apply, only makes
// a lease read wait for entries that are about to apply).
func (s *Store) sendDurable(early []*readyPeer) {
	if len(early) == 0 {
		return
	}
	for _, rp := range early {
		if s.cfg.FollowerLeases {
			rp.p.mu.Lock()
			rp.p.fl.pending.append(rp.rd.Entries, rp.p.applied)
			rp.p.mu.Unlock()
			rp.pendingNoted = true
		}
		s.send(rp.p, rp.rd.Messages)
		rp.sentEarly = true
	}
	// Not on this goroutine: a transport may deliver as it flushes (the
	// in-memory one does), and the receiver's answer may come back into
	// this store and need the engine's lock, which the round holds while
	// it waits for this goroutine (a tombstone answered this way
	// deadlocked a cluster spec).
	go s.trans.Flush()
}

// sendHeld is step 5: send the messages that promise durable state (votes,
// responses, a follower's acks, a leader's held messages), now that it is,
// unless they went as soon as the WAL record was synced (sendDurable).
func (s *Store) sendHeld(batch []*readyPeer) {
	for _, rp := range batch {
		switch {
		case rp.leader:
			s.send(rp.p, rp.held)
		case !rp.sentEarly:
			s.send(rp.p, rp.rd.Messages)
		}
	}
	s.trans.Flush()
}

// advance is step 6: advance each RawNode; forget peers removed from their
// region; a peer with more to do stays dirty.
func (s *Store) advance(batch []*readyPeer) error {
	for _, rp := range batch {
		rp.p.mu.Lock()
		rp.p.rn.Advance(rp.rd)
		more := rp.p.rn.HasReady()
		rp.p.mu.Unlock()
		if rp.removed {
			if err := s.destroyPeer(rp.p); err != nil {
				return err
			}
		} else if more {
			s.markDirty(rp.p)
		}
	}
	return nil
}

// writeTx persists the round (its WAL record, synced, then its bbolt
// transaction, committed without an fsync: storage/engine, checkpoint.go) and reports how
// long it took to the metrics hook.
func (s *Store) writeTx(prepare func() []wal.Item, durable func(), fn func(*engine.Tx) error) error {
	start := time.Now()
	err := s.eng.Round(prepare, durable, fn)
	s.stats.observeWriteTx(time.Since(start))
	return err
}

// splitEarly separates a leader's messages that may be sent before its
// own persist (appends and heartbeats) from the rest (held: returned first).
func splitEarly(msgs []raftpb.Message) (held, early []raftpb.Message) {
	for _, m := range msgs {
		if m.Type == raftpb.MsgApp || m.Type == raftpb.MsgHeartbeat {
			early = append(early, m)
		} else {
			held = append(held, m)
		}
	}
	return held, early
}

func needsWrite(batch []*readyPeer) bool {
	for _, rp := range batch {
		rd := &rp.rd
		if !raft.IsEmptySnap(rd.Snapshot) || len(rd.Entries) > 0 || !raft.IsEmptyHardState(rd.HardState) || len(rd.CommittedEntries) > 0 {
			return true
		}
	}
	return false
}

// persistTx writes the Ready's snapshot, entries and hard state.
func (s *Store) persistTx(tx *engine.Tx, rp *readyPeer) error {
	p, rd := rp.p, &rp.rd
	if !raft.IsEmptySnap(rd.Snapshot) {
		var r region.Region
		var err error
		if _, _, staged := s.snaps.stagedFile(rd.Snapshot.Data); staged {
			rp.stagedSnap, r, err = s.snaps.applyStaged(tx, rd.Snapshot)
		} else {
			var meta []byte
			if meta, err = tx.ApplySnapshot(rd.Snapshot.Data, rd.Snapshot.Metadata.Index, rd.Snapshot.Metadata.Term); err == nil {
				r, err = decodeRegion(meta)
			}
		}
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.region = r
		p.mu.Unlock()
		s.summaryChanged()
		rp.snapApplied = true
		s.eng.WroteRange()
		s.stats.snapshotsApplied.Add(1)
		rp.applied = rd.Snapshot.Metadata.Index
		rp.appliedTerm = rd.Snapshot.Metadata.Term
	}
	prevLast := p.lastIndex
	if rp.snapApplied {
		prevLast = 0 // the snapshot apply cleared the log
	}
	if err := tx.AppendEntries(p.regionID, rd.Entries, prevLast); err != nil {
		return err
	}
	if len(rd.Entries) > 0 {
		s.eng.WroteLog(p.regionID, rd.Entries[0].Index)
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		if err := tx.PutHardState(p.regionID, rd.HardState); err != nil {
			return err
		}
	}
	return nil
}

// applyTx applies committed entries and records the applied index.
func (s *Store) applyTx(tx *engine.Tx, rp *readyPeer) error {
	p := rp.p
	if p.isRemoved() {
		// A merge earlier in this round absorbed the region (merge.go):
		// its state is deleted, and nothing of it may be written again.
		rp.skip = true
		return nil
	}
	if !rp.snapApplied {
		p.mu.Lock()
		rp.applied, rp.appliedTerm = p.applied, p.appliedTerm
		p.mu.Unlock()
	}
	if len(rp.rd.CommittedEntries) == 0 && !rp.snapApplied {
		return nil
	}
	for i := range rp.rd.CommittedEntries {
		e := &rp.rd.CommittedEntries[i]
		if e.Index <= rp.applied {
			continue
		}
		if err := s.applyEntryTx(tx, rp, e); err != nil {
			return fmt.Errorf("entry %d: %w", e.Index, err)
		}
		rp.applied, rp.appliedTerm = e.Index, e.Term
	}
	// Lazy, bounded GC of the dedup table: it decides nothing (dedup.go).
	if err := s.trimDedupTx(tx, p, rp.applied, len(rp.rd.CommittedEntries)); err != nil {
		return err
	}
	as := engine.ApplyState{AppliedIndex: rp.applied, AppliedTerm: rp.appliedTerm}
	first, _ := p.storage.FirstIndex()
	as.TruncatedIndex = first - 1
	as.TruncatedTerm, _ = p.storage.Term(first - 1)
	if rp.snapApplied {
		as.TruncatedIndex, as.TruncatedTerm = rp.rd.Snapshot.Metadata.Index, rp.rd.Snapshot.Metadata.Term
	}
	// Log GC: once enough applied entries pile up, drop all but a tail kept
	// for slightly lagging followers; those further behind get a snapshot.
	if gc := s.cfg.LogGCThreshold; rp.applied > as.TruncatedIndex+gc {
		keep := gc / 4
		rp.compactTo = rp.applied - keep
		// From this transaction: compactTo is usually below the mirror.
		term, err := p.storage.termTx(tx, rp.compactTo)
		if err == nil {
			if err := tx.DeleteLog(p.regionID, as.TruncatedIndex+1, rp.compactTo); err != nil {
				return err
			}
			as.TruncatedIndex, as.TruncatedTerm = rp.compactTo, term
			rp.compactTerm = term
			s.eng.CommitAtRoundEnd()
		} else {
			rp.compactTo = 0
		}
	}
	return tx.PutApplyState(p.regionID, as)
}

// publish makes a persisted round visible, in order: the raft log's
// in-memory mirror, the region's shape (conf changes, ranges, split-off
// regions), then the peer's own state, and wakes whoever waited for it.
func (s *Store) publish(rp *readyPeer) error {
	if err := s.publishMirror(rp); err != nil {
		return err
	}
	if err := s.publishShape(rp); err != nil {
		return err
	}
	p, rd := rp.p, &rp.rd
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(rd.Entries); n > 0 {
		p.lastIndex = rd.Entries[n-1].Index
	} else if rp.snapApplied {
		p.lastIndex = rd.Snapshot.Metadata.Index
	}
	if rd.SoftState != nil {
		s.publishLeaderLocked(p, rd.SoftState)
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		if rd.HardState.Term != p.term {
			p.revokeLeaseLocked()
			p.term = rd.HardState.Term
		}
		p.commit = rd.HardState.Commit
	}
	p.applied, p.appliedTerm = rp.applied, rp.appliedTerm
	if s.cfg.FollowerLeases {
		p.publishFollowerLeaseLocked(rp)
	}
	p.finishAckedLocked(rp.acked)
	p.onReadStatesLocked(rd.ReadStates)
	p.notifyAppliedLocked()
	return nil
}

// publishMirror brings the raft log's in-memory mirror (storage.go) to
// what the round persisted: snapshot, entries, hard state, compaction.
func (s *Store) publishMirror(rp *readyPeer) error {
	p, rd := rp.p, &rp.rd
	ms := p.storage.MemoryStorage
	if rp.stagedSnap != 0 {
		s.snaps.dropStaged(rp.stagedSnap)
	}
	if rp.snapApplied {
		if err := p.storage.applySnapshot(rd.Snapshot); err != nil {
			return fmt.Errorf("region %d: mirror snapshot: %w", p.regionID, err)
		}
	}
	if err := ms.Append(rd.Entries); err != nil {
		return fmt.Errorf("region %d: mirror append: %w", p.regionID, err)
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		if err := ms.SetHardState(rd.HardState); err != nil {
			return err
		}
	}
	// The durable compaction, and the mirror's bound (storage.go).
	if err := p.storage.trim(rp.applied, rp.compactTo, rp.compactTerm); err != nil {
		return fmt.Errorf("region %d: mirror compact: %w", p.regionID, err)
	}
	return nil
}

// publishLeaderLocked takes in a change of leader or of this peer's role:
// a lease ends with the leadership it rested on, proposals and reads
// addressed to a leader that is gone fail so their callers retry.
func (s *Store) publishLeaderLocked(p *Peer, ss *raft.SoftState) {
	newLead := ss.Lead
	if leading := ss.RaftState == raft.StateLeader; leading != p.leading {
		p.leading = leading
		s.summaryChanged()
	}
	if newLead != p.lead || ss.RaftState != raft.StateLeader {
		p.revokeLeaseLocked()
	}
	giveUpAt := s.now().Add(time.Duration(s.cfg.ElectionTicks) * s.cfg.TickInterval)
	if ss.RaftState != raft.StateLeader {
		p.transferring = false
		p.confInFlight = false // it may still apply, but under another leader
		p.failQueuedLocked(p.notLeaderWithLocked(newLead))
		p.orphanProposalsLocked(giveUpAt, false)
	} else if newLead != p.lead {
		// Become leader: what it forwarded went to a leader that is gone.
		p.orphanProposalsLocked(giveUpAt, true)
	}
	if newLead != p.lead && p.lead != 0 {
		// Reads in flight went to the old leader and may never be
		// answered. (From "unknown" to a leader is no change: they were
		// addressed to raft's view of the leader, which this is.)
		p.failReadsLocked(p.notLeaderWithLocked(newLead))
	}
	if newLead != p.lead {
		s.log.Info("leader changed", "region", p.regionID, "leader", newLead, "term", p.rn.BasicStatus().Term)
	}
	p.lead = newLead
	p.restepHeldPropsLocked(s.now()) // a leader to take them, perhaps
}

// publishFollowerLeaseLocked records the round's pending writes before its
// acks go out (step 5): the leader counts them only once the keys their
// entries write are known here. A lease covers the region as granted: a
// split (both halves), a membership change or a snapshot ends it; the
// follower asks anew.
func (p *Peer) publishFollowerLeaseLocked(rp *readyPeer) {
	if rp.snapApplied {
		p.fl.pending.reset()
	}
	if !rp.pendingNoted {
		p.fl.pending.append(rp.rd.Entries, p.applied)
	}
	p.fl.pending.trim(p.applied)
	if rp.snapApplied || rp.regionChanged || len(rp.created) > 0 {
		p.revokeFollowerLeaseLocked()
	}
}

// finishAckedLocked answers the proposals the round applied. Only an
// entry committed in the term it was proposed in proves quorum contact at
// its proposal time, so only that renews the lease.
func (p *Peer) finishAckedLocked(acked []ackedProposal) {
	for _, a := range acked {
		pr, ok := p.proposals[a.id]
		if !ok {
			continue
		}
		delete(p.proposals, a.id)
		if a.term == pr.term {
			p.extendLeaseLocked(pr.term, pr.proposed)
		}
		pr.finishWith(a.result, a.err)
	}
}

// publishShape tells raft about applied conf changes, and the store about
// changed ranges and regions born from splits.
func (s *Store) publishShape(rp *readyPeer) error {
	p := rp.p
	p.mu.Lock()
	for _, cc := range rp.confChanges {
		p.rn.ApplyConfChange(cc)
	}
	if len(rp.confChanges) > 0 || rp.confSkipped {
		p.confInFlight = false
	}
	if rp.merged || rp.regionChanged && p.region.Merge != nil {
		// A merge changes which keys the leadership covers, and a frozen
		// region serves nothing: the lease ends (merge.go).
		p.revokeLeaseLocked()
	}
	if rp.snapApplied {
		p.initialized = true
		s.summaryChanged()
	}
	if rp.snapApplied || rp.regionChanged {
		// The round is durable (persistAndApply checkpointed it).
		p.durableFreeze = region.MergeState{}
		if p.region.Merge != nil {
			p.durableFreeze = *p.region.Merge
		}
	}
	r := p.region.Clone()
	leader, lead := p.isLeaderLocked(), p.lead
	var tombstones []*Notice
	if leader {
		// A removed peer never learns that the entry removing it committed:
		// the leader stops replicating to it at once. Tell it directly.
		for _, gone := range rp.removedPeers {
			tombstones = append(tombstones, tombstoneNotice(p.id, gone.ID, p.rn.BasicStatus().Term))
		}
	}
	p.mu.Unlock()
	for i, gone := range rp.removedPeers {
		if i < len(tombstones) {
			s.trans.Send(&Message{RegionID: r.ID, FromStore: s.cfg.StoreID, ToStore: gone.StoreID, Notice: tombstones[i]})
		}
	}
	// The ranges change and the split-born regions appear as one step to
	// a snapshot's admission (snapclaim.go): between a split parent's
	// shrink and its new region's creation, the new region's range
	// would be nobody's.
	s.shapeMu.Lock()
	err := s.publishRangesLocked(rp, p, r, leader)
	s.shapeMu.Unlock()
	if err != nil {
		return err
	}
	if !leader {
		for _, c := range rp.created {
			s.answerSplitCampaign(c, lead)
		}
	}
	return nil
}

// publishRangesLocked updates the range tree for rp's round and starts
// the peers of the regions its splits created. Called with s.shapeMu held.
func (s *Store) publishRangesLocked(rp *readyPeer, p *Peer, r region.Region, leader bool) error {
	if rp.snapApplied || rp.regionChanged {
		s.mu.Lock()
		if s.peers[r.ID] == p && !rp.removed {
			s.ranges.Insert(r)
		}
		if rp.snapApplied {
			s.endSnapClaimsLocked(r.ID)
		}
		s.mu.Unlock()
	}
	for _, src := range rp.mergedSources {
		s.forgetMergedSource(src, r)
	}
	if rp.snapApplied && !rp.removed {
		if err := s.dropMergedBy(r); err != nil {
			return err
		}
	}
	for _, c := range rp.created {
		if err := s.startSplitPeer(c.region, c.hard, leader); err != nil {
			return err
		}
	}
	return nil
}

// batchProposalsLocked steps the writes queued since the last round into
// raft as ONE MsgProp: raft appends them together and sends each follower
// one MsgApp carrying all of them (one per proposal before: 7-8 times the
// messages and acks under a 32-thread insert load). If this peer no longer
// leads, or raft drops the batch (a leadership transfer in flight, the
// uncommitted-size limit), every write in it fails as a single Propose
// would have; the client retries with the same request ID. On a follower
// the forwarded ones (WriteOptions.Forward) go to the leader as one
// MsgProp, which raft sends there, and the rest fail.
func (p *Peer) batchProposalsLocked() {
	if len(p.queued) == 0 {
		return
	}
	ents, ids := p.queued, p.queuedIDs
	p.queued, p.queuedIDs = nil, nil
	st := p.rn.BasicStatus()
	leader := st.RaftState == raft.StateLeader
	var refused error // for the proposals that cannot go anywhere
	if !leader {
		refused = p.notLeaderLocked()
		// Keep only the forwarded ones, and only with a leader to go to.
		kept, keptIDs := ents[:0], ids[:0]
		for i, id := range ids {
			pr, ok := p.proposals[id]
			switch {
			case ok && pr.forwarded && p.lead != 0:
				kept, keptIDs = append(kept, ents[i]), append(keptIDs, id)
			case ok:
				delete(p.proposals, id)
				pr.finish(refused)
			}
		}
		ents, ids = kept, keptIDs
		if len(ents) == 0 {
			return
		}
	}
	var err error
	if serr := p.rn.Step(raftpb.Message{Type: raftpb.MsgProp, From: p.id, Entries: ents}); serr != nil {
		err = fmt.Errorf("region %d: %w (%v)", p.regionID, ErrProposalDropped, serr)
	}
	for _, id := range ids {
		pr, ok := p.proposals[id]
		if !ok {
			continue
		}
		if err != nil {
			delete(p.proposals, id)
			pr.finish(err)
			continue
		}
		if leader {
			// The term the entry is proposed in: only an entry committed
			// in it renews the lease (publish). One queued as forwarded
			// by a peer that has since become leader is its own now.
			pr.term, pr.forwarded = st.Term, false
		}
	}
}
