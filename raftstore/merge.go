package raftstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/hedgekv/hedgekv/clock"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3/raftpb"
)

// Merging two adjacent regions: the left one (the target) absorbs its
// right neighbour (the source), as CockroachDB's subsume does. Both must
// have replicas on the same stores, so that every store's replica of the
// source becomes its replica of the target where it stands: no data moves,
// since every region of a store keeps its pairs in one engine.
//
//  1. Freeze. The source's log gets a prepare entry (opPrepareMerge) naming
//     the target. A replica applying it bumps both epoch fields (a route
//     cached before fails with EpochNotMatch) and from then on serves
//     nothing and applies no write, split, Applier command or conf change
//     (route.go, apply.go): its state stays the freeze's on every replica.
//  2. Check. The coordinator asks every replica of the source whether it
//     has applied the freeze (NoticeMergeCheck; a replica that has answers
//     NoticeMergeApplied), until all have.
//  3. Commit. The target's log gets a commit entry (opCommitMerge) naming
//     the source's frozen metadata and the target's epoch. A replica
//     applying it takes the source's range (epoch version above both), and
//     forgets its local source replica in the same transaction: its state
//     and log go and a tombstone stays, but its pairs stay, now the
//     target's.
//
// A merge that cannot finish is abandoned through the target's log too:
// an abort entry (opAbortMerge) makes every replica of the target refuse
// that freeze's commit for good (region.Region.AbortedMerge), or answers
// that it already merged. Commit and abort are ordered by the one log, so
// exactly one of them takes effect; only after the abort does the source
// get its rollback entry (opRollbackMerge) and unfreeze. A coordinator
// that stops halfway leaves the source frozen; the merge check of the
// store leading it (mergeCheck) then runs the merge again, which commits
// or aborts it.

// MergeRefusedError: the two regions cannot merge as they are (not
// adjacent, no right neighbour, not on the same stores, one frozen for
// another merge). It is an ErrInvalidRequest (errors.Is).
type MergeRefusedError struct {
	Left, Right uint64 // Right is 0 if unknown
	Reason      string
}

func (e *MergeRefusedError) Error() string {
	if e.Right == 0 {
		return fmt.Sprintf("merge of region %d refused: %s: %v", e.Left, e.Reason, ErrInvalidRequest)
	}
	return fmt.Sprintf("merge of region %d with region %d refused: %s: %v", e.Left, e.Right, e.Reason, ErrInvalidRequest)
}

func (e *MergeRefusedError) Unwrap() error { return ErrInvalidRequest }

// ErrMergeRolledBack: the merge was abandoned and the right region
// unfrozen, serving again as before; trying again may succeed (what
// stopped it, wrapped beside, may have been a race with a split or a
// slow replica).
var ErrMergeRolledBack = errors.New("merge rolled back")

// errRefusedAtApply marks a merge entry that was applied and refused: it
// will never take effect, on any replica.
var errRefusedAtApply = errors.New("refused where it applied")

// errAlreadyMerged answers an abort whose merge committed first.
var errAlreadyMerged = errors.New("the merge committed")

// A prepare's value: target(8) | the source epoch the coordinator saw:
// confVer(8) | version(8).
func encodePrepareMerge(target uint64, ep region.Epoch) []byte {
	b := binary.BigEndian.AppendUint64(nil, target)
	b = binary.BigEndian.AppendUint64(b, ep.ConfVer)
	return binary.BigEndian.AppendUint64(b, ep.Version)
}

// A commit's or abort's value: freeze index(8) | the target epoch the
// coordinator saw: confVer(8) | version(8) | the source's frozen metadata.
func encodeCommitMerge(freeze uint64, ep region.Epoch, source region.Region) ([]byte, error) {
	meta, err := encodeRegion(source)
	if err != nil {
		return nil, err
	}
	b := binary.BigEndian.AppendUint64(nil, freeze)
	b = binary.BigEndian.AppendUint64(b, ep.ConfVer)
	b = binary.BigEndian.AppendUint64(b, ep.Version)
	return append(b, meta...), nil
}

