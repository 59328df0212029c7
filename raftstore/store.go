package raftstore

import (
	"context"
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
	"go.etcd.io/bbolt"
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
	eng   *engine
	trans Transport

	mu     sync.RWMutex
	peers  map[uint64]*Peer // by region ID
	ranges region.Tree      // regions by key, for requests without a region ID

	dirtyMu sync.Mutex
	dirty   map[uint64]*Peer
	wakec   chan struct{}

	stats stats
	snaps *snapshots // snapshot sources and received files (snapstream.go)
	view  ClusterView
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

	bg       sync.WaitGroup // background workers (split check, balancer)
	stopc    chan struct{}
	done     chan struct{}
	started  atomic.Bool
	stopOnce sync.Once
}

// now is the store's clock: leases, read batches and safe points are timed
// on it.
func (s *Store) now() time.Time { return s.cfg.Clock() }

// NewStore opens (or creates) the engine under cfg.DataDir, loads every
// region peer found there, bootstraps region 1 if the engine is empty, and
// returns a store that is not yet running. trans may be set later with
// SetTransport, before Start.
func NewStore(cfg Config, trans Transport) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	eng, err := openEngine(cfg.DataDir, cfg.NoSync)
	if err != nil {
		return nil, err
	}
	s := &Store{
		cfg:   cfg,
		log:   cfg.Logger.With("store", cfg.StoreID),
		eng:   eng,
		trans: trans,
		peers: make(map[uint64]*Peer),
		dirty: make(map[uint64]*Peer),
		wakec: make(chan struct{}, 1),
		stopc: make(chan struct{}),
		done:  make(chan struct{}),
	}
	if eng.replayed > 0 {
		s.log.Info("replayed the round log after the last checkpoint", "records", eng.replayed)
	}
	// A random base keeps proposal IDs unique across restarts, so an entry
	// proposed before a crash can never wake a waiter of a new proposal.
	var rb [8]byte
	if _, err := rand.Read(rb[:]); err != nil {
		eng.close()
		return nil, fmt.Errorf("proposal id seed: %w", err)
	}
	s.proposalBase = binary.BigEndian.Uint64(rb[:])
	if s.snaps, err = newSnapshots(eng, s.log, cfg.DataDir, cfg.SnapshotSendRate); err != nil {
		eng.close()
		return nil, err
	}
	if err := s.load(); err != nil {
		eng.close()
		return nil, err
	}
	return s, nil
}

// load checks the store identity, bootstraps if the engine is empty, and
// creates a peer for every persisted region.
func (s *Store) load() error {
	id, err := s.eng.storeID()
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
	if err := s.bumpIncarnation(); err != nil {
		return err
	}
	persisted, err := s.eng.loadPeers()
	if err != nil {
		return fmt.Errorf("load peers: %w", err)
	}
	for _, pp := range persisted {
		if _, err := s.createPeer(pp); err != nil {
			return fmt.Errorf("region %d: %w", pp.region.ID, err)
		}
	}
	return nil
}

