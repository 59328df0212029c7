package raftstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Snapshot applies and range clears outside the Ready loop (issue 18).
//
// A received snapshot (a checked file under snap/, snapstream.go) was
// applied inside the round's one bbolt transaction: bbolt keeps every dirty
// page of a transaction in heap until it commits (196 MiB for a 64 MiB
// region), and every region of the store waited for it. Destroying a
// replica deleted its range in one transaction too, and bbolt's cursor,
// seeking the range's start after each delete, walks every leaf emptied so
// far: 32 s for 40,000 pairs of 1 KB, the whole store's loop waiting. Now:
//
//  1. The loop takes the peer's Ready carrying the snapshot and holds it:
//     nothing of it is persisted, sent or advanced, and the loop takes no
//     other Ready of the peer until it is done (raft allows one Ready in
//     flight, and a pending snapshot keeps it from campaigning). The peer
//     serves nothing from then on: its snapGen is odd, which
//     checkServingLocked and stillHolds refuse, and it asks for no follower
//     lease.
//  2. The store's worker (one goroutine, its jobs in order) syncs the file,
//     commits a marker (regionID|'s'|peerID: the snapshot, its file, the
//     Ready's hard state), clears the range's pairs and dedup records and
//     the region's old log, then writes the snapshot's records and pairs:
//     each step in transactions of at most snapApplyBatch bytes (or
//     clearBatchKeys deletes) under the engine's lock, between rounds.
//  3. The loop then persists the held Ready as any other: the round's
//     transaction writes the snapshot's small state (apply state, region,
//     dedup base) and deletes the marker, the round checkpoints (a shape
//     change) before it publishes and sends, so the snapshot's ack leaves
//     only once the snapshot is durable, and raft is advanced after. The
//     peer serves again from the publish on.
//
// A crash, a stop or a disk failure half-way leaves the marker: the next
// open (or the rebuild after the disk failure) applies the file again from
// the start and writes the state the held Ready would have, or, if the
// file is unusable and the peer was a placeholder (no leader counts on its
// log), clears what was written: the leader sends another snapshot. A peer
// destroyed or superseded half-way has what was written cleared instead.
//
// A destroyed replica's range is cleared by the worker too: destroyPeer
// commits the tombstone and a clear marker (regionID|'c'|peerID) and
// returns. Clears never touch a range a live region or a pending apply
// claims (the jobs run in order, so an apply queued after a clear clears
// its own range first anyway).

var (
	errApplyHalted = errors.New("snapshot apply halted")
	errPeerGone    = errors.New("peer removed during its snapshot apply")
)

func applyMarkerOf(regionID, peerID uint64) engine.Marker {
	return engine.Marker{Kind: engine.MarkerSnapApply, RegionID: regionID, PeerID: peerID}
}

func clearMarkerOf(regionID, peerID uint64) engine.Marker {
	return engine.Marker{Kind: engine.MarkerClear, RegionID: regionID, PeerID: peerID}
}

// putMarker records marker m with v, JSON-encoded, as its value.
func putMarker(tx *engine.Tx, m engine.Marker, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.PutMarker(m, b)
}

// applyMarker is a snapshot apply begun and not finished.
type applyMarker struct {
	Peer        uint64
	Index, Term uint64
	File        string        // under snap/
	Region      region.Region // the snapshot's
	// Hard is the held Ready's hard state (HasHard: it had one).
	HasHard                        bool
	HardTerm, HardVote, HardCommit uint64
	// WasInit: the peer held data before (a leader may count on its log).
	WasInit bool
}

// clearMarker is a destroyed replica's range not yet cleared.
type clearMarker struct {
	Start, End []byte
}

type jobState int

const (
	jobQueued jobState = iota
	jobRunning
	jobApplied   // data written: the loop finishes it
	jobFailed    // the loop fails its round with err
	jobFinishing // in the round's transaction: serves once published
	jobGone      // aborted or finished: in no map
)

// applyJob is a held Ready whose snapshot the worker applies.
type applyJob struct {
	s         *Store
	p         *Peer
	rp        *readyPeer
	id        uint64 // the staged file's
	st        stagedSnap
	marker    applyMarker
	state     jobState
	err       error
	dedupBase uint64
}

// clearJob clears a range nothing claims, then deletes its marker.
type clearJob struct {
	s          *Store
	marker     engine.Marker // to delete once done
	start, end []byte
	why        string
}

