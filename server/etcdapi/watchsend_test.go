package etcdapi

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// recordingStream is a Send that records what it sent, and can be held.
type recordingStream struct {
	mu   sync.Mutex
	sent []int64 // WatchId of each response, in order
	hold chan struct{}
	err  error
}

func (r *recordingStream) send(resp *pb.WatchResponse) error {
	if r.hold != nil {
		<-r.hold
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.sent = append(r.sent, resp.WatchId)
	return nil
}

func (r *recordingStream) ids() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.sent...)
}

func evs(n int) []*mvccpb.Event {
	out := make([]*mvccpb.Event, n)
	for i := range out {
		out[i] = &mvccpb.Event{Kv: &mvccpb.KeyValue{ModRevision: int64(i + 1)}}
	}
	return out
}

// Everything handed or sent goes out in the order it was queued, and a
// watcher's unsent count falls back to zero once its events are sent.
func TestStreamSenderKeepsOrderAndCountsUnsent(t *testing.T) {
	rs := &recordingStream{hold: make(chan struct{})}
	s := newStreamSender(rs.send)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.run(ctx)

	w := &watcher{}
	s.Hand(&pb.WatchResponse{WatchId: 1, Events: evs(3)}, w, 3)
	s.Hand(&pb.WatchResponse{WatchId: 2, Events: evs(2)}, w, 2)
	if got := w.unsent.Load(); got != 5 {
		t.Fatalf("unsent after two hands while the stream is held = %d, want 5", got)
	}
	done := make(chan error, 1)
	go func() { done <- s.Send(&pb.WatchResponse{WatchId: 3}) }()
	select {
	case err := <-done:
		t.Fatalf("Send returned (%v) before its response was sent", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(rs.hold) // the client reads again
	if err := <-done; err != nil {
		t.Fatalf("Send: %v", err)
	}
	if got := rs.ids(); len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Fatalf("sent %v, want [1 2 3]", got)
	}
	if got := w.unsent.Load(); got != 0 {
		t.Fatalf("unsent after the sends = %d, want 0", got)
	}
	if w.lastSent.Load() == 0 {
		t.Fatal("lastSent not set by the sender")
	}
}

// A Send that fails fails every response after it (the stream is broken),
// and once the stream's context ends, Send fails at once and Hand drops.
func TestStreamSenderFailsAfterABrokenSendAndAfterItStops(t *testing.T) {
	broken := errors.New("transport is closing")
	rs := &recordingStream{err: broken}
	s := newStreamSender(rs.send)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { s.run(ctx); close(stopped) }()

	if err := s.Send(&pb.WatchResponse{WatchId: 1}); !errors.Is(err, broken) {
		t.Fatalf("Send on a broken stream = %v, want %v", err, broken)
	}
	rs.mu.Lock()
	rs.err = nil // a later Send must not reach the stream again
	rs.mu.Unlock()
	if err := s.Send(&pb.WatchResponse{WatchId: 2}); !errors.Is(err, broken) {
		t.Fatalf("Send after a failed one = %v, want %v", err, broken)
	}
	cancel()
	<-stopped
	if err := s.Send(&pb.WatchResponse{WatchId: 3}); err == nil {
		t.Fatal("Send after the stream ended succeeded")
	}
	s.Hand(&pb.WatchResponse{WatchId: 4}, &watcher{}, 1) // must not block
	if got := rs.ids(); len(got) != 0 {
		t.Fatalf("sent %v on a broken stream", got)
	}
}

// A client that never reads holds the sender, but never the feed: Hand
// returns at once however much is queued.
func TestStreamSenderHandNeverWaits(t *testing.T) {
	rs := &recordingStream{hold: make(chan struct{})}
	s := newStreamSender(rs.send)
	ctx, cancel := context.WithCancel(context.Background())
	go s.run(ctx)
	w := &watcher{}
	handed := make(chan struct{})
	go func() {
		defer close(handed)
		for range 10000 {
			s.Hand(&pb.WatchResponse{WatchId: 1, Events: evs(1)}, w, 1)
		}
	}()
	select {
	case <-handed:
	case <-time.After(30 * time.Second): // a deadlock guard, not a speed bound
		t.Fatal("Hand blocked on a stream whose client does not read")
	}
	if got := w.unsent.Load(); got != 10000 {
		t.Fatalf("unsent = %d, want 10000", got)
	}
	cancel()
	close(rs.hold)
}
