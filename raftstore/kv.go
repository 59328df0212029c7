package raftstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/raft/v3"
)

// route finds the peer a request is for and checks its epoch and key.
// regionID 0 means "the region holding key on this store".
func (s *Store) route(regionID uint64, epoch region.Epoch, key []byte) (*Peer, error) {
	if s.stopped() {
		return nil, ErrStopped
	}
	if regionID == 0 {
		s.mu.RLock()
		r, ok := s.ranges.Lookup(key)
		s.mu.RUnlock()
		if !ok {
			return nil, &region.RegionNotFoundError{}
		}
		regionID = r.ID
	}
	p, ok := s.peer(regionID)
	if !ok {
		return nil, &region.RegionNotFoundError{RegionID: regionID}
	}
	p.mu.Lock()
	if !p.initialized || p.removed {
		p.mu.Unlock()
		return nil, &region.RegionNotFoundError{RegionID: regionID}
	}
	err := p.checkLocked(epoch, key)
	p.mu.Unlock()
	var en *region.EpochNotMatchError
	if errors.As(err, &en) {
		// Also name the region that holds the key now, so the client can
		// route there without another round trip.
		s.mu.RLock()
		if cur, ok := s.ranges.Lookup(key); ok && cur.ID != regionID {
			en.Current = append(en.Current, cur.Clone())
		}
		s.mu.RUnlock()
	}
	if err != nil {
		return nil, err
	}
	s.touch(p)
	return p, nil
}

// checkLocked refuses a request routed with another epoch or for a key
// outside the region. A zero epoch skips the epoch check (CLI, tests).
func (p *Peer) checkLocked(epoch region.Epoch, key []byte) error {
	if epoch != (region.Epoch{}) && epoch != p.region.Epoch {
		return &region.EpochNotMatchError{RegionID: p.regionID, Current: []region.Region{p.region.Clone()}}
	}
	if !p.region.Contains(key) {
		return &region.KeyNotInRegionError{Key: key, RegionID: p.regionID, StartKey: p.region.StartKey, EndKey: p.region.EndKey}
	}
	return nil
}

// prepareRead decides how p may serve a linearizable read and waits until
// it can: at once under a valid leader lease, otherwise after a ReadIndex
// round and until the peer has applied that index. A follower serves only
// when the request allows replica reads; otherwise it says NotLeader.
//
// A bounded-staleness read (MaxStaleness > 0) that finds no valid lease is
// served from local state when a safe point proves it fresh enough (see
// stale.go); otherwise a follower answers DataIsNotReady and a leader falls
// back to ReadIndex.
func (s *Store) prepareRead(ctx context.Context, p *Peer, opts ReadOptions) (ReadInfo, error) {
	info := ReadInfo{StoreID: s.cfg.StoreID, PeerID: p.id}
	now := time.Now()
	p.mu.Lock()
	if p.leaseValidLocked(now) {
		// The lease stands in for the ReadIndex round trip, not for the
		// index: the read must still see everything committed so far.
		// Followers may apply a commit before the leader does (it tells them
		// while it persists), so wait for the leader's own apply.
		p.readsSinceRenew = true
		renew := p.leaseNeedsRenewLocked(now)
		applied := p.waitAppliedLocked(p.rn.BasicStatus().Commit)
		p.mu.Unlock()
		if renew {
			s.markDirty(p)
		}
		if err := s.waitApplied(ctx, p, applied); err != nil {
			return info, err
		}
		info.Mode = ReadModeLease
		s.stats.readsLease.Add(1)
		return info, nil
	}
	leader := p.isLeaderLocked()
	if opts.MaxStaleness > 0 {
		bound, err := p.staleReadLocked(now, opts.MaxStaleness)
		if err == nil {
			p.mu.Unlock()
			s.stats.readsStale.Add(1)
			info.Mode, info.StalenessBound = ReadModeStale, bound
			return info, nil
		}
		if !leader {
			p.mu.Unlock()
			return info, err
		}
	}
	if !leader && !opts.ReplicaRead {
		err := p.notLeaderLocked()
		p.mu.Unlock()
		return info, err
	}
	p.mu.Unlock()

	idx, err := s.readIndex(ctx, p)
	if err != nil {
		return info, err
	}
	p.mu.Lock()
	applied := p.waitAppliedLocked(idx)
	p.mu.Unlock()
	if err := s.waitApplied(ctx, p, applied); err != nil {
		return info, err
	}
	info.Mode = ReadModeReadIndex
	s.stats.readsReadIndex.Add(1)
	return info, nil
}

