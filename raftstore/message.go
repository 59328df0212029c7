package raftstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// The message path of a store: what arrives from the Transport (routed to
// its region's peer, then handled as a notice or stepped into raft), the
// delivery reports, and what the peers send.

// HandleRaftMessage delivers an inbound message to its region's peer:
// routeMessage finds (or creates) the peer, admitLocked screens the
// message against the peer it found, and then a notice is handled beside
// raft (handleNoticeLocked) and a raft message stepped into it
// (stepLocked).
func (s *Store) HandleRaftMessage(m *Message) error {
	if s.stopped() {
		return ErrStopped
	}
	if err := s.diskError(); err != nil {
		return err // frozen: stepping raft would answer for state never persisted
	}
	p, err := s.routeMessage(m)
	if p == nil || err != nil {
		return err
	}
	if isSnapMsg(m) {
		defer s.settleSnapClaim(p, m)
	}
	p.mu.Lock()
	if t, err := s.admitLocked(p, m); t != nil || err != nil {
		p.mu.Unlock()
		if t != nil {
			s.log.Info("a removed peer is still live: told it to destroy itself", "region", m.RegionID, "peer", m.FromPeer(), "peer_store", m.FromStore, "msg", m.TypeName())
			s.trans.Send(t)
			s.trans.Flush()
		}
		return err
	}
	if m.Notice != nil {
		return s.handleNoticeLocked(p, m) // unlocks p.mu
	}
	return s.stepLocked(p, m) // unlocks p.mu
}

