package raftstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// readQueue batches ReadIndex requests. Reads that arrive while a ReadIndex
// is in flight must NOT join it: its index may predate a write acknowledged
// before they arrived. They wait in pending and go out together as the next
// batch, one RawNode.ReadIndex per loop round, sharing one heartbeat round.
//
// A follower keeps up to maxFollowerReadBatches batches in flight to its
// leader: with one, a read arriving just after a batch left waits for that
// batch's round trip and then for its own, two round trips, which across
// a WAN is the whole cost of a follower read. Each batch still gets an
// index from the leader after its reads arrived, so pipelining changes no
// answer, only how long reads queue.
const maxFollowerReadBatches = 4

type readQueue struct {
	pending  []chan readResult
	inflight map[uint64]*readBatch
	nextID   uint64
}

// readCtx is the request context a batch travels with: this peer
// instance's identity, then the batch's number. An answer (a ReadState on
// the leader, a MsgReadIndexResp on a follower) resolves a batch only if
// it names this instance: batch numbers restart with every instance, and
// an answer meant for an earlier one carries an index that may predate
// writes acknowledged before this instance's reads arrived (instance.go).
func (p *Peer) readCtx(id uint64) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, p.instance)
	binary.BigEndian.PutUint64(b[8:], id)
	return b
}

// batchOf returns the batch number ctx names if it names this instance.
func (p *Peer) batchOf(ctx []byte) (uint64, bool) {
	if len(ctx) != 16 || binary.BigEndian.Uint64(ctx) != p.instance {
		return 0, false
	}
	return binary.BigEndian.Uint64(ctx[8:]), true
}

type readBatch struct {
	term    uint64
	issued  time.Time
	waiters []chan readResult
}

type readResult struct {
	index uint64
	err   error
}

// readIndex returns an index that covers every write acknowledged before
// the call, obtained through raft's ReadIndex (forwarded to the leader when
// p is a follower).
func (s *Store) readIndex(ctx context.Context, p *Peer) (uint64, error) {
	ch := make(chan readResult, 1)
	p.mu.Lock()
	if st := p.rn.BasicStatus(); st.RaftState != raft.StateLeader && st.Lead == 0 {
		// Raft silently drops a ReadIndex when no leader is known
		// (etcd-io/etcd#9566); fail fast so the client tries elsewhere.
		err := p.notLeaderLocked()
		p.mu.Unlock()
		return 0, err
	}
	p.reads.pending = append(p.reads.pending, ch)
	var direct *raftpb.Message
	if !p.isLeaderLocked() && len(p.reads.inflight) < maxFollowerReadBatches {
		direct = p.followerReadIndexLocked(s.now())
	}
	p.mu.Unlock()
	switch {
	case direct != nil:
		s.sendNow(p, *direct)
	case p.isLeader():
		s.markDirty(p) // the loop issues the leader's batch
	}
	// A follower's read queued behind the batch in flight goes out with the
	// next batch, sent when the answer (or the timeout) for this one comes.
	select {
	case r := <-ch:
		return r.index, r.err
	case <-ctx.Done():
		return 0, fmt.Errorf("read index of region %d: %w", p.regionID, ctx.Err())
	case <-s.stopc:
		return 0, ErrStopped
	}
}

// followerReadIndexLocked turns the pending reads into a batch and returns
// the MsgReadIndex to send to the leader straight from the caller's
// goroutine: a follower read then never waits for a Ready round, only for
// one round trip to the leader (which answers from its lease), and the
// answer is taken in HandleRaftMessage. This is the message raft itself
// would forward (a local message: no term). Up to maxFollowerReadBatches
// are in flight; reads arriving while that many are form the next one.
func (p *Peer) followerReadIndexLocked(now time.Time) *raftpb.Message {
	// Raft's own view of the leader: p.lead lags it by a Ready round.
	lead := p.rn.BasicStatus().Lead
	if len(p.reads.pending) == 0 || lead == 0 {
		return nil
	}
	id := p.newBatchLocked(now)
	return &raftpb.Message{Type: raftpb.MsgReadIndex, From: p.id, To: lead, Entries: []raftpb.Entry{{Data: p.readCtx(id)}}}
}

// newBatchLocked moves the pending reads into a new in-flight batch.
func (p *Peer) newBatchLocked(now time.Time) uint64 {
	if p.reads.inflight == nil {
		p.reads.inflight = make(map[uint64]*readBatch)
	}
	p.reads.nextID++
	id := p.reads.nextID
	p.reads.inflight[id] = &readBatch{term: p.rn.BasicStatus().Term, issued: now, waiters: p.reads.pending}
	p.reads.pending = nil
	p.store.stats.readIndexBatches.Add(1)
	return id
}

// takeReadIndexRespLocked resolves a follower's batch from the leader's
// answer without a Ready round. The answer counts only if it comes from the
// leader of the current term; otherwise raft gets to judge it. It returns
// the next batch to send, if reads queued up meanwhile.
func (p *Peer) takeReadIndexRespLocked(m raftpb.Message, now time.Time) (next *raftpb.Message, ok bool) {
	if m.Type != raftpb.MsgReadIndexResp || len(m.Entries) != 1 || p.isLeaderLocked() ||
		m.From != p.rn.BasicStatus().Lead || m.Term != p.rn.BasicStatus().Term {
		return nil, false
	}
	p.onReadStatesLocked([]raft.ReadState{{Index: m.Index, RequestCtx: m.Entries[0].Data}})
	if len(p.reads.inflight) < maxFollowerReadBatches {
		next = p.followerReadIndexLocked(now)
	}
	return next, true
}

