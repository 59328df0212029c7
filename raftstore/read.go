package raftstore

import (
	"context"
	"fmt"
	"time"

	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/region"
)

// readScope is what a read checked its peer against when it was decided:
// the keys it reads (a scan: its start key) and the region's version then.
// A split that applies while the read waits changes the version; the read
// must then not answer, because the split-off keys now belong to another
// region whose replica here may lag behind what the read index covers
// (it was created from this peer's data at the split).
type readScope struct {
	epoch   region.Epoch // as the request gave it; zero: no epoch check
	keys    [][]byte
	version uint64 // the region's version when the read was decided
}

func (p *Peer) checkScopeLocked(sc *readScope) error {
	for _, k := range sc.keys {
		if err := p.checkServingLocked(sc.epoch, k); err != nil {
			return err
		}
	}
	return nil
}

// recheck is called once a read has waited (for its read index, or for the
// leader's apply): the region must still hold the read's keys at the
// version the read was decided at, else EpochNotMatch, which the client
// retries with fresh routing. It returns the region as of the check.
func (s *Store) recheck(p *Peer, sc *readScope) (region.Region, error) {
	p.mu.Lock()
	err := p.checkScopeLocked(sc)
	if err == nil && p.region.Epoch.Version != sc.version {
		err = &region.EpochNotMatchError{RegionID: p.regionID, Current: []region.Region{p.region.Clone()}}
	}
	r := p.region.Clone()
	p.mu.Unlock()
	if err != nil {
		return r, s.withCurrentRegion(err, sc.keys[0])
	}
	return r, nil
}

// prepareRead decides how p may serve a linearizable read and waits until
// it can: at once under a valid leader lease; on a follower holding a valid
// read lease, once the writes of what it reads are applied
// (followerLeaseRead); otherwise after a ReadIndex round and until the
// peer has applied that index. A follower serves only when the request
// allows replica reads; otherwise it says NotLeader.
//
// A bounded-staleness read (MaxStaleness > 0) that finds no valid lease is
// served from local state when a safe point proves it fresh enough (see
// stale.go); otherwise a follower answers DataIsNotReady and a leader falls
// back to ReadIndex.
//
// The read's keys are checked against the region under the same lock as
// the decision, and again after any wait (recheck); it returns the region
// as of the last check.
func (s *Store) prepareRead(ctx context.Context, p *Peer, opts ReadOptions, keys ...[]byte) (ReadInfo, region.Region, error) {
	info := ReadInfo{StoreID: s.cfg.StoreID, PeerID: p.id}
	sc := &readScope{epoch: opts.Epoch, keys: keys}
	now := s.now()
	p.mu.Lock()
	if err := p.checkScopeLocked(sc); err != nil {
		p.mu.Unlock()
		return info, region.Region{}, s.withCurrentRegion(err, keys[0])
	}
	sc.version = p.region.Epoch.Version
	diskErr := s.diskError()
	f := readFacts{
		diskFailed:   diskErr != nil,
		leaderLease:  p.leaseValidLocked(now),
		leader:       p.isLeaderLocked(),
		replicaRead:  opts.ReplicaRead,
		staleAllowed: opts.MaxStaleness > 0,
		local:        opts.Local,
	}
	f.followerLease = !f.leader && opts.ReplicaRead && s.cfg.FollowerLeases && p.followerLeaseValidLocked(now)
	var bound time.Duration
	var staleErr error
	if f.staleAllowed {
		bound, staleErr = p.staleReadLocked(now, opts.MaxStaleness)
		f.staleOK = staleErr == nil
	}
	path := decideRead(f)
	// A stale read that found its newest safe point old (or none) asks the
	// leader for fresh ones (stale.go), unless the store is frozen.
	var nudge *Notice
	if f.staleAllowed && !f.diskFailed && path != readLease && path != readFollowerLease &&
		(staleErr != nil || bound > opts.MaxStaleness/2) {
		nudge = p.nudgeLeaderLocked(now)
	}
	switch path {
	case readFollowerLease:
		// Linearizable and local: better than a stale read too.
		return s.followerLeaseRead(ctx, p, opts, sc, info) // unlocks p.mu
	case readLease:
		return s.leaseRead(ctx, p, sc, info, now) // unlocks p.mu
	}
	var r region.Region
	var err error
	switch path {
	case readLocal:
		if lp := p.leaderPeerLocked(); lp != nil {
			info.LeaderStoreID = lp.StoreID
		}
		info.Mode, r = readmode.Local, p.region.Clone()
	case readStale:
		r = p.staleAnswerLocked(&info, bound)
	case readRefuseDisk:
		err = diskErr
	case readRefuseStale:
		err = staleErr
	case readNotLeader:
		err = p.notLeaderLocked()
	}
	p.mu.Unlock()
	if nudge != nil {
		s.sendNotice(p, *nudge)
	}
	if path == readIndex {
		return s.readIndexRead(ctx, p, sc, info)
	}
	return info, r, err
}