// routeMessage returns the peer m is for: the region's peer here, or an
// uninitialized one m creates (maybeCreatePeer). nil with a nil error:
// m was handled here (a tombstone) or is for nobody (a lease notice for a
// region not here).
func (s *Store) routeMessage(m *Message) (*Peer, error) {
	p, ok := s.peer(m.RegionID)
	if m.isNoticeOf(NoticeTombstone) {
		if !ok {
			return nil, nil
		}
		return nil, s.handleTombstone(p, m.Notice)
	}
	if ok && m.ToPeer() != p.id && p.supersedePlaceholder() {
		// A placeholder for a peer ID this region no longer uses.
		s.mu.Lock()
		if s.peers[m.RegionID] == p {
			delete(s.peers, m.RegionID)
		}
		s.mu.Unlock()
		s.summaryChanged()
		ok = false
	}
	if !ok && m.Notice != nil && m.Notice.Kind.isLease() {
		return nil, nil // nothing to grant or hold for a region not here
	}
	if !ok {
		var err error
		if p, err = s.maybeCreatePeer(m); err != nil {
			return nil, err
		}
	}
	if m.Notice == nil && m.Msg.Type == raftpb.MsgSnap {
		if err := s.checkInboundSnapshot(p, m); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// checkInboundSnapshot checks a MsgSnap before raft sees it.
func (s *Store) checkInboundSnapshot(p *Peer, m *Message) error {
	// A MsgSnap may arrive with no snapshot at all (nothing on the
	// Stream RPC checks; FuzzHandleRaftMessage reproduces it): refuse it
	// rather than dereference nil and crash the store.
	if m.Msg.Snapshot == nil {
		return fmt.Errorf("region %d: MsgSnap without a snapshot: %w", m.RegionID, errCorrupt)
	}
	// Decoded (and checksummed) before raft sees it: a snapshot that
	// would fail to apply must not reach the Ready loop, where an
	// apply error stops the store. A streamed one was checked as it
	// was received (ReceiveSnapshot); any other descriptor is refused.
	var r region.Region
	var err error
	if st, _, staged := s.snaps.stagedFile(m.Msg.Snapshot.Data); staged {
		r = st.region
		if r.ID != m.RegionID {
			err = fmt.Errorf("snapshot file of region %d: %w", r.ID, errCorrupt)
		}
	} else {
		r, err = decodeSnapshotRegion(m.Msg.Snapshot.Data)
	}
	if err != nil {
		return fmt.Errorf("region %d: bad snapshot: %w", m.RegionID, err)
	}
	// A region created by a split this store has not applied yet must
	// not take over part of its parent's range: refuse the snapshot
	// until the parent catches up (its leader will retry).
	if !p.isInitialized() && !s.claimSnapshot(p, r) {
		s.stats.snapshotsRefusedOverlap.Add(1)
		return fmt.Errorf("region %d: snapshot overlaps a region here: %w", m.RegionID, ErrProposalDropped)
	}
	return nil
}

// admitLocked screens m, a raft message or a notice, against the peer it
// was routed to: an error if m is not for this peer, or the tombstone to
// answer it with if its sender is a removed peer (tombstoneForStaleLocked).
// Otherwise it learns the sender's store (the peer cache) and whether m
// shows a live leader, and m goes on.
func (s *Store) admitLocked(p *Peer, m *Message) (*Message, error) {
	if m.ToPeer() != p.id || p.removed {
		// For a replaced peer of this region, or for one removed or
		// superseded (a placeholder a split replaced) since the lookup: a
		// message stepped into it would be answered by a peer that no
		// longer exists, acking state the live peer does not have.
		return nil, &region.RegionNotFoundError{RegionID: m.RegionID}
	}
	p.learnSenderLocked(m)
	if t := p.tombstoneForStaleLocked(m, s.cfg.StoreID); t != nil {
		return t, nil
	}
	p.noteLeaderLocked(m, s.now())
	return nil, nil
}

// stepLocked steps the raft message m into p's RawNode, after the store's
// own answers (a vote refused, a ReadIndex answered from the lease or
// taken by a batch) and the follower-lease ack cap. Called with p.mu held;
// it unlocks it.
func (s *Store) stepLocked(p *Peer, m *Message) error {
	switch {
	case isAnswer(m.Msg) && p.hibernating:
		// The answer to a heartbeat or append this leader sent before it
		// hibernated, quiet: it says nothing new (a follower behind would
		// still get its append from this step). Waking for it made most
		// leaders send their hibernate notices twice (3,962 of 5,000 at
		// once on a store).
	case isLiveness(m.Msg):
		// Keeps a peer awake but is not traffic.
		p.setHibernatingLocked(false, m.Msg.Type.String())
	default:
		if wake := p.activityLocked(m.Msg.Type.String()); wake != nil {
			defer s.sendNotice(p, *wake)
		}
	}
	now := s.now()
	if p.refusesVoteLocked(m.Msg, now) {
		p.mu.Unlock()
		return nil
	}
	if m.Msg.Type == raftpb.MsgReadIndex {
		// Followers' reads keep the lease warm just as the leader's own do.
		p.readsSinceRenew = true
	}
	if resp, ok := p.answerReadIndexFromLeaseLocked(m.Msg, now); ok {
		p.mu.Unlock()
		s.sendNow(p, resp)
		return nil
	}
	if next, ok := p.takeReadIndexRespLocked(m.Msg, now); ok {
		p.mu.Unlock()
		if next != nil {
			s.sendNow(p, *next)
		}
		return nil
	}
	if m.Msg.Type == raftpb.MsgTimeoutNow {
		p.inheritGrantsLocked(m.LeaseHorizon, now)
	}
	holderRose := p.capAckLocked(&m.Msg, now)
	err := p.rn.Step(m.Msg)
	if errors.Is(err, raft.ErrProposalDropped) && m.Msg.Type == raftpb.MsgProp {
		// A follower's forwarded proposal met a leadership transfer (or
		// no leader): keep it for the next leader (heldprops.go).
		p.holdPropLocked(m.Msg, now, s.electionTimeout())
		err = nil
	}
	if err == nil && m.SafePoint != nil && m.Msg.Type == raftpb.MsgHeartbeat {
		p.recordSafePointLocked(*m.SafePoint, now)
	}
	if holderRose {
		p.restepAcksLocked(now)
	}
	p.mu.Unlock()
	if err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		return fmt.Errorf("region %d step %s: %w", m.RegionID, m.Msg.Type, err)
	}
	s.markDirty(p)
	return nil
}

// isLiveness reports whether m is raft talking to itself rather than
// traffic: heartbeats, appends without entries and the answers to both.
// They keep a peer awake but do not restart its idle count. An append
// counted as traffic kept whole stores awake under load: each message
// the transport dropped on a full queue put its follower in probe
// (ReportUnreachable), the next heartbeat answer drew an empty append
// and its answer restarted the leader's idle count, so no leader of a
// store that dropped ever hibernated, and their heartbeats kept the
// queues full (5,000 regions on one core: 4,367 awake after minutes).
func isLiveness(m raftpb.Message) bool {
	switch m.Type {
	case raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp, raftpb.MsgAppResp:
		return true
	case raftpb.MsgApp:
		return len(m.Entries) == 0
	}
	return false
}

// isAnswer reports whether m answers a leader's heartbeat or append.
func isAnswer(m raftpb.Message) bool {
	return m.Type == raftpb.MsgHeartbeatResp || m.Type == raftpb.MsgAppResp
}

// ReportUnreachable tells the peer's raft that a send to toPeerID failed.
func (s *Store) ReportUnreachable(regionID, toPeerID uint64) {
	if p, ok := s.peer(regionID); ok {
		p.mu.Lock()
		p.rn.ReportUnreachable(toPeerID)
		p.mu.Unlock()
		s.markDirty(p)
	}
}

// ReportSnapshot tells the peer's raft how sending the snapshot m carried
// ended. A report about a send of an earlier term, or of another snapshot
// than the one raft waits for now, is ignored: raft would take it for the
// send in flight.
func (s *Store) ReportSnapshot(m *Message, ok bool) {
	if m == nil || m.Msg.Snapshot == nil {
		return
	}
	p, found := s.peer(m.RegionID)
	if !found {
		return
	}
	st := raft.SnapshotFinish
	if !ok {
		st = raft.SnapshotFailure
	}
	to, index := m.Msg.To, m.Msg.Snapshot.Metadata.Index
	p.mu.Lock()
	status := p.rn.Status()
	pr, tracked := status.Progress[to]
	current := m.Msg.From == p.id && status.RaftState == raft.StateLeader && status.Term == m.Msg.Term &&
		tracked && pr.State == tracker.StateSnapshot && pr.PendingSnapshot == index
	if current {
		p.rn.ReportSnapshot(to, st)
	}
	p.mu.Unlock()
	if !current {
		s.log.Debug("stale snapshot report ignored", "region", m.RegionID, "to_peer", to, "index", index, "term", m.Msg.Term, "ok", ok)
		return
	}
	if !ok {
		s.stats.snapshotsFailed.Add(1)
	}
	s.markDirty(p)
}

// sendNow sends one raft message outside the Ready loop and flushes it,
// on the caller's goroutine if the transport can (directSender).
func (s *Store) sendNow(p *Peer, m raftpb.Message) {
	ds, direct := s.trans.(directSender)
	if !direct {
		s.send(p, []raftpb.Message{m})
		s.trans.Flush()
		return
	}
	msg, found := s.envelope(p, m.To)
	if !found {
		return
	}
	msg.Msg = m
	ds.SendNow(msg)
}

// envelope addresses a message from p to peer to: its store (the
// region's, or one learned from to's messages) and p's conf version.
func (s *Store) envelope(p *Peer, to uint64) (*Message, bool) {
	p.mu.Lock()
	toStore, found := p.storeOfLocked(to)
	r, confVer := p.regionID, p.region.Epoch.ConfVer
	p.mu.Unlock()
	if !found {
		return nil, false
	}
	return &Message{RegionID: r, FromStore: s.cfg.StoreID, ToStore: toStore, FromConfVer: confVer}, true
}

// directSender is a Transport that can write one message on the caller's
// goroutine, for round trips where a hand-off to a sender costs latency.
type directSender interface {
	SendNow(m *Message)
}

// send hands messages to the transport, addressed by store.
// A leader holding a valid lease stamps its heartbeats with a safe point.
func (s *Store) send(p *Peer, msgs []raftpb.Message) {
	if len(msgs) == 0 {
		return
	}
	var sp *SafePoint
	p.mu.Lock()
	r := p.region
	now := s.now()
	stores := make([]uint64, len(msgs))
	var horizon time.Duration
	for i := range msgs {
		switch msgs[i].Type {
		case raftpb.MsgHeartbeat:
			if sp == nil {
				sp = p.makeSafePointLocked(now)
			}
		case raftpb.MsgTimeoutNow:
			p.onTimeoutNowLocked(now)
			horizon = p.grantHorizonLocked(now)
		}
		stores[i], _ = p.storeOfLocked(msgs[i].To)
	}
	p.mu.Unlock()
	for i := range msgs {
		m := &Message{RegionID: r.ID, FromStore: s.cfg.StoreID, ToStore: stores[i], Msg: msgs[i], FromConfVer: r.Epoch.ConfVer}
		if msgs[i].Type == raftpb.MsgTimeoutNow {
			m.LeaseHorizon = horizon
		}
		if stores[i] == 0 {
			// No store known for the peer: lost. A snapshot must say so,
			// or raft keeps the follower waiting for it (StateSnapshot)
			// until the leader changes.
			s.log.Warn("raft message to a peer of unknown store dropped", "region", r.ID, "to_peer", msgs[i].To, "type", msgs[i].Type.String())
			if msgs[i].Type == raftpb.MsgSnap {
				s.ReportSnapshot(m, false)
			}
			continue
		}
		if msgs[i].Type == raftpb.MsgHeartbeat {
			m.SafePoint = sp
		}
		// Votes are rare; the power-loss tests (test/crash) read these
		// lines to check that no store votes twice in one term. A
		// candidate's MsgVote says it voted for itself (not a pre-vote).
		switch {
		case msgs[i].Type == raftpb.MsgVoteResp && !msgs[i].Reject:
			s.log.Info("vote granted", "region", r.ID, "term", msgs[i].Term, "candidate", msgs[i].To)
		case msgs[i].Type == raftpb.MsgVote:
			s.log.Info("vote granted", "region", r.ID, "term", msgs[i].Term, "candidate", msgs[i].From)
		}
		s.trans.Send(m)
	}
}
