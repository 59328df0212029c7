package etcdapi

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/etcdmvcc"
)

// The watch feed: one per store (Service), etcd's watchableStore with its
// synced and unsynced watcher groups. A watcher is either
//
//   - unsynced: its own goroutine reads its events from the store's
//     history (eventsFrom) from next, the first revision it has not sent,
//     until it has read all there is; or
//   - synced: the feed hands it its events. One goroutine reads each new
//     revision's changes once from the same history (the "r/" index),
//     whenever the Applier applies a revision here and at least every
//     watchPoll, finds the synced watchers of each changed key (watchIndex)
//     and hands the event to each, reading the history record (and the
//     previous value, only if one of them asked for prev_kv) only for keys
//     somebody watches.
//
// The state stays the only source of events: the feed keeps nothing but
// F, the first revision it has not read, and reads from it every round,
// so nothing applied (by an entry, a snapshot, a restore) is missed.
//
// The hand-over, and its invariant. For every watcher, every event it
// wants below its next has been sent or handed to its stream's sender,
// and none at or above next has. F and the synced group change only under feed.mu: a
// round reads revisions F..hi and hands them over, then sets F = hi+1, all
// under feed.mu; a watcher joins the synced group under feed.mu and only
// if next >= F (if the feed got ahead while it read, it reads the rest
// from the state holding feed.mu, where F cannot move: the state holds
// every revision before F, so that read ends at or past F). The feed
// hands a synced watcher only the events at or after its next. So an
// event below next came from the watcher's own reads, one at or above it
// from the feed, none from both (no duplicate), and none from neither
// (no gap), since the feed reads every revision from F on and next >= F.
// A watcher leaves the group under feed.mu (too far behind, see
// watchBuffer; a compaction or failure the feed met; cancelled) with next
// set to the first revision it was not given, and catches up from there.
//
// A slow client never slows the feed or the other watchers: the feed
// hands each watcher's events to its stream's sender without waiting
// (watchsend.go: one goroutine sends a stream's responses, in the order
// handed), and a watcher with more than watchBuffer events handed but not
// sent drops back to unsynced and reads its way back from history, as a
// new watcher does; the sender sends what it was handed first, so the
// watcher's own reads follow it in order.

// watchBuffer bounds the events handed to the sender for a synced watcher
// and not sent yet (a round hands at most one batch past it to a watcher
// with none outstanding, so a single large revision still goes through).
const watchBuffer = 256

// watchBufferLen is watchBuffer, or the knob that replaces it.
func (s *Service) watchBufferLen() int {
	if n := s.knobs().WatchBuffer; n > 0 {
		return n
	}
	return watchBuffer
}

type feed struct {
	s *Service
	// mu is held for a whole round (read and fan-out) and by join and
	// leave: see the invariant above.
	mu sync.Mutex
	// next is F. Written under mu; read without it by a synced watcher
	// for its progress notifications.
	next   atomic.Int64
	synced *watchIndex
	closed bool
	start  sync.Once
	// A round's scratch, under mu: the watchers that got events, and
	// the matches of one key.
	touched []*watcher
	matches []*watcher
}

func newFeed(s *Service) *feed { return &feed{s: s, synced: newWatchIndex()} }

