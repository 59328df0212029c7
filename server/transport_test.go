package server

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeHandler records what a transport or raft service hands the store.
type fakeHandler struct {
	mu          sync.Mutex
	msgs        []*raftstore.Message
	unreachable []peerKey
	snaps       []snapReport
}

type snapReport struct {
	regionID, toPeerID uint64
	ok                 bool
}

func (h *fakeHandler) HandleRaftMessage(m *raftstore.Message) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, m)
	return nil
}

func (h *fakeHandler) ReportUnreachable(regionID, toPeerID uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unreachable = append(h.unreachable, peerKey{regionID, toPeerID})
}

func (h *fakeHandler) ReportSnapshot(m *raftstore.Message, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.snaps = append(h.snaps, snapReport{m.RegionID, m.Msg.To, ok})
}

func (h *fakeHandler) received() []*raftstore.Message {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.msgs)
}

func (h *fakeHandler) unreachableReports() []peerKey {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.unreachable)
}

func (h *fakeHandler) snapshotReports() []snapReport {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.snaps)
}

// startRaftServer serves only the Raft service for storeID on lis.
func startRaftServer(t *testing.T, lis net.Listener, storeID uint64, h raftstore.Handler) *raftService {
	t.Helper()
	svc := newRaftService(storeID, h, testLogger(t))
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxRecvMsgSize))
	kvpb.RegisterRaftServer(srv, svc)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		svc.stop()
		srv.Stop()
		<-done
		svc.wait()
	})
	return svc
}

func fastTransportOptions() transportOptions {
	o := defaultTransportOptions()
	o.backoffMin = 10 * time.Millisecond
	o.backoffMax = 100 * time.Millisecond
	o.dialTimeout = 500 * time.Millisecond
	return o
}

func newTestTransport(t *testing.T, self uint64, peers map[uint64]string, opts transportOptions, h raftstore.Handler) *transport {
	t.Helper()
	tr := newTransport(self, peers, opts, newMetrics(func() float64 { return 0 }), testLogger(t))
	tr.SetHandler(h)
	t.Cleanup(tr.Close)
	return tr
}

func appMsg(region, from, to uint64, payload string) *raftstore.Message {
	return &raftstore.Message{RegionID: region, FromStore: 1, ToStore: 2, Msg: raftpb.Message{
		Type: raftpb.MsgApp, From: from, To: to, Term: 3, Index: 10, LogTerm: 3, Commit: 9,
		Entries: []raftpb.Entry{{Term: 3, Index: 11, Data: []byte(payload)}},
	}}
}

// TestTransportCarriesNotices: notices travel in the stream batch beside
// raft messages, in order, with their kind, peers, term, commit and lease
// intact, and no raft message made of them.
func TestTransportCarriesNotices(t *testing.T) {
	lis := listen(t)
	recv := &fakeHandler{}
	startRaftServer(t, lis, 2, recv)
	tr := newTestTransport(t, 1, map[uint64]string{2: lis.Addr().String()}, fastTransportOptions(), &fakeHandler{})

	grant := &raftstore.Notice{Kind: raftstore.NoticeLeaseGrant, From: 11, To: 12, Term: 3,
		Lease: &raftstore.LeaseMsg{Instance: 7, Seq: 2, Commit: 9, Duration: 450 * time.Millisecond}}
	hib := &raftstore.Notice{Kind: raftstore.NoticeHibernate, From: 11, To: 12, Term: 3, Commit: 9}
	sent := []*raftstore.Message{
		{RegionID: 1, FromStore: 1, ToStore: 2, Notice: grant, FromConfVer: 4},
		appMsg(1, 11, 12, "x"),
		{RegionID: 1, FromStore: 1, ToStore: 2, Notice: hib, FromConfVer: 4},
	}
	for _, m := range sent {
		tr.Send(m)
	}
	tr.Flush()
	waitFor(t, 5*time.Second, "3 messages delivered", func() bool { return len(recv.received()) == len(sent) })
	got := recv.received()
	for i, want := range sent {
		m := got[i]
		if want.Notice == nil {
			if m.Notice != nil || m.Msg.Type != raftpb.MsgApp {
				t.Fatalf("message %d = %+v, want the MsgApp", i, m)
			}
			continue
		}
		if m.Notice == nil || m.Msg.Type != 0 || m.FromConfVer != 4 {
			t.Fatalf("message %d = %+v, want notice %+v", i, m, want.Notice)
		}
		n, w := *m.Notice, *want.Notice
		if (n.Lease == nil) != (w.Lease == nil) || (n.Lease != nil && *n.Lease != *w.Lease) {
			t.Fatalf("notice %d lease %+v, want %+v", i, n.Lease, w.Lease)
		}
		n.Lease, w.Lease = nil, nil
		if n != w {
			t.Fatalf("notice %d = %+v, want %+v", i, n, w)
		}
	}
}

