package raftstore

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Raft's own bootstrap values: region 1 starts from a virtual snapshot at
// this index and term on every initial store, so all of them agree on the
// log's origin without exchanging anything (as TiKV does).
const (
	raftInitIndex = 5
	raftInitTerm  = 5
)

// Store hosts the region peers of one process and runs their Ready loop.
type Store struct {
	cfg   Config
	log   *slog.Logger
	eng   *engine.Engine
	trans Transport

	mu     sync.RWMutex
	peers  map[uint64]*Peer // by region ID
	ranges region.Tree      // regions by key, for requests without a region ID
	// snapClaims: the ranges of snapshots admitted for regions not
	// initialized here, by region ID (snapclaim.go).
	snapClaims map[uint64][]*snapClaim
	// shapeMu orders a snapshot's admission (claimSnapshot) against a
	// round's publish of changed ranges and split-born regions. Taken
	// before mu, never under it or a peer's mu, and not held across a
	// send (the in-memory transport delivers on the sender's goroutine).
	shapeMu sync.Mutex

	dirtyMu sync.Mutex
	dirty   map[uint64]*Peer
	wakec   chan struct{}
	// awake are the peers not hibernating: the ones a tick visits
	// (hibernate.go). awakeMu is taken under a peer's mu, never the
	// other way.
	awakeMu sync.Mutex
	awake   map[*Peer]struct{}
	// awakePeak is the most peers awake has held since it was last
	// copied small (awakePeers).
	awakePeak int
	// lagging is the region CaughtUp last found not caught up.
	lagging atomic.Uint64
	// summaryGen counts the changes Summary reads (peers hosted, their
	// initialization, role and replicas: summaryChanged), and summary is
	// the last one computed, at summaryAt.
	summaryGen atomic.Uint64
	summaryMu  sync.Mutex
	summary    *Summary
	summaryAt  uint64

	stats stats
	snaps *snapshots // snapshot sources and received files (snapstream.go)
	view  ClusterView
	// regionIDs: where region IDs come from when this store holds no
	// replica of the first region (regionid.go).
	regionIDs RegionIDSource
	// sweepAt is when the Ready loop next sweeps snapshot sources and
	// files (sweepSnapshots); only the loop touches it.
	sweepAt time.Time
	// lastMove is when the balancer last moved a replica or leader; only
	// its goroutine touches it.
	lastMove time.Time

	proposalBase uint64
	proposalSeq  atomic.Uint64

	// incarnation and instances make peer instance identities
	// (instance.go).
	incarnation uint64
	instances   atomic.Uint64

	// diskErr is set while the disk is failed (diskfail.go); diskInjected
	// makes disk writes fail on purpose.
	diskErr      atomic.Pointer[error]
	diskInjected atomic.Pointer[error]

	// knobs are this store's test hooks, set by tests only.
	knobs storeKnobs

	bg       sync.WaitGroup // background workers (split check, balancer)
	stopc    chan struct{}
	done     chan struct{}
	started  atomic.Bool
	stopOnce sync.Once
	// led caches ledRegions' answer (ledregions.go).
	led ledCache
}

// now is the store's clock: leases, read batches and safe points are timed
// on it, and the loop ticks on it.
func (s *Store) now() time.Time { return s.cfg.Clock.Now() }

