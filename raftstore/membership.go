package raftstore

import (
	"context"
	"fmt"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Peers come and go three ways: a split creates one (apply.go), a message
// from a region this store does not know creates an uninitialized one that
// waits for a snapshot (an added replica, or a split this store has not
// applied yet), and a conf change removes one.

// A tombstone (engine.Tx.PutTombstone) is kept for every peer removed
// here. Messages to such a peer are stale and must not resurrect it; a new
// replica of the region gets a new peer ID (IDs are cluster-unique, not
// ordered: allocPeerID puts the allocating store in the low bits).

// A tombstone (NoticeTombstone) is how a leader tells a peer it removed to
// destroy itself; the receiving store handles it before any other check
// (HandleRaftMessage), and never creates a peer for one.
func tombstoneNotice(from, to, term uint64) *Notice {
	return &Notice{Kind: NoticeTombstone, From: from, To: to, Term: term}
}

// handleTombstone destroys the addressed peer if it is the one removed and
// the sender's term is not older than what the peer has seen.
func (s *Store) handleTombstone(p *Peer, m *Notice) error {
	p.mu.Lock()
	stale := m.To != p.id || m.Term < p.rn.BasicStatus().Term
	p.mu.Unlock()
	if stale {
		return nil
	}
	return s.destroyPeer(p)
}

// tombstoneForStale returns the tombstone to answer m with when its sender
// is a removed peer of this region that never heard of its removal (its
// store was down when the leader's tombstone went out): m comes from a peer
// this replica does not list, under an epoch with fewer conf changes
// applied than this replica's. Conf changes apply in log order, so this
// replica has applied the one that added the sender (the sender's own
// epoch includes it), and the sender is absent only because a later one
// removed it; a peer added since is never behind this replica's conf
// version. nil: m is not from such a peer. Called under p.mu, on every
// inbound message: the common case costs two comparisons.
func (p *Peer) tombstoneForStaleLocked(m *Message, self uint64) *Message {
	from := m.FromPeer()
	if m.FromConfVer == 0 || from == 0 || !p.initialized || p.removed || m.FromConfVer >= p.region.Epoch.ConfVer {
		return nil
	}
	if _, member := p.region.PeerByID(from); member {
		return nil
	}
	t := tombstoneNotice(p.id, from, p.rn.BasicStatus().Term)
	return &Message{RegionID: p.regionID, FromStore: self, ToStore: m.FromStore, Notice: t, FromConfVer: p.region.Epoch.ConfVer}
}

// A removed peer that never learned of its removal can also be one that
// has the entry removing it in its log but never heard that it committed:
// the leader stops replicating to it at once, and the leader's one
// tombstone (publishShape) is lost if the network drops it or if the
// removal applied on a leader that changed meanwhile. Such a peer cannot
// campaign (raft refuses while a conf change is unapplied), so it sends
// nothing that tombstoneForStaleLocked could answer, and it lingers: its
// store keeps reporting the region, and a store removal never completes.
// So a follower that has heard no leader for staleCheckTicks asks its
// region's other peers, once per election timeout, with a notice that
// carries its conf version: a member that no longer lists it answers with
// a tombstone; any other member ignores it. That notice is a
// NoticeStaleCheck.

// staleCheckAfter is how long a follower goes without hearing a leader
// before it asks: two election timeouts.
func (s *Store) staleCheckAfter() time.Duration {
	return 2 * time.Duration(s.cfg.ElectionTicks) * s.cfg.TickInterval
}

// staleChecksLocked returns the notices a follower sends to ask whether
// it is still a member, if it is time to.
func (p *Peer) staleChecksLocked(now time.Time) []Notice {
	if !p.initialized || p.removed || p.hibernating {
		return nil
	}
	st := p.rn.BasicStatus()
	if st.RaftState == raft.StateLeader {
		p.leaderSeen = now
		return nil
	}
	after := p.store.staleCheckAfter()
	if p.leaderSeen.IsZero() {
		p.leaderSeen = now
	}
	if now.Sub(p.leaderSeen) < after || now.Sub(p.staleChecked) < after/2 {
		return nil
	}
	p.staleChecked = now
	return p.staleCheckNoticesLocked(st.Term)
}

// removalChecksLocked returns the stale checks a follower on a store being
// removed sends at once, whatever it heard last and asleep or not (the
// liveness loop asks every second): every replica of such a store goes,
// and one whose removal was lost must not first wait out two election
// timeouts, nor sleep through it (hibernating). A member that still lists
// it ignores the check. At most one round of checks a second.
func (p *Peer) removalChecksLocked(now time.Time) []Notice {
	if !p.initialized || p.removed || p.applyingSnapshotLocked() || now.Sub(p.staleChecked) < time.Second {
		return nil
	}
	st := p.rn.BasicStatus()
	if st.RaftState == raft.StateLeader {
		return nil
	}
	p.staleChecked = now
	return p.staleCheckNoticesLocked(st.Term)
}

// staleCheckNoticesLocked asks each other peer of the region whether this
// one is still a member.
func (p *Peer) staleCheckNoticesLocked(term uint64) []Notice {
	var out []Notice
	for _, pr := range p.region.Peers {
		if pr.ID != p.id {
			out = append(out, Notice{Kind: NoticeStaleCheck, From: p.id, To: pr.ID, Term: term})
		}
	}
	return out
}

// noteLeaderLocked records that m shows a live leader to this peer.
func (p *Peer) noteLeaderLocked(m *Message, now time.Time) {
	if m.Notice != nil {
		if m.Notice.Kind.fromLeader() {
			p.leaderSeen = now
		}
		return
	}
	switch m.Msg.Type {
	case raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgSnap:
		p.leaderSeen = now
	}
}

// maybeCreatePeer creates an uninitialized peer for a message from a
// region's leader (appends, heartbeats, snapshots). Other messages (votes
// from a region we don't know) are refused: they don't need us.
func (s *Store) maybeCreatePeer(m *Message) (*Peer, error) {
	if !m.createsPeer() {
		return nil, &region.RegionNotFoundError{RegionID: m.RegionID}
	}
	var hs raftpb.HardState
	// Read through the open batch, not committed state alone: a vote this
	// region's peer cast here binds the placeholder, after a restart and
	// as much when it is created again under the same peer ID (superseded
	// by a placeholder for another peer ID meanwhile: routeMessage) within
	// the batch's interval, while that vote is only in the batch. Seeded
	// from committed state, it forgot the vote and granted another one in
	// the same term (TestRecreatedPlaceholderKeepsItsVote). No round can
	// persist the superseded peer's vote after this read: the round checks
	// that it is not removed under the engine's lock, which this read
	// takes after routeMessage marked it removed. A later term of another
	// peer ID of the region, kept under the same key, binds it too: a
	// term never goes back.
	err := s.eng.ViewLatest(func(tx *engine.Tx) error {
		if tx.Tombstoned(m.RegionID, m.ToPeer()) {
			return &region.RegionNotFoundError{RegionID: m.RegionID}
		}
		var err error
		hs, _, err = tx.HardState(m.RegionID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create peer for region %d: %w", m.RegionID, err)
	}
	hs.Commit = 0 // nothing is in its log yet
	s.mu.Lock()
	if p, ok := s.peers[m.RegionID]; ok { // created concurrently
		s.mu.Unlock()
		return p, nil
	}
	s.mu.Unlock()
	// createPeer checks again under its lock: a split may start the real
	// peer in between, and a placeholder must not replace it.
	r := region.Region{ID: m.RegionID, Peers: []region.Peer{
		{ID: m.ToPeer(), StoreID: s.cfg.StoreID},
		{ID: m.FromPeer(), StoreID: m.FromStore},
	}}
	p, err := s.createPeer(persistedPeer{region: r, hard: hs})
	if err != nil {
		return nil, fmt.Errorf("create peer for region %d: %w", m.RegionID, err)
	}
	if p.id == m.ToPeer() && !p.isInitialized() {
		s.log.Info("created uninitialized peer", "region", m.RegionID, "peer", m.ToPeer(), "from_store", m.FromStore)
	}
	return p, nil
}

// destroyPeer removes a peer that was removed from its region: its raft
// state, log and the data of its range go, and a tombstone stays.
func (s *Store) destroyPeer(p *Peer) error {
	p.mu.Lock()
	if p.removed {
		p.mu.Unlock()
		return nil // a tombstone and the applied conf change both got here
	}
	r := p.region.Clone()
	p.removed = true
	p.failProposalsLocked(&region.RegionNotFoundError{RegionID: r.ID})
	p.failReadsLocked(&region.RegionNotFoundError{RegionID: r.ID})
	// Reads waiting for an apply that will not come: wake them, and
	// stillHolds turns them away.
	for _, w := range p.applyWait {
		close(w.done)
	}
	p.applyWait = nil
	p.mu.Unlock()
	// The peer leaves the store's maps only once its tombstone is durable.
	// Until then messages for the region find it removed and are refused;
	// were it gone before, a heartbeat from a leader that has not applied
	// the removal yet would create a placeholder under the same peer ID,
	// which that leader believes holds its log (raft panics on it).
	// The range's pairs and dedup records are cleared after, by the
	// snapshot worker in bounded transactions (snapapply.go): in this
	// transaction they held the store's loop for as long as they took
	// (a removed store's replicas went one every 10-17 s at scale).
	err := s.eng.Update(func(tx *engine.Tx) error {
		// The state, log and dedup clock base go; the range's data and
		// dedup records go with the clear below.
		if err := tx.DeleteRegion(r.ID); err != nil {
			return err
		}
		if err := tx.PutTombstone(r.ID, p.id); err != nil {
			return err
		}
		if !p.initialized {
			return nil
		}
		return putMarker(tx, clearMarkerOf(r.ID, p.id), clearMarker{Start: r.StartKey, End: r.EndKey})
	})
	if err != nil {
		return fmt.Errorf("destroy region %d peer %d: %w", r.ID, p.id, err)
	}
	s.mu.Lock()
	if s.peers[r.ID] == p {
		delete(s.peers, r.ID)
		s.ranges.Remove(r.ID)
	}
	s.mu.Unlock()
	s.summaryChanged()
	if p.initialized {
		s.snaps.enqueueClear(s, r.ID, p.id, r)
	}
	s.log.Info("destroyed removed peer", "region", r.ID, "peer", p.id)
	return nil
}

// startSplitPeer starts the peer of a region a split created. If this
// store's parent peer leads, the new peer campaigns at once so the region
// has a leader without waiting out an election timeout.
func (s *Store) startSplitPeer(r region.Region, hs raftpb.HardState, campaign bool) error {
	// createPeer supersedes an uninitialized placeholder of the region.
	p, err := s.createPeer(persistedPeer{region: r, hard: hs, apply: initApplyState})
	if err != nil {
		return fmt.Errorf("start split region %d: %w", r.ID, err)
	}
	if campaign {
		p.mu.Lock()
		_ = p.rn.Campaign()
		p.mu.Unlock()
	}
	s.markDirty(p)
	return nil
}

// AddPeer adds a replica of regionID on storeID: first as a learner, which
// the leader catches up by snapshot, then promoted to voter. It runs on the
// region's leader and returns when the new voter is in the configuration.
func (s *Store) AddPeer(ctx context.Context, regionID, storeID uint64) error {
	p, err := s.leaderPeer(regionID)
	if err != nil {
		return err
	}
	p.mu.Lock()
	existing, has := p.region.PeerOnStore(storeID)
	p.mu.Unlock()
	peerID := existing.ID
	if !has {
		if peerID, err = s.addLearner(ctx, p, storeID); err != nil {
			return err
		}
	} else if !existing.IsLearner {
		return nil
	}
	if err := s.waitCaughtUp(ctx, p, peerID); err != nil {
		return err
	}
	cc := raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode, NodeID: peerID}}}
	if err := s.proposeConfChange(ctx, p, cc, []region.Peer{{ID: peerID, StoreID: storeID}}); err != nil {
		return fmt.Errorf("promote learner: %w", err)
	}
	return nil
}