// TestTransportBatchesRegions: messages of several regions queued before
// one Flush reach the other store in one stream batch, intact and in order.
func TestTransportBatchesRegions(t *testing.T) {
	lis := listen(t)
	recv := &fakeHandler{}
	svc := startRaftServer(t, lis, 2, recv)
	sendH := &fakeHandler{}
	tr := newTestTransport(t, 1, map[uint64]string{2: lis.Addr().String()}, fastTransportOptions(), sendH)

	var sent []*raftstore.Message
	for region := uint64(1); region <= 5; region++ {
		for i := range 3 {
			m := appMsg(region, region*10+1, region*10+2, fmt.Sprintf("r%d-%d", region, i))
			sent = append(sent, m)
			tr.Send(m)
		}
	}
	tr.Flush()
	waitFor(t, 5*time.Second, "15 messages delivered", func() bool { return len(recv.received()) == len(sent) })

	got := recv.received()
	for i, m := range got {
		want := sent[i]
		if m.RegionID != want.RegionID || m.FromStore != 1 || m.ToStore != 2 {
			t.Fatalf("message %d routed as region %d %d->%d, want region %d 1->2", i, m.RegionID, m.FromStore, m.ToStore, want.RegionID)
		}
		if m.Msg.Type != raftpb.MsgApp || m.Msg.To != want.Msg.To || m.Msg.From != want.Msg.From || m.Msg.Commit != 9 ||
			len(m.Msg.Entries) != 1 || !bytes.Equal(m.Msg.Entries[0].Data, want.Msg.Entries[0].Data) {
			t.Fatalf("message %d = %+v, want %+v", i, m.Msg, want.Msg)
		}
	}
	if n := svc.batches.Load(); n != 1 {
		t.Fatalf("15 messages of one Flush came in %d batches, want 1", n)
	}
	if r := sendH.unreachableReports(); len(r) != 0 {
		t.Fatalf("unexpected unreachable reports %v", r)
	}

	// A second round reuses the stream.
	tr.Send(appMsg(9, 91, 92, "again"))
	tr.Flush()
	waitFor(t, 5*time.Second, "second round delivered", func() bool { return len(recv.received()) == len(sent)+1 })
}

// TestTransportSplitsLargeFlush: one Flush bigger than maxBatchBytes goes
// out as several stream messages, none lost.
func TestTransportSplitsLargeFlush(t *testing.T) {
	lis := listen(t)
	recv := &fakeHandler{}
	svc := startRaftServer(t, lis, 2, recv)
	opts := fastTransportOptions()
	opts.maxBatchBytes = 200
	tr := newTestTransport(t, 1, map[uint64]string{2: lis.Addr().String()}, opts, &fakeHandler{})

	for i := range 10 {
		tr.Send(appMsg(uint64(i+1), 1, 2, string(bytes.Repeat([]byte{'x'}, 80))))
	}
	tr.Flush()
	waitFor(t, 5*time.Second, "10 messages delivered", func() bool { return len(recv.received()) == 10 })
	if n := svc.batches.Load(); n < 4 {
		t.Fatalf("10 messages of ~100 bytes under a 200 byte batch limit came in %d batches", n)
	}
}