// NewStore opens (or creates) the engine under cfg.DataDir, loads every
// region peer found there, bootstraps region 1 if the engine is empty, and
// returns a store that is not yet running. trans may be set later with
// SetTransport, before Start.
func NewStore(cfg Config, trans Transport) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	cfg.KeepWhole = sortedKeepRanges(cfg.KeepWhole) // the store's own copy, sorted
	s := &Store{
		cfg:   cfg,
		log:   cfg.Logger.With("store", cfg.StoreID),
		trans: trans,
		peers: make(map[uint64]*Peer),
		dirty: make(map[uint64]*Peer),
		awake: make(map[*Peer]struct{}),
		wakec: make(chan struct{}, 1),
		stopc: make(chan struct{}),
		done:  make(chan struct{}),
	}
	eng, err := engine.Open(cfg.DataDir, engine.Options{
		NoSync:             cfg.NoSync,
		FS:                 cfg.FS,
		AfterBoltSync:      cfg.AfterBoltSync,
		BatchInterval:      cfg.BatchInterval,
		FailCommit:         s.injectedDiskError,
		ApplyBatchBytes:    cfg.applyBatchBytes,
		ClearBatchKeys:     cfg.clearBatchKeys,
		CheckpointInterval: cfg.checkpointInterval,
	})
	if err != nil {
		return nil, err
	}
	s.eng = eng
	if n := eng.Replayed(); n > 0 {
		s.log.Info("replayed the round log after the last checkpoint", "records", n)
	}
	// A random base keeps proposal IDs unique across restarts, so an entry
	// proposed before a crash can never wake a waiter of a new proposal.
	var rb [8]byte
	if _, err := rand.Read(rb[:]); err != nil {
		eng.Close()
		return nil, fmt.Errorf("proposal id seed: %w", err)
	}
	s.proposalBase = binary.BigEndian.Uint64(rb[:])
	if s.snaps, err = newSnapshots(eng, s.log, cfg.SnapshotSendRate); err != nil {
		eng.Close()
		return nil, err
	}
	if err := s.load(); err != nil {
		eng.Close()
		return nil, err
	}
	return s, nil
}