// readFacts are what decides how a read is served, read under the peer's
// lock at one instant.
type readFacts struct {
	diskFailed    bool // the store froze after a failed disk write (diskfail.go)
	leaderLease   bool // this peer leads and its lease is valid (lease.go)
	leader        bool
	replicaRead   bool // the session lets a follower serve linearizable reads
	followerLease bool // a follower with replicaRead and a valid read lease (followerlease.go)
	staleAllowed  bool // the session allows a stale read (MaxStaleness > 0)
	staleOK       bool // and one within its bound can be served here now (stale.go)
	local         bool // the caller asked for this replica's state as it is (ReadOptions.Local)
}

// readPath is how a read is served, or why it is refused.
type readPath int

const (
	readLease         readPath = iota + 1 // the leader's lease: no round trip
	readFollowerLease                     // a follower's read lease: no round trip
	readStale                             // local state within the session's bound
	readIndex                             // a ReadIndex round trip to the leader
	readRefuseDisk                        // frozen and no stale read allowed: the disk error
	readRefuseStale                       // a follower that can serve neither: the stale read's error
	readNotLeader                         // a follower the session may not read from
	readLocal                             // this replica's applied state as it is
)

var readPathNames = map[readPath]string{
	readLease: "lease", readFollowerLease: "follower-lease", readStale: "stale", readIndex: "read-index",
	readRefuseDisk: "refuse-disk", readRefuseStale: "refuse-stale", readNotLeader: "not-leader",
	readLocal: "local",
}

func (r readPath) String() string { return readPathNames[r] }

// decideRead is the read path as a pure function of the facts, in order of
// preference: a frozen store serves only stale reads; a caller that asked
// for the replica's state as it is gets it; a lease (the
// leader's, then a follower's) answers linearizably with no round trip; a
// stale read, when the session allows one, beats a round trip; a follower
// that cannot serve it stale says why rather than pay a round trip the
// session did not ask for; otherwise ReadIndex, which a follower serves
// only for a session that reads from followers.
func decideRead(f readFacts) readPath {
	switch {
	case f.diskFailed && f.staleAllowed && f.staleOK:
		return readStale
	case f.diskFailed:
		return readRefuseDisk
	case f.local:
		return readLocal
	case f.leaderLease:
		return readLease
	case f.followerLease:
		return readFollowerLease
	case f.staleAllowed && f.staleOK:
		return readStale
	case f.staleAllowed && !f.leader:
		return readRefuseStale
	case !f.leader && !f.replicaRead:
		return readNotLeader
	}
	return readIndex
}

// leaseRead serves a read from the leader's lease. The lease stands in
// for the ReadIndex round trip, not for the index: the read must still see
// everything committed so far. Followers may apply a commit before the
// leader does (it tells them while it persists), so it waits for the
// leader's own apply. Called with p.mu held; it unlocks it.
func (s *Store) leaseRead(ctx context.Context, p *Peer, sc *readScope, info ReadInfo, now time.Time) (ReadInfo, region.Region, error) {
	p.readsSinceRenew = true
	renew := p.leaseNeedsRenewLocked(now)
	applied := p.waitAppliedLocked(p.rn.BasicStatus().Commit)
	p.mu.Unlock()
	if renew {
		s.markDirty(p)
	}
	if err := s.waitApplied(ctx, p, applied); err != nil {
		return info, region.Region{}, err
	}
	r, err := s.recheck(p, sc)
	if err != nil {
		return info, r, err
	}
	info.Mode = readmode.Lease
	s.stats.readsLease.Add(1)
	return info, r, nil
}