func decodeCommitMerge(b []byte) (freeze uint64, ep region.Epoch, source region.Region, err error) {
	if len(b) < 24 {
		return 0, ep, source, fmt.Errorf("merge command: %w", errCorrupt)
	}
	freeze = binary.BigEndian.Uint64(b)
	ep = region.Epoch{ConfVer: binary.BigEndian.Uint64(b[8:]), Version: binary.BigEndian.Uint64(b[16:])}
	source, err = decodeRegion(b[24:])
	return freeze, ep, source, err
}

// A rollback's value: target(8) | freeze index(8).
func encodeRollbackMerge(target, freeze uint64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, target), freeze)
}

// applyPrepareMergeTx freezes the source.
func (s *Store) applyPrepareMergeTx(tx *engine.Tx, rp *readyPeer, e *raftpb.Entry, cmd command) error {
	p := rp.p
	if len(cmd.value) != 24 {
		return fmt.Errorf("prepare merge command: %w", errCorrupt)
	}
	target := binary.BigEndian.Uint64(cmd.value)
	ep := region.Epoch{ConfVer: binary.BigEndian.Uint64(cmd.value[8:]), Version: binary.BigEndian.Uint64(cmd.value[16:])}
	if ep != p.region.Epoch || p.region.Merge != nil {
		rp.ack(cmd.id, e.Term, fmt.Errorf("freeze of region %d: %w: %w", p.regionID, errRefusedAtApply,
			&region.EpochNotMatchError{RegionID: p.regionID, Current: []region.Region{p.region.Clone()}}))
		return nil
	}
	r := p.region.Clone()
	r.Merge = &region.MergeState{Target: target, Index: e.Index}
	r.Epoch.ConfVer++
	r.Epoch.Version++
	if err := putRegion(tx, r); err != nil {
		return err
	}
	p.setRegion(r)
	rp.regionChanged = true
	rp.ack(cmd.id, e.Term, nil)
	return nil
}

// applyRollbackMergeTx unfreezes the source; the coordinator proposes it
// only once the target's log aborted the freeze.
func (s *Store) applyRollbackMergeTx(tx *engine.Tx, rp *readyPeer, e *raftpb.Entry, cmd command) error {
	p := rp.p
	if len(cmd.value) != 16 {
		return fmt.Errorf("rollback merge command: %w", errCorrupt)
	}
	want := region.MergeState{Target: binary.BigEndian.Uint64(cmd.value), Index: binary.BigEndian.Uint64(cmd.value[8:])}
	if p.region.Merge == nil || *p.region.Merge != want {
		rp.ack(cmd.id, e.Term, fmt.Errorf("rollback of region %d's freeze at %d: not frozen so: %w", p.regionID, want.Index, errRefusedAtApply))
		return nil
	}
	r := p.region.Clone()
	r.Merge = nil
	r.Epoch.Version++ // routes cached while it was frozen are stale
	if err := putRegion(tx, r); err != nil {
		return err
	}
	p.setRegion(r)
	rp.regionChanged = true
	rp.ack(cmd.id, e.Term, nil)
	return nil
}

// applyAbortMergeTx settles, in the target's log, that the source's
// freeze will not commit (or that it did).
func (s *Store) applyAbortMergeTx(tx *engine.Tx, rp *readyPeer, e *raftpb.Entry, cmd command) error {
	p := rp.p
	freeze, _, src, err := decodeCommitMerge(cmd.value)
	if err != nil {
		return err
	}
	if len(src.StartKey) > 0 && p.region.Contains(src.StartKey) {
		rp.ack(cmd.id, e.Term, errAlreadyMerged)
		return nil
	}
	if a := p.region.AbortedMerge; a != nil && a.Target == src.ID && a.Index >= freeze {
		rp.ack(cmd.id, e.Term, nil) // aborted already (a retry, or a later freeze)
		return nil
	}
	r := p.region.Clone()
	r.AbortedMerge = &region.MergeState{Target: src.ID, Index: freeze}
	if err := putRegion(tx, r); err != nil {
		return err
	}
	p.setRegion(r)
	rp.ack(cmd.id, e.Term, nil)
	return nil
}

