package raftstore

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

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

	// SnapshotsFailed: snapshot sends reported failed to raft (it sends
	// another); SnapshotBuildErrors: snapshot builds that failed.
	SnapshotsFailed, SnapshotBuildErrors uint64

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
	// FollowerLeaseGrantsRefused: grants a follower here ignored because
	// they answered no request of its own instance (a late grant meant for
	// an earlier instance of the peer, or for a request it no longer
	// remembers).
	FollowerLeaseGrantsRefused uint64
	// FollowerLeaseCommitViolations counts commits a leader here made that
	// broke the follower-lease rule (an entry committed that a valid holder
	// had not acked, or an entry of a new term committed inside the
	// deferral). The leader checks every rise of its commit index; the
	// count must stay 0, and the specs and the nemesis assert it.
	FollowerLeaseCommitViolations uint64
	// MergeViolations counts merges committed here where the local replica
	// of the source had not applied its freeze (merge.go): the
	// coordinator's check rules it out, so it must stay 0.
	MergeViolations uint64
	// SplitsOverSnapshot counts splits applied here that found their new
	// region's snapshot under way and left the region to it (apply.go):
	// the snapshot claims rule it out (snapclaim.go), so it must stay 0.
	SplitsOverSnapshot uint64
	// ReadIndexAnswersRefused: ReadIndex answers that named another
	// instance of the peer (an answer to a batch of an instance that
	// restarted).
	ReadIndexAnswersRefused uint64
	// DiskFailures: rounds whose disk write failed, each freezing the store
	// until a write succeeded again (diskfail.go).
	DiskFailures uint64
	// BatchesRebuilt: uncommitted rounds lost with a failed round or
	// commit and rebuilt from the WAL before the store went on (storage/engine, batch.go).
	BatchesRebuilt uint64
	// WALRecords and WALSyncs: round-log records written, and those
	// fdatasynced (a record of commit indexes alone is not: storage/wal);
	// BatchCommits: commits of the rounds' shared bbolt transaction
	// (storage/engine, batch.go): every 20 ms of writes and at checkpoints;
	// PagesWritten: the bbolt pages those commits wrote.
	WALRecords, WALSyncs, BatchCommits, PagesWritten uint64
	// LeadershipsByTransfer and LeadershipsByElection count the times a
	// peer here became leader, by how: by a transfer (it won the campaign
	// that the previous leader's MsgTimeoutNow forced: a handover) or by
	// any other campaign (after an election timeout with no leader heard,
	// or a split-born region's first). Once a cluster has started and
	// split, a region whose leader stops without handing it over gets a
	// new leader only by an election, so the election count says how many
	// leaderships were lost rather than handed over.
	LeadershipsByTransfer, LeadershipsByElection uint64
	// HibernateRefusals counts, by the condition that failed, the times an
	// idle leader found it could not hibernate yet, or a follower refused
	// its leader's hibernate notice (hibernate.go). Wakes counts, by what
	// did it (a request, a notice, or a raft message's type), the times a
	// hibernating peer woke. Together they say what keeps regions awake.
	HibernateRefusals, Wakes map[string]uint64
}

type stats struct {
	readsLease, readsReadIndex, readsStale, readIndexBatches atomic.Uint64
	proposals, snapshotsBuilt, snapshotsApplied, readyRounds atomic.Uint64
	votesRefused, safePointsRefused                          atomic.Uint64
	readsFollowerLease, followerLeaseGrants                  atomic.Uint64
	followerLeaseGrantsRefused, followerLeaseViolations      atomic.Uint64
	readIndexAnswersRefused                                  atomic.Uint64
	mergeViolations                                          atomic.Uint64
	snapshotsRefusedOverlap, splitsOverSnapshot              atomic.Uint64
	diskFailures                                             atomic.Uint64
	leadersByTransfer, leadersByElection                     atomic.Uint64
	softStateChanges                                         atomic.Uint64 // LeaderChanges

	snapshotsFailed, snapshotBuildErrors atomic.Uint64
	// transferTerms maps a region ID to the term of the latest campaign its
	// peer here started because of a leadership transfer, until the peer
	// next becomes leader (countLeadershipLocked).
	transferTerms sync.Map // uint64 -> uint64
	// hook receives the measurements that are distributions, not counts.
	hook atomic.Pointer[MetricsHook]

	// hibMu guards the hibernation counters (Stats.HibernateRefusals,
	// Stats.Wakes): each counts only a change (a peer that could not
	// sleep, or woke), never a tick.
	hibMu             sync.Mutex
	refusals, wakeups map[string]uint64
}

func (s *stats) countRefusal(why string) {
	s.hibMu.Lock()
	if s.refusals == nil {
		s.refusals = make(map[string]uint64)
	}
	s.refusals[why]++
	s.hibMu.Unlock()
}

func (s *stats) countWake(cause string) {
	s.hibMu.Lock()
	if s.wakeups == nil {
		s.wakeups = make(map[string]uint64)
	}
	s.wakeups[cause]++
	s.hibMu.Unlock()
}