// waitApplied waits for a channel from waitAppliedLocked.
func (s *Store) waitApplied(ctx context.Context, p *Peer, applied <-chan struct{}) error {
	select {
	case <-applied:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("region %d: wait for apply: %w", p.regionID, ctx.Err())
	case <-s.stopc:
		return ErrStopped
	}
}

// Get reads one key. found is false for a missing key.
func (s *Store) Get(ctx context.Context, opts ReadOptions, key []byte) (value []byte, found bool, info ReadInfo, err error) {
	p, err := s.route(opts.RegionID, opts.Epoch, key)
	if err != nil {
		return nil, false, info, err
	}
	if info, err = s.prepareRead(ctx, p, opts); err != nil {
		return nil, false, info, err
	}
	value, found, err = s.eng.get(key)
	if err != nil {
		return nil, false, info, fmt.Errorf("get: %w", err)
	}
	if err := s.stillHolds(p); err != nil {
		return nil, false, info, err
	}
	return value, found, info, nil
}

// BatchGet reads several keys of one region; missing keys are left out.
func (s *Store) BatchGet(ctx context.Context, opts ReadOptions, keys [][]byte) ([]KV, ReadInfo, error) {
	if len(keys) == 0 {
		return nil, ReadInfo{StoreID: s.cfg.StoreID}, nil
	}
	p, err := s.route(opts.RegionID, opts.Epoch, keys[0])
	if err != nil {
		return nil, ReadInfo{}, err
	}
	p.mu.Lock()
	for _, k := range keys[1:] {
		if err := p.checkLocked(opts.Epoch, k); err != nil {
			p.mu.Unlock()
			return nil, ReadInfo{}, err
		}
	}
	p.mu.Unlock()
	info, err := s.prepareRead(ctx, p, opts)
	if err != nil {
		return nil, info, err
	}
	kvs, err := s.eng.batchGet(keys)
	if err != nil {
		return nil, info, fmt.Errorf("batch get: %w", err)
	}
	if err := s.stillHolds(p); err != nil {
		return nil, info, err
	}
	return kvs, info, nil
}

// Scan reads [start, end) clamped to the region holding start (or
// opts.RegionID), at most limit pairs, in key order. It also returns the
// region so the caller knows where to continue.
func (s *Store) Scan(ctx context.Context, opts ReadOptions, start, end []byte, limit int) ([]KV, region.Region, ReadInfo, error) {
	p, err := s.route(opts.RegionID, opts.Epoch, start)
	if err != nil {
		return nil, region.Region{}, ReadInfo{}, err
	}
	info, err := s.prepareRead(ctx, p, opts)
	if err != nil {
		return nil, region.Region{}, info, err
	}
	p.mu.Lock()
	r := p.region.Clone()
	p.mu.Unlock()
	lo, hi, ok := r.ClampRange(start, end)
	if !ok || limit <= 0 {
		return nil, r, info, nil
	}
	kvs, err := s.eng.scan(lo, hi, limit)
	if err != nil {
		return nil, r, info, fmt.Errorf("scan: %w", err)
	}
	if err := s.stillHolds(p); err != nil {
		return nil, r, info, err
	}
	return kvs, r, info, nil
}

// stillHolds is checked after a read: it fails if p was removed from its
// region meanwhile. destroyPeer marks the peer removed before it deletes
// the range from the engine, so a read whose engine transaction began after
// that delete always sees the mark here, and never answers "no such key"
// for keys the region holds. (A read applied up to its read index before
// the removal is otherwise linearizable; only the vanishing data is wrong.)
func (s *Store) stillHolds(p *Peer) error {
	if p.isRemoved() {
		return &region.RegionNotFoundError{RegionID: p.regionID}
	}
	return nil
}

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
	proposed := time.Now()
	if err := p.rn.Propose(cmd.encode()); err != nil {
		p.mu.Unlock()
		return fmt.Errorf("region %d: %w (%v)", p.regionID, ErrProposalDropped, err)
	}
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
