package raftstore

import (
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Forwarded proposals held over a leadership change.
//
// raft drops a proposal that reaches a leader handing its leadership over,
// or a peer that knows no leader, and a proposal forwarded from a follower
// (WriteOptions.Forward) is dropped without a word to its follower: it
// would wait for an apply that never comes, and answer ErrMaybeApplied
// for a write that was never appended. So a peer keeps the forwarded
// MsgProps raft dropped, for at most an election timeout, and steps them
// again once there is a leader that is not handing over: as leader it
// appends them, as a follower raft sends them on to the new leader. They
// were never appended, so stepping them again is their first append, not
// a second.

// heldProp is a dropped forwarded proposal and when it is given up.
type heldProp struct {
	msg      raftpb.Message
	giveUpAt time.Time
}

// maxHeldProps bounds the proposals a peer holds; more are dropped, as
// raft would have (their followers' waits end as orphans).
const maxHeldProps = 1024

// holdPropLocked keeps a forwarded MsgProp raft dropped.
func (p *Peer) holdPropLocked(m raftpb.Message, now time.Time, keep time.Duration) {
	if m.From == p.id || len(p.heldProps) >= maxHeldProps {
		return // our own: its caller was told (batchProposalsLocked)
	}
	p.heldProps = append(p.heldProps, heldProp{msg: m, giveUpAt: now.Add(keep)})
}

// restepHeldPropsLocked steps the held proposals again once this peer
// leads with no transfer in flight or follows a known leader, and drops
// those held too long. Its callers' rounds take the Ready that makes.
func (p *Peer) restepHeldPropsLocked(now time.Time) {
	if len(p.heldProps) == 0 {
		return
	}
	st := p.rn.BasicStatus()
	ready := (st.RaftState == raft.StateLeader && st.LeadTransferee == 0) ||
		(st.RaftState == raft.StateFollower && st.Lead != 0)
	kept := p.heldProps[:0]
	for _, h := range p.heldProps {
		switch {
		case ready:
			_ = p.rn.Step(h.msg) // dropped again: as raft would have
		case now.Before(h.giveUpAt):
			kept = append(kept, h)
		}
	}
	clear(p.heldProps[len(kept):])
	p.heldProps = kept
}