// applyCommitMergeTx makes the target absorb the source. Whether it does
// depends only on the target's state and the entry, so every replica of
// the target decides alike; that the local source replica applied the
// freeze is the coordinator's check (waitFrozen), asserted here.
func (s *Store) applyCommitMergeTx(tx *engine.Tx, rp *readyPeer, e *raftpb.Entry, cmd command) error {
	p := rp.p
	freeze, ep, src, err := decodeCommitMerge(cmd.value)
	if err != nil {
		return err
	}
	refuse := func(why string) error {
		rp.ack(cmd.id, e.Term, fmt.Errorf("commit merge of region %d into %d: %s: %w", src.ID, p.regionID, why, errRefusedAtApply))
		return nil
	}
	switch {
	case ep != p.region.Epoch:
		return refuse("the target's epoch moved")
	case p.region.Merge != nil:
		return refuse("the target is frozen for a merge of its own")
	case src.Merge == nil || src.Merge.Target != p.regionID || src.Merge.Index != freeze:
		return refuse("the source is not frozen for this merge")
	case p.region.AbortedMerge != nil && p.region.AbortedMerge.Target == src.ID && freeze <= p.region.AbortedMerge.Index:
		// A source's freezes have rising indexes, and the abort of a later
		// one means every earlier one was aborted or rolled back too.
		return refuse("the merge was aborted")
	}
	merged, err := region.Merge(p.region, src)
	if err != nil {
		return refuse(err.Error())
	}
	sp, ok := s.peer(src.ID)
	if ok {
		sp.mu.Lock()
		frozen := sp.initialized && !sp.removed && sp.region.Merge != nil && *sp.region.Merge == *src.Merge
		if frozen {
			// Nothing of the source is written after this: it is gone.
			sp.removed = true
		}
		sp.mu.Unlock()
		if !frozen {
			ok = false
		}
	}
	if !ok {
		// The coordinator saw every replica of the source apply the
		// freeze before it proposed this; the range's data here may not
		// be the source's as of its freeze.
		s.stats.mergeViolations.Add(1)
		s.log.Error("merge committed where the source's freeze was not applied", "target", p.regionID, "source", src.ID, "freeze", freeze)
	}
	// The source's dedup records (keyed by user key, so already the
	// target's) carry the source's clock; one at or past the target's
	// clock would never count as seen (engine.Tx.DedupSeen), and a retry
	// of its write would apply again. So the target's clock moves on to
	// just past the source's at the freeze. Every replica has the same
	// two clocks here, so they move alike.
	if srcClock := tx.DedupClock(src.ID, freeze); srcClock >= tx.DedupClock(p.regionID, e.Index) {
		if err := tx.SplitDedup(src.ID, p.regionID, freeze, e.Index-1); err != nil {
			return err
		}
	}
	if err := tx.DeleteRegion(src.ID); err != nil {
		return err
	}
	if self, mine := src.PeerOnStore(s.cfg.StoreID); mine {
		put := tx.PutTombstone
		if ok {
			// Absorbed after its durable freeze: settleMerge relies on it.
			put = func(regionID, peerID uint64) error { return tx.PutMergedTombstone(regionID, peerID, p.regionID) }
		}
		if err := put(src.ID, self.ID); err != nil {
			return err
		}
	}
	if err := putRegion(tx, merged); err != nil {
		return err
	}
	p.setRegion(merged)
	rp.regionChanged, rp.merged = true, true
	if ok {
		rp.mergedSources = append(rp.mergedSources, sp)
	}
	rp.ack(cmd.id, e.Term, nil)
	return nil
}

