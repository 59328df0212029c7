package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/keepalive"
)

// transport is the gRPC raftstore.Transport. Per target store it keeps one
// queue, one sender goroutine and one long-lived Raft.Stream carrying the
// messages of every region, so a Ready round that talks to a store costs
// one stream write instead of one RPC per message. Snapshots travel apart,
// chunked over Raft.Snapshot, so a large one never holds up heartbeats.
//
// Delivery is best effort, as raft expects: whatever cannot be sent (queue
// full, store unreachable, stream broken) is dropped and reported through
// Handler.ReportUnreachable, and raft resends it.
type transport struct {
	selfID  uint64
	opts    transportOptions
	logger  *slog.Logger
	metrics *metrics

	handler atomic.Pointer[handlerRef]

	// ctx ends every stream and sender at Close.
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup // sender and snapshot goroutines
	snapSem chan struct{}  // bounds concurrent snapshot sends

	// senders is copy-on-write (replaced under mu), so that Send and Flush,
	// called by the Ready loop every round, find their senders without
	// taking mu.
	senders atomic.Pointer[map[uint64]*peerSender]

	mu     sync.Mutex
	closed bool
	peers  map[uint64]string // store id -> address; changed by SetAddr
	conns  map[uint64]*grpc.ClientConn

	// stalled, if set, reports an injected stall (see faults.go): while it
	// lasts the store sends no raft messages, as in a GC pause. Set before
	// the store starts.
	stalled func() bool
}

type handlerRef struct{ raftstore.Handler }

type transportOptions struct {
	// clusterID names this store's cluster in every call (clusterid.go).
	clusterID uint64
	// queueSize bounds the messages waiting per target store; beyond it
	// Send drops, so a dead store cannot make the Ready loop grow memory.
	queueSize int
	// maxBatchBytes splits what one Flush sends into stream messages
	// below the receiver's gRPC message limit.
	maxBatchBytes int
	// dialTimeout bounds the wait for a connection before a stream is
	// opened; messages meanwhile queue and, past queueSize, are dropped.
	dialTimeout time.Duration
	// backoffMin/backoffMax space out reconnection attempts after a failure;
	// while backing off, messages are dropped at once.
	backoffMin, backoffMax time.Duration
	// sendTimeout bounds one stream write: a peer that accepts the
	// connection but stops reading would otherwise block its sender (and
	// its unreachable reports) until keepalive gives up on it.
	sendTimeout      time.Duration
	snapshotChunk    int
	snapshotTimeout  time.Duration
	maxSnapshotSends int
	// tls, if set, is the store's identity for dialing peers (tls.go).
	tls *TLS
}

func defaultTransportOptions() transportOptions {
	return transportOptions{
		queueSize:        4096,
		maxBatchBytes:    4 << 20,
		dialTimeout:      time.Second,
		backoffMin:       50 * time.Millisecond,
		backoffMax:       2 * time.Second,
		sendTimeout:      5 * time.Second,
		snapshotChunk:    1 << 20,
		snapshotTimeout:  5 * time.Minute,
		maxSnapshotSends: 4,
	}
}

var errTransportClosed = errors.New("raft transport closed")

func newTransport(selfID uint64, peers map[uint64]string, opts transportOptions, m *metrics, logger *slog.Logger) *transport {
	ctx, cancel := context.WithCancel(context.Background())
	t := &transport{
		selfID:  selfID,
		peers:   maps.Clone(peers),
		opts:    opts,
		logger:  logger,
		metrics: m,
		ctx:     ctx,
		cancel:  cancel,
		snapSem: make(chan struct{}, opts.maxSnapshotSends),
		conns:   make(map[uint64]*grpc.ClientConn),
	}
	t.senders.Store(&map[uint64]*peerSender{})
	return t
}

// SetHandler sets where delivery reports go; the Store, created after the
// transport because it needs it.
func (t *transport) SetHandler(h raftstore.Handler) {
	t.handler.Store(&handlerRef{h})
}

// Send queues m for its target store without blocking on the network.
func (t *transport) Send(m *raftstore.Message) {
	if m == nil {
		return
	}
	if t.stalled != nil && t.stalled() {
		t.metrics.raftDropped.Inc()
		t.dropped(m)
		return
	}
	if m.ToStore == t.selfID {
		// The store routes local peers itself; a message to ourselves is a
		// bug upstream, and looping it back would hide it.
		t.logger.Debug("dropping raft message addressed to this store", "region", m.RegionID, "type", m.TypeName())
		t.dropped(m)
		return
	}
	if m.Notice == nil && m.Msg.Type == raftpb.MsgSnap {
		t.sendSnapshotAsync(m)
		return
	}
	if p := t.sender(m.ToStore); p != nil {
		p.enqueue(m)
	}
}

