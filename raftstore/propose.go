package raftstore

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Put writes key=value through raft; it returns once applied on this leader.
func (s *Store) Put(ctx context.Context, opts WriteOptions, key, value []byte) error {
	return s.propose(ctx, opts, command{op: opPut, key: key, value: value})
}

// Delete removes key through raft.
func (s *Store) Delete(ctx context.Context, opts WriteOptions, key []byte) error {
	return s.propose(ctx, opts, command{op: opDelete, key: key})
}

// Propose runs an Applier's command (Config.Applier, applier.go) through
// the raft log of the region holding key and returns the Applier's result
// once the command is applied on this leader. key routes it as a Put's key
// does (opts.RegionID and opts.Epoch as for Put), and must still lie in the
// region when the entry applies; payload is the Applier's alone.
//
// An error means no result: the command may still have been applied (a
// NotLeader after it was appended, a ctx that ended while it committed),
// and Propose does not deduplicate, so opts.RequestID must be 0: the
// Applier makes retries harmless (see Applier). Refused with ErrNoApplier
// when the store has no Applier.
//
// With opts.Forward a follower takes the command too (see WriteOptions)
// and returns the result of its own apply, which is the leader's: applies
// are deterministic. It waits at most forwardWait for it, as etcd bounds
// a request: a leader may drop a forwarded proposal without a word (over
// its uncommitted-size limit; one dropped during a leadership transfer
// is held for the next leader, heldprops.go).
func (s *Store) Propose(ctx context.Context, opts WriteOptions, key []byte, payload []byte) ([]byte, error) {
	if s.cfg.Applier == nil {
		return nil, ErrNoApplier
	}
	if opts.RequestID != 0 {
		return nil, fmt.Errorf("%w: Propose does not deduplicate: RequestID must be 0", ErrInvalidRequest)
	}
	return s.proposeResult(ctx, opts, command{op: opApply, key: key, value: payload})
}

// proposeResult queues cmd and waits for the result of its apply (see
// waitResult).
func (s *Store) proposeResult(ctx context.Context, opts WriteOptions, cmd command) ([]byte, error) {
	done := make(chan proposalResult, 1)
	var fwd bool
	p, id, err := s.queueProposal(opts, cmd, func(pr *proposal) {
		pr.results = append(pr.results, done)
		fwd = pr.forwarded
	})
	if err != nil {
		return nil, err
	}
	return s.waitResult(ctx, p, id, fwd, done)
}

// forwardable: the commands a follower may forward to its leader
// (WriteOptions.Forward). Put and Delete deduplicate on the leader and are
// never forwarded; these have no request ID a retry could join. A merge's
// are forwarded because its coordinator need lead neither region
// (merge.go).
func forwardable(op cmdOp) bool {
	switch op {
	case opApply, opAllocRegionID, opPrepareMerge, opCommitMerge, opAbortMerge, opRollbackMerge:
		return true
	}
	return false
}

// waitResult waits for the result of proposal id queued on p; a forwarded
// one (fwd) is waited for at most forwardWait.
func (s *Store) waitResult(ctx context.Context, p *Peer, id uint64, fwd bool, done <-chan proposalResult) ([]byte, error) {
	var bound <-chan time.Time
	if fwd {
		t := time.NewTimer(s.forwardWait())
		defer t.Stop()
		bound = t.C
	}
	select {
	case r := <-done:
		return r.result, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("region %d: wait for apply: %w", p.regionID, ctx.Err())
	case <-bound:
		s.dropProposal(p, id)
		return nil, fmt.Errorf("region %d: %w: a forwarded proposal was not applied here within %v", p.regionID, ErrMaybeApplied, s.forwardWait())
	case <-s.stopc:
		return nil, ErrStopped
	}
}

// forwardWait bounds the wait for a forwarded proposal: etcd's request
// timeout (5 s plus two election timeouts).
func (s *Store) forwardWait() time.Duration {
	return 5*time.Second + 2*time.Duration(s.cfg.ElectionTicks)*s.cfg.TickInterval
}

// dropProposal forgets proposal id of p, if still pending, and fails it.
func (s *Store) dropProposal(p *Peer, id uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr, ok := p.proposals[id]; ok {
		delete(p.proposals, id)
		pr.finish(ErrMaybeApplied)
	}
}

// propose appends cmd to the region's log and waits until it is applied.
func (s *Store) propose(ctx context.Context, opts WriteOptions, cmd command) error {
	done := make(chan error, 1)
	p, _, err := s.queueProposal(opts, cmd, func(pr *proposal) { pr.waiters = append(pr.waiters, done) })
	if err != nil {
		return err
	}
	return s.waitProposal(ctx, p, done)
}

// queueProposal routes cmd and, on the region's leader (or on a follower
// that knows its leader, for a forwarded Propose), queues it for the
// loop's next round with the waiter wait adds to its proposal; a request
// ID already in flight here only gains the waiter (a retry joins it). It
// returns the peer to wait on and the request ID.
func (s *Store) queueProposal(opts WriteOptions, cmd command, wait func(*proposal)) (*Peer, uint64, error) {
	if err := s.diskError(); err != nil {
		return nil, 0, err
	}
	p, err := s.route(opts.RegionID, opts.Epoch, cmd.key)
	if err != nil {
		return nil, 0, err
	}
	return s.queueOn(p, opts, cmd, wait)
}

// queueOn is queueProposal on a peer already routed to (a merge's
// commands go to a frozen region, which route refuses).
func (s *Store) queueOn(p *Peer, opts WriteOptions, cmd command, wait func(*proposal)) (*Peer, uint64, error) {
	cmd.id = opts.RequestID
	if cmd.id == 0 {
		cmd.id = s.nextRequestID()
	}
	p.mu.Lock()
	st := p.rn.BasicStatus()
	forward := false
	if st.RaftState != raft.StateLeader {
		// A follower forwards only what forwardable allows, and only to a
		// leader it knows: raft would drop the entry otherwise, and the
		// caller had better go elsewhere.
		if !opts.Forward || !forwardable(cmd.op) || p.lead == 0 || !p.initialized {
			err := p.notLeaderLocked()
			p.mu.Unlock()
			return nil, 0, err
		}
		forward = true
	}
	if pr, ok := p.proposals[cmd.id]; ok {
		// The same request is already in flight here: wait for it.
		wait(pr)
		p.mu.Unlock()
		return p, cmd.id, nil
	}
	// Queued, not stepped: the loop steps every queued write of the region
	// as one proposal at its next round (batchProposalsLocked). The time
	// taken here is before raft sees the entry, so a lease extended from it
	// (publish) starts no later than the round it proves.
	proposed := s.now()
	p.queued = append(p.queued, raftpb.Entry{Data: cmd.encode()})
	p.queuedIDs = append(p.queuedIDs, cmd.id)
	s.stats.proposals.Add(1)
	term := st.Term
	if forward {
		term = 0 // raft gives it a term at the leader
	}
	pr := &proposal{term: term, proposed: proposed, forwarded: forward}
	wait(pr)
	p.proposals[cmd.id] = pr
	p.mu.Unlock()
	s.markDirty(p)
	return p, cmd.id, nil
}

func (s *Store) waitProposal(ctx context.Context, p *Peer, done <-chan error) error {
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("region %d: wait for apply: %w", p.regionID, ctx.Err())
	case <-s.stopc:
		return ErrStopped
	}
}