// TestTransportSnapshotChunked: a snapshot over 3 MiB goes over
// Raft.Snapshot in chunks, arrives intact, and is reported ok.
func TestTransportSnapshotChunked(t *testing.T) {
	lis := listen(t)
	recv := &fakeHandler{}
	svc := startRaftServer(t, lis, 2, recv)
	sendH := &fakeHandler{}
	tr := newTestTransport(t, 1, map[uint64]string{2: lis.Addr().String()}, fastTransportOptions(), sendH)

	data := make([]byte, 3<<20+12345)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	snap := &raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{
		Index: 42, Term: 5, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}},
	}}
	tr.Send(&raftstore.Message{RegionID: 7, FromStore: 1, ToStore: 2, Msg: raftpb.Message{
		Type: raftpb.MsgSnap, From: 71, To: 72, Term: 5, Snapshot: snap,
	}})
	tr.Flush()
	waitFor(t, 10*time.Second, "snapshot reported", func() bool { return len(sendH.snapshotReports()) == 1 })

	if r := sendH.snapshotReports()[0]; r != (snapReport{7, 72, true}) {
		t.Fatalf("snapshot report %+v, want region 7 peer 72 ok", r)
	}
	got := recv.received()
	if len(got) != 1 {
		t.Fatalf("received %d messages, want the snapshot only", len(got))
	}
	m := got[0]
	if m.RegionID != 7 || m.Msg.Type != raftpb.MsgSnap || m.Msg.To != 72 || m.Msg.Snapshot == nil {
		t.Fatalf("received %+v", m)
	}
	if md := m.Msg.Snapshot.Metadata; md.Index != 42 || md.Term != 5 || !slices.Equal(md.ConfState.Voters, []uint64{1, 2, 3}) {
		t.Fatalf("snapshot metadata %+v", md)
	}
	if !bytes.Equal(m.Msg.Snapshot.Data, data) {
		t.Fatalf("snapshot data differs: got %d bytes, want %d", len(m.Msg.Snapshot.Data), len(data))
	}
	if len(snap.Data) != len(data) {
		t.Fatal("the transport modified the sender's snapshot")
	}
	if n := svc.batches.Load(); n != 0 {
		t.Fatalf("snapshot went over the message stream (%d batches)", n)
	}
}

// TestTransportUnreachable: messages to a store nobody listens on, or one
// without an address, are reported unreachable; a snapshot is reported
// failed.
func TestTransportUnreachable(t *testing.T) {
	h := &fakeHandler{}
	tr := newTestTransport(t, 1, map[uint64]string{3: deadAddr(t)}, fastTransportOptions(), h)

	send := func() {
		for _, region := range []uint64{7, 8} {
			m := appMsg(region, region*10+1, region*10+3, "x")
			m.ToStore = 3
			tr.Send(m)
		}
		unknown := appMsg(9, 91, 94, "x")
		unknown.ToStore = 4 // no address configured
		tr.Send(unknown)
		tr.Flush()
	}
	send()
	want := []peerKey{{7, 73}, {8, 83}, {9, 94}}
	waitFor(t, 5*time.Second, "unreachable reports", func() bool {
		got := h.unreachableReports()
		for _, k := range want {
			if !slices.Contains(got, k) {
				return false
			}
		}
		return true
	})

	// While backing off, a second round is reported too, not silently lost.
	before := len(h.unreachableReports())
	send()
	waitFor(t, 5*time.Second, "second round reported", func() bool { return len(h.unreachableReports()) >= before+3 })

	tr.Send(&raftstore.Message{RegionID: 7, FromStore: 1, ToStore: 3, Msg: raftpb.Message{
		Type: raftpb.MsgSnap, From: 71, To: 73, Snapshot: &raftpb.Snapshot{Data: []byte("snap")},
	}})
	waitFor(t, 5*time.Second, "snapshot failure reported", func() bool { return len(h.snapshotReports()) == 1 })
	if r := h.snapshotReports()[0]; r != (snapReport{7, 73, false}) {
		t.Fatalf("snapshot report %+v, want region 7 peer 73 failed", r)
	}
}

// TestTransportQueueOverflow: Send never blocks; what does not fit the
// queue is dropped and reported, the rest delivered.
func TestTransportQueueOverflow(t *testing.T) {
	lis := listen(t)
	recv := &fakeHandler{}
	startRaftServer(t, lis, 2, recv)
	opts := fastTransportOptions()
	opts.queueSize = 2
	h := &fakeHandler{}
	tr := newTestTransport(t, 1, map[uint64]string{2: lis.Addr().String()}, opts, h)

	const n = 20
	for i := range n {
		tr.Send(appMsg(uint64(i+1), 1, 2, "x"))
	}
	tr.Flush()
	waitFor(t, 5*time.Second, "every message delivered or reported", func() bool {
		return len(recv.received())+len(h.unreachableReports()) == n
	})
	if len(h.unreachableReports()) == 0 {
		t.Fatal("20 messages fit a queue of 2")
	}
}

