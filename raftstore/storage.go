package raftstore

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// The mirror's bound (docs/design.md, "The bounded log mirror"). Entries
// past the applied index always stay in memory: raft sends, commits and
// applies them. Of the applied ones the mirror keeps the last
// mirrorTailEntries, at most mirrorTailBytes of them: a follower whose
// appends were rejected or dropped is resent from its match index, which
// trails the leader's applied index by the appends in flight to it, a few
// rounds of batched writes (one round of 32 writers is 32 entries; 256 is 8
// such rounds; 1 MiB is one MsgApp, raft's MaxSizePerMsg). Anything older,
// down to the durable log's first index, is read from bbolt: only a
// follower that was down or cut off for a while needs it. The tail is
// trimmed once mirrorTrimSlack entries beyond it pile up, not every round:
// MemoryStorage.Compact copies what it keeps.
const (
	mirrorTailEntries = 256
	mirrorTailBytes   = 1 << 20
	mirrorTrimSlack   = 64
	// termBlock is how many terms one bbolt read for Term fetches: raft's
	// findConflictByTerm walks back one index at a time.
	termBlock = 64
)

// peerStorage is a region peer's raft.Storage. bbolt holds the durable log
// (from the apply state's TruncatedIndex+1), written by the Ready loop
// before the in-memory mirror, a raft.MemoryStorage, is updated. The
// mirror holds only the log's recent part (see the bound above) so that
// raft's frequent Term/Entries calls never touch disk; older entries are
// read from bbolt's raftlog bucket on demand. FirstIndex is the durable
// log's. Snapshot also reads bbolt: it builds the region snapshot at the
// current applied index on demand.
type peerStorage struct {
	*raft.MemoryStorage
	eng      *engine.Engine
	built    *atomic.Uint64
	regionID uint64
	// snaps, if set, makes Snapshot file a streaming source and return
	// its descriptor (snapstream.go); unset (tests), it builds in memory.
	snaps     *snapshots
	buildErrs *atomic.Uint64

	// mu guards the durable log's bounds (raft reads them under the
	// peer's mutex, publish sets them on the loop's goroutine) and the
	// term cache. Never held across a bbolt read.
	mu        sync.Mutex
	first     uint64 // the durable log's first index
	truncTerm uint64 // the term at first-1
	termsLo   uint64 // terms[i] is the term of index termsLo+i (below the mirror)
	terms     []uint64

	// diskReads counts Entries and Term calls served from bbolt;
	// readErrs, reads that failed (answered ErrCompacted: raft sends a
	// snapshot instead of panicking), lastReadErr the last such error.
	diskReads, readErrs atomic.Uint64
	lastReadErr         atomic.Pointer[error]

	// sized is the byte size of the mirror's entries sizedFrom through
	// sizedTo, all applied (so never rewritten), kept by tailTrimPoint on
	// the loop's goroutine: a round sizes only the entries applied since
	// the last, instead of walking back over the last mirrorTailEntries
	// every round, which with many regions was a share of every round.
	sizedFrom, sizedTo, sized uint64
}

var _ raft.Storage = (*peerStorage)(nil)

// persistedPeer is everything a peer needs to restart.
type persistedPeer struct {
	region  region.Region
	hard    raftpb.HardState
	apply   engine.ApplyState
	entries []raftpb.Entry
	// tailFrom is the index of entries[0] when the log is loaded from past
	// its first index (only its tail goes in the mirror), with tailTerm the
	// term before it; 0 when entries start at the first index.
	tailFrom, tailTerm uint64
}

// loadPeers reads every region the engine holds, each log's applied part
// only as far back as the mirror keeps (see above).
func loadPeers(e *engine.Engine) ([]persistedPeer, error) {
	pps, err := e.LoadPeers(engine.MirrorBound{Entries: mirrorTailEntries, Bytes: mirrorTailBytes})
	if err != nil {
		return nil, err
	}
	out := make([]persistedPeer, 0, len(pps))
	for _, pp := range pps {
		r, err := decodeRegion(pp.Meta)
		if err != nil {
			return nil, fmt.Errorf("region %d: %w", pp.Span.ID, err)
		}
		out = append(out, persistedPeer{region: r, hard: pp.Hard, apply: pp.Apply, entries: pp.Entries, tailFrom: pp.TailFrom, tailTerm: pp.TailTerm})
	}
	return out, nil
}