// staleAnswerLocked fills info for a stale read served now with bound and
// returns the region: no wait, the keys were checked under this same lock.
func (p *Peer) staleAnswerLocked(info *ReadInfo, bound time.Duration) region.Region {
	if lp := p.leaderPeerLocked(); lp != nil {
		info.LeaderStoreID = lp.StoreID
	}
	p.store.stats.readsStale.Add(1)
	info.Mode, info.StalenessBound = readmode.Stale, bound
	return p.region.Clone()
}

// followerLeaseRead serves a follower read from the follower's lease when
// it is valid: it waits for the grant's commit index (checked by the
// validity) and every pending entry of its log that writes what the read
// reads, for at most what is left of the lease; otherwise, and if that
// wait runs out, it is a ReadIndex read. Called with p.mu held; unlocks it.
//
// No second look at the lease after reading: at the moment of the check
// (now, read under p.mu, so the log cannot change in between) every write
// committed so far is in this log, and applied here once the wait is over;
// whatever committed later and is read or not, the answer is the latest
// committed value at some moment within the read (docs/design.md).
func (s *Store) followerLeaseRead(ctx context.Context, p *Peer, opts ReadOptions, sc *readScope, info ReadInfo) (ReadInfo, region.Region, error) {
	now := s.now()
	if !p.followerLeaseValidLocked(now) {
		p.mu.Unlock()
		return s.readIndexRead(ctx, p, sc, info)
	}
	var idx uint64
	if opts.wholeRegion {
		idx = p.fl.pending.waitIndex(nil, true, p.region.StartKey, p.region.EndKey)
	} else if opts.scan {
		lo, hi, _ := p.region.ClampRange(sc.keys[0], opts.scanEnd)
		idx = p.fl.pending.waitIndex(nil, true, lo, hi)
	} else {
		idx = p.fl.pending.waitIndex(sc.keys, false, nil, nil)
	}
	left := p.fl.held.until.Sub(now)
	applied := p.waitAppliedLocked(idx)
	p.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, left)
	err := s.waitApplied(wctx, p, applied)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return info, region.Region{}, err
		}
		// The entry did not apply within the lease (it may never commit):
		// the round trip it is, then.
		return s.readIndexRead(ctx, p, sc, info)
	}
	r, err := s.recheck(p, sc)
	if err != nil {
		return info, r, err
	}
	info.Mode = readmode.FollowerLease
	s.stats.readsFollowerLease.Add(1)
	return info, r, nil
}