// addLearner adds a learner on storeID under a fresh peer ID.
func (s *Store) addLearner(ctx context.Context, p *Peer, storeID uint64) (uint64, error) {
	id, err := s.allocPeerID()
	if err != nil {
		return 0, err
	}
	cc := raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode, NodeID: id}}}
	if err := s.proposeConfChange(ctx, p, cc, []region.Peer{{ID: id, StoreID: storeID, IsLearner: true}}); err != nil {
		return 0, fmt.Errorf("add learner: %w", err)
	}
	return id, nil
}

// RemovePeer removes the replica of regionID on storeID. Removing the
// leader's own replica first hands leadership to another voter and returns
// NotLeader, so the caller retries there.
func (s *Store) RemovePeer(ctx context.Context, regionID, storeID uint64) error {
	p, err := s.leaderPeer(regionID)
	if err != nil {
		return err
	}
	p.mu.Lock()
	target, has := p.region.PeerOnStore(storeID)
	var other *region.Peer
	for _, pr := range p.region.Peers {
		if pr.StoreID != storeID && !pr.IsLearner {
			pr := pr
			other = &pr
		}
	}
	p.mu.Unlock()
	if !has {
		return nil
	}
	if target.ID == p.id {
		if other == nil {
			return fmt.Errorf("region %d: cannot remove its last voter: %w", regionID, ErrInvalidRequest)
		}
		if err := s.TransferLeader(ctx, regionID, other.StoreID); err != nil {
			return err
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.notLeaderLocked()
	}
	cc := raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode, NodeID: target.ID}}}
	return s.proposeConfChange(ctx, p, cc, nil)
}

