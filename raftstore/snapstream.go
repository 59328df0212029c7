package raftstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3/raftpb"
)

// Snapshots stream (issue 18): no side ever holds a region's snapshot in
// memory.
//
// Sender: raft asks the leader's peerStorage for a snapshot when a follower
// needs one. It gets the snapshot's metadata and, as its data, a
// descriptor (snapDesc, a few bytes): Snapshot opens a bbolt read
// transaction, reads the applied state and region from it and files the
// transaction as a source under a fresh ID. When the transport sends the
// MsgSnap it asks the store for the data (OpenSnapshot), which a goroutine
// writes from that transaction, a key-value pair at a time, into a pipe
// the transport reads in chunks, at no more than Config.SnapshotSendRate
// for all of the store's sends together. Data and applied index come from
// one transaction, so they agree. A source no transport claims within
// snapSourceTTL is closed (its MsgSnap was lost before the network).
//
// Receiver: the transport hands the stream to ReceiveSnapshot, which
// writes it to a file under the data directory's snap/ while checking it
// (checksum and every rule decodeSnapshotData has), then steps the MsgSnap
// into raft with a descriptor of the file as its data. The store's worker
// applies the snapshot from the file in bounded transactions while the
// Ready loop holds the peer's Ready (snapapply.go); the file is deleted
// once the loop has finished it. A file raft never applies is deleted once
// the peer is gone or has applied past its index, and every file at start
// (after an apply a restart interrupted is finished from its file).

const (
	snapSourceTTL = time.Minute
	// DefaultSnapshotSendRate is Config.SnapshotSendRate's default.
	DefaultSnapshotSendRate = 64 << 20
)

var snapDescMagic = []byte("HKVD1")

// Descriptor kinds: a sender's source, a receiver's staged file.
const (
	snapDescSource = 's'
	snapDescStaged = 'f'
)

// snapDesc encodes a descriptor: "HKVD1" | kind | id(8).
func snapDesc(kind byte, id uint64) []byte {
	b := append(append([]byte(nil), snapDescMagic...), kind)
	return binary.BigEndian.AppendUint64(b, id)
}

func parseSnapDesc(data []byte) (kind byte, id uint64, ok bool) {
	if len(data) != len(snapDescMagic)+9 || !bytes.HasPrefix(data, snapDescMagic) {
		return 0, 0, false
	}
	return data[len(snapDescMagic)], binary.BigEndian.Uint64(data[len(snapDescMagic)+1:]), true
}

// IsSnapshotDescriptor reports whether a MsgSnap's data is a descriptor
// whose data must be streamed from the sending store (OpenSnapshot).
func IsSnapshotDescriptor(data []byte) bool {
	kind, _, ok := parseSnapDesc(data)
	return ok && kind == snapDescSource
}

type sendSource struct {
	tx       *engine.Tx
	regionID uint64
	opened   time.Time
}

type stagedSnap struct {
	path     string
	regionID uint64
	index    uint64
	region   region.Region // as the snapshot carries it
}

// snapshots is a store's snapshot sources and staged files.
type snapshots struct {
	eng  *engine.Engine
	log  *slog.Logger
	dir  string
	rate *rateLimiter

	mu       sync.Mutex
	nextID   uint64
	sources  map[uint64]*sendSource
	staged   map[uint64]*stagedSnap
	streams  map[*io.PipeWriter]struct{} // sends in progress
	closed   bool
	lastWarn map[warnKey]time.Time // the last failure logged, per kind and region
	wg       sync.WaitGroup        // stream writers

	// The apply worker (snapapply.go): the Readys held for an apply, by
	// region; the jobs in order; whether the worker runs; halted while
	// the peers are rebuilt from disk.
	held    map[uint64]*applyJob
	queue   []workerJob
	working bool
	halted  bool
	workers sync.WaitGroup
}

