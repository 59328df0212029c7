package raftstore

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/region"
)

// Disk failures.
//
// When a round's bbolt transaction fails (the disk is full, an fsync
// failed), nothing of that round is durable and nothing of it may be
// acknowledged or sent; the RawNodes, however, have handed out a Ready
// that will never be persisted, so they cannot go on. The store then:
//
//   - stops its Ready loop and answers every write, every linearizable
//     read and every raft message with ErrDiskFailed (gRPC Unavailable,
//     saying why): clients go to other replicas, and the other stores,
//     hearing nothing, elect a leader among themselves;
//   - keeps serving bounded-staleness reads from what it applied before
//     the failure (durable, and covered by the safe points it holds);
//   - probes the disk every diskProbeInterval with a small write; once one
//     succeeds it rebuilds every peer from what is on disk, exactly as a
//     restart would (forgetting the unpersisted Readys, refusing votes for
//     an election timeout), and resumes. The region's leader then brings
//     it up to date from its log or with a snapshot.
//
// bbolt never applies a failed transaction, so the file is left as of the
// last round that committed.

// ErrDiskFailed: the store's last disk write failed; it accepts no writes
// (and serves no linearizable reads) until a write succeeds again.
var ErrDiskFailed = errors.New("raftstore: disk write failed")

// storeKnobs are a store's test hooks: per store, so that tests running
// side by side do not share them. Nothing outside tests sets them.
type storeKnobs struct {
	// diskProbed, if set, runs on the loop once a probe of a failed disk
	// succeeded (the engine has rebuilt any lost batch) and before the
	// peers are rebuilt from it.
	diskProbed atomic.Pointer[func()]
}

// diskProbeInterval is how often a store whose disk failed tries a write.
const diskProbeInterval = 500 * time.Millisecond

// diskError returns the wrapped ErrDiskFailed while the disk is failed,
// nil otherwise.
func (s *Store) diskError() error {
	if p := s.diskErr.Load(); p != nil {
		return *p
	}
	return nil
}

// InjectDiskFailure makes every disk write of this store fail with err
// until it is called with nil, as a full disk or a failing fsync would
// (fault injection for tests and `ctl fault STORE disk=fail`).
func (s *Store) InjectDiskFailure(err error) {
	if err == nil {
		s.diskInjected.Store(nil)
		return
	}
	s.diskInjected.Store(&err)
}

// injectedDiskError is the injected failure, if any.
func (s *Store) injectedDiskError() error {
	if p := s.diskInjected.Load(); p != nil {
		return *p
	}
	return nil
}

// onDiskFailed is called by the loop when a round's write failed: it
// freezes the store (see above) and fails everything waiting on it.
func (s *Store) onDiskFailed(cause error) {
	err := fmt.Errorf("store %d: %w: %v; not accepting writes until the disk takes writes again", s.cfg.StoreID, ErrDiskFailed, cause)
	s.diskErr.Store(&err)
	s.stats.diskFailures.Add(1)
	s.log.Error("disk write failed: store frozen, serving only bounded-staleness reads until a write succeeds", "err", cause)
	for _, p := range s.allPeers() {
		p.mu.Lock()
		p.failProposalsLocked(err)
		p.failReadsLocked(err)
		p.mu.Unlock()
	}
}

// probeDisk tries a small durable write, after rebuilding the batch the
// failure lost, if it lost one (from the WAL: storage/engine, batch.go); no checkpoint
// may run before that rebuild, the probe's included. The rebuild takes
// the engine back to its last commit, behind what the peers applied: the
// peers are retired first (retirePeers), and serve nothing until
// recoverFromDisk has replaced them by peers loaded from the rebuilt
// engine.
func (s *Store) probeDisk() error {
	if err := s.injectedDiskError(); err != nil {
		return err
	}
	if err := s.eng.RecoverLost(s.retirePeers); err != nil {
		return fmt.Errorf("rebuild lost batch: %w", err)
	}
	return s.eng.Probe()
}

// retirePeers marks every peer of the frozen store removed, before its
// engine goes back to what is on disk (the last commit, behind what the
// peers applied: a lost batch) and until recoverFromDisk replaces them.
// Every read checks its peer under the peer's mutex before it reads the
// engine (prepareRead: the applied index, safe points, leases) and again
// after (stillHolds): one that read the rolled-back engine began its read
// after this, and finds its peer removed and retries (RegionNotFound)
// rather than answer older data than its peer's checks promised. Reads
// waiting for an apply that will not come are woken to find the same;
// proposals and ReadIndex requests fail with the disk error. Nothing the
// loop held of these peers is persisted or answered. Idempotent.
func (s *Store) retirePeers() {
	derr := s.diskError()
	if derr == nil {
		derr = fmt.Errorf("store %d: %w: peers being rebuilt from disk", s.cfg.StoreID, ErrDiskFailed)
	}
	for _, p := range s.allPeers() {
		p.mu.Lock()
		p.removed = true
		p.failProposalsLocked(derr)
		p.failReadsLocked(derr)
		for _, w := range p.applyWait {
			close(w.done)
		}
		p.applyWait = nil
		p.mu.Unlock()
	}
}

// recoverFromDisk rebuilds every peer from the engine, as a restart does,
// once the disk takes writes again. The loop is the only goroutine that
// creates or drives peers, and it is the caller, so no round is under way.
func (s *Store) recoverFromDisk() error {
	// The probe that succeeded rebuilt a lost batch (storage/engine, batch.go). A snapshot
	// apply under way is finished or cleared from its marker next: the
	// peers below are loaded from what the two leave.
	// Retired already if the probe rebuilt a lost batch; if not, before
	// anything below changes what the engine holds.
	s.retirePeers()
	if err := s.snaps.recover(); err != nil {
		return fmt.Errorf("snapshot applies: %w", err)
	}
	persisted, err := loadPeers(s.eng)
	if err != nil {
		return fmt.Errorf("reload peers: %w", err)
	}
	s.mu.Lock()
	s.peers = make(map[uint64]*Peer, len(persisted))
	s.ranges = region.Tree{}
	s.mu.Unlock()
	s.dirtyMu.Lock()
	clear(s.dirty)
	s.dirtyMu.Unlock()
	now := s.now()
	for _, pp := range persisted {
		p, err := s.createPeer(pp)
		if err != nil {
			return fmt.Errorf("region %d: %w", pp.region.ID, err)
		}
		p.mu.Lock()
		// Like a restart: this peer forgot the leader its lost rounds
		// acknowledged (votes.go).
		p.refuseVotesForElectionLocked(now)
		p.mu.Unlock()
		s.markDirty(p)
	}
	s.diskErr.Store(nil)
	s.log.Warn("disk takes writes again: peers rebuilt from disk", "regions", len(persisted))
	return nil
}