// SendNow writes m on the caller's goroutine when the stream to its store
// is up and nothing is queued before it, and otherwise queues and flushes
// it. Used for the ReadIndex round trip of follower reads, whose latency
// is two hand-offs to sender goroutines shorter this way.
func (t *transport) SendNow(m *raftstore.Message) {
	if t.stalled != nil && t.stalled() {
		t.metrics.raftDropped.Inc()
		return
	}
	if m == nil || m.ToStore == t.selfID || (m.Notice == nil && m.Msg.Type == raftpb.MsgSnap) {
		t.Send(m)
		t.Flush()
		return
	}
	p := t.sender(m.ToStore)
	if p == nil {
		return
	}
	if p.sendMu.TryLock() {
		direct := p.stream != nil && !p.pending()
		if direct {
			p.send([]*raftstore.Message{m})
		}
		p.sendMu.Unlock()
		if direct {
			return
		}
	}
	p.enqueue(m)
	p.signal()
}

// Flush wakes the sender of every store with queued messages.
func (t *transport) Flush() {
	for _, p := range *t.senders.Load() {
		if p.pending() {
			p.signal()
		}
	}
}

// Close ends every stream and waits for the sender goroutines. Messages
// still queued are dropped without reports: the store is stopping.
func (t *transport) Close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	conns := t.conns
	t.conns = nil
	t.mu.Unlock()

	t.cancel()
	t.wg.Wait()
	for id, c := range conns {
		if err := c.Close(); err != nil {
			t.logger.Debug("close connection", "store", id, "err", err)
		}
	}
}

// SetAddr records (or changes) store id's address. A connection to an old
// address is closed; the store's sender notices its broken stream and
// reconnects, at the new address, on its next send.
func (t *transport) SetAddr(id uint64, addr string) {
	t.mu.Lock()
	if t.closed || t.peers[id] == addr {
		t.mu.Unlock()
		return
	}
	if t.peers == nil {
		t.peers = make(map[uint64]string)
	}
	t.peers[id] = addr
	old := t.conns[id]
	delete(t.conns, id)
	t.mu.Unlock()
	if old != nil {
		if err := old.Close(); err != nil {
			t.logger.Debug("close connection", "store", id, "err", err)
		}
	}
	if p := (*t.senders.Load())[id]; p != nil {
		// Whatever failed so far failed at the old address (or at none):
		// try the new one at once rather than after the backoff.
		p.addrChanged.Store(true)
	}
	t.logger.Info("store address set", "to_store", id, "addr", addr)
}

// sender returns the sender for store id, starting it on first use; nil
// once the transport is closed.
func (t *transport) sender(id uint64) *peerSender {
	if p := (*t.senders.Load())[id]; p != nil {
		// After Close the sender is gone; enqueueing is harmless.
		return p
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	old := *t.senders.Load()
	if p := old[id]; p != nil {
		return p
	}
	p := &peerSender{
		t:           t,
		storeID:     id,
		wake:        make(chan struct{}, 1),
		unreachable: make(map[peerKey]struct{}),
		up:          true,
	}
	next := maps.Clone(old)
	next[id] = p
	t.senders.Store(&next)
	t.wg.Add(1)
	go p.run()
	return p
}

// Conn is conn for the control plane (controlplane.Transport).
func (t *transport) Conn(id uint64) (*grpc.ClientConn, error) { return t.conn(id) }

// conn returns the client connection to store id, created lazily. gRPC
// connects in the background and reconnects by itself.
func (t *transport) conn(id uint64) (*grpc.ClientConn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errTransportClosed
	}
	if c := t.conns[id]; c != nil {
		return c, nil
	}
	addr, ok := t.peers[id]
	if !ok || addr == "" {
		return nil, fmt.Errorf("store %d: no address configured", id)
	}
	c, err := grpc.NewClient(addr, append(peerDialOptions(t.opts.tls, t.opts.clusterID),
		// Reconnect quickly: a restarted store should rejoin its raft
		// groups within seconds, not after gRPC's default 2 minute cap.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
		// Find a dead peer behind a half-open connection, where a stream
		// write would otherwise succeed into the void for minutes.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 3 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgSize)),
	)...)
	if err != nil {
		return nil, fmt.Errorf("dial store %d at %s: %w", id, addr, err)
	}
	t.conns[id] = c
	return c, nil
}

func (t *transport) reportUnreachable(regionID, toPeerID uint64) {
	if h := t.handler.Load(); h != nil {
		h.ReportUnreachable(regionID, toPeerID)
	}
}