// load checks the store identity, bootstraps if the engine is empty, and
// creates a peer for every persisted region.
func (s *Store) load() error {
	id, err := s.eng.StoreID()
	if err != nil {
		return fmt.Errorf("read store id: %w", err)
	}
	if id != 0 && id != s.cfg.StoreID {
		return fmt.Errorf("data dir %s belongs to store %d, not %d", s.cfg.DataDir, id, s.cfg.StoreID)
	}
	if id == 0 {
		if err := s.bootstrap(); err != nil {
			return err
		}
	}
	if err := s.loadClusterID(); err != nil {
		return err
	}
	if err := s.bumpIncarnation(); err != nil {
		return err
	}
	persisted, err := loadPeers(s.eng)
	if err != nil {
		return fmt.Errorf("load peers: %w", err)
	}
	for _, pp := range persisted {
		if _, err := s.createPeer(pp); err != nil {
			return fmt.Errorf("region %d: %w", pp.region.ID, err)
		}
	}
	// A stop between a merged region's snapshot and the forgetting of the
	// frozen source it absorbed leaves both (merge.go, dropMergedBy).
	for _, pp := range persisted {
		if m := pp.region.Merge; m != nil {
			if tp, ok := s.peer(m.Target); ok {
				if t := tp.regionClone(); t.Contains(pp.region.StartKey) {
					if err := s.dropMergedBy(t); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// loadClusterID records the configured cluster ID in an engine that has
// none, and refuses one that recorded another: the data dir of one cluster
// started with another's token would take (and answer) the other's raft
// traffic for regions and peers that share its IDs.
func (s *Store) loadClusterID() error {
	if s.cfg.ClusterID == 0 {
		return nil
	}
	var have uint64
	if err := s.eng.View(func(tx *engine.Tx) error {
		have = tx.ClusterID()
		return nil
	}); err != nil {
		return fmt.Errorf("read cluster id: %w", err)
	}
	switch {
	case have == 0:
		// Only the first open writes.
		return s.eng.Update(func(tx *engine.Tx) error { return tx.PutClusterID(s.cfg.ClusterID) })
	case have != s.cfg.ClusterID:
		return fmt.Errorf("data dir %s belongs to cluster %016x, not %016x: start the store with its cluster's token", s.cfg.DataDir, have, s.cfg.ClusterID)
	}
	return nil
}

func (s *Store) bootstrap() error {
	return s.eng.Update(func(tx *engine.Tx) error {
		if err := tx.PutStoreID(s.cfg.StoreID); err != nil {
			return err
		}
		if len(s.cfg.InitialStores) == 0 {
			return nil // joins later; gets its peers by snapshot
		}
		stores := append([]uint64(nil), s.cfg.InitialStores...)
		sort.Slice(stores, func(i, j int) bool { return stores[i] < stores[j] })
		r := region.Region{ID: 1, Epoch: region.Epoch{ConfVer: 1, Version: 1}}
		member := false
		for _, sid := range stores {
			r.Peers = append(r.Peers, region.Peer{ID: sid, StoreID: sid})
			member = member || sid == s.cfg.StoreID
		}
		if !member {
			return nil
		}
		if err := putRegion(tx, r); err != nil {
			return err
		}
		if err := tx.PutHardState(r.ID, raftpb.HardState{Term: raftInitTerm, Commit: raftInitIndex}); err != nil {
			return err
		}
		return tx.PutApplyState(r.ID, engine.ApplyState{
			AppliedIndex: raftInitIndex, AppliedTerm: raftInitTerm,
			TruncatedIndex: raftInitIndex, TruncatedTerm: raftInitTerm,
		})
	})
}

func (s *Store) raftConfig(peerID uint64, storage raft.Storage, applied uint64) *raft.Config {
	return &raft.Config{
		ID:              peerID,
		ElectionTick:    s.cfg.ElectionTicks,
		HeartbeatTick:   s.cfg.HeartbeatTicks,
		Storage:         storage,
		Applied:         applied,
		MaxSizePerMsg:   1 << 20,
		MaxInflightMsgs: 256,
		// Bound memory held by a leader that cannot commit.
		MaxUncommittedEntriesSize: 64 << 20,
		CheckQuorum:               true,
		PreVote:                   true,
		ReadOnlyOption:            raft.ReadOnlySafe,
		Logger:                    raftLogger{s.log},
	}
}

// createPeer builds a peer from its persisted state and installs it. An
// initialized peer replaces what the store had for its region (the
// uninitialized placeholder a split supersedes). A placeholder replaces
// nothing: if a peer appeared meanwhile, that one is returned. Nor does a
// placeholder enter the range tree: it holds no range yet, and its empty
// bounds would read as the whole key space and evict every other region.
func (s *Store) createPeer(pp persistedPeer) (*Peer, error) {
	self, ok := pp.region.PeerOnStore(s.cfg.StoreID)
	if !ok {
		return nil, fmt.Errorf("store %d holds no peer of %s", s.cfg.StoreID, pp.region.String())
	}
	storage, err := newPeerStorage(s.eng, pp, &s.stats.snapshotsBuilt)
	if err != nil {
		return nil, fmt.Errorf("rebuild log: %w", err)
	}
	storage.snaps, storage.buildErrs = s.snaps, &s.stats.snapshotBuildErrors
	rn, err := raft.NewRawNode(s.raftConfig(self.ID, storage, pp.apply.AppliedIndex))
	if err != nil {
		return nil, fmt.Errorf("new raw node: %w", err)
	}
	instance, err := s.nextInstance()
	if err != nil {
		return nil, err
	}
	last, _ := storage.LastIndex()
	p := &Peer{
		store:       s,
		storage:     storage,
		id:          self.ID,
		instance:    instance,
		regionID:    pp.region.ID,
		rn:          rn,
		region:      pp.region,
		term:        pp.hard.Term,
		commit:      pp.hard.Commit,
		applied:     pp.apply.AppliedIndex,
		appliedTerm: pp.apply.AppliedTerm,
		lastIndex:   last,
		initialized: pp.apply.AppliedIndex > 0,
		proposals:   make(map[uint64]*proposal),
	}
	if pp.region.Merge != nil {
		p.durableFreeze = *pp.region.Merge // loaded from disk
	}
	if last > p.applied {
		// Entries persisted before this peer was created were never seen
		// by its pending-writes record: count them as writing every key
		// (followerlease.go).
		p.fl.pending.coverAll(last)
	}
	if !s.started.Load() {
		// Loaded at start: whatever leader it acked before is forgotten.
		p.refuseVotesForElectionLocked(s.now())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.peers[pp.region.ID]; ok {
		if !p.initialized {
			return old, nil
		}
		old.mu.Lock()
		old.removed = true
		old.mu.Unlock()
		// A split-born peer replacing a placeholder: the placeholder may
		// have acked the region's leader, and this raft node knows nothing
		// of it.
		p.refuseVotesForElectionLocked(s.now())
	}
	s.peers[pp.region.ID] = p
	s.addAwake(p)
	s.summaryChanged()
	if p.initialized {
		s.ranges.Insert(pp.region.Clone())
	}
	return p, nil
}

// SetTransport sets the transport; call before Start.
func (s *Store) SetTransport(t Transport) { s.trans = t }

// SetClusterView gives the balancer its view of the other stores; call
// before Start. Without one the store does not balance.
func (s *Store) SetClusterView(v ClusterView) { s.view = v }

// Start launches the Ready loop.
func (s *Store) Start() {
	if s.started.Swap(true) {
		return
	}
	// Every ticker is armed before Start returns, so that on a manual
	// clock the first tick is one interval after Start, whenever the
	// goroutines get to run.
	go s.run(s.cfg.Clock.NewTicker(s.cfg.TickInterval))
	if s.cfg.SplitCheckInterval > 0 {
		s.bg.Add(1)
		t := s.cfg.Clock.NewTicker(s.cfg.SplitCheckInterval)
		go func() { defer s.bg.Done(); s.splitCheck(t) }()
	}
	if s.cfg.MergeCheckInterval > 0 {
		s.bg.Add(1)
		t := s.cfg.Clock.NewTicker(s.cfg.MergeCheckInterval)
		go func() { defer s.bg.Done(); s.mergeCheck(t) }()
	}
	if s.cfg.BalanceInterval > 0 {
		s.bg.Add(1)
		t := s.cfg.Clock.NewTicker(s.cfg.BalanceInterval)
		go func() { defer s.bg.Done(); s.balanceLoop(t) }()
	}
	if s.view != nil && s.hibernateTicks() > 0 {
		s.bg.Add(1)
		t := s.cfg.Clock.NewTicker(livenessInterval)
		go func() { defer s.bg.Done(); s.livenessLoop(t) }()
	}
}

// Stop stops the loop, fails waiting requests with ErrStopped and closes
// the engine. It is safe to call more than once.
func (s *Store) Stop() error { return s.stop(false) }

// Crash stops the store as a process crash (kill -9) would: the loop and
// the background workers stop and waiting requests fail with ErrStopped,
// as Stop does, but nothing is flushed or checkpointed: the rounds not yet
// committed to bbolt are dropped and the engine's files are closed as they
// are. The next NewStore on the data dir recovers as after a crash (the
// last checkpoint and the round log). For in-process fault injection
// (tests, chaos tools); a store that was stopped or crashed stays so.
func (s *Store) Crash() { _ = s.stop(true) }

func (s *Store) stop(crash bool) error {
	var err error
	s.stopOnce.Do(func() {
		close(s.stopc)
		if s.started.Load() {
			<-s.done
		}
		s.bg.Wait()
		s.mu.RLock()
		for _, p := range s.peers {
			p.mu.Lock()
			p.failProposalsLocked(ErrStopped)
			p.failReadsLocked(ErrStopped)
			p.mu.Unlock()
		}
		s.mu.RUnlock()
		// Before the engine: bbolt's close waits for every read
		// transaction, a snapshot being sent included.
		s.snaps.close()
		if crash {
			s.eng.Crash()
			return
		}
		err = s.eng.Close()
	})
	return err
}

// ID is the store ID.
func (s *Store) ID() uint64 { return s.cfg.StoreID }

// Zone is the store's zone label.
func (s *Store) Zone() string { return s.cfg.Zone }

// MaxReplicas is how many voters the balancer keeps per region.
func (s *Store) MaxReplicas() int { return s.cfg.MaxReplicas }

func (s *Store) stopped() bool {
	select {
	case <-s.stopc:
		return true
	default:
		return false
	}
}

func (s *Store) markDirty(p *Peer) {
	s.dirtyMu.Lock()
	s.dirty[p.regionID] = p
	s.dirtyMu.Unlock()
	select {
	case s.wakec <- struct{}{}:
	default:
	}
}

// nextRequestID names a proposal the caller gave no request ID.
func (s *Store) nextRequestID() uint64 { return s.proposalBase + s.proposalSeq.Add(1) }

// allPeers returns the peers hosted now, for a pass over all of them.
func (s *Store) allPeers() []*Peer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	peers := make([]*Peer, 0, len(s.peers))
	for _, p := range s.peers {
		peers = append(peers, p)
	}
	return peers
}

func (s *Store) peer(regionID uint64) (*Peer, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, ok := s.peers[regionID]
	return p, ok
}

// Regions returns this store's view of every region it hosts, in key order.
func (s *Store) Regions() []RegionStatus {
	peers := s.allPeers()
	out := make([]RegionStatus, 0, len(peers))
	now := s.now()
	for _, p := range peers {
		if st, ok := s.regionStatus(p, now); ok {
			out = append(out, st)
		}
	}
	sort.Slice(out, func(i, j int) bool { return string(out[i].Region.StartKey) < string(out[j].Region.StartKey) })
	return out
}

// RegionsFrom is Regions paged: at most limit regions (every one if 0) in
// key order, from the one holding start or the first after it; more is
// set if regions are left after them. It reads only the regions it
// returns, so a page or a lookup by key costs the same however many
// regions the store hosts.
func (s *Store) RegionsFrom(start []byte, limit int) (out []RegionStatus, more bool) {
	s.mu.RLock()
	rs, more := s.ranges.From(start, limit)
	s.mu.RUnlock()
	now := s.now()
	for _, r := range rs {
		p, ok := s.peer(r.ID)
		if !ok {
			continue
		}
		if st, ok := s.regionStatus(p, now); ok {
			out = append(out, st)
		}
	}
	return out, more
}

// Term is the raft term known to this store's replica of the region
// holding key (false: no initialized replica here). It is a RegionStatus's
// Term without the rest, for answers that carry it on every request.
func (s *Store) Term(key []byte) (uint64, bool) {
	s.mu.RLock()
	r, ok := s.ranges.Lookup(key)
	s.mu.RUnlock()
	if !ok {
		return 0, false
	}
	p, ok := s.peer(r.ID)
	if !ok {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.term, p.initialized
}

// regionStatus is one initialized peer's RegionStatus (false if it is not
// initialized). It takes the peer's lock.
func (s *Store) regionStatus(p *Peer, now time.Time) (RegionStatus, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.initialized {
		return RegionStatus{}, false
	}
	st := RegionStatus{
		Region:       p.region.Clone(),
		LeaderPeerID: p.lead,
		IsLeader:     p.isLeaderLocked(),
		Transferring: p.transferring,
		Hibernating:  p.hibernating,
		Term:         p.term,
		CommitIndex:  p.commit,
		AppliedIndex: p.applied,
		LastIndex:    p.lastIndex,
	}
	if st.IsLeader {
		st.Progress = p.progressLocked()
	}
	if lp := p.leaderPeerLocked(); lp != nil {
		st.LeaderStoreID = lp.StoreID
	}
	if p.leaseValidLocked(now) {
		st.LeaseExpiry = p.lease.until
	}
	if st.IsLeader && p.size.counted && p.size.version == p.region.Epoch.Version {
		st.SizeKnown, st.ApproximateKeys, st.ApproximateBytes = true, p.size.keys, p.size.bytes
	}
	return st, true
}

// progressLocked is a leader's raft progress of every peer but itself,
// by peer ID (raft visits them in order, copying no map). p.mu is held.
func (p *Peer) progressLocked() []PeerProgress {
	out := make([]PeerProgress, 0, len(p.region.Peers))
	p.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id != p.id {
			out = append(out, PeerProgress{
				PeerID: id, Match: pr.Match, Next: pr.Next, State: pr.State.String(),
				Paused: pr.IsPaused(), PendingSnapshot: pr.PendingSnapshot, RecentActive: pr.RecentActive,
			})
		}
	})
	return out
}

// ErrInvalidRequest marks a request that can never succeed as asked.
var ErrInvalidRequest = errors.New("raftstore: invalid request")