// forgetMergedSource drops the source replica a committed merge absorbed
// into merged: its waiters fail with an EpochNotMatch naming merged, so
// clients route there.
func (s *Store) forgetMergedSource(sp *Peer, merged region.Region) {
	sp.mu.Lock()
	gone := &region.EpochNotMatchError{RegionID: sp.regionID, Current: []region.Region{merged.Clone()}}
	sp.failProposalsLocked(gone)
	sp.failReadsLocked(gone)
	for _, w := range sp.applyWait {
		close(w.done)
	}
	sp.applyWait = nil
	sp.mu.Unlock()
	s.mu.Lock()
	if s.peers[sp.regionID] == sp {
		delete(s.peers, sp.regionID)
	}
	s.mu.Unlock()
	s.log.Info("merged region", "source", sp.regionID, "into", merged.String())
}

// Merge merges region leftID with its right neighbour: the left one
// absorbs it and keeps its ID. It runs on any store with replicas of both
// (they must have replicas on the same stores, else *MergeRefusedError),
// leader of either or not. It returns the merged region. A merge whose
// source froze but that cannot finish is rolled back; one whose commit is
// in doubt (the wait for it ended) leaves the source frozen, and a later
// Merge or the merge check finishes or aborts it.
func (s *Store) Merge(ctx context.Context, leftID uint64) (region.Region, error) {
	if err := s.diskError(); err != nil {
		return region.Region{}, err
	}
	tp, ok := s.peer(leftID)
	if !ok || !tp.isInitialized() {
		return region.Region{}, &region.RegionNotFoundError{RegionID: leftID}
	}
	left := tp.regionClone()
	if left.Merge != nil {
		return region.Region{}, &MergeRefusedError{Left: leftID, Reason: fmt.Sprintf("it is frozen for a merge into region %d", left.Merge.Target)}
	}
	if len(left.EndKey) == 0 {
		return region.Region{}, &MergeRefusedError{Left: leftID, Reason: "it is the last region: it has no right neighbour"}
	}
	sp, ok := s.peerAt(left.EndKey)
	if !ok {
		return region.Region{}, &MergeRefusedError{Left: leftID, Reason: fmt.Sprintf("this store has no replica of its right neighbour (from %s); the two must have replicas on the same stores", region.FormatKey(left.EndKey))}
	}
	right := sp.regionClone()
	if !bytes.Equal(right.StartKey, left.EndKey) {
		return region.Region{}, &region.EpochNotMatchError{RegionID: leftID, Current: []region.Region{left, right}}
	}
	if !region.SameStores(left, right) {
		return region.Region{}, &MergeRefusedError{Left: leftID, Right: right.ID,
			Reason: fmt.Sprintf("their replicas are not on the same stores (%s; %s): move replicas first", storesOf(left), storesOf(right))}
	}
	if right.Merge != nil && right.Merge.Target != leftID {
		return region.Region{}, &MergeRefusedError{Left: leftID, Right: right.ID, Reason: fmt.Sprintf("region %d is frozen for a merge into region %d", right.ID, right.Merge.Target)}
	}
	if right.Merge == nil && len(right.EndKey) > 0 {
		// Absorbed first, right would leave its own frozen neighbour a
		// target that no longer exists.
		if np, ok := s.peerAt(right.EndKey); ok {
			if n := np.regionClone(); n.Merge != nil && n.Merge.Target == right.ID {
				return region.Region{}, &MergeRefusedError{Left: leftID, Right: right.ID,
					Reason: fmt.Sprintf("region %d is frozen for a merge into region %d; that merge must settle first", n.ID, right.ID)}
			}
		}
	}
	if right.Merge == nil {
		cmd := command{op: opPrepareMerge, key: right.StartKey, value: encodePrepareMerge(leftID, right.Epoch)}
		if err := s.proposeMerge(ctx, sp, cmd); err != nil {
			if cur := sp.regionClone(); cur.Merge != nil && cur.Merge.Target == leftID {
				return s.abandonMerge(tp, sp, cur, fmt.Errorf("freeze region %d: %w", right.ID, err))
			}
			return region.Region{}, fmt.Errorf("freeze region %d for a merge into %d: %w", right.ID, leftID, err)
		}
		right = sp.regionClone()
		if right.Merge == nil || right.Merge.Target != leftID {
			return region.Region{}, fmt.Errorf("freeze region %d for a merge into %d: %w", right.ID, leftID, &region.EpochNotMatchError{RegionID: right.ID, Current: []region.Region{right}})
		}
	}
	if err := s.waitFrozen(ctx, sp, right); err != nil {
		return s.abandonMerge(tp, sp, right, err)
	}
	left = tp.regionClone()
	if left.Merge != nil || !bytes.Equal(left.EndKey, right.StartKey) || !region.SameStores(left, right) {
		return s.abandonMerge(tp, sp, right, &MergeRefusedError{Left: leftID, Right: right.ID, Reason: "region " + fmt.Sprint(leftID) + " changed while its neighbour froze"})
	}
	value, err := encodeCommitMerge(right.Merge.Index, left.Epoch, right)
	if err != nil {
		return region.Region{}, err
	}
	err = s.proposeMerge(ctx, tp, command{op: opCommitMerge, key: left.StartKey, value: value})
	switch {
	case err == nil:
		return tp.regionClone(), nil
	case errors.Is(err, errRefusedAtApply):
		return s.abandonMerge(tp, sp, right, err)
	}
	return region.Region{}, fmt.Errorf("merge of region %d into %d is in doubt (region %d stays frozen until a merge retried or the merge check settles it): %w", right.ID, leftID, right.ID, err)
}

