package raftstore

import (
	"bytes"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Votes after a restart.
//
// The leader lease (lease.go) rests on followers that acked the leader
// refusing votes for an election timeout afterwards. Raft refuses only
// while it knows a leader, and a RawNode rebuilt from disk knows none: a
// follower that restarts inside the leader's lease would grant the first
// vote it is asked for, and a new leader could commit while the old one
// still serves reads from its lease. So a peer whose memory of the leader
// may be gone ignores vote and pre-vote requests for one election timeout:
// every peer loaded when the store starts, and a split-born peer that
// replaces a placeholder (which may have acked the new region's leader).
// A split-born peer that replaces nothing has acked no one, so new regions
// still elect at once. Votes for a leadership transfer are let through:
// the lease is never valid while a transfer is live.

// campaignTransfer is the context raft puts on votes that a transfer
// forces (raft.campaignTransfer, unexported).
var campaignTransfer = []byte("CampaignTransfer")

func (p *Peer) refuseVotesForElectionLocked(now time.Time) {
	p.noVotesBefore = now.Add(p.store.electionTimeout())
}

// refusesVoteLocked reports whether m is a vote request to drop unseen,
// as raft itself drops one that arrives while it hears from a leader.
func (p *Peer) refusesVoteLocked(m raftpb.Message, now time.Time) bool {
	if m.Type != raftpb.MsgVote && m.Type != raftpb.MsgPreVote {
		return false
	}
	if bytes.Equal(m.Context, campaignTransfer) || !now.Before(p.noVotesBefore) {
		return false
	}
	p.store.stats.votesRefused.Add(1)
	return true
}
