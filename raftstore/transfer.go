package raftstore

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/tracker"

	"github.com/hedgekv/hedgekv/region"
)

// Leadership transfer: the leader waits for its target to catch up, then
// revokes its lease and the follower leases it granted, fails queued
// ReadIndex reads, and asks raft to transfer; it retries after every
// election timeout until the target leads.

// TransferLeader asks the leader of regionID (on this store) to hand
// leadership to its peer on toStoreID, and waits until it has moved or ctx
// ends. The lease is revoked before the transfer starts.
func (s *Store) TransferLeader(ctx context.Context, regionID, toStoreID uint64) error {
	p, ok := s.peer(regionID)
	if !ok {
		return &region.RegionNotFoundError{RegionID: regionID}
	}
	s.touch(p, wakeAdmin)
	p.mu.Lock()
	target, ok := p.region.PeerOnStore(toStoreID)
	if !ok {
		p.mu.Unlock()
		return fmt.Errorf("region %d has no peer on store %d: %w", regionID, toStoreID, ErrInvalidRequest)
	}
	if target.ID == p.id && p.isLeaderLocked() {
		p.mu.Unlock()
		return nil
	}
	// Not the leader, even when this store is the target (the caller's
	// view of the leader is stale): NotLeader with the hint sends the
	// request to the store that can make the transfer.
	if !p.isLeaderLocked() {
		err := p.notLeaderLocked()
		p.mu.Unlock()
		return err
	}
	p.mu.Unlock()
	// The retry follows raft's election timeout, so it is on the store's
	// clock; the poll only paces a look at state, so it is real time.
	retry := s.cfg.Clock.NewTicker(time.Duration(s.cfg.ElectionTicks) * s.cfg.TickInterval)
	defer retry.Stop()
	poll := time.NewTicker(s.cfg.TickInterval / 2)
	defer poll.Stop()
	defer func() {
		p.mu.Lock()
		p.transferring = false
		p.mu.Unlock()
	}()
	start := true
	for {
		p.mu.Lock()
		if p.lead == target.ID {
			p.mu.Unlock()
			return nil
		}
		if start && p.isLeaderLocked() && !p.transfereeCaughtUpLocked(target.ID) {
			// Raft drops every proposal while a transfer is pending, up to
			// an election timeout per attempt: a target far behind would
			// stall the region's writes for as long as it lags (seen at
			// scale: 40 s). Start once it has caught up, as TiKV does.
			p.mu.Unlock()
			select {
			case <-ctx.Done():
				return fmt.Errorf("transfer leader of region %d to store %d: target has not caught up: %w", regionID, toStoreID, ctx.Err())
			case <-s.stopc:
				return ErrStopped
			case <-poll.C:
			}
			continue
		}
		if start && p.isLeaderLocked() {
			p.transferring = true
			p.revokeLeaseLocked()
			// No read may join a ReadIndex batch while the transfer runs
			// (tikv#4680): fail what is queued; clients retry.
			p.failPendingReadsLocked(p.notLeaderLocked())
			// Holders stop serving now rather than at expiry; the new
			// leader's deferral is what makes either safe.
			revokes := p.revokeNoticesLocked(s.now())
			p.rn.TransferLeader(target.ID)
			p.mu.Unlock()
			for _, n := range revokes {
				s.sendNotice(p, n)
			}
			s.markDirty(p)
		} else {
			// Stepped down: wait until we hear who leads now.
			p.mu.Unlock()
		}
		start = false
		select {
		case <-ctx.Done():
			return fmt.Errorf("transfer leader of region %d to store %d: %w", regionID, toStoreID, ctx.Err())
		case <-s.stopc:
			return ErrStopped
		case <-retry.C():
			// Raft abandons a transfer after an election timeout; try again.
			start = true
		case <-poll.C:
		}
	}
}

// maxTransferLag is how many entries a transfer target may lag the
// leader's log when the transfer starts (TiKV's leader_transfer_max_log_lag):
// it catches up within the transfer, so writes pause only briefly.
const maxTransferLag = 128

// transfereeCaughtUpLocked reports whether peer id is within
// maxTransferLag entries of this leader's log and not waiting for a
// snapshot. It is polled every half tick while a transfer waits: it walks
// the progress in place rather than copying it (Status).
func (p *Peer) transfereeCaughtUpLocked(id uint64) bool {
	var target tracker.Progress
	var selfMatch uint64
	found, foundSelf := false, false
	p.rn.WithProgress(func(pid uint64, _ raft.ProgressType, pr tracker.Progress) {
		switch pid {
		case id:
			target, found = pr, true
		case p.id:
			selfMatch, foundSelf = pr.Match, true
		}
	})
	if !found || !foundSelf {
		return false
	}
	return target.State != tracker.StateSnapshot && target.Match+maxTransferLag >= selfMatch
}