// settleMerge finishes the merge source is frozen for: Merge run again if
// the target is still its left neighbour here, else the abort and the
// rollback (a commit the target refuses for good: not adjacent). A
// target a merge absorbed here is gone for good: the rollback alone (see
// rollbackForAbsorbedTarget). A target with no replica here otherwise is
// left to a store that has one.
func (s *Store) settleMerge(ctx context.Context, source region.Region) (region.Region, error) {
	tp, ok := s.peer(source.Merge.Target)
	sp, found := s.peer(source.ID)
	if !found {
		return region.Region{}, &region.RegionNotFoundError{RegionID: source.ID}
	}
	if !ok {
		if into, absorbed := s.mergedInto(source.Merge.Target); absorbed {
			return s.rollbackForAbsorbedTarget(ctx, sp, source, into)
		}
	}
	if !ok || !tp.isInitialized() {
		return region.Region{}, fmt.Errorf("settle the merge of region %d: %w", source.ID, &region.RegionNotFoundError{RegionID: source.Merge.Target})
	}
	if t := tp.regionClone(); bytes.Equal(t.EndKey, source.StartKey) {
		return s.Merge(ctx, t.ID)
	}
	return s.abandonMerge(tp, sp, source, fmt.Errorf("region %d is no longer the left neighbour of region %d", source.Merge.Target, source.ID))
}

// mergedInto returns the region a merge absorbed regionID into here, if
// one did.
func (s *Store) mergedInto(regionID uint64) (into uint64, ok bool) {
	_ = s.eng.View(func(tx *engine.Tx) error {
		into, ok = tx.MergedInto(regionID)
		return nil
	})
	return into, ok
}

// rollbackForAbsorbedTarget unfreezes source, frozen for a target that a
// merge into region into absorbed here. Its commit can never apply: this
// store's replica of the target applied every entry of the target's log up
// to the target's own freeze (it was absorbed frozen: lemma 2), so a commit
// of source placed before that freeze applied here and source would be
// gone here; any later one is refused by a frozen target, which never
// thaws once absorbed (lemma 1). So no abort in the target's log is needed
// (there is no log left to abort in): the rollback alone is safe. Three
// adjacent regions merged at once from two stores leave this: the middle
// one absorbed while its right neighbour froze for it.
func (s *Store) rollbackForAbsorbedTarget(ctx context.Context, sp *Peer, source region.Region, into uint64) (region.Region, error) {
	err := s.proposeMerge(ctx, sp, command{op: opRollbackMerge, key: source.StartKey, value: encodeRollbackMerge(source.Merge.Target, source.Merge.Index)})
	if err != nil && !errors.Is(err, errRefusedAtApply) {
		return region.Region{}, fmt.Errorf("roll back region %d, frozen for region %d which region %d absorbed: %w", source.ID, source.Merge.Target, into, err)
	}
	s.log.Info("merge rolled back: its target was absorbed by another merge", "source", source.ID, "target", source.Merge.Target, "absorbed_into", into)
	return region.Region{}, fmt.Errorf("merge of region %d into %d: %w: region %d absorbed the target", source.ID, source.Merge.Target, ErrMergeRolledBack, into)
}