// newPeerStorage rebuilds the mirror from what was persisted: the log's
// tail that loadPeers read, based at the entry before it.
func newPeerStorage(eng *engine.Engine, p persistedPeer, built *atomic.Uint64) (*peerStorage, error) {
	ms := raft.NewMemoryStorage()
	base, baseTerm := p.apply.TruncatedIndex, p.apply.TruncatedTerm
	if p.tailFrom > base+1 {
		base, baseTerm = p.tailFrom-1, p.tailTerm
	}
	if base > 0 {
		err := ms.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{
			Index:     base,
			Term:      baseTerm,
			ConfState: confStateOf(p.region),
		}})
		if err != nil {
			return nil, fmt.Errorf("region %d: mirror base %d: %w", p.region.ID, base, err)
		}
	}
	if err := ms.Append(p.entries); err != nil {
		return nil, fmt.Errorf("region %d: mirror append: %w", p.region.ID, err)
	}
	if err := ms.SetHardState(p.hard); err != nil {
		return nil, fmt.Errorf("region %d: mirror hard state: %w", p.region.ID, err)
	}
	return &peerStorage{MemoryStorage: ms, eng: eng, regionID: p.region.ID, built: built,
		first: p.apply.TruncatedIndex + 1, truncTerm: p.apply.TruncatedTerm}, nil
}

// Snapshot returns a snapshot of the region at its applied index: with a
// streaming source, its metadata and a descriptor of its data (raft calls
// this under the peer's mutex: it opens a read transaction and reads two
// keys, whatever the region's size); without, the whole snapshot.
func (s *peerStorage) Snapshot() (raftpb.Snapshot, error) {
	var snap raftpb.Snapshot
	var err error
	if s.snaps != nil {
		snap, err = s.snaps.open(s.regionID)
	} else {
		snap, err = buildSnapshot(s.eng, s.regionID)
	}
	if err != nil {
		// Raft retries at the follower's next heartbeat response; any other
		// error would make it panic. Say so, once a while per region.
		if s.buildErrs != nil {
			s.buildErrs.Add(1)
		}
		if s.snaps != nil {
			s.snaps.buildFailed(s.regionID, err)
		}
		return raftpb.Snapshot{}, raft.ErrSnapshotTemporarilyUnavailable
	}
	s.built.Add(1)
	return snap, nil
}

// bounds returns the durable log's first index and the term before it.
func (s *peerStorage) bounds() (first, truncTerm uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first, s.truncTerm
}

// FirstIndex is the durable log's first index, not the mirror's.
func (s *peerStorage) FirstIndex() (uint64, error) {
	first, _ := s.bounds()
	return first, nil
}

// Term answers from the mirror, or, for an index below it, from bbolt.
func (s *peerStorage) Term(i uint64) (uint64, error) {
	t, first, below, err := s.termAbove(i)
	if !below {
		return t, err
	}
	return s.diskTerm(first, i)
}

// termAbove answers Term for i from the durable log's bounds and the
// mirror; below: i is in the durable log under the mirror, for the caller
// to read from bbolt (first is the durable log's first index).
func (s *peerStorage) termAbove(i uint64) (t, first uint64, below bool, err error) {
	first, truncTerm := s.bounds()
	switch {
	case i+1 < first:
		return 0, first, false, raft.ErrCompacted
	case i+1 == first:
		return truncTerm, first, false, nil
	}
	t, err = s.MemoryStorage.Term(i)
	if errors.Is(err, raft.ErrCompacted) {
		return 0, first, true, nil
	}
	return t, first, false, err
}

