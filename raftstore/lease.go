package raftstore

import "time"

// lease is the leader lease (DESIGN.md, "Leader lease").
//
// Raft runs with CheckQuorum, so a follower that heard from the leader less
// than an election timeout ago ignores vote requests. If a quorum acked a
// round (heartbeat for ReadIndex, or append for a proposal) that the leader
// issued at time t, each of those followers heard from it after t, so no
// other leader can be elected before t + (electionTicks-1) ticks — minus one
// tick because a follower's election clock may be reset just before its next
// tick fires. The lease is that bound shortened by a drift margin, on the
// monotonic clock (time.Time carries it).
//
// The lease is bound to the term it was earned in, and revoked on step-down,
// on term change, and when a leadership transfer starts: MsgTimeoutNow lets
// the transferee campaign at once, bypassing the followers' vote check.
type lease struct {
	term  uint64
	until time.Time
}

// duration is how long a quorum-acked round keeps the lease.
func (s *Store) leaseDuration() time.Duration {
	d := time.Duration(s.cfg.ElectionTicks-1) * s.cfg.TickInterval
	return time.Duration(float64(d) * (1 - s.cfg.LeaseDriftMargin))
}

// extendLocked records a quorum-acked round issued at issued in term.
func (p *Peer) extendLeaseLocked(term uint64, issued time.Time) {
	if term != p.term || !p.isLeaderLocked() || p.transferring {
		return
	}
	until := issued.Add(p.store.leaseDuration())
	if p.lease.term != term || until.After(p.lease.until) {
		p.lease = lease{term: term, until: until}
	}
}

func (p *Peer) revokeLeaseLocked() { p.lease = lease{} }

// leaseValidLocked reports whether a lease read may be served now:
//  1. this peer is leader and no transfer is under way;
//  2. the lease was earned in the current term and has not expired;
//  3. the peer has applied an entry of its own term, so its state machine
//     holds every write any earlier leader acknowledged.
func (p *Peer) leaseValidLocked(now time.Time) bool {
	if p.transferring || !p.isLeaderLocked() {
		return false
	}
	if p.lease.term != p.term || !now.Before(p.lease.until) {
		return false
	}
	return p.appliedTerm == p.term
}

// leaseNeedsRenewLocked: under a read-only load nothing else renews the
// lease, so a read that finds less than half of it left triggers a
// background ReadIndex round before it runs out.
func (p *Peer) leaseNeedsRenewLocked(now time.Time) bool {
	return p.lease.term != p.term || p.lease.until.Sub(now) < p.store.leaseDuration()/2
}
