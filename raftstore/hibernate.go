package raftstore

import (
	"context"
	"time"

	"github.com/hedgekv/hedgekv/clock"
	"go.etcd.io/raft/v3"
)

// Hibernation: a region with no traffic stops ticking, so a store can host
// thousands of idle regions for almost nothing (no ticks, no heartbeats).
//
//  1. A leader that has seen no activity for HibernateAfter, whose log is
//     fully committed, applied and matched by every peer, with nothing
//     pending, tells its peers to hibernate and stops ticking.
//  2. A follower that is caught up with that leader's commit stops ticking
//     when told. A follower that is not keeps ticking and catches up.
//  3. Anything for the region wakes the peer: a raft message (other than
//     the notice itself, or a late answer to a sleeping leader's heartbeat
//     or append) or a request. A woken follower nudges its leader awake; a
//     woken leader's next heartbeat wakes the followers. Only traffic
//     restarts the idle count: heartbeats, empty appends and their answers
//     do not (isLiveness).
//  4. A store that goes down cannot wake anyone, so the liveness loop
//     wakes the peers whose leader sits on a store the ClusterView reports
//     down (downChecks times in a row); they tick, time out and elect a
//     new leader. On a store being removed it has every follower, asleep
//     or not, ask whether it is still a member (removalChecksLocked), every
//     second: one removed while asleep, or whose tombstone was lost, learns
//     it within a second.
//
// Not ticking only delays elections, never hastens them, so the lease
// rules (lease.go) are unaffected: a hibernating follower never campaigns.
//
// The loop ticks only the store's awake set (setHibernatingLocked keeps
// it), so a tick costs in proportion to the awake regions, not to all of
// them: a pass over every peer on every 50 ms tick cost an idle store
// more with every region it hosted, and slowed the loop for the regions
// still awake (TiKV's hibernate regions and CockroachDB's quiesced
// replicas are not ticked either).

// setHibernatingLocked puts the peer to sleep or wakes it, and keeps the
// store's awake set, the peers a tick visits, in step. Every change of
// p.hibernating goes through here: a peer woken without joining the set
// would never tick again.
func (p *Peer) setHibernatingLocked(h bool, cause string) {
	if p.hibernating == h {
		return
	}
	p.hibernating = h
	s := p.store
	s.awakeMu.Lock()
	if h {
		delete(s.awake, p)
	} else if !p.removed {
		s.awake[p] = struct{}{}
		s.awakePeak = max(s.awakePeak, len(s.awake))
	}
	s.awakeMu.Unlock()
	if !h {
		s.stats.countWake(cause)
	}
}

// addAwake puts a new peer in the awake set: it starts ticking.
func (s *Store) addAwake(p *Peer) {
	s.awakeMu.Lock()
	s.awake[p] = struct{}{}
	s.awakePeak = max(s.awakePeak, len(s.awake))
	s.awakeMu.Unlock()
}

// awakePeers returns the peers the next tick visits.
func (s *Store) awakePeers() []*Peer {
	s.awakeMu.Lock()
	defer s.awakeMu.Unlock()
	if s.awakePeak > 64 && len(s.awake) < s.awakePeak/8 {
		// A Go map never shrinks, and ranging over it costs its peak
		// size: with every region of 10,000 asleep, ranging over the
		// set that once held them all was a third of the idle store's
		// CPU. Copy it into one of its size now.
		small := make(map[*Peer]struct{}, len(s.awake))
		for p := range s.awake {
			small[p] = struct{}{}
		}
		s.awake, s.awakePeak = small, len(small)
	}
	peers := make([]*Peer, 0, len(s.awake))
	for p := range s.awake {
		peers = append(peers, p)
	}
	return peers
}

// dropAwake takes a removed peer out of the awake set.
func (s *Store) dropAwake(p *Peer) {
	s.awakeMu.Lock()
	delete(s.awake, p)
	s.awakeMu.Unlock()
}

// activityLocked records traffic on the peer and wakes it (cause: what
// woke it, for the wake counters). It returns a wake notice for the
// leader when a hibernating follower wakes.
func (p *Peer) activityLocked(cause string) *Notice {
	p.idleTicks = 0
	if !p.hibernating {
		return nil
	}
	p.setHibernatingLocked(false, cause)
	st := p.rn.BasicStatus()
	if st.RaftState == raft.StateLeader || st.Lead == 0 {
		return nil
	}
	return &Notice{Kind: NoticeWake, From: p.id, To: st.Lead, Term: st.Term}
}

// touch records activity from a request (cause: which) and sends a wake
// notice if needed.
func (s *Store) touch(p *Peer, cause string) {
	p.mu.Lock()
	wake := p.activityLocked(cause)
	p.mu.Unlock()
	if wake != nil {
		s.sendNotice(p, *wake)
	}
}

// maybeHibernateLocked is step 1, called on every tick of a leader. It
// returns the notices to send.
func (p *Peer) maybeHibernateLocked() []Notice {
	limit := p.store.hibernateTicks()
	if limit <= 0 || p.idleTicks < limit || !p.isLeaderLocked() {
		return nil
	}
	st := p.rn.Status()
	f := quietFacts{
		lastIndex: p.lastIndex, commit: st.Commit, applied: p.applied,
		proposals: len(p.proposals), reads: len(p.reads.pending) + len(p.reads.inflight),
		transferring: p.transferring, joint: len(st.Config.Voters[1]) > 0,
	}
	for id, pr := range st.Progress {
		if id != p.id {
			f.matches = append(f.matches, pr.Match)
		}
	}
	if why := f.awakeBecause(); why != "" {
		p.store.stats.countRefusal(why)
		p.idleTicks = limit / 2 // look again in a while, not on every tick
		return nil
	}
	p.setHibernatingLocked(true, "")
	p.revokeLeaseLocked() // it would lapse unrenewed anyway
	var notices []Notice
	for _, pr := range p.region.Peers {
		if pr.ID != p.id {
			notices = append(notices, Notice{Kind: NoticeHibernate, From: p.id, To: pr.ID, Term: st.Term, Commit: st.Commit})
		}
	}
	return notices
}