// MovePeer replaces the replica on fromStore by one on toStore: add a
// learner, catch it up, promote it, then remove the old voter. Each step is
// a simple ConfChangeV2, so the region goes 3 -> 4 -> 3 voters and keeps a
// quorum even with another voter down (one joint step that promotes and
// removes at once would need quorums of both configurations).
func (s *Store) MovePeer(ctx context.Context, regionID, fromStore, toStore uint64) error {
	p, err := s.leaderPeer(regionID)
	if err != nil {
		return err
	}
	p.mu.Lock()
	old, hasOld := p.region.PeerOnStore(fromStore)
	p.mu.Unlock()
	if hasOld && old.ID == p.id {
		return fmt.Errorf("region %d: move the leader's replica after transferring leadership: %w", regionID, ErrInvalidRequest)
	}
	if err := s.AddPeer(ctx, regionID, toStore); err != nil {
		return err
	}
	if !hasOld {
		return nil
	}
	return s.RemovePeer(ctx, regionID, fromStore)
}

// leaderPeer returns the peer of regionID if it leads, else NotLeader.
func (s *Store) leaderPeer(regionID uint64) (*Peer, error) {
	if err := s.diskError(); err != nil {
		return nil, err
	}
	p, ok := s.peer(regionID)
	if !ok || !p.isInitialized() {
		return nil, &region.RegionNotFoundError{RegionID: regionID}
	}
	s.touch(p, wakeAdmin)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.isLeaderLocked() {
		return nil, p.notLeaderLocked()
	}
	return p, nil
}