// abandonMerge aborts the freeze of right in the target's log, then rolls
// the source back. If the merge committed first, it returns the merged
// region. Its own deadline: the caller's may be what ended.
func (s *Store) abandonMerge(tp, sp *Peer, right region.Region, cause error) (region.Region, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.forwardWait())
	defer cancel()
	value, err := encodeCommitMerge(right.Merge.Index, region.Epoch{}, right)
	if err != nil {
		return region.Region{}, err
	}
	err = s.proposeMerge(ctx, tp, command{op: opAbortMerge, key: tp.regionClone().StartKey, value: value})
	if errors.Is(err, errAlreadyMerged) {
		return tp.regionClone(), nil
	}
	if err != nil {
		return region.Region{}, fmt.Errorf("%w; and its abort failed (region %d stays frozen until the merge check settles it): %v", cause, right.ID, err)
	}
	err = s.proposeMerge(ctx, sp, command{op: opRollbackMerge, key: right.StartKey, value: encodeRollbackMerge(right.Merge.Target, right.Merge.Index)})
	if err != nil && !errors.Is(err, errRefusedAtApply) {
		return region.Region{}, fmt.Errorf("%w; aborted, but its rollback failed (the merge check retries it): %v", cause, err)
	}
	s.log.Info("merge rolled back", "source", right.ID, "target", right.Merge.Target, "cause", cause)
	return region.Region{}, fmt.Errorf("merge of region %d into %d: %w: %w", right.ID, right.Merge.Target, ErrMergeRolledBack, cause)
}

// proposeMerge proposes a merge entry through p, leader or follower, and
// waits until p applied it: a follower forwards it, bounded as Propose's.
func (s *Store) proposeMerge(ctx context.Context, p *Peer, cmd command) error {
	p.mu.Lock()
	gone := p.removed || !p.initialized
	p.mu.Unlock()
	if gone {
		return &region.RegionNotFoundError{RegionID: p.regionID}
	}
	done := make(chan error, 1)
	var fwd bool
	_, id, err := s.queueOn(p, WriteOptions{Forward: true}, cmd, func(pr *proposal) {
		pr.waiters = append(pr.waiters, done)
		fwd = pr.forwarded
	})
	if err != nil {
		return err
	}
	var bound <-chan time.Time
	if fwd {
		t := time.NewTimer(s.forwardWait())
		defer t.Stop()
		bound = t.C
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("region %d: wait for apply: %w", p.regionID, ctx.Err())
	case <-bound:
		s.dropProposal(p, id)
		return fmt.Errorf("region %d: %w: a forwarded proposal was not applied here within %v", p.regionID, ErrMaybeApplied, s.forwardWait())
	case <-s.stopc:
		return ErrStopped
	}
}

// waitFrozen returns once every replica of the source has applied its
// freeze durably (the local one included), asking each one that has not
// said so every tick.
func (s *Store) waitFrozen(ctx context.Context, sp *Peer, right region.Region) error {
	want := *right.Merge
	for {
		sp.mu.Lock()
		if sp.removed || sp.region.Merge == nil || *sp.region.Merge != want {
			sp.mu.Unlock()
			return fmt.Errorf("region %d is no longer frozen for the merge", right.ID)
		}
		selfDurable := sp.durableFreeze == want
		var ask []Notice
		for _, pr := range sp.region.Peers {
			if pr.ID != sp.id && sp.mergeAcks[pr.ID] != want.Index {
				ask = append(ask, Notice{Kind: NoticeMergeCheck, From: sp.id, To: pr.ID, Term: sp.term, Commit: want.Index})
			}
		}
		sp.mu.Unlock()
		if len(ask) == 0 && selfDurable {
			return nil
		}
		for _, n := range ask {
			s.sendNotice(sp, n)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for every replica of region %d to apply its freeze (%d not yet): %w", right.ID, len(ask), ctx.Err())
		case <-s.stopc:
			return ErrStopped
		case <-time.After(s.cfg.TickInterval):
		}
	}
}