func newSnapshots(eng *engine.Engine, log *slog.Logger, rate int64) (*snapshots, error) {
	dir := eng.SnapshotDir()
	ss := &snapshots{
		eng: eng, log: log, dir: dir, rate: newRateLimiter(rate),
		sources:  make(map[uint64]*sendSource),
		staged:   make(map[uint64]*stagedSnap),
		streams:  make(map[*io.PipeWriter]struct{}),
		lastWarn: make(map[warnKey]time.Time),
		held:     make(map[uint64]*applyJob),
	}
	// An apply or a clear a stop or crash interrupted is finished first,
	// from its file.
	if err := ss.resolve(); err != nil {
		return nil, err
	}
	// Whatever else is here was received before a restart: raft has
	// forgotten it, and the leader sends another.
	if err := eng.ResetSnapshotDir(); err != nil {
		return nil, err
	}
	return ss, nil
}

// open files a read transaction as the source of a snapshot of the region
// and returns the snapshot raft sends: its metadata and a descriptor.
func (ss *snapshots) open(regionID uint64) (raftpb.Snapshot, error) {
	tx, err := ss.eng.BeginRead()
	if err != nil {
		return raftpb.Snapshot{}, fmt.Errorf("begin snapshot of region %d: %w", regionID, err)
	}
	md, err := snapshotMetaTx(tx, regionID)
	if err != nil {
		tx.Release()
		return raftpb.Snapshot{}, fmt.Errorf("snapshot of region %d: %w", regionID, err)
	}
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		tx.Release()
		return raftpb.Snapshot{}, ErrStopped
	}
	ss.nextID++
	id := ss.nextID
	ss.sources[id] = &sendSource{tx: tx, regionID: regionID, opened: time.Now()}
	ss.mu.Unlock()
	return raftpb.Snapshot{Data: snapDesc(snapDescSource, id), Metadata: md}, nil
}

// warnKey names a kind of snapshot failure in one region.
type warnKey struct {
	receive  bool // receiving, else building
	regionID uint64
}

// warnEvery is how often one kind of failure in one region is logged:
// raft retries a snapshot at every heartbeat, far too often to log each.
const warnEvery = 10 * time.Second

// shouldWarn reports whether a failure of kind k is to be logged now.
func (ss *snapshots) shouldWarn(k warnKey) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := time.Now()
	if now.Sub(ss.lastWarn[k]) < warnEvery {
		return false
	}
	ss.lastWarn[k] = now
	return true
}

// buildFailed logs a failed build, at most every warnEvery per region.
func (ss *snapshots) buildFailed(regionID uint64, err error) {
	if ss.shouldWarn(warnKey{regionID: regionID}) {
		ss.log.Warn("building a snapshot failed; raft retries at the follower's next heartbeat", "region", regionID, "err", err)
	}
}

// receiveFailed logs a snapshot this store could not take (its disk is
// full, the stream broke), at most every warnEvery per region: the
// sender logs it too, but this is the store an operator has to fix.
func (ss *snapshots) receiveFailed(regionID uint64, err error) {
	if ss.shouldWarn(warnKey{receive: true, regionID: regionID}) {
		ss.log.Warn("receiving a snapshot failed; the leader sends another", "region", regionID, "err", err)
	}
}

// OpenSnapshot returns the data of the snapshot the MsgSnap m carries (its
// data is a descriptor from this store), streamed from the transaction it
// was taken in and paced by Config.SnapshotSendRate. The caller must Close
// it. A source is read once: a second call fails.
func (s *Store) OpenSnapshot(m *Message) (io.ReadCloser, error) {
	if m == nil || m.Msg.Snapshot == nil {
		return nil, fmt.Errorf("no snapshot: %w", ErrInvalidRequest)
	}
	return s.snaps.stream(m.Msg.Snapshot.Data)
}

