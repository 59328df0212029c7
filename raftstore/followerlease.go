package raftstore

import (
	"math"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Follower read leases (quorum leases, Moraru et al., SoCC 2014, adapted
// to raft). docs/design.md ("Follower lease read") has the whole argument;
// in short:
//
// Invariant: once any replica can return a write W, every follower holding
// a valid lease has W in its log, and a holder never answers a read of key
// K while its log holds a write of K it has not applied.
//
//   - Grants. A follower asks its leader for a lease (a notice riding on
//     the raft transport, never stepped into raft) and remembers when it
//     sent the request. A leader that holds its own lease answers with a
//     grant of length L = min(FollowerLeaseDuration, what is left of its
//     own lease) and its commit index, and records the holder until
//     now+L on its own clock, BEFORE it sends the grant. The holder counts
//     the lease from its request's send time, on its own monotonic clock,
//     for L·(1-LeaseDriftMargin): it always ends first. It serves nothing
//     from the lease until it has applied the grant's commit index.
//   - Writes pay for it. The leader caps every follower's append ack (a
//     non-reject MsgAppResp) at the smallest true ack of the valid holders
//     before raft sees it, and steps the held-back acks again when that
//     minimum rises or a holder's lease ends. Understating an ack is
//     truthful ("my log matches up to i" holds for any lower i), so raft's
//     safety stands, and every path that exposes a commit (the leader's
//     lease read, ReadIndex, followers learning the commit) inherits the
//     rule: no entry commits unless a quorum and every valid holder have it.
//   - Local reads. Every peer records, as entries reach its log and before
//     it acks them, which keys each unapplied entry writes (an entry that
//     is not a put or delete counts as writing every key). A holder reads
//     key K locally once it has applied the grant's commit index and every
//     entry of its log that writes K.
//   - Leadership. A grant never outlives the granting leader's own lease,
//     and a holder's lease is valid only while raft's live term and leader
//     are the grant's. A transfer revokes the leader's lease (so no grant
//     is made after MsgTimeoutNow) and the new leader may be elected at
//     once; so every new leader, while follower leases are on, holds its
//     followers' acks below its first entry for one maximum follower lease
//     (plus drift): no grant of an earlier term is still valid when
//     anything of the new term commits (MongoDB's LeaseGuard rule). Its
//     own maximum is not enough when stores run different lease lengths
//     (election ticks, tick intervals): the MsgTimeoutNow that elects it
//     carries how long the old leader's grants may still run (its lease
//     horizon), and the deferral lasts at least that long.
//
// Follower leases live in memory only: a restarted follower holds none, and
// a restarted leader is no longer leader.

// leaseReqRing is how many recent requests a follower remembers the send
// time of; a grant answering an older one is ignored.
const leaseReqRing = 8

// heldLease is a follower's lease, from the leader of term.
type heldLease struct {
	term, leader uint64
	until        time.Time
	// commit is the grant's commit index: nothing is served before it is
	// applied.
	commit uint64
}

// leaseRequests are a follower's recent requests.
type leaseRequests struct {
	seq  uint64
	sent [leaseReqRing]time.Time // by seq % leaseReqRing
	last time.Time
}

// holderRecord is a leader's record of one holder's lease.
type holderRecord struct {
	until time.Time // end of the lease, on the leader's clock
	// commit is the grant commit of the first grant since the record was
	// last absent or run out: the holder serves nothing before it has
	// applied it, and every later commit needed its ack.
	commit uint64
}

// grantTable is a leader's view of its holders, for one term.
type grantTable struct {
	term    uint64
	holders map[uint64]holderRecord // by peer id
	// acks is each follower's true (uncapped) append ack in this term.
	acks map[uint64]uint64
	// Until deferUntil no ack is stepped above deferCap, the commit index
	// before this leader's first entry (see the package comment above).
	deferUntil time.Time
	deferCap   uint64
	// held: some ack was stepped lower than it is; restep when the cap
	// rises.
	held bool
	// noRenew: peers being removed get no new grant (proposeConfChange
	// waits for their leases to end).
	noRenew map[uint64]bool
	// checked is the highest commit index checkCommitLocked has checked.
	checked uint64
}

// followerLeaseState is a peer's follower-lease state, guarded by its mu.
type followerLeaseState struct {
	held    heldLease
	reqs    leaseRequests
	grants  grantTable
	pending pendingWrites
	// inherited is when the grants a transferring leader told this peer of
	// (a MsgTimeoutNow's lease horizon) have surely run out, on this
	// peer's clock: if elected, it defers its commits until then at least.
	inherited time.Time
}

// maxLeaseHorizon bounds the lease horizon a MsgTimeoutNow may ask for: a
// grant never outlives its leader's lease, which is shorter than an
// election timeout; a larger value is a peer's bug, and would only stall
// writes.
const maxLeaseHorizon = time.Minute

// followerLeaseDuration is the longest lease a leader grants.
func (s *Store) followerLeaseDuration() time.Duration {
	if d := s.cfg.FollowerLeaseDuration; d > 0 {
		return d
	}
	return s.leaseDuration()
}

// followerLeaseDefer is how long a new leader holds its commits back: a
// grant of an earlier term may still be valid for the longest lease, run
// on a clock up to the drift margin faster, plus a tick for the delivery
// of the last grant.
func (s *Store) followerLeaseDefer() time.Duration {
	d := s.followerLeaseDuration()
	return time.Duration(float64(d)*(1+s.cfg.LeaseDriftMargin)) + s.cfg.TickInterval
}

// mayHoldLease reports whether the store of peer may be granted a lease.
func (s *Store) mayHoldLease(storeID uint64) bool {
	if len(s.cfg.FollowerLeaseStores) == 0 {
		return true
	}
	for _, id := range s.cfg.FollowerLeaseStores {
		if id == storeID {
			return true
		}
	}
	return false
}

// ---- holder side ------------------------------------------------------------

// leaseRequestLocked returns the request to send to the leader if this
// follower has no lease or less than three quarters of one left (a grant
// answers a tick or more later, and a lease that runs out sends reads to
// ReadIndex); at most one per tick.
func (p *Peer) leaseRequestLocked(now time.Time) (Notice, bool) {
	s := p.store
	if !s.cfg.FollowerLeases || !p.initialized || p.removed || p.applyingSnapshotLocked() {
		return Notice{}, false
	}
	st := p.rn.BasicStatus()
	if st.RaftState != raft.StateFollower || st.Lead == 0 || !s.mayHoldLease(s.cfg.StoreID) {
		return Notice{}, false
	}
	h := p.fl.held
	if h.term == st.Term && h.leader == st.Lead && h.until.Sub(now) > s.followerLeaseDuration()*3/4 {
		return Notice{}, false
	}
	if !p.fl.reqs.last.IsZero() && now.Sub(p.fl.reqs.last) < s.cfg.TickInterval {
		return Notice{}, false
	}
	p.fl.reqs.seq++
	seq := p.fl.reqs.seq
	p.fl.reqs.sent[seq%leaseReqRing] = now
	p.fl.reqs.last = now
	return Notice{Kind: NoticeLeaseRequest, From: p.id, To: st.Lead, Term: st.Term,
		Lease: &LeaseMsg{Instance: p.instance, Seq: seq}}, true
}

// onLeaseGrantLocked takes a grant from the leader of the current term.
func (p *Peer) onLeaseGrantLocked(m *Notice, now time.Time) {
	s := p.store
	lm := m.Lease
	st := p.rn.BasicStatus()
	if !s.cfg.FollowerLeases || lm == nil || st.RaftState != raft.StateFollower || m.Term != st.Term || m.From != st.Lead {
		return
	}
	if lm.Instance != p.instance || lm.Seq == 0 || lm.Seq > p.fl.reqs.seq || p.fl.reqs.seq-lm.Seq >= leaseReqRing || lm.Duration <= 0 {
		// Not a request of this instance that we remember the send time
		// of: for another instance (lemma 1 in docs/design.md), or too old.
		s.stats.followerLeaseGrantsRefused.Add(1)
		return
	}
	sent := p.fl.reqs.sent[lm.Seq%leaseReqRing]
	until := sent.Add(time.Duration(float64(lm.Duration) * (1 - s.cfg.LeaseDriftMargin)))
	if !now.Before(until) {
		return
	}
	h := &p.fl.held
	if h.term == st.Term && h.leader == m.From && now.Before(h.until) {
		// A renewal of a lease still valid: the leader's record of it was
		// valid throughout, so every commit since the first grant is in
		// this log already; the first grant's commit still stands.
		if until.After(h.until) {
			h.until = until
		}
		return
	}
	*h = heldLease{term: st.Term, leader: m.From, until: until, commit: lm.Commit}
	s.stats.followerLeaseGrants.Add(1)
}

// revokeFollowerLeaseLocked drops this follower's lease.
func (p *Peer) revokeFollowerLeaseLocked() { p.fl.held = heldLease{} }

// followerLeaseValidLocked reports whether this follower may serve a read
// from its lease at now: raft's live term and leader are the grant's, the
// lease has not run out, and the grant's commit index is applied. now must
// be read under p.mu, after everything the read decides on: the log, and
// so the pending writes, cannot change meanwhile.
func (p *Peer) followerLeaseValidLocked(now time.Time) bool {
	return heldLeaseReadable(p.fl.held, p.rn.BasicStatus(), p.removed, p.initialized, p.applied, now)
}

// heldLeaseReadable is followerLeaseValidLocked's rule, a pure function
// of the peer's state (testdata/lease.txt).
func heldLeaseReadable(h heldLease, st raft.BasicStatus, removed, initialized bool, applied uint64, now time.Time) bool {
	if h.term == 0 || removed || !initialized {
		return false
	}
	return st.RaftState == raft.StateFollower && st.Term == h.term && st.Lead == h.leader &&
		now.Before(h.until) && applied >= h.commit
}

// ---- leader side ------------------------------------------------------------

// grantsForTermLocked returns the grant table, reset if it belongs to an
// earlier term: a new leader starts with no holders and defers its
// commits (see the package comment). commit must be raft's commit index
// now; called before any ack of the term is stepped, it is below the
// term's first entry.
func (p *Peer) grantsForTermLocked(term, commit uint64, now time.Time) *grantTable {
	g := &p.fl.grants
	if g.term != term {
		until := now.Add(p.store.followerLeaseDefer())
		if p.fl.inherited.After(until) {
			until = p.fl.inherited
		}
		*g = grantTable{
			term:       term,
			holders:    map[uint64]holderRecord{},
			acks:       map[uint64]uint64{},
			deferUntil: until,
			deferCap:   commit,
			noRenew:    map[uint64]bool{},
		}
	}
	return g
}

// capLocked is the highest ack that may be stepped now: no higher than
// the true ack of any valid holder, nor than deferCap while the deferral
// lasts. Expired holders are dropped.
func (g *grantTable) capLocked(now time.Time) uint64 {
	c := uint64(math.MaxUint64)
	if now.Before(g.deferUntil) {
		c = g.deferCap
	}
	for id, h := range g.holders {
		if !now.Before(h.until) {
			delete(g.holders, id)
			continue
		}
		c = min(c, g.acks[id])
	}
	return c
}

// onLeaseRequestLocked answers a follower's request with a grant, if this
// leader may make one: it holds its own lease (so no transfer is under
// way and it has applied an entry of its term, which also means its
// deferral is over), and the follower's store may hold leases.
func (p *Peer) onLeaseRequestLocked(m *Notice, now time.Time) (Notice, bool) {
	s := p.store
	lm := m.Lease
	if !s.cfg.FollowerLeases || lm == nil {
		return Notice{}, false
	}
	st := p.rn.BasicStatus()
	if st.RaftState != raft.StateLeader || m.Term != st.Term || m.From == p.id {
		return Notice{}, false
	}
	// A follower asking for a lease is a reader: keep our own lease warm,
	// as a forwarded ReadIndex would.
	p.readsSinceRenew = true
	if !p.leaseValidLocked(now) {
		return Notice{}, false
	}
	peer, ok := p.region.PeerByID(m.From)
	if !ok || !s.mayHoldLease(peer.StoreID) {
		return Notice{}, false
	}
	d := min(s.followerLeaseDuration(), p.lease.until.Sub(now))
	if d < s.cfg.TickInterval {
		return Notice{}, false // not worth a grant; the lease renews soon
	}
	g := p.grantsForTermLocked(st.Term, st.Commit, now)
	if g.noRenew[m.From] {
		return Notice{}, false
	}
	if len(p.region.Voters()) < 2 {
		// A single voter commits without any ack to cap: no leases.
		return Notice{}, false
	}
	rec, valid := g.holders[m.From]
	valid = valid && now.Before(rec.until)
	if !valid {
		// A new lease (none, or the last one ran out): read the full
		// status (it copies every peer's progress) once, not on every
		// renewal.
		full := p.rn.Status()
		pr, ok := full.Progress[m.From]
		if !ok {
			return Notice{}, false
		}
		if _, known := g.acks[m.From]; !known {
			// Raft's match is a lower bound of the truth (it may be a
			// capped ack), which only makes the cap stricter until the
			// next ack.
			g.acks[m.From] = pr.Match
		}
		// The grant's commit is what may commit from now on with no ack
		// the cap would see: acks raft has stepped already (any
		// follower's Match) become a commit once the leader's own append
		// is persisted, which raft counts at Advance without a message.
		// So the holder must apply up to the highest Match, not only the
		// commit index (lemma 1 in docs/design.md).
		rec = holderRecord{commit: full.Commit}
		for id, fp := range full.Progress {
			if id != p.id {
				rec.commit = max(rec.commit, fp.Match)
			}
		}
	}
	// Recorded before the grant leaves: from here on no entry above
	// rec.commit commits without this follower.
	if until := now.Add(d); until.After(rec.until) {
		rec.until = until
	}
	g.holders[m.From] = rec
	return Notice{Kind: NoticeLeaseGrant, From: p.id, To: m.From, Term: st.Term,
		Lease: &LeaseMsg{Instance: lm.Instance, Seq: lm.Seq, Commit: rec.commit, Duration: d}}, true
}

// capAckLocked lowers a follower's append ack to what may be stepped now,
// remembering the true value. It reports whether the ack raised a valid
// holder's true ack (the cap may have risen: restep the others).
func (p *Peer) capAckLocked(m *raftpb.Message, now time.Time) (holderRose bool) {
	if !p.store.cfg.FollowerLeases || m.Type != raftpb.MsgAppResp || m.Reject || m.From == p.id {
		return false
	}
	st := p.rn.BasicStatus()
	if st.RaftState != raft.StateLeader || m.Term != st.Term {
		return false
	}
	g := p.grantsForTermLocked(st.Term, st.Commit, now)
	if m.Index > g.acks[m.From] {
		g.acks[m.From] = m.Index
		_, holderRose = g.holders[m.From]
	}
	if c := g.capLocked(now); m.Index > c {
		m.Index = c
		g.held = true
	}
	return holderRose
}

// restepAcksLocked steps again the acks held back, up to the cap now: the
// cap rose (a holder caught up, a lease ended, the deferral is over).
func (p *Peer) restepAcksLocked(now time.Time) {
	g := &p.fl.grants
	if !g.held {
		return
	}
	st := p.rn.Status()
	if st.RaftState != raft.StateLeader || st.Term != g.term {
		g.held = false
		return
	}
	c := g.capLocked(now)
	still := false
	for id, ack := range g.acks {
		pr, ok := st.Progress[id]
		if !ok || id == p.id {
			continue
		}
		idx := min(ack, c)
		if idx > pr.Match {
			// A truthful ack: the follower did ack ack >= idx in this term.
			_ = p.rn.Step(raftpb.Message{Type: raftpb.MsgAppResp, From: id, To: p.id, Term: g.term, Index: idx})
		}
		if ack > idx {
			still = true
		}
	}
	g.held = still
}

// holderUntilLocked returns when the lease of peer id ends in this
// leader's view (zero if it holds none), and stops renewing it: used
// before the peer is removed from the region, so that its lease, which
// the cap would otherwise enforce against acks the removed peer no longer
// sends, runs out first.
func (p *Peer) holderUntilLocked(id uint64, now time.Time) time.Time {
	g := &p.fl.grants
	if g.term != p.rn.BasicStatus().Term || g.holders == nil {
		return time.Time{}
	}
	g.noRenew[id] = true
	h, ok := g.holders[id]
	if !ok || !now.Before(h.until) {
		return time.Time{}
	}
	return h.until
}

// removedHolderUntilLocked returns the latest end of a follower lease
// held by a peer cc removes (zero if none), and stops renewing theirs.
func (p *Peer) removedHolderUntilLocked(cc raftpb.ConfChangeV2, now time.Time) time.Time {
	var until time.Time
	for _, c := range cc.Changes {
		if c.Type != raftpb.ConfChangeRemoveNode {
			continue
		}
		if u := p.holderUntilLocked(c.NodeID, now); u.After(until) {
			until = u
		}
	}
	return until
}

// grantHorizonLocked is how long, from now on this leader's clock, a grant
// it made in this term may still be valid: what a MsgTimeoutNow carries,
// so that the target, once elected, defers its commits past it. (No grant
// is made once a transfer has begun: leaseValidLocked.)
func (p *Peer) grantHorizonLocked(now time.Time) time.Duration {
	g := &p.fl.grants
	if g.term != p.rn.BasicStatus().Term {
		return 0
	}
	var h time.Duration
	for _, rec := range g.holders {
		h = max(h, rec.until.Sub(now))
	}
	return h
}

// inheritGrantsLocked records a MsgTimeoutNow's lease horizon, received
// now: measured on this peer's clock, which may run slower than the
// sender's by the drift margin, plus a tick for the grant's delivery.
func (p *Peer) inheritGrantsLocked(horizon time.Duration, now time.Time) {
	if horizon <= 0 {
		return
	}
	horizon = min(horizon, maxLeaseHorizon)
	s := p.store
	until := now.Add(time.Duration(float64(horizon)*(1+s.cfg.LeaseDriftMargin)) + s.cfg.TickInterval)
	if until.After(p.fl.inherited) {
		p.fl.inherited = until
	}
}

// revokeNoticesLocked returns a revoke notice for every valid holder, sent
// when a transfer starts: the holders stop serving at once rather than at
// expiry (the new leader's deferral is what makes either safe).
func (p *Peer) revokeNoticesLocked(now time.Time) []Notice {
	g := &p.fl.grants
	st := p.rn.BasicStatus()
	if g.term != st.Term {
		return nil
	}
	var out []Notice
	for id, h := range g.holders {
		if now.Before(h.until) {
			out = append(out, Notice{Kind: NoticeLeaseRevoke, From: p.id, To: id, Term: st.Term})
		}
	}
	return out
}

// onLeaseRevokeLocked: the leader of the current term revoked our lease.
func (p *Peer) onLeaseRevokeLocked(m *Notice) {
	if h := p.fl.held; h.term == m.Term && h.leader == m.From {
		p.revokeFollowerLeaseLocked()
	}
}

// checkCommitLocked checks, on a leader, that its commit index has not
// risen past what the follower-lease rule allows, and counts a violation
// (Stats.FollowerLeaseCommitViolations) if it has: every holder valid now
// has acked the commit index or must apply past it before it serves
// (lemmas 1-3 in docs/design.md), and nothing above the deferral cap
// commits before the deferral ends. It is called once per Ready, after
// whatever raised the commit (an ack stepped, an ack restepped, the
// leader's own append counted at Advance, a conf change): a holder
// granted since the rise was granted at least the risen commit, and a
// holder that ran out since is not checked, so it reports no false
// violation, and may miss one that a holder's expiry hid.
func (p *Peer) checkCommitLocked(now time.Time) {
	if !p.store.cfg.FollowerLeases {
		return
	}
	g := &p.fl.grants
	st := p.rn.BasicStatus()
	if st.RaftState != raft.StateLeader || g.term != st.Term || st.Commit <= g.checked {
		return
	}
	g.checked = st.Commit
	bad := now.Before(g.deferUntil) && st.Commit > g.deferCap
	for id, h := range g.holders {
		if now.Before(h.until) && st.Commit > max(g.acks[id], h.commit) {
			bad = true
			p.store.log.Error("follower lease rule broken: an entry committed that a valid holder has not acked",
				"region", p.regionID, "holder", id, "commit", st.Commit, "holder_ack", g.acks[id], "grant_commit", h.commit)
		}
	}
	if bad {
		p.store.stats.followerLeaseViolations.Add(1)
	}
}