// onHibernateNoticeLocked is step 2. A follower not caught up asks its
// leader to stay awake (returned): otherwise it would time out waiting for
// heartbeats that no longer come and start an election.
func (p *Peer) onHibernateNoticeLocked(m *Notice) *Notice {
	// Raft's own view of the leader: p.lead lags it by a Ready round.
	st := p.rn.BasicStatus()
	if m.From != st.Lead || m.Term != st.Term {
		return nil // from a leader of the past
	}
	if st.Commit == m.Commit && p.lastIndex == m.Commit && p.applied == m.Commit {
		p.setHibernatingLocked(true, "")
		return nil
	}
	p.store.stats.countRefusal(refusedFollowerBehind)
	return &Notice{Kind: NoticeWake, From: p.id, To: m.From, Term: st.Term}
}

func (s *Store) hibernateTicks() int {
	if s.cfg.HibernateAfter <= 0 {
		return 0
	}
	return int(s.cfg.HibernateAfter / s.cfg.TickInterval)
}

// livenessInterval is how often livenessLoop asks the cluster view.
const livenessInterval = time.Second

// downChecks is how many checks in a row must find a store down before
// the peers it leads are woken. A store too busy to answer one status
// request in time is listed down (the cluster view's timeout is 500 ms);
// waking on that alone woke thousands of sleeping followers of a live
// leader (2,742 on one store of 5,000 regions under load), which then
// campaigned and woke their regions. It delays the failover of a sleeping
// region by a second.
const downChecks = 2

// livenessLoop is step 4.
func (s *Store) livenessLoop(t clock.Ticker) {
	defer t.Stop()
	seenDown := map[uint64]int{} // store -> checks in a row it was down
	for {
		select {
		case <-s.stopc:
			return
		case <-t.C():
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		stores := s.view.Stores(ctx)
		cancel()
		down := map[uint64]bool{}
		removing := false
		stillDown := map[uint64]int{}
		for _, st := range stores {
			if !st.Up {
				stillDown[st.ID] = seenDown[st.ID] + 1
				if stillDown[st.ID] >= downChecks {
					down[st.ID] = true
				}
			}
			removing = removing || (st.ID == s.cfg.StoreID && st.Removing)
		}
		seenDown = stillDown
		if len(down) == 0 && !removing {
			continue
		}
		peers := s.allPeers()
		now := s.now()
		asked := false
		for _, p := range peers {
			p.mu.Lock()
			lp := p.leaderPeerLocked()
			if p.hibernating && lp != nil && down[lp.StoreID] {
				p.setHibernatingLocked(false, wakeLeaderDown)
				p.idleTicks = 0
			}
			var checks []Notice
			if removing {
				checks = p.removalChecksLocked(now)
			}
			p.mu.Unlock()
			if len(checks) > 0 {
				s.queueNotices(p, checks)
				asked = true
			}
		}
		if asked {
			s.trans.Flush()
		}
	}
}

// quietFacts are what step 1 looks at on a leader idle for HibernateAfter.
type quietFacts struct {
	lastIndex, commit, applied uint64
	proposals, reads           int // waiting for their entry or read index
	transferring, joint        bool
	matches                    []uint64 // each follower's Match
}

// quiet says whether a leader may hibernate: its log is fully committed,
// applied and matched by every follower, and nothing waits on it. Not
// RecentActive: CheckQuorum clears it every election timeout, and a
// follower that matches the log is all that hibernating needs
// (testdata/hibernate.txt).
func (f quietFacts) quiet() bool { return f.awakeBecause() == "" }

// Why an idle leader stayed awake (awakeBecause), or a follower refused
// its leader's hibernate notice: the labels of the refusal counters, which
// say at scale which condition keeps regions awake.
const (
	refusedUncommitted    = "uncommitted"
	refusedUnapplied      = "unapplied"
	refusedProposals      = "proposals"
	refusedReads          = "reads"
	refusedTransferring   = "transferring"
	refusedJoint          = "joint"
	refusedFollowerMatch  = "follower_match"  // a follower has not matched the log
	refusedFollowerBehind = "follower_behind" // a follower refused the notice
)

// awakeBecause is the first condition that keeps the leader awake, or ""
// if it may hibernate.
func (f quietFacts) awakeBecause() string {
	switch {
	case f.commit != f.lastIndex:
		return refusedUncommitted
	case f.applied != f.commit:
		return refusedUnapplied
	case f.proposals > 0:
		return refusedProposals
	case f.reads > 0:
		return refusedReads
	case f.transferring:
		return refusedTransferring
	case f.joint:
		return refusedJoint
	}
	for _, m := range f.matches {
		if m != f.lastIndex {
			return refusedFollowerMatch
		}
	}
	return ""
}

// What woke a hibernating peer, beside a raft message's type: the labels
// of the wake counters.
const (
	wakeRequest    = "request"     // a read or write routed to it
	wakeAdmin      = "admin"       // a split, membership change or transfer
	wakeNotice     = "notice_wake" // a follower woken by traffic woke its leader
	wakeRenew      = "notice_renew"
	wakeLeaderDown = "leader_down"
)