// TestTransportReconnects: after the receiving store restarts on the same
// address, the sender reconnects and delivers again.
func TestTransportReconnects(t *testing.T) {
	lis := listen(t)
	addr := lis.Addr().String()
	recv := &fakeHandler{}

	// First incarnation, stopped by hand.
	svc := newRaftService(2, recv, testLogger(t))
	srv := grpc.NewServer()
	kvpb.RegisterRaftServer(srv, svc)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()

	h := &fakeHandler{}
	tr := newTestTransport(t, 1, map[uint64]string{2: addr}, fastTransportOptions(), h)
	tr.Send(appMsg(1, 1, 2, "before"))
	tr.Flush()
	waitFor(t, 5*time.Second, "first message", func() bool { return len(recv.received()) == 1 })

	svc.stop()
	srv.Stop()
	<-served
	svc.wait()

	// Sends while the store is down are reported.
	waitFor(t, 5*time.Second, "a send to the stopped store reported", func() bool {
		tr.Send(appMsg(2, 1, 2, "while down"))
		tr.Flush()
		return len(h.unreachableReports()) > 0
	})

	lis2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot re-bind %s: %v", addr, err)
	}
	startRaftServer(t, lis2, 2, recv)
	waitFor(t, 10*time.Second, "delivery after restart", func() bool {
		tr.Send(appMsg(3, 1, 2, "after"))
		tr.Flush()
		for _, m := range recv.received() {
			if m.RegionID == 3 {
				return true
			}
		}
		return false
	})
}

// TestTransportIgnoresSelf: a message to this very store goes nowhere.
func TestTransportIgnoresSelf(t *testing.T) {
	h := &fakeHandler{}
	tr := newTestTransport(t, 1, map[uint64]string{1: deadAddr(t)}, fastTransportOptions(), h)
	m := appMsg(1, 1, 2, "x")
	m.ToStore = 1
	tr.Send(m)
	tr.Flush()
	if n := len(*tr.senders.Load()); n != 0 {
		t.Fatalf("a sender was started for this store itself")
	}
	if len(h.received())+len(h.unreachableReports()) != 0 {
		t.Fatal("self-addressed message was delivered or reported")
	}
	tr.Close()
	tr.Send(appMsg(1, 1, 2, "after close")) // must not panic or block
	tr.Flush()
}

// TestRaftServiceRejectsBadInput: garbage raft messages and headerless
// snapshots end the stream with InvalidArgument and reach no handler.
func TestRaftServiceRejectsBadInput(t *testing.T) {
	lis := listen(t)
	recv := &fakeHandler{}
	startRaftServer(t, lis, 2, recv)
	cli := kvpb.NewRaftClient(dial(t, lis.Addr().String()))
	ctx := testCtx(t)

	cases := []struct {
		name string
		msg  *kvpb.RaftMessage
	}{
		{"garbage", &kvpb.RaftMessage{RegionId: 1, FromStore: 1, ToStore: 2, Message: []byte{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}},
		{"wrong store", &kvpb.RaftMessage{RegionId: 1, FromStore: 1, ToStore: 5, Message: mustMarshal(t, raftpb.Message{Type: raftpb.MsgHeartbeat})}},
	}
	for _, tc := range cases {
		stream, err := cli.Stream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = stream.Send(&kvpb.RaftMessageBatch{Msgs: []*kvpb.RaftMessage{tc.msg}})
		if _, err := stream.CloseAndRecv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", tc.name, err)
		}
	}

	snap, err := cli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = snap.Send(&kvpb.SnapshotChunk{Data: []byte("no header")})
	if _, err := snap.CloseAndRecv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("headerless snapshot: got %v, want InvalidArgument", err)
	}
	snap, err = cli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = snap.Send(&kvpb.SnapshotChunk{Header: &kvpb.RaftMessage{RegionId: 1, FromStore: 1, ToStore: 2,
		Message: mustMarshal(t, raftpb.Message{Type: raftpb.MsgHeartbeat})}})
	if _, err := snap.CloseAndRecv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("snapshot stream with a heartbeat header: got %v, want InvalidArgument", err)
	}
	if n := len(recv.received()); n != 0 {
		t.Fatalf("%d bad messages reached the handler", n)
	}
}