type workerJob struct {
	apply *applyJob
	clear *clearJob
}

// ---- the loop's side ---------------------------------------------------------

// collectReadyApart is collectReady with snapshot applies held apart: peers
// with a held Ready are left out, new snapshots go to the worker, and held
// Readys whose data the worker wrote come back to be finished.
func (s *Store) collectReadyApart(dirty map[uint64]*Peer) []*readyPeer {
	done := s.snaps.takeApplied(dirty)
	batch := s.snaps.divert(s, s.collectReady(dirty))
	return append(batch, done...)
}

// takeApplied drops the held peers from dirty and returns the held Readys
// ready to finish (or to fail the round: a failed apply).
func (ss *snapshots) takeApplied(dirty map[uint64]*Peer) []*readyPeer {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var out []*readyPeer
	for rid, j := range ss.held {
		if dirty[rid] == j.p {
			delete(dirty, rid)
		}
		if j.state != jobApplied && j.state != jobFailed {
			continue
		}
		if j.p.isRemoved() {
			ss.cleanupLocked(j)
			continue
		}
		out = append(out, j.rp)
	}
	return out
}

// divert takes the Readys that carry a received snapshot out of batch and
// hands their applies to the worker.
func (ss *snapshots) divert(s *Store, batch []*readyPeer) []*readyPeer {
	kept := batch[:0]
	for _, rp := range batch {
		var st *stagedSnap
		var id uint64
		if !raft.IsEmptySnap(rp.rd.Snapshot) {
			st, id, _ = ss.stagedFile(rp.rd.Snapshot.Data)
		}
		if st == nil {
			kept = append(kept, rp)
			continue
		}
		p := rp.p
		p.mu.Lock()
		p.snapGen++ // odd: serves nothing until finishApply
		p.revokeFollowerLeaseLocked()
		wasInit := p.initialized
		p.mu.Unlock()
		md := rp.rd.Snapshot.Metadata
		m := applyMarker{Peer: p.id, Index: md.Index, Term: md.Term, File: filepath.Base(st.path), Region: st.region, WasInit: wasInit}
		if hs := rp.rd.HardState; !raft.IsEmptyHardState(hs) {
			m.HasHard, m.HardTerm, m.HardVote, m.HardCommit = true, hs.Term, hs.Vote, hs.Commit
		}
		j := &applyJob{s: s, p: p, rp: rp, id: id, st: *st, marker: m}
		ss.mu.Lock()
		if old, ok := ss.held[p.regionID]; ok && old.p != p {
			ss.cleanupLocked(old) // a superseded peer's: before anything after it
		}
		ss.held[p.regionID] = j
		ss.enqueueLocked(workerJob{apply: j})
		ss.mu.Unlock()
		s.log.Info("applying snapshot outside the loop", "region", p.regionID, "peer", p.id, "index", md.Index)
	}
	return kept
}

// finishApply writes, in the round's transaction, the state of a snapshot
// whose data the worker wrote; held is false if no job holds it (one that
// never went to the worker is applied whole in the transaction).
func (ss *snapshots) finishApply(tx *engine.Tx, id uint64, md raftpb.SnapshotMetadata) (_ region.Region, held bool, _ error) {
	ss.mu.Lock()
	var j *applyJob
	for _, h := range ss.held {
		if h.id == id {
			j = h
		}
	}
	var state jobState
	var jerr error
	if j != nil {
		state, jerr = j.state, j.err
	}
	ss.mu.Unlock()
	if j == nil {
		return region.Region{}, false, nil
	}
	if state == jobFailed {
		return region.Region{}, true, jerr
	}
	if state != jobApplied {
		return region.Region{}, true, fmt.Errorf("region %d: snapshot apply not done (state %d): %w", j.st.regionID, state, errCorrupt)
	}
	rg := j.st.region
	if err := finishSnapshotTx(tx, rg, md.Index, md.Term, j.dedupBase); err != nil {
		return region.Region{}, true, err
	}
	if err := tx.DeleteMarker(applyMarkerOf(rg.ID, j.p.id)); err != nil {
		return region.Region{}, true, err
	}
	ss.mu.Lock()
	j.state = jobFinishing
	ss.mu.Unlock()
	return rg, true, nil
}

