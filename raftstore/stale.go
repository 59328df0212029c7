package raftstore

import (
	"time"

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/raft/v3"
)

// Bounded-staleness reads.
//
// A leader that holds a valid lease knows no other leader exists, so every
// write acknowledged so far (by it, or by earlier leaders, whose entries it
// has committed) has an index no greater than its commit index. It stamps
// each heartbeat round with that promise, a SafePoint{Term, Commit, Time}.
// A follower keeps the last few it heard in its current term; to serve a
// read at most MaxStaleness stale, it needs one whose Commit it has applied
// and whose Time is recent enough:
//
//	now - sp.Time + MaxClockOffset <= MaxStaleness
//
// The wall clocks of leader and follower are compared, so their disagreement
// (MaxClockOffset) is added to the bound, as CockroachDB's closed timestamps
// do. Without a leader no new safe points arrive, and reads keep succeeding
// until the last one is too old — that is what keeps a leaderless region
// readable.

const safePointRing = 8

type safePoints struct {
	ring [safePointRing]SafePoint
	n    int // total recorded; ring[(n-1)%len] is the newest
}

// makeSafePointLocked returns the safe point to stamp on heartbeats now,
// nil if this peer may not promise anything (no valid lease).
func (p *Peer) makeSafePointLocked(now time.Time) *SafePoint {
	if !p.leaseValidLocked(now) {
		return nil
	}
	st := p.rn.BasicStatus()
	sp := SafePoint{Term: st.Term, Commit: st.Commit, Time: now.Round(0)}
	// The leader may serve stale reads from its own promise, too.
	p.recordSafePointLocked(sp, now)
	return &sp
}

// recordSafePointLocked keeps sp if it is from the current term and newer
// than what we have. A safe point stamped further in the future than
// MaxClockOffset allows proves the clocks disagree by more than every
// staleness bound assumes: it is refused (and counted), as CockroachDB
// refuses a peer whose clock is beyond its maximum offset. A leader clock
// behind ours only makes the bounds we compute larger than the truth.
func (p *Peer) recordSafePointLocked(sp SafePoint, now time.Time) {
	if sp.Term != p.rn.BasicStatus().Term {
		return
	}
	if ahead := sp.Time.Sub(now.Round(0)); ahead > p.store.cfg.MaxClockOffset {
		if p.store.stats.safePointsRefused.Add(1)%100 == 1 {
			p.store.log.Warn("refusing safe point: leader clock ahead of ours by more than the max clock offset",
				"region", p.regionID, "ahead", ahead, "max_clock_offset", p.store.cfg.MaxClockOffset)
		}
		return
	}
	if p.safe.n > 0 {
		last := p.safe.ring[(p.safe.n-1)%safePointRing]
		if last.Term == sp.Term && !sp.Time.After(last.Time) {
			return
		}
	}
	p.safe.ring[p.safe.n%safePointRing] = sp
	p.safe.n++
}

// staleReadLocked returns the staleness bound of a local read now, or
// DataIsNotReady if no safe point this peer has applied is fresh enough.
func (p *Peer) staleReadLocked(now time.Time, maxStaleness time.Duration) (time.Duration, error) {
	bound, age, ok := p.safe.bound(p.applied, now, p.store.cfg.MaxClockOffset, maxStaleness)
	if !ok {
		return 0, &region.DataIsNotReadyError{RegionID: p.regionID, PeerID: p.id, SafeAge: age}
	}
	return bound, nil
}

// bound is staleReadLocked's rule, a pure function (testdata/stale.txt):
// the newest safe point whose commit index is applied bounds a local
// read's staleness at its age plus the clock offset allowed between
// stores; within maxStaleness the read may be served (ok), else age is
// that safe point's age in milliseconds (0: none applied).
func (sps *safePoints) bound(applied uint64, now time.Time, maxClockOffset, maxStaleness time.Duration) (bound time.Duration, age uint64, ok bool) {
	var best *SafePoint
	for i := 0; i < min(sps.n, safePointRing); i++ {
		sp := &sps.ring[(sps.n-1-i)%safePointRing]
		if sp.Commit <= applied {
			best = sp
			break // newest first
		}
	}
	if best == nil {
		return 0, 0, false
	}
	if b := now.Round(0).Sub(best.Time) + maxClockOffset; b <= maxStaleness {
		return max(b, 0), 0, true
	}
	return 0, uint64(now.Round(0).Sub(best.Time).Milliseconds()), false
}

// A leader stamps safe points only while it holds a lease, and only its own
// traffic (reads and writes at the leader, followers' ReadIndex requests)
// renews the lease. Stale reads on followers are no traffic at the leader,
// so under a load of stale reads alone the safe points would stop, and
// once the last one is MaxStaleness old every read would be refused. A
// follower therefore nudges its leader when a stale read finds its newest
// safe point past half the read's bound (or too old): the leader treats
// the nudge as a read (it wakes, renews its lease with one heartbeat
// round, and its next heartbeats carry safe points again): a NoticeRenew.

// nudgeLeaderLocked returns the nudge to send to the leader, at most one
// every quarter lease.
func (p *Peer) nudgeLeaderLocked(now time.Time) *Notice {
	st := p.rn.BasicStatus()
	if st.RaftState == raft.StateLeader || st.Lead == 0 {
		return nil
	}
	if !p.lastNudge.IsZero() && now.Sub(p.lastNudge) < p.store.leaseDuration()/4 {
		return nil
	}
	p.lastNudge = now
	return &Notice{Kind: NoticeRenew, From: p.id, To: st.Lead, Term: st.Term}
}

// onNudgeLocked: a follower needs fresh safe points; renew the lease as a
// read would.
func (p *Peer) onNudgeLocked(m *Notice) {
	p.activityLocked(wakeRenew)
	if p.isLeaderLocked() && m.Term == p.rn.BasicStatus().Term {
		p.readsSinceRenew = true
	}
}
