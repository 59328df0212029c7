package raftstore

import "sync/atomic"

// Stats are the store's cumulative counters, for metrics and for tests that
// must know which path served something.
type Stats struct {
	ReadsLease       uint64 // reads served from the leader lease
	ReadsReadIndex   uint64 // reads served after a ReadIndex round (leader or follower)
	ReadsStale       uint64 // bounded-staleness local reads
	ReadIndexBatches uint64 // ReadIndex requests issued (each may carry many reads)
	Proposals        uint64
	SnapshotsBuilt   uint64
	SnapshotsApplied uint64
	ReadyRounds      uint64 // loop rounds that persisted something (= bbolt commits)
	// VotesRefused: vote requests ignored because the peer may have
	// forgotten a leader it acked (votes.go).
	VotesRefused uint64
	// SafePointsRefused: safe points from a clock further ahead than
	// MaxClockOffset allows (stale.go).
	SafePointsRefused uint64
	// ReadsFollowerLease: reads a follower served from its read lease;
	// FollowerLeaseGrants: leases this store's followers took (renewals of
	// a valid lease not counted).
	ReadsFollowerLease, FollowerLeaseGrants uint64
	// DiskFailures: rounds whose disk write failed, each freezing the store
	// until a write succeeded again (diskfail.go).
	DiskFailures uint64
}

type stats struct {
	readsLease, readsReadIndex, readsStale, readIndexBatches atomic.Uint64
	proposals, snapshotsBuilt, snapshotsApplied, readyRounds atomic.Uint64
	votesRefused, safePointsRefused                          atomic.Uint64
	readsFollowerLease, followerLeaseGrants                  atomic.Uint64
	diskFailures                                             atomic.Uint64
}

// Stats returns a snapshot of the counters.
func (s *Store) Stats() Stats {
	return Stats{
		ReadsLease:        s.stats.readsLease.Load(),
		ReadsReadIndex:    s.stats.readsReadIndex.Load(),
		ReadsStale:        s.stats.readsStale.Load(),
		ReadIndexBatches:  s.stats.readIndexBatches.Load(),
		Proposals:         s.stats.proposals.Load(),
		SnapshotsBuilt:    s.stats.snapshotsBuilt.Load(),
		SnapshotsApplied:  s.stats.snapshotsApplied.Load(),
		ReadyRounds:       s.stats.readyRounds.Load(),
		VotesRefused:      s.stats.votesRefused.Load(),
		SafePointsRefused: s.stats.safePointsRefused.Load(),

		ReadsFollowerLease:  s.stats.readsFollowerLease.Load(),
		FollowerLeaseGrants: s.stats.followerLeaseGrants.Load(),
		DiskFailures:        s.stats.diskFailures.Load(),
	}
}