// publishedLocked is called as the loop publishes the round that finished
// the apply of staged file id (committed and checkpointed): the peer
// serves again. A read that began before is refused by stillHolds (the
// generation moved).
func (ss *snapshots) publishedLocked(id uint64) {
	for rid, j := range ss.held {
		if j.id != id || j.state != jobFinishing {
			continue
		}
		j.p.mu.Lock()
		j.p.snapGen++
		j.p.mu.Unlock()
		delete(ss.held, rid)
		j.state = jobGone
	}
}

// finishSnapshotTx writes a snapshot's state once its data is in: the
// log starts after it, and the region is the snapshot's.
func finishSnapshotTx(tx *engine.Tx, rg region.Region, index, term, dedupBase uint64) error {
	meta, err := encodeRegion(rg)
	if err != nil {
		return err
	}
	if err := tx.FinishSnapshot(meta, index, term, dedupBase); err != nil {
		return fmt.Errorf("region %d: finish snapshot: %w", rg.ID, err)
	}
	return nil
}

// ---- reads ---------------------------------------------------------------------

// applyingSnapshotLocked reports whether a snapshot is being written into
// the peer's range: it serves nothing meanwhile.
func (p *Peer) applyingSnapshotLocked() bool { return p.snapGen%2 == 1 }

// dataGen is noted by a read before it reads the engine (stillHolds).
func (p *Peer) dataGen() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.snapGen
}

// dataKeptSince reports whether the peer is not removed and no snapshot
// apply was under way when gen was noted nor began since: a read of the
// engine in between saw either all of the peer's data or none of a
// snapshot's. One lock for both: it runs after every read.
func (p *Peer) dataKeptSince(gen uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.removed && gen%2 == 0 && p.snapGen == gen
}

// ---- the worker -----------------------------------------------------------------

// enqueueLocked queues j and starts the worker if it is idle.
func (ss *snapshots) enqueueLocked(j workerJob) {
	ss.queue = append(ss.queue, j)
	if !ss.working && !ss.halted && !ss.closed {
		ss.working = true
		ss.workers.Add(1)
		go ss.work()
	}
}

func (ss *snapshots) work() {
	defer ss.workers.Done()
	for {
		ss.mu.Lock()
		if len(ss.queue) == 0 || ss.halted || ss.closed {
			ss.working = false
			ss.mu.Unlock()
			return
		}
		j := ss.queue[0]
		ss.queue = ss.queue[1:]
		ss.mu.Unlock()
		if j.apply != nil {
			ss.runApply(j.apply)
		} else if err := ss.runClear(j.clear); err != nil && !errors.Is(err, errApplyHalted) {
			j.clear.s.log.Warn("clearing a range failed; retried at the next start", "why", j.clear.why, "err", err)
		}
	}
}

// halted reports errApplyHalted once the store stops or rebuilds its peers.
func (ss *snapshots) haltedErr() error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.halted || ss.closed {
		return errApplyHalted
	}
	return nil
}

func (ss *snapshots) runApply(j *applyJob) {
	ss.mu.Lock()
	if j.state != jobQueued { // cleaned up before it ran
		ss.mu.Unlock()
		return
	}
	j.state = jobRunning
	ss.mu.Unlock()
	s, p := j.s, j.p
	stop := func() error {
		if hook := s.cfg.Knobs.beforeApplyBatch; hook != nil {
			hook(j.st.regionID)
		}
		if err := ss.haltedErr(); err != nil {
			return err
		}
		if p.isRemoved() {
			return errPeerGone
		}
		return nil
	}
	var base uint64
	err := stop()
	wrote := false
	if err == nil {
		err = ss.eng.SyncSnapshotFile(j.st.path)
	}
	if err == nil {
		err = ss.eng.LockedUpdate(func(tx *engine.Tx) error { return putMarker(tx, applyMarkerOf(j.st.regionID, p.id), j.marker) })
		wrote = err == nil
	}
	if err == nil {
		base, err = ss.eng.ApplySnapshotFile(j.st.path, spanOf(j.st.region), s.claimed(j.st.regionID, j), stop)
	}
	ss.mu.Lock()
	switch {
	case err == nil:
		j.state, j.dedupBase = jobApplied, base
	case errors.Is(err, errApplyHalted):
		// The marker stays: the next open or rebuild applies it again.
	case errors.Is(err, errPeerGone):
		if ss.held[j.st.regionID] == j {
			delete(ss.held, j.st.regionID)
		}
		j.state = jobGone
	default:
		j.state, j.err = jobFailed, err
	}
	ss.mu.Unlock()
	switch {
	case errors.Is(err, errPeerGone) && wrote:
		c := &clearJob{s: s, marker: applyMarkerOf(j.st.regionID, p.id), start: j.st.region.StartKey, end: j.st.region.EndKey,
			why: fmt.Sprintf("region %d peer %d removed during its snapshot apply", j.st.regionID, p.id)}
		if cerr := ss.runClear(c); cerr != nil && !errors.Is(cerr, errApplyHalted) {
			s.log.Warn("clearing an abandoned snapshot apply failed; retried at the next start", "region", j.st.regionID, "err", cerr)
		}
	case err != nil && !errors.Is(err, errApplyHalted) && !errors.Is(err, errPeerGone):
		s.log.Error("snapshot apply failed", "region", j.st.regionID, "peer", p.id, "err", err)
	}
	s.markDirty(p) // the loop finishes it, fails its round, or forgets it
}