// readIndexRead is a linearizable read through a ReadIndex round (sent to
// the leader from a follower) and a wait for its index to apply here.
func (s *Store) readIndexRead(ctx context.Context, p *Peer, sc *readScope, info ReadInfo) (ReadInfo, region.Region, error) {
	idx, err := s.readIndex(ctx, p)
	if err != nil {
		return info, region.Region{}, err
	}
	p.mu.Lock()
	applied := p.waitAppliedLocked(idx)
	p.mu.Unlock()
	if err := s.waitApplied(ctx, p, applied); err != nil {
		return info, region.Region{}, err
	}
	r, err := s.recheck(p, sc)
	if err != nil {
		return info, r, err
	}
	info.Mode = readmode.ReadIndex
	s.stats.readsReadIndex.Add(1)
	return info, r, nil
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
	if info, _, err = s.prepareRead(ctx, p, opts, key); err != nil {
		return nil, false, info, err
	}
	gen := p.dataGen()
	value, found, err = s.eng.Get(key)
	if err != nil {
		return nil, false, info, fmt.Errorf("get: %w", err)
	}
	if err := s.stillHolds(p, gen); err != nil {
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
	info, _, err := s.prepareRead(ctx, p, opts, keys...)
	if err != nil {
		return nil, info, err
	}
	gen := p.dataGen()
	kvs, err := s.eng.BatchGet(keys)
	if err != nil {
		return nil, info, fmt.Errorf("batch get: %w", err)
	}
	if err := s.stillHolds(p, gen); err != nil {
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
	opts.scan, opts.scanEnd = true, end
	info, r, err := s.prepareRead(ctx, p, opts, start)
	if err != nil {
		return nil, region.Region{}, info, err
	}
	lo, hi, ok := r.ClampRange(start, end)
	if !ok || limit <= 0 {
		return nil, r, info, nil
	}
	gen := p.dataGen()
	kvs, err := s.eng.Scan(ctx, lo, hi, limit)
	if err != nil {
		return nil, r, info, fmt.Errorf("scan: %w", err)
	}
	if err := s.stillHolds(p, gen); err != nil {
		return nil, r, info, err
	}
	return kvs, r, info, nil
}

// ReadView runs fn on a read view of the region holding key (or
// opts.RegionID), for a layer that keeps its own records in the region
// through Propose (applier.go) and reads them with several lookups that
// must agree. The view is taken after the read barrier a Get of key goes
// through with opts (the leader lease, ReadIndex, the follower lease, or a
// bounded-staleness read, as prepareRead decides; on a follower lease it
// waits for every pending write of the region, not only key's), so it
// holds every write and command acknowledged before ReadView was called
// (within the bound, for a stale read). It is one moment of the store's
// data (engine.Snapshot), bounded to the region's key range as of the
// barrier: a Get outside fails with engine.ErrOutOfBounds, a Scan is
// clamped.
//
// After fn the read is checked as a Get's is: the region still holds key
// at the version the read was decided at (no split, no epoch change:
// EpochNotMatch), and the peer still serves it with the data it had
// (removed, or a snapshot applied: RegionNotFound). If that check fails its
// error is returned, not fn's, and whatever fn made of the view is stale:
// the caller must discard it (and retry with fresh routing). Otherwise
// fn's error is returned as is. The view is released when fn returns: fn
// must not keep it, nor bytes a Scan lent it.
func (s *Store) ReadView(ctx context.Context, opts ReadOptions, key []byte, fn func(v StateView) error) (ReadInfo, error) {
	p, err := s.route(opts.RegionID, opts.Epoch, key)
	if err != nil {
		return ReadInfo{}, err
	}
	opts.scan, opts.scanEnd, opts.wholeRegion = false, nil, true
	info, r, err := s.prepareRead(ctx, p, opts, key)
	if err != nil {
		return info, err
	}
	gen := p.dataGen()
	snap, err := s.eng.Snapshot()
	if err != nil {
		return info, fmt.Errorf("read view: %w", err)
	}
	ferr := fn(snap.Within(r.StartKey, r.EndKey))
	snap.Release()
	if _, err := s.recheck(p, &readScope{epoch: opts.Epoch, keys: [][]byte{key}, version: r.Epoch.Version}); err != nil {
		return info, err
	}
	if err := s.stillHolds(p, gen); err != nil {
		return info, err
	}
	return info, ferr
}

// stillHolds is checked after a read: it fails if p was removed from its
// region meanwhile. destroyPeer marks the peer removed before it deletes
// the range from the engine, so a read whose engine transaction began after
// that delete always sees the mark here, and never answers "no such key"
// for keys the region holds. (A read applied up to its read index before
// the removal is otherwise linearizable; only the vanishing data is wrong.)
// Likewise it fails if a snapshot apply was under way or began since gen
// was noted (before the engine read): the read may have seen part of it.
func (s *Store) stillHolds(p *Peer, gen uint64) error {
	if !p.dataKeptSince(gen) {
		return &region.RegionNotFoundError{RegionID: p.regionID}
	}
	return nil
}