// issueReadsLocked sends the pending reads as one ReadIndex batch. A
// renewal with no waiters is issued the same way when the lease runs low.
//
// A follower sends its batch straight to the leader (returned, for the
// caller to send once unlocked), and only while fewer than
// maxFollowerReadBatches are in flight.
func (p *Peer) issueReadsLocked(now time.Time, renew bool) (direct *raftpb.Message) {
	switch decideIssue(len(p.reads.pending), renew, p.isLeaderLocked(), p.rn.BasicStatus().Lead != 0, len(p.reads.inflight)) {
	case issueFail:
		p.failPendingReadsLocked(p.notLeaderLocked())
	case issueFollower:
		return p.followerReadIndexLocked(now)
	case issueLeader:
		p.rn.ReadIndex(p.readCtx(p.newBatchLocked(now)))
	}
	return nil
}

// readIssue is what a round does with the queued reads.
type readIssue int

const (
	issueNone     readIssue = iota // nothing queued, or wait for a batch in flight to come back
	issueFail                      // a follower that knows no leader: nobody to ask
	issueFollower                  // a follower sends a batch to its leader
	issueLeader                    // the leader starts a batch (raft's ReadIndex: one heartbeat round)
)

var readIssueNames = map[readIssue]string{issueNone: "none", issueFail: "fail", issueFollower: "follower", issueLeader: "leader"}

func (r readIssue) String() string { return readIssueNames[r] }

// decideIssue is issueReadsLocked's rule, a pure function
// (testdata/readindex.txt). A leader issues a batch whenever reads wait or
// its lease needs the heartbeat round a ReadIndex brings (renew), one per
// round; a follower sends its pending reads to the leader, keeping at most
// maxFollowerReadBatches in flight, and fails them when it knows no leader.
func decideIssue(pending int, renew, leader, knowsLeader bool, inflight int) readIssue {
	switch {
	case pending == 0 && !renew:
		return issueNone
	case leader:
		return issueLeader
	case !knowsLeader:
		return issueFail
	case inflight >= maxFollowerReadBatches:
		return issueNone
	}
	return issueFollower
}

// onReadStatesLocked resolves batches answered in this Ready.
func (p *Peer) onReadStatesLocked(states []raft.ReadState) {
	for _, rs := range states {
		id, mine := p.batchOf(rs.RequestCtx)
		if !mine {
			p.store.stats.readIndexAnswersRefused.Add(1)
			continue
		}
		b, ok := p.reads.inflight[id]
		if !ok {
			continue
		}
		delete(p.reads.inflight, id)
		p.store.stats.observeReadIndexRTT(p.store.now().Sub(b.issued))
		// A ReadState on the leader means a quorum acked a heartbeat round
		// sent after the batch was issued: that renews the lease.
		p.extendLeaseLocked(b.term, b.issued)
		for _, w := range b.waiters {
			w <- readResult{index: rs.Index}
		}
	}
}

// failReadsLocked fails every in-flight and pending read: after a leader or
// term change their ReadIndex may never be answered.
func (p *Peer) failReadsLocked(err error) {
	for id, b := range p.reads.inflight {
		for _, w := range b.waiters {
			w <- readResult{err: err}
		}
		delete(p.reads.inflight, id)
	}
	p.failPendingReadsLocked(err)
}

func (p *Peer) failPendingReadsLocked(err error) {
	for _, w := range p.reads.pending {
		w <- readResult{err: err}
	}
	p.reads.pending = nil
}

// expireReadsLocked fails batches that waited longer than timeout: a
// forwarded MsgReadIndex or its answer can be lost on the network.
func (p *Peer) expireReadsLocked(now time.Time, timeout time.Duration) {
	for id, b := range p.reads.inflight {
		if now.Sub(b.issued) < timeout {
			continue
		}
		// The next tick's loop round sends what queued behind it.
		for _, w := range b.waiters {
			w <- readResult{err: fmt.Errorf("read index of region %d timed out: %w", p.regionID, ErrProposalDropped)}
		}
		delete(p.reads.inflight, id)
	}
}

// answerReadIndexFromLeaseLocked lets a leader with a valid lease answer a
// follower's forwarded ReadIndex at once with its commit index, instead of
// a heartbeat round: the lease already proves no other leader exists.
func (p *Peer) answerReadIndexFromLeaseLocked(m raftpb.Message, now time.Time) (raftpb.Message, bool) {
	if m.Type != raftpb.MsgReadIndex || m.From == p.id || !p.leaseValidLocked(now) {
		return raftpb.Message{}, false
	}
	return raftpb.Message{
		Type:    raftpb.MsgReadIndexResp,
		To:      m.From,
		From:    p.id,
		Term:    p.term,
		Index:   p.rn.BasicStatus().Commit,
		Entries: m.Entries,
	}, true
}