// cleanupLocked abandons j, whose peer is gone: what it wrote is cleared.
func (ss *snapshots) cleanupLocked(j *applyJob) {
	if ss.held[j.st.regionID] == j {
		delete(ss.held, j.st.regionID)
	}
	switch j.state {
	case jobQueued:
		j.state = jobGone // never wrote anything
	case jobApplied, jobFailed:
		j.state = jobGone
		ss.enqueueLocked(workerJob{clear: &clearJob{s: j.s, marker: applyMarkerOf(j.st.regionID, j.p.id),
			start: j.st.region.StartKey, end: j.st.region.EndKey,
			why: fmt.Sprintf("region %d peer %d removed before its snapshot apply finished", j.st.regionID, j.p.id)}})
	}
	// jobRunning: the worker sees the peer removed and clears.
}

// enqueueClear has the worker clear a destroyed replica's range.
func (ss *snapshots) enqueueClear(s *Store, regionID, peerID uint64, r region.Region) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.enqueueLocked(workerJob{clear: &clearJob{s: s, marker: clearMarkerOf(regionID, peerID), start: r.StartKey, end: r.EndKey,
		why: fmt.Sprintf("region %d peer %d destroyed", regionID, peerID)}})
}

func (ss *snapshots) runClear(c *clearJob) error {
	claimed := c.s.claimed(0, nil)
	for _, iv := range engine.FreeRanges(c.start, c.end, claimed) {
		if err := ss.eng.ClearUserRange(iv[0], iv[1], ss.haltedErr); err != nil {
			return err
		}
	}
	return ss.eng.LockedUpdate(func(tx *engine.Tx) error { return tx.DeleteMarker(c.marker) })
}

// claimed returns the ranges a clear must not touch: every region here,
// and every snapshot waiting to be applied or finished, but for region
// except (0: none), the regions frozen for a merge into it, and job self.
// A snapshot of a merged region replaces the pairs of a local source
// frozen for it (it takes the source's place: dropMergedBy): were the
// source's range kept, a key deleted after the merge would stay here.
func (s *Store) claimed(except uint64, self *applyJob) []engine.Span {
	s.mu.RLock()
	var out []engine.Span
	for _, r := range s.ranges.All() {
		if except != 0 && (r.ID == except || r.Merge != nil && r.Merge.Target == except) {
			continue
		}
		out = append(out, spanOf(r))
	}
	s.mu.RUnlock()
	ss := s.snaps
	ss.mu.Lock()
	for _, j := range ss.held {
		if j != self && j.state != jobGone {
			out = append(out, spanOf(j.st.region))
		}
	}
	ss.mu.Unlock()
	return out
}

// halt stops the worker (the queue and held Readys are forgotten: the
// markers on disk say what is left) and waits for it.
func (ss *snapshots) halt() {
	ss.mu.Lock()
	ss.halted = true
	ss.queue = nil
	for _, j := range ss.held {
		j.state = jobGone
	}
	ss.held = make(map[uint64]*applyJob)
	ss.mu.Unlock()
	ss.workers.Wait()
}

// recover is called before the peers are rebuilt from disk after a disk
// failure: what was under way is finished or cleared from its markers.
func (ss *snapshots) recover() error {
	ss.halt()
	err := ss.resolve()
	ss.mu.Lock()
	ss.halted = false
	ss.mu.Unlock()
	return err
}

// ---- writing and clearing in bounded transactions -------------------------------