// proposeConfChange proposes cc and waits until it is applied.
//
// Raft silently turns a conf change into an empty entry while an earlier
// one may be unapplied (its pendingConfIndex is past its applied index):
// proposed then, cc would never be applied and its caller would wait out
// its deadline. So cc goes to raft only when raft's own applied index
// covers every conf change it accepted: an entry of this term is applied
// (a new leader sets pendingConfIndex to its last index on election), raft
// has caught up with what this store applied (it learns at Advance, one
// step after the waiters here are woken), and no conf change of ours is in
// flight. Another one in flight is refused, retryably.
func (s *Store) proposeConfChange(ctx context.Context, p *Peer, cc raftpb.ConfChangeV2, added []region.Peer) error {
	reqID := s.nextRequestID()
	cc.Context = encodeConfContext(reqID, added)
	done := make(chan error, 1)
	p.mu.Lock()
	for {
		if !p.isLeaderLocked() {
			err := p.notLeaderLocked()
			p.mu.Unlock()
			return err
		}
		if p.confInFlight || p.confChangePending() {
			p.mu.Unlock()
			return fmt.Errorf("region %d: a membership change is still being applied: %w", p.regionID, ErrProposalDropped)
		}
		// A peer leaving the region must hold no follower lease: once it
		// is gone no ack of its can lift the cap, and the lease would
		// stall writes until it ends anyway. It gets no renewal from now.
		if until := p.removedHolderUntilLocked(cc, s.now()); !until.IsZero() {
			p.mu.Unlock()
			// On the store's clock: the lease ends on it.
			t := s.cfg.Clock.NewTimer(until.Sub(s.now()) + time.Millisecond)
			select {
			case <-t.C():
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("region %d: wait for a removed peer's follower lease to end: %w", p.regionID, ctx.Err())
			case <-s.stopc:
				t.Stop()
				return ErrStopped
			}
			p.mu.Lock()
			continue
		}
		st := p.rn.Status()
		if p.appliedTerm == st.Term && st.Applied >= p.applied {
			break
		}
		// Under write load the leader is a little behind: wait for its next
		// apply, or for raft to take in the last one.
		var wait <-chan struct{}
		if p.applied < st.Commit {
			wait = p.waitAppliedLocked(st.Commit)
		}
		p.mu.Unlock()
		var soon <-chan time.Time // raft takes in an apply within its round
		if wait == nil {
			soon = time.After(time.Millisecond)
		}
		select {
		case <-wait:
		case <-soon:
		case <-ctx.Done():
			return fmt.Errorf("region %d: wait for apply before a membership change: %w", p.regionID, ctx.Err())
		case <-s.stopc:
			return ErrStopped
		}
		p.mu.Lock()
	}
	if err := p.rn.ProposeConfChange(cc); err != nil {
		p.mu.Unlock()
		return fmt.Errorf("region %d: %w (%v)", p.regionID, ErrProposalDropped, err)
	}
	p.confInFlight = true
	p.proposals[reqID] = &proposal{term: p.rn.BasicStatus().Term, proposed: s.now(), waiters: []chan error{done}}
	p.mu.Unlock()
	s.markDirty(p)
	return s.waitProposal(ctx, p, done)
}