// onMergeCheckLocked answers a merge check: with the freeze index asked
// about, if this replica has applied that freeze and it is durable.
func (p *Peer) onMergeCheckLocked(n *Notice) (Notice, bool) {
	if p.region.Merge == nil || p.region.Merge.Index != n.Commit || p.durableFreeze != *p.region.Merge {
		return Notice{}, false
	}
	return Notice{Kind: NoticeMergeApplied, From: p.id, To: n.From, Term: p.term, Commit: n.Commit}, true
}

// onMergeAppliedLocked records that peer n.From applied the freeze.
func (p *Peer) onMergeAppliedLocked(n *Notice) {
	if p.mergeAcks == nil || len(p.mergeAcks) >= maxSenders {
		p.mergeAcks = make(map[uint64]uint64)
	}
	p.mergeAcks[n.From] = n.Commit
}

func (p *Peer) regionClone() region.Region {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.region.Clone()
}

// peerAt returns the initialized peer whose region holds key here.
func (s *Store) peerAt(key []byte) (*Peer, bool) {
	s.mu.RLock()
	r, ok := s.ranges.Lookup(key)
	s.mu.RUnlock()
	if !ok {
		return nil, false
	}
	p, ok := s.peer(r.ID)
	if !ok || !p.isInitialized() {
		return nil, false
	}
	return p, true
}

func storesOf(r region.Region) string {
	ids := make([]uint64, 0, len(r.Peers))
	for _, p := range r.Peers {
		ids = append(ids, p.StoreID)
	}
	return fmt.Sprintf("region %d on stores %v", r.ID, ids)
}

// dropMergedBy forgets the replicas here of regions frozen for a merge
// into r, whose snapshot (just applied) holds their keys: the replica of
// r lagged past the commit, and got the merged region whole. Their pairs
// are r's now, so their range is not cleared.
func (s *Store) dropMergedBy(r region.Region) error {
	for _, sp := range s.allPeers() {
		sp.mu.Lock()
		absorbed := sp.initialized && !sp.removed && sp.regionID != r.ID && sp.region.Merge != nil &&
			sp.region.Merge.Target == r.ID && r.Contains(sp.region.StartKey)
		if absorbed {
			sp.removed = true
		}
		src := sp.region.Clone()
		sp.mu.Unlock()
		if !absorbed {
			continue
		}
		err := s.eng.Update(func(tx *engine.Tx) error {
			if err := tx.DeleteRegion(src.ID); err != nil {
				return err
			}
			return tx.PutMergedTombstone(src.ID, sp.id, r.ID)
		})
		if err != nil {
			return fmt.Errorf("forget region %d merged into %d: %w", src.ID, r.ID, err)
		}
		s.forgetMergedSource(sp, r)
		s.mu.Lock()
		s.ranges.Remove(src.ID)
		s.ranges.Insert(r) // at a load, the source may have displaced r
		s.mu.Unlock()
	}
	return nil
}

// mergeSettleAfter is how long a region stays frozen before the merge
// check of the store leading it settles the merge: longer than any
// coordinator waits for one entry (forwardWait), twice.
func (s *Store) mergeSettleAfter() time.Duration {
	if d := s.cfg.Knobs.MergeSettleAfter; d > 0 {
		return d
	}
	return 2 * s.forwardWait()
}

