package raftstore

import (
	"fmt"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Notices are the messages peers exchange beside raft: raftstore's own
// protocol for hibernation, follower leases, safe-point renewal and
// removed peers. A notice travels in a Message beside raft messages
// (Message.Notice, with Msg unused), through the same Transport and with
// the same envelope (region, stores, the sender's conf version); the
// receiving store handles it in handleNoticeLocked and never steps it
// into raft.
//
// The kinds and who sends them:
//
//   - NoticeHibernate: a leader going idle tells its followers to stop
//     ticking; Commit is its commit index (hibernate.go).
//   - NoticeWake: a follower that woke, or is not caught up, wakes its
//     leader (hibernate.go).
//   - NoticeLeaseRequest, NoticeLeaseGrant: a follower asks its leader
//     for a read lease, the leader grants one; Lease names the request
//     (instance and sequence number) and, on a grant, its commit index and
//     length (followerlease.go).
//   - NoticeLeaseRevoke: a leader starting a transfer ends its followers'
//     leases (followerlease.go).
//   - NoticeRenew: a follower serving stale reads asks its leader for
//     fresh safe points (stale.go).
//   - NoticeTombstone: a peer was removed from the region and must
//     destroy itself (membership.go).
//   - NoticeStaleCheck: a follower that has heard no leader for long asks
//     its region's members whether it still is one; a member that no longer
//     lists it answers with a tombstone (membership.go).
//   - NoticeMergeCheck, NoticeMergeApplied: a merge's coordinator asks a
//     replica of the frozen region whether it applied the freeze at
//     Commit; it answers if it has (merge.go).
type NoticeKind uint8

// The kinds of notice. Their numbers are the wire's (kvpb.NoticeKind).
const (
	NoticeHibernate NoticeKind = iota + 1
	NoticeWake
	NoticeLeaseRequest
	NoticeLeaseGrant
	NoticeLeaseRevoke
	NoticeRenew
	NoticeTombstone
	NoticeStaleCheck
	NoticeMergeCheck
	NoticeMergeApplied

	maxNoticeKind = NoticeMergeApplied
)

var noticeNames = [...]string{
	NoticeHibernate:    "hibernate",
	NoticeWake:         "wake",
	NoticeLeaseRequest: "lease-request",
	NoticeLeaseGrant:   "lease-grant",
	NoticeLeaseRevoke:  "lease-revoke",
	NoticeRenew:        "renew",
	NoticeTombstone:    "tombstone",
	NoticeStaleCheck:   "stale-check",
	NoticeMergeCheck:   "merge-check",
	NoticeMergeApplied: "merge-applied",
}

func (k NoticeKind) String() string {
	if k.Valid() {
		return noticeNames[k]
	}
	return fmt.Sprintf("NoticeKind(%d)", uint8(k))
}

// Valid reports whether k is a kind this package knows.
func (k NoticeKind) Valid() bool { return k >= NoticeHibernate && k <= maxNoticeKind }

// fromLeader reports whether notices of kind k come from the region's
// leader, and so show a live leader to the follower that gets one
// (noteLeaderLocked), as a heartbeat does.
func (k NoticeKind) fromLeader() bool {
	return k == NoticeHibernate || k == NoticeLeaseGrant || k == NoticeLeaseRevoke
}

// isLease reports whether k belongs to the follower-lease protocol.
func (k NoticeKind) isLease() bool {
	return k == NoticeLeaseRequest || k == NoticeLeaseGrant || k == NoticeLeaseRevoke
}

// Notice is one notice from peer From to peer To of the message's region.
type Notice struct {
	Kind NoticeKind
	From uint64 // the sending peer
	To   uint64 // the peer it is for
	Term uint64 // the sender's raft term
	// Commit is the leader's commit index (NoticeHibernate).
	Commit uint64
	// Lease is the follower-lease payload (NoticeLeaseRequest,
	// NoticeLeaseGrant).
	Lease *LeaseMsg
}

// LeaseMsg is what a follower-lease request or grant carries: Instance
// and Seq name the request a grant answers (the asking peer instance's
// identity, instance.go, and its request number, which restarts with
// every instance); a grant also carries the leader's commit index and the
// lease length.
type LeaseMsg struct {
	Instance uint64
	Seq      uint64
	Commit   uint64
	Duration time.Duration
}

// IsNotice reports whether m carries a notice rather than a raft message.
func (m *Message) IsNotice() bool { return m.Notice != nil }

// FromPeer is the sending peer: the raft message's or the notice's.
func (m *Message) FromPeer() uint64 {
	if m.Notice != nil {
		return m.Notice.From
	}
	return m.Msg.From
}

// ToPeer is the peer m is for: the raft message's or the notice's.
func (m *Message) ToPeer() uint64 {
	if m.Notice != nil {
		return m.Notice.To
	}
	return m.Msg.To
}

// TypeName names what m carries, for logs: a raft message type, or
// "notice" and the notice's kind.
func (m *Message) TypeName() string {
	if m.Notice != nil {
		return "notice " + m.Notice.Kind.String()
	}
	return m.Msg.Type.String()
}

// isNoticeOf reports whether m is a notice of kind k.
func (m *Message) isNoticeOf(k NoticeKind) bool { return m.Notice != nil && m.Notice.Kind == k }

// createsPeer reports whether m, for a region this store does not host,
// creates an uninitialized peer that waits for a snapshot: a message from
// the region's leader (appends, heartbeats, snapshots, and the hibernate
// notice, which came as a heartbeat before notices had a type of their
// own). Lease notices never do (HandleRaftMessage drops them first).
func (m *Message) createsPeer() bool {
	if m.Notice != nil {
		return m.Notice.Kind == NoticeHibernate
	}
	switch m.Msg.Type {
	case raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgSnap:
		return true
	}
	return false
}

// handleNoticeLocked handles a notice admitted for p (HandleRaftMessage),
// beside raft: no notice is stepped into it. Called with p.mu held; it
// unlocks it.
func (s *Store) handleNoticeLocked(p *Peer, m *Message) error {
	n := m.Notice
	switch n.Kind {
	case NoticeHibernate:
		wake := p.onHibernateNoticeLocked(n)
		p.mu.Unlock()
		if wake != nil {
			s.sendNotice(p, *wake)
		}
	case NoticeWake:
		p.activityLocked(wakeNotice)
		p.mu.Unlock()
	case NoticeRenew:
		p.onNudgeLocked(n)
		p.mu.Unlock()
		s.markDirty(p)
	case NoticeLeaseRequest:
		grant, ok := p.onLeaseRequestLocked(n, s.now())
		p.mu.Unlock()
		s.markDirty(p) // the request may have made the lease due a renewal
		if ok {
			s.sendNotice(p, grant)
		}
	case NoticeLeaseGrant:
		p.onLeaseGrantLocked(n, s.now())
		p.mu.Unlock()
	case NoticeLeaseRevoke:
		p.onLeaseRevokeLocked(n)
		p.mu.Unlock()
	case NoticeMergeCheck:
		reply, ok := p.onMergeCheckLocked(n)
		p.mu.Unlock()
		if ok {
			s.sendNotice(p, reply)
		}
	case NoticeMergeApplied:
		p.onMergeAppliedLocked(n)
		p.mu.Unlock()
	default:
		// NoticeStaleCheck: from a member (a removed peer got its
		// tombstone in admitLocked), it only asked. A tombstone was
		// handled before routing; an unknown kind is ignored.
		p.mu.Unlock()
	}
	return nil
}

// sendNotice sends one notice from p outside the Ready loop and flushes
// it, on the caller's goroutine if the transport can (directSender).
func (s *Store) sendNotice(p *Peer, n Notice) {
	ds, direct := s.trans.(directSender)
	if !direct && n.Lease == nil {
		s.queueNotices(p, []Notice{n})
		s.trans.Flush()
		return
	}
	msg, found := s.envelope(p, n.To)
	if !found {
		return
	}
	msg.Notice = &n
	if direct {
		ds.SendNow(msg)
		return
	}
	s.trans.Send(msg)
	s.trans.Flush()
}

// queueNotices hands notices from p to the transport, addressed by store,
// without flushing.
func (s *Store) queueNotices(p *Peer, ns []Notice) {
	p.mu.Lock()
	r := p.region
	stores := make([]uint64, len(ns))
	for i := range ns {
		stores[i], _ = p.storeOfLocked(ns[i].To)
	}
	p.mu.Unlock()
	for i := range ns {
		if stores[i] == 0 {
			s.log.Warn("notice to a peer of unknown store dropped", "region", r.ID, "to_peer", ns[i].To, "kind", ns[i].Kind.String())
			continue
		}
		s.trans.Send(&Message{RegionID: r.ID, FromStore: s.cfg.StoreID, ToStore: stores[i], Notice: &ns[i], FromConfVer: r.Epoch.ConfVer})
	}
}