func (s *stats) hibernationCounts() (refusals, wakes map[string]uint64) {
	s.hibMu.Lock()
	defer s.hibMu.Unlock()
	return maps.Clone(s.refusals), maps.Clone(s.wakeups)
}

// Stats returns a snapshot of the counters.
func (s *Store) Stats() Stats {
	w := s.eng.WriteStats()
	refusals, wakes := s.stats.hibernationCounts()
	return Stats{
		HibernateRefusals: refusals, Wakes: wakes,
		WALRecords: w.WALRecords, WALSyncs: w.WALSyncs, BatchCommits: w.BatchCommits, PagesWritten: w.PagesWritten,
		BatchesRebuilt:    w.BatchesRebuilt,
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

		SnapshotsFailed:     s.stats.snapshotsFailed.Load(),
		SnapshotBuildErrors: s.stats.snapshotBuildErrors.Load(),

		ReadsFollowerLease:  s.stats.readsFollowerLease.Load(),
		FollowerLeaseGrants: s.stats.followerLeaseGrants.Load(),

		FollowerLeaseGrantsRefused:    s.stats.followerLeaseGrantsRefused.Load(),
		FollowerLeaseCommitViolations: s.stats.followerLeaseViolations.Load(),
		ReadIndexAnswersRefused:       s.stats.readIndexAnswersRefused.Load(),
		MergeViolations:               s.stats.mergeViolations.Load(),
		SplitsOverSnapshot:            s.stats.splitsOverSnapshot.Load(),
		DiskFailures:                  s.stats.diskFailures.Load(),

		LeadershipsByTransfer: s.stats.leadersByTransfer.Load(),
		LeadershipsByElection: s.stats.leadersByElection.Load(),
	}
}

// countLeadershipLocked is called with every Ready taken from p's raft,
// under p.mu. Raft does not say why a peer campaigned, but a campaign a
// transfer forces (MsgTimeoutNow) sends its vote requests with the
// CampaignTransfer context, and a peer campaigns at most once per term: a
// leadership won at the term of such a campaign was handed over, any other
// was won by an election. A peer that steps down and wins again between
// two Readys is not counted (raft reports no change of soft state).
func (p *Peer) countLeadershipLocked(rd *raft.Ready) {
	st := &p.store.stats
	for _, m := range rd.Messages {
		if m.Type == raftpb.MsgVote && bytes.Equal(m.Context, campaignTransfer) {
			st.transferTerms.Store(p.regionID, m.Term)
			break
		}
	}
	if rd.SoftState != nil {
		st.softStateChanges.Add(1)
	}
	if rd.SoftState == nil || rd.SoftState.RaftState != raft.StateLeader {
		return
	}
	if term, ok := st.transferTerms.LoadAndDelete(p.regionID); ok && term.(uint64) == p.rn.BasicStatus().Term {
		st.leadersByTransfer.Add(1)
	} else {
		st.leadersByElection.Add(1)
	}
}

// MetricsHook receives the measurements the store takes as they happen,
// those a histogram needs (counters and gauges are read through Stats and
// Gauges instead). It keeps raftstore free of any metrics library: the
// server turns these calls into Prometheus observations. The functions run
// on the Ready loop or under a peer's lock, so they must be quick, and safe
// for concurrent use; a nil field is skipped.
type MetricsHook struct {
	// ReadIndexRTT is the time from issuing a ReadIndex batch (a leader's
	// heartbeat round, or a follower's MsgReadIndex to its leader) to its
	// answer, once per batch whatever the number of reads it carries.
	ReadIndexRTT func(time.Duration)
	// WriteTx is how long one Ready round's bbolt write transaction took,
	// fsync included: the group commit every write waits for.
	WriteTx func(time.Duration)
}

// SetMetricsHook installs h; it may be called at any time.
func (s *Store) SetMetricsHook(h MetricsHook) { s.stats.hook.Store(&h) }

func (s *stats) observeReadIndexRTT(d time.Duration) {
	if h := s.hook.Load(); h != nil && h.ReadIndexRTT != nil {
		h.ReadIndexRTT(d)
	}
}

func (s *stats) observeWriteTx(d time.Duration) {
	if h := s.hook.Load(); h != nil && h.WriteTx != nil {
		h.WriteTx(d)
	}
}

// Gauges are the store's state right now, summed over the regions it hosts
// (placeholders of regions not yet initialized are not counted).
type Gauges struct {
	Regions     int // regions with an initialized peer here
	Leaders     int // of them, those this store leads (as of their last Ready)
	Hibernating int // of them, those whose peer stopped ticking (hibernate.go)
	// ApplyLagSum and ApplyLagMax are commit index minus applied index,
	// in entries, summed and at most over the regions: entries known
	// committed that this store has not applied yet.
	ApplyLagSum, ApplyLagMax uint64
	// DBFileBytes is the size of the bbolt file; 0 if it cannot be read.
	DBFileBytes int64
}