func (s *Store) bootstrap() error {
	return s.eng.update(func(tx *bbolt.Tx) error {
		if err := tx.Bucket(bucketMeta).Put(keyStoreID, uint64Bytes(s.cfg.StoreID)); err != nil {
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
		if err := putHardState(tx, r.ID, raftpb.HardState{Term: raftInitTerm, Commit: raftInitIndex}); err != nil {
			return err
		}
		return putApplyState(tx, r.ID, applyState{
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
	go s.run()
	if s.cfg.SplitCheckInterval > 0 {
		s.bg.Add(1)
		go func() { defer s.bg.Done(); s.splitCheck() }()
	}
	if s.cfg.BalanceInterval > 0 {
		s.bg.Add(1)
		go func() { defer s.bg.Done(); s.balanceLoop() }()
	}
	if s.view != nil && s.hibernateTicks() > 0 {
		s.bg.Add(1)
		go func() { defer s.bg.Done(); s.livenessLoop() }()
	}
}

// Stop stops the loop, fails waiting requests with ErrStopped and closes
// the engine. It is safe to call more than once.
func (s *Store) Stop() error {
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
		err = s.eng.close()
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

// HandleRaftMessage steps an inbound message into its region's peer.
func (s *Store) HandleRaftMessage(m *Message) error {
	if s.stopped() {
		return ErrStopped
	}
	if err := s.diskError(); err != nil {
		return err // frozen: stepping raft would answer for state never persisted
	}
	p, ok := s.peer(m.RegionID)
	if isTombstone(m.Msg) {
		if !ok {
			return nil
		}
		return s.handleTombstone(p, m.Msg)
	}
	if ok && m.Msg.To != p.id && p.supersedePlaceholder() {
		// A placeholder for a peer ID this region no longer uses.
		s.mu.Lock()
		if s.peers[m.RegionID] == p {
			delete(s.peers, m.RegionID)
		}
		s.mu.Unlock()
		ok = false
	}
	if !ok && isLeaseNotice(m.Msg) {
		return nil // nothing to grant or hold for a region not here
	}
	if !ok {
		var err error
		if p, err = s.maybeCreatePeer(m); err != nil {
			return err
		}
	}
	if m.Msg.Type == raftpb.MsgSnap {
		// A MsgSnap may arrive with no snapshot at all (nothing on the
		// Stream RPC checks; FuzzHandleRaftMessage reproduces it): refuse it
		// rather than dereference nil and crash the store.
		if m.Msg.Snapshot == nil {
			return fmt.Errorf("region %d: MsgSnap without a snapshot: %w", m.RegionID, errCorrupt)
		}
		// Decoded (and checksummed) before raft sees it: a snapshot that
		// would fail to apply must not reach the Ready loop, where an
		// apply error stops the store. A streamed one was checked as it
		// was received (ReceiveSnapshot); any other descriptor is refused.
		var r region.Region
		var err error
		if st, _, staged := s.snaps.stagedFile(m.Msg.Snapshot.Data); staged {
			r = st.region
			if r.ID != m.RegionID {
				err = fmt.Errorf("snapshot file of region %d: %w", r.ID, errCorrupt)
			}
		} else {
			r, _, err = decodeSnapshotRegion(m.Msg.Snapshot.Data)
		}
		if err != nil {
			return fmt.Errorf("region %d: bad snapshot: %w", m.RegionID, err)
		}
		// A region created by a split this store has not applied yet must
		// not take over part of its parent's range: refuse the snapshot
		// until the parent catches up (its leader will retry).
		if !p.isInitialized() && s.overlapsOther(r) {
			return fmt.Errorf("region %d: snapshot overlaps a region here: %w", m.RegionID, ErrProposalDropped)
		}
	}
	p.mu.Lock()
	if m.Msg.To != p.id || p.removed {
		// For a replaced peer of this region, or for one removed or
		// superseded (a placeholder a split replaced) since the lookup: a
		// message stepped into it would be answered by a peer that no
		// longer exists, acking state the live peer does not have.
		p.mu.Unlock()
		return &region.RegionNotFoundError{RegionID: m.RegionID}
	}
	p.learnSenderLocked(m)
	if t := p.tombstoneForStaleLocked(m, s.cfg.StoreID); t != nil {
		p.mu.Unlock()
		s.log.Info("a removed peer is still live: told it to destroy itself", "region", m.RegionID, "peer", m.Msg.From, "peer_store", m.FromStore, "msg", m.Msg.Type)
		s.trans.Send(t)
		s.trans.Flush()
		return nil
	}
	p.noteLeaderLocked(m.Msg, s.now())
	switch {
	case isNotice(m.Msg, staleCheckCtx):
		// From a member (a removed peer got its tombstone above): it only
		// asked.
		p.mu.Unlock()
		return nil
	case isNotice(m.Msg, hibernateCtx):
		wake := p.onHibernateNoticeLocked(m.Msg)
		p.mu.Unlock()
		if wake != nil {
			s.sendNow(p, *wake)
		}
		return nil
	case isNotice(m.Msg, wakeCtx):
		p.activityLocked()
		p.mu.Unlock()
		return nil
	case isNotice(m.Msg, renewCtx):
		p.onNudgeLocked(m.Msg)
		p.mu.Unlock()
		s.markDirty(p)
		return nil
	case isNotice(m.Msg, leaseReqCtx):
		grant, lm, ok := p.onLeaseRequestLocked(m.Msg, m.Lease, s.now())
		p.mu.Unlock()
		s.markDirty(p) // the request may have made the lease due a renewal
		if ok {
			s.sendNotice(p, grant, lm)
		}
		return nil
	case isNotice(m.Msg, leaseGrantCtx):
		p.onLeaseGrantLocked(m.Msg, m.Lease, s.now())
		p.mu.Unlock()
		return nil
	case isNotice(m.Msg, leaseRevokeCtx):
		p.onLeaseRevokeLocked(m.Msg)
		p.mu.Unlock()
		return nil
	case m.Msg.Type == raftpb.MsgHeartbeat || m.Msg.Type == raftpb.MsgHeartbeatResp:
		// Heartbeats keep a peer awake but are not traffic.
		p.hibernating = false
	default:
		if wake := p.activityLocked(); wake != nil {
			defer s.sendNow(p, *wake)
		}
	}
	now := s.now()
	if p.refusesVoteLocked(m.Msg, now) {
		p.mu.Unlock()
		return nil
	}
	if m.Msg.Type == raftpb.MsgReadIndex {
		// Followers' reads keep the lease warm just as the leader's own do.
		p.readsSinceRenew = true
	}
	if resp, ok := p.answerReadIndexFromLeaseLocked(m.Msg, now); ok {
		p.mu.Unlock()
		s.sendNow(p, resp)
		return nil
	}
	if next, ok := p.takeReadIndexRespLocked(m.Msg, now); ok {
		p.mu.Unlock()
		if next != nil {
			s.sendNow(p, *next)
		}
		return nil
	}
	holderRose := p.capAckLocked(&m.Msg, now)
	err := p.rn.Step(m.Msg)
	if err == nil && m.SafePoint != nil && m.Msg.Type == raftpb.MsgHeartbeat {
		p.recordSafePointLocked(*m.SafePoint, now)
	}
	if holderRose {
		p.restepAcksLocked(now)
	}
	p.mu.Unlock()
	if err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		return fmt.Errorf("region %d step %s: %w", m.RegionID, m.Msg.Type, err)
	}
	s.markDirty(p)
	return nil
}

// ReportUnreachable tells the peer's raft that a send to toPeerID failed.
func (s *Store) ReportUnreachable(regionID, toPeerID uint64) {
	if p, ok := s.peer(regionID); ok {
		p.mu.Lock()
		p.rn.ReportUnreachable(toPeerID)
		p.mu.Unlock()
		s.markDirty(p)
	}
}

// ReportSnapshot tells the peer's raft how sending the snapshot m carried
// ended. A report about a send of an earlier term, or of another snapshot
// than the one raft waits for now, is ignored: raft would take it for the
// send in flight.
func (s *Store) ReportSnapshot(m *Message, ok bool) {
	if m == nil || m.Msg.Snapshot == nil {
		return
	}
	p, found := s.peer(m.RegionID)
	if !found {
		return
	}
	st := raft.SnapshotFinish
	if !ok {
		st = raft.SnapshotFailure
	}
	to, index := m.Msg.To, m.Msg.Snapshot.Metadata.Index
	p.mu.Lock()
	status := p.rn.Status()
	pr, tracked := status.Progress[to]
	current := m.Msg.From == p.id && status.RaftState == raft.StateLeader && status.Term == m.Msg.Term &&
		tracked && pr.State == tracker.StateSnapshot && pr.PendingSnapshot == index
	if current {
		p.rn.ReportSnapshot(to, st)
	}
	p.mu.Unlock()
	if !current {
		s.log.Debug("stale snapshot report ignored", "region", m.RegionID, "to_peer", to, "index", index, "term", m.Msg.Term, "ok", ok)
		return
	}
	if !ok {
		s.stats.snapshotsFailed.Add(1)
	}
	s.markDirty(p)
}

// sendNow sends one message outside the Ready loop and flushes it, on the
// caller's goroutine if the transport can (directSender).
func (s *Store) sendNow(p *Peer, m raftpb.Message) { s.sendNotice(p, m, nil) }

// sendNotice is sendNow for a message that may carry a follower-lease
// payload beside it.
func (s *Store) sendNotice(p *Peer, m raftpb.Message, lease *LeaseMsg) {
	ds, direct := s.trans.(directSender)
	if !direct && lease == nil {
		s.send(p, []raftpb.Message{m})
		s.trans.Flush()
		return
	}
	p.mu.Lock()
	toStore, found := p.storeOfLocked(m.To)
	r, confVer := p.regionID, p.region.Epoch.ConfVer
	p.mu.Unlock()
	if !found {
		return
	}
	msg := &Message{RegionID: r, FromStore: s.cfg.StoreID, ToStore: toStore, Msg: m, Lease: lease, FromConfVer: confVer}
	if direct {
		ds.SendNow(msg)
		return
	}
	s.trans.Send(msg)
	s.trans.Flush()
}

// directSender is a Transport that can write one message on the caller's
// goroutine, for round trips where a hand-off to a sender costs latency.
type directSender interface {
	SendNow(m *Message)
}

// send hands messages to the transport, addressed by store.
// A leader holding a valid lease stamps its heartbeats with a safe point.
func (s *Store) send(p *Peer, msgs []raftpb.Message) {
	if len(msgs) == 0 {
		return
	}
	var sp *SafePoint
	p.mu.Lock()
	r := p.region
	now := s.now()
	stores := make([]uint64, len(msgs))
	for i := range msgs {
		switch msgs[i].Type {
		case raftpb.MsgHeartbeat:
			if sp == nil {
				sp = p.makeSafePointLocked(now)
			}
		case raftpb.MsgTimeoutNow:
			p.onTimeoutNowLocked(now)
		}
		stores[i], _ = p.storeOfLocked(msgs[i].To)
	}
	p.mu.Unlock()
	for i := range msgs {
		m := &Message{RegionID: r.ID, FromStore: s.cfg.StoreID, ToStore: stores[i], Msg: msgs[i], FromConfVer: r.Epoch.ConfVer}
		if stores[i] == 0 {
			// No store known for the peer: lost. A snapshot must say so,
			// or raft keeps the follower waiting for it (StateSnapshot)
			// until the leader changes.
			s.log.Warn("raft message to a peer of unknown store dropped", "region", r.ID, "to_peer", msgs[i].To, "type", msgs[i].Type.String())
			if msgs[i].Type == raftpb.MsgSnap {
				s.ReportSnapshot(m, false)
			}
			continue
		}
		if msgs[i].Type == raftpb.MsgHeartbeat {
			m.SafePoint = sp
		}
		s.trans.Send(m)
	}
}

// Regions returns this store's view of every region it hosts, in key order.
func (s *Store) Regions() []RegionStatus {
	peers := s.allPeers()
	out := make([]RegionStatus, 0, len(peers))
	for _, p := range peers {
		p.mu.Lock()
		if !p.initialized {
			p.mu.Unlock()
			continue
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
		}
		if lp := p.leaderPeerLocked(); lp != nil {
			st.LeaderStoreID = lp.StoreID
		}
		if p.leaseValidLocked(s.now()) {
			st.LeaseExpiry = p.lease.until
		}
		if st.IsLeader && p.size.counted && p.size.version == p.region.Epoch.Version {
			st.SizeKnown, st.ApproximateKeys, st.ApproximateBytes = true, p.size.keys, p.size.bytes
		}
		p.mu.Unlock()
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return string(out[i].Region.StartKey) < string(out[j].Region.StartKey) })
	return out
}

// TransferLeader asks the leader of regionID (on this store) to hand
// leadership to its peer on toStoreID, and waits until it has moved or ctx
// ends. The lease is revoked before the transfer starts.
func (s *Store) TransferLeader(ctx context.Context, regionID, toStoreID uint64) error {
	p, ok := s.peer(regionID)
	if !ok {
		return &region.RegionNotFoundError{RegionID: regionID}
	}
	s.touch(p)
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
	retry := time.NewTicker(time.Duration(s.cfg.ElectionTicks) * s.cfg.TickInterval)
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
			for _, m := range revokes {
				s.sendNow(p, m)
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
		case <-retry.C:
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
// snapshot.
func (p *Peer) transfereeCaughtUpLocked(id uint64) bool {
	st := p.rn.Status()
	pr, ok := st.Progress[id]
	self, okSelf := st.Progress[p.id]
	if !ok || !okSelf {
		return false
	}
	return pr.State != tracker.StateSnapshot && pr.Match+maxTransferLag >= self.Match
}

// ErrInvalidRequest marks a request that can never succeed as asked.
var ErrInvalidRequest = errors.New("raftstore: invalid request")