// diskTerm reads the term of i (first <= i, below the mirror) from bbolt,
// with the termBlock terms before it: the entries below the mirror are
// applied, so their terms never change while they are in the log.
func (s *peerStorage) diskTerm(first, i uint64) (uint64, error) {
	s.mu.Lock()
	if i >= s.termsLo && i-s.termsLo < uint64(len(s.terms)) {
		t := s.terms[i-s.termsLo]
		s.mu.Unlock()
		return t, nil
	}
	s.mu.Unlock()
	lo := first
	if i >= first+termBlock {
		lo = i + 1 - termBlock
	}
	ents, err := s.readLog(lo, i+1, math.MaxUint64)
	if err != nil {
		return 0, s.readFailed(err)
	}
	if last := ents[len(ents)-1].Index; last != i {
		return 0, raft.ErrCompacted // the log changed under the read
	}
	terms := make([]uint64, len(ents))
	for j := range ents {
		terms[j] = ents[j].Term
	}
	s.mu.Lock()
	if s.first == first { // not reset by a snapshot meanwhile
		s.termsLo, s.terms = lo, terms
	}
	s.mu.Unlock()
	return terms[len(terms)-1], nil
}

// Entries answers from the mirror, or, for a range starting below it, from
// bbolt and then the mirror, within maxSize (at least one entry).
func (s *peerStorage) Entries(lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	first, _ := s.bounds()
	if lo < first {
		return nil, raft.ErrCompacted
	}
	mfirst, _ := s.MemoryStorage.FirstIndex()
	if lo >= mfirst {
		ents, err := s.MemoryStorage.Entries(lo, hi, maxSize)
		if !errors.Is(err, raft.ErrCompacted) {
			return ents, err
		}
		// Trimmed since we looked: what it dropped is in bbolt.
		mfirst, _ = s.MemoryStorage.FirstIndex()
	}
	return s.entriesAcross(lo, hi, maxSize, mfirst)
}

// entriesAcross reads [lo, min(hi, mfirst)) from bbolt and goes on in the
// mirror from mfirst while maxSize allows.
func (s *peerStorage) entriesAcross(lo, hi, maxSize, mfirst uint64) ([]raftpb.Entry, error) {
	ents, err := s.readLog(lo, min(hi, mfirst), maxSize)
	if err != nil {
		return nil, s.readFailed(err)
	}
	// Short of mfirst: maxSize was reached (or the log changed under the
	// read); raft takes a shorter answer as the size limit.
	if hi <= mfirst || uint64(len(ents)) < mfirst-lo {
		return ents, nil
	}
	var size uint64
	for i := range ents {
		size += uint64(ents[i].Size())
	}
	if size >= maxSize {
		return ents, nil
	}
	rest, err := s.MemoryStorage.Entries(mfirst, hi, maxSize-size)
	if err != nil {
		return ents, nil // the mirror moved on meanwhile: bbolt's part alone is an answer
	}
	// The mirror returns at least one entry, even one past the budget.
	if len(rest) == 1 && size+uint64(rest[0].Size()) > maxSize {
		return ents, nil
	}
	return append(ents, rest...), nil
}