// Gauges computes the gauges; it takes every peer's lock in turn.
func (s *Store) Gauges() Gauges {
	var g Gauges
	for _, p := range s.allPeers() {
		p.mu.Lock()
		if p.initialized && !p.removed {
			g.Regions++
			if p.leading {
				g.Leaders++
			}
			if p.hibernating {
				g.Hibernating++
			}
			if p.commit > p.applied {
				lag := p.commit - p.applied
				g.ApplyLagSum += lag
				g.ApplyLagMax = max(g.ApplyLagMax, lag)
			}
		}
		p.mu.Unlock()
	}
	// The file, not bbolt's own stats: its size is what fills the disk,
	// free pages included.
	if fi, err := os.Stat(s.eng.DBPath()); err == nil {
		g.DBFileBytes = fi.Size()
	}
	return g
}

// DiskError is the wrapped ErrDiskFailed while the store's disk is failed
// (diskfail.go), nil otherwise: health checks report the store not ready
// while it is set.
func (s *Store) DiskError() error { return s.diskError() }

// CaughtUp reports whether every region this store hosts knows a leader
// and has applied everything it knows to be committed: a follower learns
// the commit index from its leader's messages, so once it has heard from
// the leader of every region and applied up to that index, it serves
// follower reads without a long wait and counts fully in every quorum.
// Otherwise it says, in one line, which region is not there yet. A store
// with no regions is caught up.
//
// It reads each peer's state under its lock and nothing more (no
// RegionStatus, no sort): a restarting store is polled every 50 ms until
// it is ready, and a full Regions() each time was most of the CPU of a
// 10,000-region store catching up. The region that failed the last call
// is looked at first, so a poll while it lags costs one peer.
func (s *Store) CaughtUp() (bool, string) {
	if p, ok := s.peer(s.lagging.Load()); ok {
		if why := p.notCaughtUp(); why != "" {
			return false, why
		}
	}
	for _, p := range s.allPeers() {
		if why := p.notCaughtUp(); why != "" {
			s.lagging.Store(p.regionID)
			return false, why
		}
	}
	return true, ""
}

// notCaughtUp says why an initialized peer is not caught up ("" if it is,
// or is not initialized: CaughtUp).
func (p *Peer) notCaughtUp() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.initialized:
		return ""
	case p.lead == 0:
		return fmt.Sprintf("region %d knows no leader", p.regionID)
	case p.applied < p.commit:
		return fmt.Sprintf("region %d applied %d of %d committed entries", p.regionID, p.applied, p.commit)
	}
	return ""
}

// LeaderChanges counts the changes of leader or role raft reported of any
// peer of this store: a digest of who leads what that costs nothing to
// read, where one built from every region costs a scan of them all.
func (s *Store) LeaderChanges() uint64 { return s.stats.softStateChanges.Load() }

// Summary is what the cluster view asks of every store every second: the
// counts and the stores named as replicas, without a RegionStatus per
// region (Regions), whose cost grows with the regions hosted.
type Summary struct {
	Regions, Leaders int // as len(Regions()) counts them; leaders as of their last Ready
	// ReplicaStores are the stores some region here names as a replica, in
	// order.
	ReplicaStores []uint64
}

// Summary returns the summary. Each store's cluster view asks it every
// second, and on an idle store of 10,000 regions computing it (a lock of
// every peer in turn) was a third of the store's CPU: it is computed
// again only after something it counts changed (summaryChanged).
func (s *Store) Summary() Summary {
	gen := s.summaryGen.Load()
	s.summaryMu.Lock()
	if s.summary != nil && s.summaryAt == gen {
		sum := *s.summary
		s.summaryMu.Unlock()
		sum.ReplicaStores = slices.Clone(sum.ReplicaStores)
		return sum
	}
	s.summaryMu.Unlock()
	sum := s.computeSummary()
	// The cache keeps a copy of its own: the caller may change what it
	// is given, and readers copy the cached one under summaryMu only.
	cached := sum
	cached.ReplicaStores = slices.Clone(sum.ReplicaStores)
	s.summaryMu.Lock()
	s.summary, s.summaryAt = &cached, gen
	s.summaryMu.Unlock()
	return sum
}

// summaryChanged is called after every change Summary counts: a peer
// hosted or gone, initialized, taking or losing the lead, or its region's
// replicas changed. A Summary computed before it is not used after.
func (s *Store) summaryChanged() { s.summaryGen.Add(1) }

// computeSummary takes every peer's lock in turn, as briefly as Gauges.
func (s *Store) computeSummary() Summary {
	var sum Summary
	stores := map[uint64]bool{}
	for _, p := range s.allPeers() {
		p.mu.Lock()
		if p.initialized {
			sum.Regions++
			if p.leading {
				sum.Leaders++
			}
			for _, rp := range p.region.Peers {
				stores[rp.StoreID] = true
			}
		}
		p.mu.Unlock()
	}
	sum.ReplicaStores = slices.Sorted(maps.Keys(stores))
	return sum
}