func (t *transport) reportSnapshot(m *raftstore.Message, ok bool) {
	if h := t.handler.Load(); h != nil {
		h.ReportSnapshot(m, ok)
	}
}

// dropped reports a MsgSnap lost before the network: raft keeps the
// follower waiting for a snapshot until it hears how the send ended.
func (t *transport) dropped(m *raftstore.Message) {
	if m.Msg.Type == raftpb.MsgSnap {
		t.reportSnapshot(m, false)
	}
}

// sendSnapshotAsync sends a MsgSnap on its own goroutine and reports the
// outcome: raft keeps the follower paused until it hears one.
func (t *transport) sendSnapshotAsync(m *raftstore.Message) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.dropped(m)
		return
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		start := time.Now()
		sent, err := t.sendSnapshot(m)
		if err != nil {
			t.metrics.snapshots.WithLabelValues("failed").Inc()
			t.logger.Warn("sending snapshot failed", "region", m.RegionID, "to_store", m.ToStore, "to_peer", m.Msg.To, "err", err)
		} else {
			t.metrics.snapshots.WithLabelValues("ok").Inc()
			t.logger.Info("snapshot sent", "region", m.RegionID, "to_store", m.ToStore, "to_peer", m.Msg.To,
				"index", snapIndex(m.Msg), "bytes", sent, "took", time.Since(start).Round(time.Millisecond))
		}
		t.reportSnapshot(m, err == nil)
	}()
}

// sendSnapshot streams m: the first chunk carries the message with its
// snapshot data removed, then the data follows in chunks.
func (t *transport) sendSnapshot(m *raftstore.Message) (int64, error) {
	var sent int64
	select {
	case t.snapSem <- struct{}{}:
		defer func() { <-t.snapSem }()
	case <-t.ctx.Done():
		return sent, errTransportClosed
	}
	conn, err := t.conn(m.ToStore)
	if err != nil {
		return sent, err
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.opts.snapshotTimeout)
	defer cancel()
	if err := waitReady(ctx, conn, t.opts.dialTimeout); err != nil {
		return sent, fmt.Errorf("connect to store %d: %w", m.ToStore, err)
	}

	// Copy the message and its snapshot: the original belongs to raft.
	header := m.Msg
	var data io.Reader = bytes.NewReader(nil)
	if m.Msg.Snapshot != nil {
		snap := *m.Msg.Snapshot
		data = bytes.NewReader(snap.Data)
		if raftstore.IsSnapshotDescriptor(snap.Data) {
			// Streamed from the store, a chunk at a time, at its send
			// rate; the header keeps the descriptor, which tells the
			// receiver to take it as a stream.
			src, ok := t.handlerAs()
			if !ok {
				return sent, fmt.Errorf("snapshot of region %d: the store cannot stream it", m.RegionID)
			}
			rc, err := src.OpenSnapshot(m)
			if err != nil {
				return sent, fmt.Errorf("open snapshot of region %d: %w", m.RegionID, err)
			}
			defer rc.Close()
			data = rc
		} else {
			snap.Data = nil
		}
		header.Snapshot = &snap
	}
	hb, err := header.Marshal()
	if err != nil {
		return sent, fmt.Errorf("encode snapshot header: %w", err)
	}

	stream, err := kvpb.NewRaftClient(conn).Snapshot(ctx)
	if err != nil {
		return sent, fmt.Errorf("open snapshot stream to store %d: %w", m.ToStore, err)
	}
	chunk := &kvpb.SnapshotChunk{Header: &kvpb.RaftMessage{RegionId: m.RegionID, FromStore: t.selfID, ToStore: m.ToStore, Message: hb, FromConfVer: m.FromConfVer}}
	for {
		// A fresh buffer per chunk: gRPC may hold a sent message.
		buf := make([]byte, t.opts.snapshotChunk)
		n, rerr := io.ReadFull(data, buf)
		if rerr != nil && !errors.Is(rerr, io.EOF) && !errors.Is(rerr, io.ErrUnexpectedEOF) {
			return sent, fmt.Errorf("read snapshot of region %d: %w", m.RegionID, rerr)
		}
		chunk.Data = buf[:n]
		if n > 0 || chunk.Header != nil {
			if err := stream.Send(chunk); err != nil {
				return sent, fmt.Errorf("send snapshot chunk to store %d: %w", m.ToStore, streamErr(stream, err))
			}
			sent += int64(n)
		}
		if rerr != nil {
			break
		}
		chunk = &kvpb.SnapshotChunk{}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		return sent, fmt.Errorf("store %d refused snapshot: %w", m.ToStore, err)
	}
	return sent, nil
}

