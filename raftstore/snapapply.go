package raftstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/bbolt"
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

// Variables for tests (many small transactions).
var (
	// snapApplyBatch bounds the keys and values one apply transaction
	// writes: bbolt holds them, their nodes and their pages until commit.
	snapApplyBatch = 4 << 20
	// clearBatchKeys bounds the deletes of one clear transaction.
	clearBatchKeys = 4096
)

const (
	suffixSnapApply = 's'
	suffixClear     = 'c'
)

var (
	errApplyHalted = errors.New("snapshot apply halted")
	errPeerGone    = errors.New("peer removed during its snapshot apply")
)

func applyMarkerKey(regionID, peerID uint64) []byte {
	return binary.BigEndian.AppendUint64(stateKey(regionID, suffixSnapApply), peerID)
}

func clearMarkerKey(regionID, peerID uint64) []byte {
	return binary.BigEndian.AppendUint64(stateKey(regionID, suffixClear), peerID)
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
	key        []byte // the marker to delete
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
func (ss *snapshots) finishApply(tx *bbolt.Tx, id uint64, md raftpb.SnapshotMetadata) (_ region.Region, held bool, _ error) {
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
	if err := tx.Bucket(bucketRaftState).Delete(applyMarkerKey(rg.ID, j.p.id)); err != nil {
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
func finishSnapshotTx(tx *bbolt.Tx, rg region.Region, index, term, dedupBase uint64) error {
	if err := putDedupBaseTx(tx, rg.ID, dedupBase); err != nil {
		return fmt.Errorf("region %d dedup clock: %w", rg.ID, err)
	}
	if err := deleteLog(tx, rg.ID, 0, ^uint64(0)); err != nil {
		return fmt.Errorf("clear region %d log: %w", rg.ID, err)
	}
	if err := putApplyState(tx, rg.ID, applyState{AppliedIndex: index, AppliedTerm: term, TruncatedIndex: index, TruncatedTerm: term}); err != nil {
		return err
	}
	return putRegion(tx, rg)
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

// dataKeptSince reports whether no snapshot apply was under way when gen
// was noted nor began since: a read of the engine in between saw either
// all of the peer's data or none of a snapshot's.
func (p *Peer) dataKeptSince(gen uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return gen%2 == 0 && p.snapGen == gen
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

// testHookApplyBatch, if set, runs before each transaction of an apply
// (tests: stop or crash a store half-way).
var testHookApplyBatch func(regionID uint64)

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
		if testHookApplyBatch != nil {
			testHookApplyBatch(j.st.regionID)
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
		err = syncFile(j.st.path, ss.eng.noSync)
	}
	if err == nil {
		err = ss.eng.lockedUpdate(func(tx *bbolt.Tx) error { return putJSON(tx, applyMarkerKey(j.st.regionID, p.id), j.marker) })
		wrote = err == nil
	}
	if err == nil {
		base, err = ss.eng.applySnapshotFile(j.st.path, j.st.region, s.claimed(j.st.regionID, j), stop)
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
		c := &clearJob{s: s, key: applyMarkerKey(j.st.regionID, p.id), start: j.st.region.StartKey, end: j.st.region.EndKey,
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
		ss.enqueueLocked(workerJob{clear: &clearJob{s: j.s, key: applyMarkerKey(j.st.regionID, j.p.id),
			start: j.st.region.StartKey, end: j.st.region.EndKey,
			why: fmt.Sprintf("region %d peer %d removed before its snapshot apply finished", j.st.regionID, j.p.id)}})
	}
	// jobRunning: the worker sees the peer removed and clears.
}

// enqueueClear has the worker clear a destroyed replica's range.
func (ss *snapshots) enqueueClear(s *Store, regionID, peerID uint64, r region.Region) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.enqueueLocked(workerJob{clear: &clearJob{s: s, key: clearMarkerKey(regionID, peerID), start: r.StartKey, end: r.EndKey,
		why: fmt.Sprintf("region %d peer %d destroyed", regionID, peerID)}})
}

func (ss *snapshots) runClear(c *clearJob) error {
	claimed := c.s.claimed(0, nil)
	for _, iv := range freeRanges(c.start, c.end, claimed) {
		if err := ss.eng.clearUserRange(iv[0], iv[1], ss.haltedErr); err != nil {
			return err
		}
	}
	return ss.eng.lockedUpdate(func(tx *bbolt.Tx) error { return tx.Bucket(bucketRaftState).Delete(c.key) })
}

// claimed returns the ranges a clear must not touch: every region here,
// and every snapshot waiting to be applied or finished, but for region
// except (0: none) and job self.
func (s *Store) claimed(except uint64, self *applyJob) []region.Region {
	s.mu.RLock()
	var out []region.Region
	for _, r := range s.ranges.All() {
		if r.ID != except || except == 0 {
			out = append(out, r)
		}
	}
	s.mu.RUnlock()
	ss := s.snaps
	ss.mu.Lock()
	for _, j := range ss.held {
		if j != self && j.state != jobGone {
			out = append(out, j.st.region)
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

// lockedUpdate runs fn in a write transaction under the engine's lock,
// committed as the loop's rounds are (made durable by the next checkpoint).
func (e *engine) lockedUpdate(fn func(*bbolt.Tx) error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.db.Update(fn)
}

// applySnapshotFile writes the snapshot in the file at path into the
// engine in bounded transactions: it clears rg's range (but what claimed
// holds) and the region's log, then writes the dedup records and the
// pairs. stop is checked before each transaction. It returns the dedup
// clock base, which the caller writes with the region's state.
func (e *engine) applySnapshotFile(path string, rg region.Region, claimed []region.Region, stop func() error) (uint64, error) {
	for _, iv := range freeRanges(rg.StartKey, rg.EndKey, claimed) {
		if err := e.clearUserRange(iv[0], iv[1], stop); err != nil {
			return 0, err
		}
	}
	if err := e.clearKeys(bucketRaftLog, logKey(rg.ID, 0), logKey(rg.ID+1, 0), stop); err != nil {
		return 0, err
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("open snapshot file: %w", err)
	}
	defer f.Close()
	w := &batchWriter{e: e, stop: stop}
	var base uint64
	err = decodeSnapshotStream(f, func(sd *snapshotData) error {
		if sd.region.ID != rg.ID || !bytes.Equal(sd.region.StartKey, rg.StartKey) || !bytes.Equal(sd.region.EndKey, rg.EndKey) {
			return fmt.Errorf("snapshot file holds %s, not %s: %w", sd.region.String(), rg.String(), errCorrupt)
		}
		base = sd.dedupBase
		for _, d := range sd.dedup {
			if !dedupKeyFits(d.key) {
				continue
			}
			if err := w.put(bucketDedup, dedupKey(d.key, d.id), binary.BigEndian.AppendUint64(nil, d.clock)); err != nil {
				return err
			}
		}
		return nil
	}, func(k, v []byte) error { return w.put(bucketData, k, v) })
	if err == nil {
		err = w.flush()
	}
	return base, err
}

// batchWriter puts pairs in transactions of at most snapApplyBatch bytes.
type batchWriter struct {
	e     *engine
	stop  func() error
	arena []byte
	puts  []batchPut
}

type batchPut struct {
	bucket []byte
	k, v   []byte
}

func (w *batchWriter) put(bucket, k, v []byte) error {
	if len(w.arena)+len(k)+len(v) > cap(w.arena) && len(w.puts) > 0 {
		if err := w.flush(); err != nil {
			return err
		}
	}
	if w.arena == nil {
		w.arena = make([]byte, 0, max(snapApplyBatch, len(k)+len(v)))
	}
	if len(k)+len(v) > cap(w.arena)-len(w.arena) {
		w.arena = make([]byte, 0, len(k)+len(v)) // one oversized pair
	}
	w.arena = append(w.arena, k...)
	kc := w.arena[len(w.arena)-len(k):]
	w.arena = append(w.arena, v...)
	vc := w.arena[len(w.arena)-len(v):]
	w.puts = append(w.puts, batchPut{bucket: bucket, k: kc, v: vc})
	return nil
}

// flush commits the pairs put so far; bbolt holds the slices until then,
// so the arena is reused only after.
func (w *batchWriter) flush() error {
	if len(w.puts) == 0 {
		return nil
	}
	if err := w.stop(); err != nil {
		return err
	}
	err := w.e.lockedUpdate(func(tx *bbolt.Tx) error {
		for _, p := range w.puts {
			if err := tx.Bucket(p.bucket).Put(p.k, p.v); err != nil {
				return err
			}
		}
		return nil
	})
	clear(w.puts)
	w.puts = w.puts[:0]
	if cap(w.arena) > snapApplyBatch {
		w.arena = nil
	} else {
		w.arena = w.arena[:0]
	}
	return err
}

// clearUserRange deletes the pairs of user keys in [start, end) (end
// empty: no bound) and their dedup records.
func (e *engine) clearUserRange(start, end []byte, stop func() error) error {
	var hi []byte
	if len(end) > 0 {
		hi = end
	}
	if err := e.clearKeys(bucketData, start, hi, stop); err != nil {
		return err
	}
	lo, dhi := dedupRange(start, end)
	return e.clearKeys(bucketDedup, lo, dhi, stop)
}

// clearKeys deletes bucket's keys in [lo, hi) (hi nil: no bound),
// clearBatchKeys a transaction. Each transaction collects its keys first
// and deletes them by key: deleting under a cursor and seeking the start
// again walks every leaf emptied so far, which is quadratic.
func (e *engine) clearKeys(bucket, lo, hi []byte, stop func() error) error {
	for {
		if err := stop(); err != nil {
			return err
		}
		done := false
		err := e.lockedUpdate(func(tx *bbolt.Tx) error {
			b := tx.Bucket(bucket)
			keys := make([][]byte, 0, 256)
			c := b.Cursor()
			k, _ := c.Seek(lo)
			for ; k != nil && (hi == nil || bytes.Compare(k, hi) < 0) && len(keys) < clearBatchKeys; k, _ = c.Next() {
				keys = append(keys, bytes.Clone(k))
			}
			done = k == nil || (hi != nil && bytes.Compare(k, hi) >= 0)
			for _, k := range keys {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
			if !done {
				lo = k // the first key not deleted: the next batch starts there
				lo = bytes.Clone(lo)
			}
			return nil
		})
		if err != nil || done {
			return err
		}
	}
}

// freeRanges returns [start, end) (end empty: no bound) less the ranges of
// claimed, as [start, end) pairs in key order.
func freeRanges(start, end []byte, claimed []region.Region) [][2][]byte {
	cs := slices.Clone(claimed)
	slices.SortFunc(cs, func(a, b region.Region) int { return bytes.Compare(a.StartKey, b.StartKey) })
	var out [][2][]byte
	cur := start
	for _, c := range cs {
		if len(end) > 0 && bytes.Compare(c.StartKey, end) >= 0 {
			break
		}
		if len(c.EndKey) > 0 && bytes.Compare(c.EndKey, cur) <= 0 {
			continue // before cur
		}
		if bytes.Compare(c.StartKey, cur) > 0 {
			out = append(out, [2][]byte{cur, c.StartKey})
		}
		if len(c.EndKey) == 0 {
			return out // claimed to the end
		}
		cur = c.EndKey
	}
	if len(end) == 0 || bytes.Compare(cur, end) < 0 {
		out = append(out, [2][]byte{cur, end})
	}
	return out
}

func putJSON(tx *bbolt.Tx, key []byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketRaftState).Put(key, b)
}

// syncFile makes a received snapshot file durable: a restart may apply it
// again.
func syncFile(path string, noSync bool) error {
	if noSync {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path), false)
}

// ---- after a restart or a disk failure --------------------------------------------

// resolve finishes or clears, from their markers, the applies and clears
// a stop, a crash or a disk failure left half-way, before any peer is
// loaded. A clear, or an apply of a peer destroyed (tombstone) or that is
// not its region's only apply (a superseded placeholder), is cleared; an
// apply is done again from its file and given the state its held Ready
// would have written; one whose file is unusable is cleared if the peer
// was a placeholder, and is an error otherwise (a leader may count on the
// log the peer had, which is gone).
func (ss *snapshots) resolve() error {
	type found struct {
		key    []byte
		region uint64
		apply  *applyMarker
		clear  *clearMarker
	}
	var all []found
	perRegion := map[uint64]int{}
	err := ss.eng.db.View(func(tx *bbolt.Tx) error {
		st := tx.Bucket(bucketRaftState)
		c := st.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != 17 || (k[8] != suffixSnapApply && k[8] != suffixClear) {
				continue
			}
			f := found{key: bytes.Clone(k), region: binary.BigEndian.Uint64(k)}
			var err error
			if k[8] == suffixSnapApply {
				f.apply = &applyMarker{}
				err = json.Unmarshal(v, f.apply)
				if err == nil && st.Get(tombstoneKey(f.region, f.apply.Peer)) == nil {
					perRegion[f.region]++
				}
			} else {
				f.clear = &clearMarker{}
				err = json.Unmarshal(v, f.clear)
			}
			if err != nil {
				return fmt.Errorf("marker %x: %v: %w", k, err, errCorrupt)
			}
			all = append(all, f)
		}
		return nil
	})
	if err != nil || len(all) == 0 {
		return err
	}
	noStop := func() error { return nil }
	var reapply []found
	for _, f := range all {
		var start, end []byte
		switch {
		case f.clear != nil:
			start, end = f.clear.Start, f.clear.End
		case ss.tombstoned(f.region, f.apply.Peer) || (!f.apply.WasInit && perRegion[f.region] > 1):
			start, end = f.apply.Region.StartKey, f.apply.Region.EndKey
		default:
			reapply = append(reapply, f)
			continue
		}
		if err := ss.clearResolved(f.key, start, end, 0); err != nil {
			return err
		}
	}
	for _, f := range reapply {
		m := f.apply
		path := filepath.Join(ss.dir, filepath.Base(m.File))
		claimed, err := ss.eng.persistedRanges(f.region)
		if err != nil {
			return err
		}
		base, err := ss.eng.applySnapshotFile(path, m.Region, claimed, noStop)
		if err != nil {
			if m.WasInit {
				return fmt.Errorf("region %d: snapshot apply at index %d cannot be finished from %s (%v); the replica's log is gone: remove the store's data and add it back", f.region, m.Index, path, err)
			}
			ss.log.Warn("an interrupted snapshot apply cannot be redone: cleared; the leader sends another", "region", f.region, "peer", m.Peer, "err", err)
			if err := ss.clearResolved(f.key, m.Region.StartKey, m.Region.EndKey, f.region); err != nil {
				return err
			}
			continue
		}
		err = ss.eng.update(func(tx *bbolt.Tx) error {
			st := tx.Bucket(bucketRaftState)
			var hs raftpb.HardState
			if m.HasHard {
				hs = raftpb.HardState{Term: m.HardTerm, Vote: m.HardVote, Commit: m.HardCommit}
			} else if v := st.Get(stateKey(f.region, suffixHardState)); v != nil {
				if err := hs.Unmarshal(v); err != nil {
					return fmt.Errorf("region %d hard state: %w", f.region, err)
				}
			}
			// The log ends at the snapshot: the held Ready's entries
			// after it were never acknowledged.
			hs.Commit = m.Index
			if hs.Term < m.Term {
				hs.Term, hs.Vote = m.Term, 0
			}
			if err := finishSnapshotTx(tx, m.Region, m.Index, m.Term, base); err != nil {
				return err
			}
			if err := putHardState(tx, f.region, hs); err != nil {
				return err
			}
			return st.Delete(f.key)
		})
		if err != nil {
			return fmt.Errorf("region %d: finish an interrupted snapshot apply: %w", f.region, err)
		}
		ss.log.Info("finished an interrupted snapshot apply from its file", "region", f.region, "peer", m.Peer, "index", m.Index)
	}
	return nil
}

func (ss *snapshots) tombstoned(regionID, peerID uint64) bool {
	var t bool
	_ = ss.eng.db.View(func(tx *bbolt.Tx) error {
		t = tx.Bucket(bucketRaftState).Get(tombstoneKey(regionID, peerID)) != nil
		return nil
	})
	return t
}

// clearResolved clears [start, end) but what the persisted regions (less
// region except) hold, then deletes the marker key.
func (ss *snapshots) clearResolved(key, start, end []byte, except uint64) error {
	claimed, err := ss.eng.persistedRanges(except)
	if err != nil {
		return err
	}
	for _, iv := range freeRanges(start, end, claimed) {
		if err := ss.eng.clearUserRange(iv[0], iv[1], func() error { return nil }); err != nil {
			return err
		}
	}
	return ss.eng.update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketRaftState).Delete(key) })
}

// persistedRanges returns the ranges of the regions this store holds data
// of, as persisted, but region except's.
func (e *engine) persistedRanges(except uint64) ([]region.Region, error) {
	var out []region.Region
	err := e.db.View(func(tx *bbolt.Tx) error {
		st := tx.Bucket(bucketRaftState)
		c := st.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != 9 || k[8] != suffixRegion || binary.BigEndian.Uint64(k) == except {
				continue
			}
			as, err := decodeApplyState(st.Get(stateKey(binary.BigEndian.Uint64(k), suffixApplyState)))
			if err != nil || as.AppliedIndex == 0 {
				continue
			}
			var r region.Region
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decode region meta: %w", err)
			}
			out = append(out, r)
		}
		return nil
	})
	return out, err
}

// markerCount is for tests: the apply and clear markers on disk.
func (e *engine) markerCount() (applies, clears int) {
	_ = e.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketRaftState).Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if len(k) == 17 && k[8] == suffixSnapApply {
				applies++
			} else if len(k) == 17 && k[8] == suffixClear {
				clears++
			}
		}
		return nil
	})
	return applies, clears
}