func (ss *snapshots) stream(desc []byte) (io.ReadCloser, error) {
	kind, id, ok := parseSnapDesc(desc)
	if !ok || kind != snapDescSource {
		return nil, fmt.Errorf("snapshot data is no descriptor of a snapshot here: %w", ErrInvalidRequest)
	}
	pr, pw := io.Pipe()
	ss.mu.Lock()
	src, found := ss.sources[id]
	delete(ss.sources, id)
	if found && !ss.closed {
		ss.streams[pw] = struct{}{}
		ss.wg.Add(1)
	}
	closed := ss.closed
	ss.mu.Unlock()
	if !found {
		return nil, fmt.Errorf("snapshot %d: no such source (sent already, or expired): %w", id, ErrInvalidRequest)
	}
	if closed {
		src.tx.Release()
		return nil, ErrStopped
	}
	go func() {
		defer ss.wg.Done()
		err := func() error {
			defer src.tx.Release()
			return src.tx.WriteSnapshot(src.regionID, pw)
		}()
		ss.mu.Lock()
		delete(ss.streams, pw)
		ss.mu.Unlock()
		pw.CloseWithError(err) // nil: EOF
	}()
	return &pacedReader{pr: pr, rate: ss.rate}, nil
}

// pacedReader reads a snapshot stream at the store's send rate.
type pacedReader struct {
	pr   *io.PipeReader
	rate *rateLimiter
}

func (r *pacedReader) Read(b []byte) (int, error) {
	n, err := r.pr.Read(b)
	r.rate.wait(n)
	return n, err
}

func (r *pacedReader) Close() error { return r.pr.Close() }

// ReceiveSnapshot receives the data of the MsgSnap m from r: it writes it
// to a file while checking it, then steps m into its region with the file
// as its data. An error means the snapshot was refused (the sender reports
// the failure to raft, which sends another).
func (s *Store) ReceiveSnapshot(m *Message, r io.Reader) error {
	if s.stopped() {
		return ErrStopped
	}
	if m == nil || m.Msg.Type != raftpb.MsgSnap || m.Msg.Snapshot == nil {
		return fmt.Errorf("region %d: not a MsgSnap with a snapshot: %w", m.RegionID, errCorrupt)
	}
	ss := s.snaps
	ss.mu.Lock()
	ss.nextID++
	id := ss.nextID
	ss.mu.Unlock()
	path := filepath.Join(ss.dir, fmt.Sprintf("%d-%d-%d.hkvs", m.RegionID, m.Msg.Snapshot.Metadata.Index, id))
	rg, err := receiveSnapshotFile(ss.eng, path, m.RegionID, r)
	if err != nil {
		_ = ss.eng.RemoveSnapshotFile(path)
		ss.receiveFailed(m.RegionID, err)
		return fmt.Errorf("region %d: receive snapshot: %w", m.RegionID, err)
	}
	ss.mu.Lock()
	ss.staged[id] = &stagedSnap{path: path, regionID: m.RegionID, index: m.Msg.Snapshot.Metadata.Index, region: rg}
	ss.mu.Unlock()
	mc := *m
	snap := *m.Msg.Snapshot
	snap.Data = snapDesc(snapDescStaged, id)
	mc.Msg.Snapshot = &snap
	if err := s.HandleRaftMessage(&mc); err != nil {
		ss.dropStaged(id)
		return err
	}
	return nil
}

// receiveSnapshotFile writes a snapshot stream to path, checking it, and
// returns the region it is of.
func receiveSnapshotFile(e *engine.Engine, path string, regionID uint64, r io.Reader) (region.Region, error) {
	meta, err := e.ReceiveSnapshotFile(path, regionID, r)
	if err != nil {
		return region.Region{}, err
	}
	return decodeRegion(meta)
}