// handlerAs returns the handler as a snapshot source.
func (t *transport) handlerAs() (raftstore.SnapshotSource, bool) {
	h := t.handler.Load()
	if h == nil {
		return nil, false
	}
	src, ok := h.Handler.(raftstore.SnapshotSource)
	return src, ok
}

// streamErr turns the io.EOF a client stream's Send returns when the stream
// broke into the status that broke it.
func streamErr[Req, Resp any](stream grpc.ClientStreamingClient[Req, Resp], err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := stream.CloseAndRecv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// waitReady waits up to timeout for conn to be connected, starting the
// connection if it is idle. Opening a stream on a connection that is still
// connecting would otherwise block for gRPC's full connect timeout.
func waitReady(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		s := conn.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			conn.Connect()
		case connectivity.Shutdown:
			return errTransportClosed
		}
		if !conn.WaitForStateChange(ctx, s) {
			return fmt.Errorf("connection %s: %w", s, ctx.Err())
		}
	}
}

func snapIndex(m raftpb.Message) uint64 {
	if m.Snapshot == nil {
		return 0
	}
	return m.Snapshot.Metadata.Index
}

// peerKey names a raft peer for unreachable reports.
type peerKey struct{ regionID, peerID uint64 }

// peerSender owns the stream to one store.
type peerSender struct {
	t       *transport
	storeID uint64
	wake    chan struct{} // capacity 1: a pending wake-up absorbs later ones

	// addrChanged is set by SetAddr; the sender then drops its backoff.
	addrChanged atomic.Bool

	mu    sync.Mutex
	queue []*raftstore.Message
	// unreachable collects peers whose messages Send dropped on a full
	// queue; run reports them, so Send never calls into the store.
	unreachable map[peerKey]struct{}

	// sendMu guards the stream and its retry state below: run holds it
	// while it writes, SendNow while it writes directly.
	sendMu       sync.Mutex
	stream       grpc.ClientStreamingClient[kvpb.RaftMessageBatch, kvpb.Done]
	cancelStream context.CancelFunc
	backoff      time.Duration
	retryAt      time.Time
	up           bool // for logging state changes once, not per message
}

// hibernationSlack: how many messages past queueSize a hibernate or wake
// notice may still queue (see enqueue).
const hibernationSlack = 4

func (p *peerSender) enqueue(m *raftstore.Message) {
	limit := p.t.opts.queueSize
	if m.IsNotice() && (m.Notice.Kind == raftstore.NoticeHibernate || m.Notice.Kind == raftstore.NoticeWake) {
		// These notices are what lets a busy store shed its load: one
		// dropped leaves a follower awake under a sleeping leader, and it
		// campaigns and wakes its region again. Dropped on a full queue of
		// heartbeats, most regions of a store never slept (5,000 regions on
		// one core: 4,400 awake after three minutes). They are few (one per
		// peer per hibernation) and tiny, so they get room of their own.
		limit *= hibernationSlack
	}
	p.mu.Lock()
	if len(p.queue) >= limit {
		p.unreachable[peerKey{m.RegionID, m.ToPeer()}] = struct{}{}
		p.mu.Unlock()
		p.t.metrics.raftDropped.Inc()
		p.signal()
		return
	}
	p.queue = append(p.queue, m)
	p.mu.Unlock()
}

func (p *peerSender) pending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue) > 0 || len(p.unreachable) > 0
}