// run is the feed's goroutine: until the service stops.
func (f *feed) run(ctx context.Context) {
	defer f.close()
	var pending time.Time // since when an announced revision has not shown
	for {
		wake, applied := f.s.cfg.Applier.hub.next()
		more, advanced := f.round(ctx)
		if more {
			continue // a full batch: more is waiting
		}
		// The Applier announces a revision once its round has ended
		// (RoundApplied), when reads see it. Should one not show yet,
		// look again every millisecond, for at most watchPoll without
		// progress (should it never show).
		delay := watchPoll
		switch {
		case !f.waiting(applied):
			pending = time.Time{}
		case advanced || pending.IsZero():
			pending, delay = time.Now(), time.Millisecond
		case time.Since(pending) < watchPoll:
			delay = time.Millisecond
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// waiting reports whether a revision the Applier announced is not read yet
// while some watcher is synced.
func (f *feed) waiting(applied int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.synced.n > 0 && applied >= f.next.Load()
}

func (f *feed) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.dropAllLocked()
}

// round reads the revisions from F on (at most about feedBatch index
// entries, whole revisions) and queues their events to the synced
// watchers. It reports whether it stopped at the batch's bound, and
// whether it moved F.
func (f *feed) round(ctx context.Context) (more, advanced bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.synced.n == 0 {
		return false, false
	}
	from := f.next.Load()
	var hi int64
	compacted := false
	err := f.s.localView(ctx, func(v view) error {
		f.resetRound() // a retried read starts over
		more, compacted = false, false
		cur, err := v.currentRev()
		if err != nil {
			return err
		}
		c, err := v.compactRev()
		if err != nil {
			return err
		}
		if from < c {
			compacted = true // the history the feed still had to read is gone
			return nil
		}
		hi = cur
		if from > cur {
			return nil
		}
		next, n := from, 0
		var derr error
		ierr := v.r.scan(revIndexKey(etcdmvcc.Revision{Main: from}), revEnd, func(k, key []byte) bool {
			r, err := etcdmvcc.ParseRevision(k[len(revPrefix):])
			if err != nil {
				derr = err
				return false
			}
			if r.Main > cur {
				return false
			}
			if r.Main >= next && n >= feedBatch {
				more, hi = true, next-1
				return false
			}
			next = r.Main + 1
			n++
			if derr = f.fanOut(v, key, r); derr != nil {
				return false
			}
			return true
		})
		if derr != nil {
			return derr
		}
		return ierr
	})
	if err != nil {
		f.resetRound()
		if ctx.Err() != nil {
			return false, false
		}
		if st, ok := status.FromError(err); !ok || st.Code() != codes.Unavailable {
			// Not a replica that cannot serve for now: let each watcher
			// meet the failure reading on its own (and be cancelled with
			// it, as before the feed).
			f.s.cfg.Logger.Warn("etcd watch feed: read failed; its watchers read on their own", "from", from, "err", err)
			f.dropAllLocked()
		}
		return false, false
	}
	if compacted {
		// Each watcher finds the compaction on its own and is cancelled
		// with compact_revision if it needed what was compacted.
		f.resetRound()
		f.dropAllLocked()
		return false, false
	}
	f.deliverLocked(hi)
	if hi+1 > from {
		f.next.Store(hi + 1)
		advanced = true
	}
	return more, advanced
}

// hand gives w's events to its stream's sender, in responses of whole
// revisions (batchEnd), without waiting for them to be sent.
func (w *watcher) hand(header *pb.ResponseHeader, evs []*mvccpb.Event) {
	for len(evs) > 0 {
		n := batchEnd(evs)
		w.ws.out.Hand(&pb.WatchResponse{Header: header, WatchId: w.id, Events: evs[:n]}, w, int64(n))
		evs = evs[n:]
	}
}

// feedBatch bounds the index entries one round reads, so that a joining
// watcher waits at most that long for feed.mu.
const feedBatch = watchBatch

// fanOut adds the change of key at r to the round's events of every
// synced watcher that wants it.
func (f *feed) fanOut(v view, key []byte, r etcdmvcc.Revision) error {
	f.matches = f.synced.match(key, f.matches[:0])
	var ev, evPrev *mvccpb.Event
	for _, w := range f.matches {
		if r.Main < w.next {
			continue // the watcher read this revision itself before joining
		}
		if ev == nil {
			var err error
			if ev, err = f.s.event(v, bytes.Clone(key), r, false); err != nil {
				return err
			}
		}
		if (ev.Type == mvccpb.PUT && w.noPut) || (ev.Type == mvccpb.DELETE && w.noDelete) {
			continue
		}
		e := ev
		if w.prevKV {
			if evPrev == nil {
				prev, err := prevKV(v, ev.Kv.Key, r.Main)
				if err != nil {
					return err
				}
				evPrev = &mvccpb.Event{Type: ev.Type, Kv: ev.Kv, PrevKv: prev}
			}
			e = evPrev
		}
		if len(w.pending) == 0 {
			f.touched = append(f.touched, w)
		}
		w.pending = append(w.pending, e)
	}
	clear(f.matches)
	return nil
}

func (f *feed) resetRound() {
	for _, w := range f.touched {
		w.pending = nil
	}
	clear(f.touched)
	f.touched = f.touched[:0]
}

// deliverLocked hands each watcher's events of the round (read up to hi)
// to its stream's sender, or drops it back to unsynced if its client has
// not taken enough of what it was handed before. The sender sends them in
// the order handed, so a dropped watcher's own reads, sent after, follow
// them.
func (f *feed) deliverLocked(hi int64) {
	limit := int64(f.s.watchBufferLen())
	header := f.s.watchHeader(hi)
	for _, w := range f.touched {
		evs := w.pending
		w.pending = nil
		if unsent := w.unsent.Load(); unsent > 0 && unsent+int64(len(evs)) > limit {
			// Its client reads too slowly: it catches up from history,
			// from the first event not handed over.
			w.mu.Lock()
			w.next = evs[0].Kv.ModRevision
			w.synced = false
			w.mu.Unlock()
			f.synced.remove(w)
			if fn := f.s.knobs().OnFallback; fn != nil {
				fn()
			}
			w.notify()
			continue
		}
		w.hand(header, evs)
	}
	clear(f.touched)
	f.touched = f.touched[:0]
}

// dropAllLocked makes every synced watcher unsynced: each has been given
// everything before F.
func (f *feed) dropAllLocked() {
	from := f.next.Load()
	f.synced.each(func(w *watcher) {
		w.mu.Lock()
		w.next = max(w.next, from)
		w.synced = false
		w.mu.Unlock()
		w.notify()
	})
	f.synced = newWatchIndex()
}

// join makes w, an unsynced watcher that has read the state up to its
// next (up to cur, the state's revision then), synced, if next >= F. If
// the feed is ahead, it reads the events from next on itself holding
// feed.mu (F cannot move meanwhile) with the state's current and
// compaction revisions; the watcher joins if that read reached F, and
// then what it read is handed to the sender before anything the feed
// hands it. If it does not join, the caller sends what it read.
// It joins nothing once the feed has stopped.
func (f *feed) join(ctx context.Context, w *watcher, read int64) (joined bool, evs []*mvccpb.Event, cur, compacted int64, err error) {
	f.start.Do(func() { go f.run(f.s.feedContext()) })
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false, nil, 0, 0, nil
	}
	if f.synced.n == 0 {
		// No watcher depends on F: the feed starts where w's read ended
		// (not at a start revision in the future, which would keep the
		// next watchers from joining until then).
		f.next.Store(min(w.next, read+1))
	}
	readRest := w.next < f.next.Load()
	if readRest {
		evs, cur, compacted, err = f.s.eventsFrom(ctx, w)
		if err != nil || w.next < compacted || w.next < f.next.Load() {
			return false, evs, cur, compacted, err
		}
	}
	w.mu.Lock()
	w.synced = true
	w.mu.Unlock()
	f.synced.add(w)
	// What w read here goes to the sender before anything the feed hands
	// it from now on.
	w.hand(f.s.watchHeader(cur), evs)
	if fn := f.s.knobs().OnJoin; fn != nil {
		fn(readRest)
	}
	return true, nil, cur, compacted, nil
}

// leave takes w out of the synced group (its watch ended).
func (f *feed) leave(w *watcher) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.synced {
		f.synced.remove(w)
		w.synced = false
	}
}

// feedContext is the feed's: it ends when the service stops.
func (s *Service) feedContext() context.Context {
	ctx, cancel := context.WithCancel(s.cfg.Context)
	go func() {
		select {
		case <-s.stopc:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx
}

// prevKV is key's record before rev (nil: none), for prev_kv.
func prevKV(v view, key []byte, rev int64) (*mvccpb.KeyValue, error) {
	prev, ok, err := v.GetAt(key, rev-1)
	if err != nil || !ok {
		return nil, err
	}
	return prev.KeyValue(key), nil
}