func mustMarshal(t *testing.T, m raftpb.Message) []byte {
	t.Helper()
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTransportBlackHole: a peer that accepts connections but never reads
// cannot wedge its sender: the write times out and the loss is reported.
func TestTransportBlackHole(t *testing.T) {
	lis := listen(t)
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})

	opts := fastTransportOptions()
	opts.sendTimeout = 200 * time.Millisecond
	h := &fakeHandler{}
	tr := newTestTransport(t, 1, map[uint64]string{2: lis.Addr().String()}, opts, h)
	big := string(bytes.Repeat([]byte{'x'}, 256<<10))
	waitFor(t, 10*time.Second, "loss to a black hole reported", func() bool {
		tr.Send(appMsg(1, 1, 2, big))
		tr.Flush()
		return len(h.unreachableReports()) > 0
	})
}

// stuckRaft accepts raft streams and never reads them.
type stuckRaft struct{ kvpb.UnimplementedRaftServer }

func (stuckRaft) Stream(stream grpc.ClientStreamingServer[kvpb.RaftMessageBatch, kvpb.Done]) error {
	<-stream.Context().Done()
	return nil
}

// TestTransportStuckReceiver: a peer that opens the stream but stops
// reading cannot wedge its sender: the write times out, the loss is
// reported, and the sender goes on.
func TestTransportStuckReceiver(t *testing.T) {
	lis := listen(t)
	srv := grpc.NewServer()
	kvpb.RegisterRaftServer(srv, stuckRaft{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})

	opts := fastTransportOptions()
	opts.sendTimeout = 200 * time.Millisecond
	h := &fakeHandler{}
	tr := newTestTransport(t, 1, map[uint64]string{2: lis.Addr().String()}, opts, h)
	big := string(bytes.Repeat([]byte{'x'}, 1<<20))
	waitFor(t, 10*time.Second, "loss to a stuck receiver reported", func() bool {
		tr.Send(appMsg(1, 1, 2, big))
		tr.Flush()
		return len(h.unreachableReports()) > 0
	})
}

// TestTransportHibernationNoticesOutlastFullQueue: on a queue full of
// heartbeats, a raft message is dropped but a hibernate or wake notice
// still queues: one dropped leaves a follower awake under a sleeping
// leader, which then keeps its whole region awake.
func TestTransportHibernationNoticesOutlastFullQueue(t *testing.T) {
	opts := defaultTransportOptions()
	opts.queueSize = 2
	tr := &transport{opts: opts, metrics: newMetrics(func() float64 { return 0 })}
	p := &peerSender{t: tr, storeID: 2, wake: make(chan struct{}, 1), unreachable: make(map[peerKey]struct{})}
	p.enqueue(appMsg(1, 1, 2, "a"))
	p.enqueue(appMsg(2, 1, 2, "b"))
	p.enqueue(appMsg(3, 1, 2, "dropped"))
	for _, k := range []raftstore.NoticeKind{raftstore.NoticeHibernate, raftstore.NoticeWake} {
		p.enqueue(&raftstore.Message{RegionID: 4, FromStore: 1, ToStore: 2, Notice: &raftstore.Notice{Kind: k, From: 1, To: 2, Term: 3}})
	}
	p.enqueue(&raftstore.Message{RegionID: 5, FromStore: 1, ToStore: 2, Notice: &raftstore.Notice{Kind: raftstore.NoticeRenew, From: 1, To: 2, Term: 3}})
	var kinds []string
	for _, m := range p.queue {
		kinds = append(kinds, m.TypeName())
	}
	want := []string{"MsgApp", "MsgApp", "notice hibernate", "notice wake"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("queued %v, want %v", kinds, want)
	}
	if _, ok := p.unreachable[peerKey{3, 2}]; !ok {
		t.Fatalf("the dropped append was not reported unreachable: %v", p.unreachable)
	}
}
