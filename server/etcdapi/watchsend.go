package etcdapi

import (
	"context"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// streamSender is the one goroutine that calls Send on a watch stream
// (gRPC allows one Send at a time), as etcd's sendLoop is. The feed hands
// it synced watchers' events (Hand) without waiting; the stream's other
// responses (created, cancelled, progress, a watcher's own reads of
// history) are queued behind them (Send) and their callers wait. It sends
// in the order handed.
//
// Why: before, every watcher had its goroutine woken for each of its
// events, and sent under a per-stream lock. A write to a key hundreds of
// watchers watch woke hundreds of goroutines that queued on a dozen locks,
// each scheduled in turn, and every event of the next writes waited behind
// them. With 10,000 watchers on a follower at 1,000 writes/s the p99 from
// a write's acknowledgement to its event was about 100 ms; handed to the
// stream's sender, about 40 (docs/BENCHMARKS.md, "watch").
type streamSender struct {
	send func(*pb.WatchResponse) error
	wake chan struct{}

	mu     sync.Mutex
	queue  []outgoing
	closed error // set once the sender stopped: every later send fails with it
}

type outgoing struct {
	r    *pb.WatchResponse
	done chan error // nil: handed over by the feed, nobody waits
	w    *watcher   // the feed's: whose unsent events these are
	n    int64
}

func newStreamSender(send func(*pb.WatchResponse) error) *streamSender {
	return &streamSender{send: send, wake: make(chan struct{}, 1)}
}

// Send queues r and waits until it is sent (or the sender stops).
func (s *streamSender) Send(r *pb.WatchResponse) error {
	o := outgoing{r: r, done: make(chan error, 1)}
	s.mu.Lock()
	if s.closed != nil {
		s.mu.Unlock()
		return s.closed
	}
	s.queue = append(s.queue, o)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return <-o.done
}

// Hand queues r, n of w's events, for sending and returns at once: the
// feed's delivery, which must never wait for a client. The feed bounds
// what it hands over per watcher (watcher.unsent).
func (s *streamSender) Hand(r *pb.WatchResponse, w *watcher, n int64) {
	w.unsent.Add(n)
	s.mu.Lock()
	if s.closed != nil {
		s.mu.Unlock()
		return // the stream ended: nobody to send to
	}
	s.queue = append(s.queue, outgoing{r: r, w: w, n: n})
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run sends until ctx ends, then fails what is queued and every later
// Send. After a failed Send it keeps answering callers with that error:
// the stream is broken, and its handler ends it.
func (s *streamSender) run(ctx context.Context) {
	var broken error
	for {
		select {
		case <-ctx.Done():
			s.stop(fmt.Errorf("watch stream ended: %w", context.Cause(ctx)))
			return
		case <-s.wake:
		}
		for {
			s.mu.Lock()
			batch := s.queue
			s.queue = nil
			s.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			for _, o := range batch {
				if broken == nil {
					broken = s.send(o.r)
				}
				if o.w != nil {
					o.w.lastSent.Store(time.Now().UnixNano())
					o.w.unsent.Add(-o.n)
				}
				if o.done != nil {
					o.done <- broken
				}
			}
		}
	}
}

func (s *streamSender) stop(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = err
	for _, o := range s.queue {
		if o.done != nil {
			o.done <- err
		}
	}
	s.queue = nil
}