// stagedFile returns the staged snapshot a local descriptor names.
func (ss *snapshots) stagedFile(desc []byte) (*stagedSnap, uint64, bool) {
	kind, id, ok := parseSnapDesc(desc)
	if !ok || kind != snapDescStaged {
		return nil, 0, false
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st, ok := ss.staged[id]
	return st, id, ok
}

// dropStaged deletes a staged file: raft will not apply it, or the loop
// published its apply (the peer then serves again: publishedLocked).
func (ss *snapshots) dropStaged(id uint64) {
	ss.mu.Lock()
	st, ok := ss.staged[id]
	delete(ss.staged, id)
	ss.publishedLocked(id)
	ss.mu.Unlock()
	if ok {
		if err := ss.eng.RemoveSnapshotFile(st.path); err != nil {
			ss.log.Warn("remove snapshot file", "path", st.path, "err", err)
		}
	}
}

// applyStaged writes, inside the round's tx, the staged snapshot desc
// names: the state of one the worker applied (finishApply), or the whole
// of one that never went to it.
func (ss *snapshots) applyStaged(tx *engine.Tx, snap raftpb.Snapshot) (uint64, region.Region, error) {
	st, id, ok := ss.stagedFile(snap.Data)
	if !ok {
		return 0, region.Region{}, fmt.Errorf("snapshot file gone: %w", errCorrupt)
	}
	if r, held, err := ss.finishApply(tx, id, snap.Metadata); held {
		return id, r, err
	}
	meta, err := tx.ApplySnapshotFile(st.path, snap.Metadata.Index, snap.Metadata.Term)
	if err != nil {
		return 0, region.Region{}, err
	}
	r, err := decodeRegion(meta)
	return id, r, err
}

// sweep closes the sources no transport claimed in time and deletes the
// staged files raft will never apply: their peer is gone, or has applied
// past them.
func (s *Store) sweepSnapshots() {
	ss := s.snaps
	now := time.Now()
	var expired []*sendSource
	var stale []uint64
	ss.mu.Lock()
	for id, src := range ss.sources {
		if now.Sub(src.opened) > snapSourceTTL {
			expired = append(expired, src)
			delete(ss.sources, id)
		}
	}
	staged := make(map[uint64]stagedSnap, len(ss.staged))
	for id, st := range ss.staged {
		staged[id] = *st
	}
	ss.mu.Unlock()
	for _, src := range expired {
		s.log.Warn("snapshot never sent: its transaction closed", "region", src.regionID)
		src.tx.Release()
	}
	for id, st := range staged {
		p, ok := s.peer(st.regionID)
		if ok {
			p.mu.Lock()
			ok = !p.removed && p.applied < st.index
			p.mu.Unlock()
		}
		if !ok {
			stale = append(stale, id)
		}
	}
	for _, id := range stale {
		ss.dropStaged(id)
	}
}

// close ends every send in progress and closes every source; files stay
// (the next start deletes them).
func (ss *snapshots) close() {
	ss.mu.Lock()
	ss.closed = true
	srcs := ss.sources
	ss.sources = map[uint64]*sendSource{}
	for pw := range ss.streams {
		pw.CloseWithError(ErrStopped)
	}
	ss.mu.Unlock()
	for _, src := range srcs {
		src.tx.Release()
	}
	ss.wg.Wait()
	ss.workers.Wait() // an apply stops between transactions; its marker stays
}

// rateLimiter paces bytes to a rate shared by every caller; rate <= 0 is
// no limit.
type rateLimiter struct {
	mu   sync.Mutex
	rate float64 // bytes per second
	next time.Time
}

func newRateLimiter(rate int64) *rateLimiter { return &rateLimiter{rate: float64(rate)} }

// wait blocks until n more bytes fit the rate.
func (l *rateLimiter) wait(n int) {
	if l.rate <= 0 || n <= 0 {
		return
	}
	l.mu.Lock()
	now := time.Now()
	// Credit at most 100ms of idle time, so a burst stays short.
	if l.next.Before(now.Add(-100 * time.Millisecond)) {
		l.next = now.Add(-100 * time.Millisecond)
	}
	l.next = l.next.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	until := l.next
	l.mu.Unlock()
	if d := time.Until(until); d > 0 {
		time.Sleep(d)
	}
}