func (p *peerSender) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *peerSender) run() {
	defer p.t.wg.Done()
	defer func() {
		p.sendMu.Lock()
		p.closeStream()
		p.sendMu.Unlock()
	}()
	var spare []*raftstore.Message
	for {
		select {
		case <-p.t.ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		msgs := p.queue
		p.queue = spare[:0]
		var unreachable map[peerKey]struct{}
		if len(p.unreachable) > 0 {
			unreachable = p.unreachable
			p.unreachable = make(map[peerKey]struct{})
		}
		p.mu.Unlock()

		for k := range unreachable {
			p.t.reportUnreachable(k.regionID, k.peerID)
		}
		if len(msgs) > 0 {
			p.sendMu.Lock()
			p.send(msgs)
			p.sendMu.Unlock()
		}
		clear(msgs) // let the sent messages be collected
		spare = msgs
	}
}

// send writes msgs to the stream in batches of at most maxBatchBytes.
func (p *peerSender) send(msgs []*raftstore.Message) {
	if err := p.ensureStream(); err != nil {
		p.drop(msgs)
		return
	}
	batch := &kvpb.RaftMessageBatch{}
	inBatch := msgs[:0:0]
	size := 0
	for i, m := range msgs {
		var data []byte
		var notice *kvpb.Notice
		if m.Notice != nil {
			notice = noticeToPB(m.Notice)
		} else {
			var err error
			if data, err = m.Msg.Marshal(); err != nil {
				p.t.logger.Error("encode raft message", "region", m.RegionID, "type", m.Msg.Type.String(), "err", err)
				p.drop(msgs[i : i+1])
				continue
			}
		}
		if len(batch.Msgs) > 0 && size+len(data) > p.t.opts.maxBatchBytes {
			if err := p.writeBatch(batch); err != nil {
				p.drop(inBatch)
				p.drop(msgs[i:])
				return
			}
			p.t.metrics.raftSent.Add(float64(len(inBatch)))
			batch, inBatch, size = &kvpb.RaftMessageBatch{}, inBatch[:0], 0
		}
		rm := &kvpb.RaftMessage{RegionId: m.RegionID, FromStore: p.t.selfID, ToStore: m.ToStore, Message: data, FromConfVer: m.FromConfVer, Notice: notice}
		rm.LeaseHorizonNanos = int64(m.LeaseHorizon)
		if sp := m.SafePoint; sp != nil {
			rm.SafePoint = &kvpb.SafePoint{Term: sp.Term, Commit: sp.Commit, TimeUnixNano: sp.Time.UnixNano()}
		}
		batch.Msgs = append(batch.Msgs, rm)
		inBatch = append(inBatch, m)
		size += len(data)
	}
	if len(batch.Msgs) == 0 {
		return
	}
	if err := p.writeBatch(batch); err != nil {
		p.drop(inBatch)
		return
	}
	p.t.metrics.raftSent.Add(float64(len(inBatch)))
}

func (p *peerSender) writeBatch(b *kvpb.RaftMessageBatch) error {
	watchdog := time.AfterFunc(p.t.opts.sendTimeout, p.cancelStream)
	err := p.stream.Send(b)
	fired := !watchdog.Stop()
	if err != nil {
		err = streamErr(p.stream, err)
		if fired {
			err = fmt.Errorf("stream write blocked over %v: %w", p.t.opts.sendTimeout, err)
		}
		p.fail(err)
		return err
	}
	p.backoff = 0
	return nil
}

// drop reports each distinct peer of msgs unreachable once.
func (p *peerSender) drop(msgs []*raftstore.Message) {
	if len(msgs) == 0 {
		return
	}
	p.t.metrics.raftDropped.Add(float64(len(msgs)))
	seen := make(map[peerKey]struct{}, len(msgs))
	for _, m := range msgs {
		k := peerKey{m.RegionID, m.ToPeer()}
		if _, ok := seen[k]; ok {
			continue
		}
		seen[k] = struct{}{}
		p.t.reportUnreachable(k.regionID, k.peerID)
	}
}

var errBackingOff = errors.New("backing off after a failed connection")

func (p *peerSender) ensureStream() error {
	if p.addrChanged.Swap(false) {
		p.backoff, p.retryAt = 0, time.Time{}
	}
	if p.stream != nil {
		return nil
	}
	if time.Now().Before(p.retryAt) {
		return errBackingOff
	}
	conn, err := p.t.conn(p.storeID)
	if err != nil {
		p.fail(err)
		return err
	}
	if err := waitReady(p.t.ctx, conn, p.t.opts.dialTimeout); err != nil {
		p.fail(err)
		return err
	}
	ctx, cancel := context.WithCancel(p.t.ctx)
	stream, err := kvpb.NewRaftClient(conn).Stream(ctx)
	if err != nil {
		cancel()
		p.fail(err)
		return err
	}
	p.stream, p.cancelStream = stream, cancel
	if !p.up {
		p.up = true
		p.t.logger.Info("raft stream connected", "to_store", p.storeID)
	}
	return nil
}

// fail drops the stream and schedules the next attempt with exponential
// backoff.
func (p *peerSender) fail(err error) {
	p.closeStream()
	p.backoff = min(max(2*p.backoff, p.t.opts.backoffMin), p.t.opts.backoffMax)
	p.retryAt = time.Now().Add(p.backoff)
	if p.t.ctx.Err() != nil {
		return
	}
	if p.up {
		p.up = false
		p.t.logger.Warn("raft stream down", "to_store", p.storeID, "retry_in", p.backoff, "err", err)
	} else {
		p.t.logger.Debug("raft stream still down", "to_store", p.storeID, "retry_in", p.backoff, "err", err)
	}
}

func (p *peerSender) closeStream() {
	if p.stream != nil {
		p.cancelStream()
		p.stream, p.cancelStream = nil, nil
	}
}