// confChangePending reports whether the current configuration is joint.
func (p *Peer) confChangePending() bool {
	return len(p.rn.Status().Config.Voters[1]) > 0
}

// waitCaughtUp waits until peerID's log matches the leader's closely
// enough to promote it without stalling commits.
func (s *Store) waitCaughtUp(ctx context.Context, p *Peer, peerID uint64) error {
	for {
		p.mu.Lock()
		if !p.isLeaderLocked() {
			err := p.notLeaderLocked()
			p.mu.Unlock()
			return err
		}
		st := p.rn.Status()
		pr, ok := st.Progress[peerID]
		p.mu.Unlock()
		if ok && pr.Match+16 >= st.Commit && pr.State == tracker.StateReplicate {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("region %d: wait for peer %d to catch up: %w", p.regionID, peerID, ctx.Err())
		case <-s.stopc:
			return ErrStopped
		case <-time.After(s.cfg.TickInterval):
		}
	}
}

// allocPeerID returns a cluster-unique peer ID: a per-store counter in the
// high bits and the store ID in the low 16, so stores never need to agree
// on anything to allocate. (Region IDs come from the cluster's counter
// instead, regionid.go: users see them.)
func (s *Store) allocPeerID() (uint64, error) {
	var id uint64
	err := s.eng.Update(func(tx *engine.Tx) error {
		n := tx.NextID() + 1
		id = n<<16 | s.cfg.StoreID
		return tx.PutNextID(n)
	})
	if err != nil {
		return 0, fmt.Errorf("allocate id: %w", err)
	}
	return id, nil
}