// readLog reads the region's entries [lo, hi) from bbolt, stopping once
// maxSize is reached (at least one entry) or at the first index missing;
// ErrCompacted if lo is missing (compacted, or cleared by a snapshot, since
// the caller read the bounds).
func (s *peerStorage) readLog(lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	s.diskReads.Add(1)
	var out []raftpb.Entry
	err := s.eng.View(func(tx *engine.Tx) error {
		var err error
		out, err = tx.Entries(s.regionID, lo, hi, maxSize)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("region %d: read log [%d, %d): %w", s.regionID, lo, hi, err)
	}
	if len(out) == 0 {
		return nil, raft.ErrCompacted
	}
	return out, nil
}

// readFailed turns a failed bbolt read into ErrCompacted, the one error
// raft survives (it sends a snapshot instead), and keeps the error.
func (s *peerStorage) readFailed(err error) error {
	if !errors.Is(err, raft.ErrCompacted) {
		s.readErrs.Add(1)
		s.lastReadErr.Store(&err)
	}
	return raft.ErrCompacted
}

// applySnapshot resets the mirror and the durable bounds to a snapshot
// bbolt now holds (publish).
func (s *peerStorage) applySnapshot(snap raftpb.Snapshot) error {
	err := s.MemoryStorage.ApplySnapshot(snap)
	if err != nil && !errors.Is(err, raft.ErrSnapOutOfDate) {
		return err
	}
	s.mu.Lock()
	if idx := snap.Metadata.Index; idx+1 > s.first {
		s.first, s.truncTerm = idx+1, snap.Metadata.Term
	}
	s.terms = nil
	s.mu.Unlock()
	s.sizedFrom = 0 // the mirror starts over
	return nil
}

// trim records a durable compaction through compactTo (0: none this
// round), then drops from the mirror what bbolt no longer holds and the
// applied entries beyond the mirror's bound (publish, after commit).
func (s *peerStorage) trim(applied, compactTo, compactTerm uint64) error {
	if compactTo > 0 {
		s.mu.Lock()
		if compactTo+1 > s.first {
			s.first, s.truncTerm = compactTo+1, compactTerm
		}
		s.mu.Unlock()
	}
	// Never past what committed bbolt state holds: older entries are read
	// from there (storage/engine, batch.go).
	to := max(compactTo, s.tailTrimPoint(min(applied, s.eng.LogFloor(s.regionID))))
	mfirst, _ := s.MemoryStorage.FirstIndex()
	last, _ := s.MemoryStorage.LastIndex()
	if to < mfirst || to > last { // nothing to drop; or not yet in the mirror (Compact panics)
		return nil
	}
	if err := s.MemoryStorage.Compact(to); err != nil && !errors.Is(err, raft.ErrCompacted) {
		return err
	}
	return nil
}

// tailTrimPoint is the index the mirror is to be compacted through to keep
// its bound, 0 if it need not be yet. Unless the applied entries in the
// mirror may be over the bound (by count, with the slack, or by bytes,
// which sized says), it returns 0 at once; otherwise it walks back from the
// applied index at most mirrorTailEntries+1 entries.
func (s *peerStorage) tailTrimPoint(applied uint64) uint64 {
	mfirst, _ := s.MemoryStorage.FirstIndex()
	last, _ := s.MemoryStorage.LastIndex()
	applied = min(applied, last)
	if applied < mfirst {
		return 0
	}
	if s.sizedFrom != mfirst || applied < s.sizedTo || s.sizedTo+1 < mfirst {
		s.sizedFrom, s.sizedTo, s.sized = mfirst, mfirst-1, 0
	}
	if applied > s.sizedTo {
		ents, err := s.MemoryStorage.Entries(s.sizedTo+1, applied+1, math.MaxUint64)
		if err != nil {
			s.sizedFrom = 0
			return 0
		}
		for i := range ents {
			s.sized += uint64(ents[i].Size())
		}
		s.sizedTo = applied
	}
	if applied-mfirst+1 < mirrorTailEntries+mirrorTrimSlack && s.sized <= mirrorTailBytes {
		// Whatever the walk below found: no suffix is over the byte
		// bound, and fewer than mirrorTrimSlack are past the count.
		return 0
	}
	ents, err := s.MemoryStorage.Entries(mfirst, applied+1, math.MaxUint64)
	if err != nil {
		return 0
	}
	keep, byBytes := len(ents), false // ents[keep:] stay
	var size uint64
	for keep > 0 && len(ents)-keep < mirrorTailEntries {
		if size += uint64(ents[keep-1].Size()); size > mirrorTailBytes {
			byBytes = true
			break
		}
		keep--
	}
	if keep == 0 || (!byBytes && keep < mirrorTrimSlack) {
		return 0
	}
	return ents[keep-1].Index
}

// termTx is the term of i from the mirror, or else from tx: the loop's own
// write transaction (applyTx), never a second one on its goroutine.
func (s *peerStorage) termTx(tx *engine.Tx, i uint64) (uint64, error) {
	if t, _, below, err := s.termAbove(i); !below {
		return t, err
	}
	t, ok, err := tx.Term(s.regionID, i)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, raft.ErrCompacted
	}
	return t, nil
}
