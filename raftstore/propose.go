package raftstore

import (
	"context"
	"fmt"

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

// propose appends cmd to the region's log and waits until it is applied.
func (s *Store) propose(ctx context.Context, opts WriteOptions, cmd command) error {
	if err := s.diskError(); err != nil {
		return err
	}
	p, err := s.route(opts.RegionID, opts.Epoch, cmd.key)
	if err != nil {
		return err
	}
	cmd.id = opts.RequestID
	if cmd.id == 0 {
		cmd.id = s.nextRequestID()
	}
	done := make(chan error, 1)
	p.mu.Lock()
	st := p.rn.BasicStatus()
	if st.RaftState != raft.StateLeader {
		err := p.notLeaderLocked()
		p.mu.Unlock()
		return err
	}
	if pr, ok := p.proposals[cmd.id]; ok {
		// The same request is already in flight here: wait for it.
		pr.waiters = append(pr.waiters, done)
		p.mu.Unlock()
		return s.waitProposal(ctx, p, done)
	}
	// Queued, not stepped: the loop steps every queued write of the region
	// as one proposal at its next round (batchProposalsLocked). The time
	// taken here is before raft sees the entry, so a lease extended from it
	// (publish) starts no later than the round it proves.
	proposed := s.now()
	p.queued = append(p.queued, raftpb.Entry{Data: cmd.encode()})
	p.queuedIDs = append(p.queuedIDs, cmd.id)
	s.stats.proposals.Add(1)
	p.proposals[cmd.id] = &proposal{term: st.Term, proposed: proposed, waiters: []chan error{done}}
	p.mu.Unlock()
	s.markDirty(p)
	return s.waitProposal(ctx, p, done)
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