// mergeCheck runs in the background (Config.MergeCheckInterval). For each
// region this store leads it settles a merge left frozen since
// mergeSettleAfter (its coordinator stopped or gave up halfway): Merge
// run again commits it or aborts and rolls it back. With automatic
// merges on, it then merges at most one small region per round with its
// right neighbour (TiKV's merge-check-tick and max-merge-region-size).
func (s *Store) mergeCheck(t clock.Ticker) {
	defer t.Stop()
	type seen struct {
		version uint64
		since   time.Time
	}
	frozen := map[uint64]seen{} // frozen regions led here, since when
	shape := map[uint64]seen{}  // every region here: its version, since when
	for {
		select {
		case <-s.stopc:
			return
		case <-t.C():
		}
		now := s.now()
		auto := s.cfg.MergeMaxKeys != 0 || s.cfg.MergeMaxBytes != 0
		// led: the regions led here that this pass may act on (frozen
		// ones, and every one when merges are automatic). A pass reads
		// each peer's fields, not its status: at 10,000 regions, building
		// every status each interval was a fifth of an idle store's CPU.
		led := map[uint64]region.Region{}
		here := map[uint64]bool{}
		for _, p := range s.allPeers() {
			p.mu.Lock()
			if !p.initialized || p.removed {
				p.mu.Unlock()
				continue
			}
			id, version := p.regionID, p.region.Epoch.Version
			if p.leading && (auto || p.region.Merge != nil) {
				led[id] = p.region.Clone()
			}
			p.mu.Unlock()
			here[id] = true
			if sh, ok := shape[id]; !ok || sh.version != version {
				shape[id] = seen{version, now}
			}
		}
		for id := range frozen {
			if _, ok := led[id]; !ok {
				delete(frozen, id)
			}
		}
		for id, r := range led {
			if r.Merge == nil {
				delete(frozen, id)
				continue
			}
			f, ok := frozen[id]
			if !ok || f.version != r.Merge.Index {
				frozen[id] = seen{r.Merge.Index, now}
				continue
			}
			if now.Sub(f.since) < s.mergeSettleAfter() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*s.forwardWait())
			m, err := s.settleMerge(ctx, r)
			cancel()
			s.log.Info("settled a merge left frozen", "source", id, "target", r.Merge.Target, "merged", m.ID != 0, "err", err)
			delete(frozen, id)
		}
		for id := range shape {
			if !here[id] {
				delete(shape, id)
			}
		}
		if !auto {
			continue
		}
		for id, left := range led {
			if left.Merge != nil || len(left.EndKey) == 0 || now.Sub(shape[id].since) < s.cfg.MergeAfterSplit {
				continue
			}
			if s.tryAutoMerge(left, func(rid uint64, version uint64) bool {
				sh, ok := shape[rid]
				return ok && sh.version == version && now.Sub(sh.since) >= s.cfg.MergeAfterSplit
			}) {
				break // one merge a round: the rest are counted again next time
			}
		}
	}
}

// tryAutoMerge merges left with its right neighbour if the two are small
// enough together and the neighbour has kept its shape (settled: as this
// store's replica of it has shown for MergeAfterSplit). It reports
// whether it merged.
func (s *Store) tryAutoMerge(left region.Region, settled func(id, version uint64) bool) bool {
	for _, kr := range s.cfg.KeepWhole {
		if bytes.Equal(kr.Start, left.EndKey) || bytes.Equal(kr.End, left.EndKey) {
			return false // a kept range was made a region of its own on purpose
		}
	}
	sp, ok := s.peerAt(left.EndKey)
	if !ok {
		return false
	}
	right := sp.regionClone()
	if right.Merge != nil || !region.SameStores(left, right) || !settled(right.ID, right.Epoch.Version) {
		return false
	}
	var keys, bytes uint64
	for _, r := range []region.Region{left, right} {
		size, _, _ := splitKey(s.eng, r, 0, 0, nil, s.stopc)
		if !size.counted {
			return false
		}
		keys, bytes = keys+size.keys, bytes+size.bytes
	}
	if (s.cfg.MergeMaxKeys > 0 && keys > s.cfg.MergeMaxKeys) || (s.cfg.MergeMaxBytes > 0 && bytes > s.cfg.MergeMaxBytes) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.forwardWait())
	defer cancel()
	m, err := s.Merge(ctx, left.ID)
	if err != nil {
		s.log.Warn("automatic merge failed", "left", left.ID, "right", right.ID, "err", err)
		return false
	}
	s.log.Info("merged small regions", "merged", m.String(), "absorbed", right.ID, "keys", keys, "bytes", bytes)
	return true
}
