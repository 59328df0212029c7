package raftstore

import (
	"time"

	"go.etcd.io/raft/v3"
)

// lease is the leader lease. docs/design.md ("Leader read from the
// lease") gives the whole argument; in short:
//
// Raft runs with CheckQuorum, so a follower that heard from the leader less
// than an election timeout (E ticks) ago ignores vote requests. If a quorum
// acked a round (heartbeat for ReadIndex, or append for a proposal) that the
// leader issued at time t, each of those followers heard from it after t,
// and none grants a vote before it has counted E ticks since. Ticks come
// from a time.Ticker: the first may fire just after the heartbeat, and a
// tick that fired while the loop was busy is delivered late, so two can
// land together right after it. E ticks therefore span at least (E-2) tick
// intervals, and no other leader is elected before t + (E-2)·tick. The lease
// is that bound shortened by a drift margin for the clocks' rates, measured
// on the monotonic clock (time.Time carries it).
//
// The lease is bound to raft's current term, and is never valid while a
// leadership transfer is live in raft (LeadTransferee set) or started here:
// MsgTimeoutNow lets the transferee campaign at once, bypassing the
// followers' vote check. A round issued before the last MsgTimeoutNow plus
// one election timeout never counts (a transfer abandoned by its caller
// stays live in raft, and a delayed MsgTimeoutNow may still elect the
// target). Followers refuse votes for an election timeout after they start
// (votes.go), because a restart forgets the leader a follower has heard.
type lease struct {
	term  uint64
	until time.Time
}

// leaseDuration is how long a quorum-acked round keeps the lease.
func (s *Store) leaseDuration() time.Duration {
	ticks := s.cfg.ElectionTicks - 2
	if ticks <= 0 {
		return 0
	}
	d := time.Duration(ticks) * s.cfg.TickInterval
	return time.Duration(float64(d) * (1 - s.cfg.LeaseDriftMargin))
}

// electionTimeout is the shortest time a follower's election clock takes
// to run out.
func (s *Store) electionTimeout() time.Duration {
	return time.Duration(s.cfg.ElectionTicks) * s.cfg.TickInterval
}

// extendLeaseLocked records a quorum-acked round issued at issued in term.
func (p *Peer) extendLeaseLocked(term uint64, issued time.Time) {
	st := p.rn.BasicStatus()
	if term != st.Term || st.RaftState != raft.StateLeader || st.LeadTransferee != 0 || p.transferring {
		return
	}
	if !p.timeoutNowAt.IsZero() && issued.Before(p.timeoutNowAt.Add(p.store.electionTimeout())) {
		return
	}
	until := issued.Add(p.store.leaseDuration())
	if p.lease.term != term || until.After(p.lease.until) {
		p.lease = lease{term: term, until: until}
	}
}

func (p *Peer) revokeLeaseLocked() { p.lease = lease{} }

// onTimeoutNowLocked is called as the leader sends MsgTimeoutNow: the
// target may be elected from now on, whatever the followers' vote check.
func (p *Peer) onTimeoutNowLocked(now time.Time) {
	p.timeoutNowAt = now
	p.revokeLeaseLocked()
}

// leaseValidLocked reports whether a lease read may be served now:
//  1. this peer is raft's leader and no transfer is under way, neither in
//     raft nor started by this store;
//  2. the lease was earned in raft's current term (not the term the last
//     Ready published: raft may have moved since) and has not expired;
//  3. the peer has applied an entry of that term, so its state machine
//     holds every write any earlier leader acknowledged.
func (p *Peer) leaseValidLocked(now time.Time) bool {
	return leaseReadable(p.lease, p.rn.BasicStatus(), p.transferring, p.appliedTerm, now)
}

// leaseReadable is leaseValidLocked's rule, a pure function of the peer's
// state (testdata/lease.txt).
func leaseReadable(l lease, st raft.BasicStatus, transferring bool, appliedTerm uint64, now time.Time) bool {
	if transferring || st.RaftState != raft.StateLeader || st.LeadTransferee != 0 {
		return false
	}
	if l.term != st.Term || !now.Before(l.until) {
		return false
	}
	return appliedTerm == st.Term
}

// leaseNeedsRenewLocked: under a read-only load nothing else renews the
// lease, so a read that finds less than half of it left triggers a
// background ReadIndex round before it runs out. With follower leases, a
// quarter: a grant is never longer than what is left of this lease, so
// renewing earlier keeps the followers' leases long.
func (p *Peer) leaseNeedsRenewLocked(now time.Time) bool {
	left := p.store.leaseDuration() / 2
	if p.store.cfg.FollowerLeases {
		left = p.store.leaseDuration() * 3 / 4
	}
	return p.lease.term != p.rn.BasicStatus().Term || p.lease.until.Sub(now) < left
}
