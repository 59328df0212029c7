package etcdapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/etcdmvcc"
	"github.com/hedgekv/hedgekv/raftstore"
)

// Watch: any replica serves a watch from its own state, and a store's
// watchers share one feed of its new events (feed.go). A watcher keeps
// next, the first revision it has not sent. Until it has caught up it
// reads the events at and after next from the keyspace's history itself,
// in revision order (the "r/" index, then each change's history record);
// then it joins the feed, which hands it every later event, and goes back
// to reading on its own if its client falls too far behind. The state is
// the only source of events, so every event is sent once, in revision
// order, whether the watcher started before, during or after the apply
// that made it, and whichever store serves it (a client that reconnects
// elsewhere resumes from its last revision + 1, as clientv3 does).

const (
	// watchPoll bounds how long an event the feed, or a watcher reading
	// on its own, was not woken for (applied while it was reading) waits.
	watchPoll = 100 * time.Millisecond
	// watchBatch bounds the events of one response (whole revisions).
	watchBatch = 1000
	// progressEvery is how often a watcher that asked for progress
	// notifications gets one while idle (etcd's default is 10 minutes;
	// clients wait for it, so it is shorter here).
	progressEvery = 10 * time.Second
)

// progressInterval is progressEvery, or the knob that replaces it.
func (s *Service) progressInterval() time.Duration {
	if d := s.knobs().ProgressEvery; d > 0 {
		return d
	}
	return progressEvery
}

// Watch implements etcd's Watch service.
func (s *Service) Watch(stream pb.Watch_WatchServer) error {
	if s.proxiesWatch(stream.Context()) {
		return s.watchElsewhere(stream) // no state here to serve it from (watchproxy.go)
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	ws := &watchStream{s: s, ctx: ctx, out: newStreamSender(stream.Send), cancels: map[int64]context.CancelFunc{}}
	go ws.out.run(ctx)
	defer ws.stopAll()
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch r := req.RequestUnion.(type) {
		case *pb.WatchRequest_CreateRequest:
			if err := ws.create(r.CreateRequest); err != nil {
				return err
			}
		case *pb.WatchRequest_CancelRequest:
			if err := ws.cancel(r.CancelRequest.WatchId, ""); err != nil {
				return err
			}
		case *pb.WatchRequest_ProgressRequest:
			rev, err := s.localRev(ctx)
			if err != nil {
				return toStatus(err)
			}
			if err := ws.send(&pb.WatchResponse{Header: s.header(rev), WatchId: -1}); err != nil {
				return err
			}
		}
	}
}

// watchStream is one Watch call: its watchers share the stream.
type watchStream struct {
	s       *Service
	ctx     context.Context
	out     *streamSender // every Send on the stream (watchsend.go)
	mu      sync.Mutex
	nextID  int64
	cancels map[int64]context.CancelFunc
	wg      sync.WaitGroup
}

func (ws *watchStream) send(r *pb.WatchResponse) error { return ws.out.Send(r) }

func (ws *watchStream) stopAll() {
	ws.mu.Lock()
	for _, c := range ws.cancels {
		c()
	}
	ws.mu.Unlock()
	ws.wg.Wait()
}

func (ws *watchStream) create(cr *pb.WatchCreateRequest) error {
	ws.mu.Lock()
	id := cr.WatchId
	if id == 0 { // clientv3's AutoWatchID: the server picks
		for {
			id = ws.nextID
			ws.nextID++
			if _, used := ws.cancels[id]; !used {
				break
			}
		}
	} else if _, used := ws.cancels[id]; used {
		ws.mu.Unlock()
		return ws.send(&pb.WatchResponse{WatchId: id, Created: true, Canceled: true, CancelReason: "etcdserver: duplicate watch ID"})
	}
	wctx, cancel := context.WithCancel(ws.ctx)
	ws.cancels[id] = cancel
	ws.mu.Unlock()

	start, end := etcdmvcc.RangeSpan(cr.Key, cr.RangeEnd)
	w := &watcher{ws: ws, id: id, start: start, end: end, prevKV: cr.PrevKv, progress: cr.ProgressNotify,
		single: len(cr.RangeEnd) == 0, seq: watcherSeq.Add(1), wake: make(chan struct{}, 1)}
	for _, f := range cr.Filters {
		switch f {
		case pb.WatchCreateRequest_NOPUT:
			w.noPut = true
		case pb.WatchCreateRequest_NODELETE:
			w.noDelete = true
		}
	}
	cur, compacted, err := ws.s.localRevs(wctx)
	if err != nil {
		cancel()
		ws.forget(id)
		return ws.send(&pb.WatchResponse{WatchId: id, Created: true, Canceled: true, CancelReason: toStatus(err).Error()})
	}
	w.next = cr.StartRevision
	if w.next <= 0 {
		w.next = cur + 1
	}
	if err := ws.send(&pb.WatchResponse{Header: ws.s.header(cur), WatchId: id, Created: true}); err != nil {
		cancel()
		return err
	}
	if w.next < compacted {
		cancel()
		ws.forget(id)
		return ws.send(&pb.WatchResponse{Header: ws.s.header(cur), WatchId: id, Canceled: true, CompactRevision: compacted,
			CancelReason: "etcdserver: mvcc: required revision has been compacted"})
	}
	ws.wg.Add(1)
	go func() {
		defer ws.wg.Done()
		if err := w.run(wctx); err != nil && wctx.Err() == nil {
			ws.s.cfg.Logger.Warn("etcd watch ended", "watch", id, "err", err)
			_ = ws.cancel(id, err.Error())
		}
	}()
	return nil
}

func (ws *watchStream) forget(id int64) {
	ws.mu.Lock()
	delete(ws.cancels, id)
	ws.mu.Unlock()
}

func (ws *watchStream) cancel(id int64, reason string) error {
	ws.mu.Lock()
	c, ok := ws.cancels[id]
	delete(ws.cancels, id)
	ws.mu.Unlock()
	if !ok {
		return nil
	}
	c()
	return ws.send(&pb.WatchResponse{WatchId: id, Canceled: true, CancelReason: reason})
}

// watcher is one watch of a stream.
type watcher struct {
	ws                      *watchStream
	id                      int64
	start, end              []byte // etcd keys; end nil: no bound
	single                  bool   // one key: start
	seq                     uint64 // orders watchers of one start in the feed's index
	prevKV, noPut, noDelete bool
	progress                bool
	wake                    chan struct{} // the feed dropped it

	// mu guards what the feed changes while the watcher is synced.
	mu sync.Mutex
	// next is the first revision not sent (nor handed to the sender): the watcher's
	// own while it is unsynced; while it is synced the feed gives it
	// only events at or after it, and sets it when it drops it.
	next   int64
	synced bool

	// unsent counts the events the feed handed to the stream's sender
	// for this watcher that it has not sent yet (the feed's bound on a
	// slow client, watchBuffer); lastSent is when the sender last sent
	// one of its responses (UnixNano), for progress notifications.
	unsent   atomic.Int64
	lastSent atomic.Int64

	pending []*mvccpb.Event // the feed's round's events for it (under feed.mu)
}

var watcherSeq atomic.Uint64

func (w *watcher) notify() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *watcher) run(ctx context.Context) error {
	s := w.ws.s
	defer s.feed.leave(w)
	w.lastSent.Store(time.Now().UnixNano())
	send := func(evs []*mvccpb.Event, rev int64) error {
		w.lastSent.Store(time.Now().UnixNano())
		return w.ws.send(&pb.WatchResponse{Header: s.watchHeader(rev), WatchId: w.id, Events: evs})
	}
	for {
		w.mu.Lock()
		synced := w.synced
		w.mu.Unlock()
		if synced {
			if err := w.whileSynced(ctx); err != nil || ctx.Err() != nil {
				return err
			}
			continue // dropped: catch up from history
		}
		wake, _ := s.cfg.Applier.hub.next()
		evs, cur, compacted, err := s.eventsFrom(ctx, w)
		joined := false
		if err == nil && len(evs) == 0 && w.next >= compacted {
			// Caught up with the state: join the feed.
			if fn := s.knobs().BeforeJoin; fn != nil {
				fn()
			}
			var jcur, jcompacted int64
			if joined, evs, jcur, jcompacted, err = s.feed.join(ctx, w, cur); jcur != 0 {
				cur, compacted = jcur, jcompacted // it read the state again
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if st, ok := status.FromError(err); ok && st.Code() != codes.Unavailable {
				return err
			}
			// The replica cannot serve now (a snapshot applying, the
			// store rebuilding): try again.
		} else if !joined && w.next < compacted { // once joined, next is the feed's to change
			return w.ws.send(&pb.WatchResponse{Header: s.header(cur), WatchId: w.id, Canceled: true, CompactRevision: compacted,
				CancelReason: "etcdserver: mvcc: required revision has been compacted"})
		} else if len(evs) > 0 || (!joined && w.progress && time.Since(time.Unix(0, w.lastSent.Load())) >= s.progressInterval()) {
			if err := send(evs, cur); err != nil {
				return err
			}
			if len(evs) > 0 {
				continue // more may be waiting: read again before sleeping
			}
		}
		if joined {
			continue
		}
		t := time.NewTimer(watchPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// whileSynced waits while the feed hands w's events to the stream's
// sender (deliverLocked), until the feed drops w (it returns nil then) or
// ctx ends, sending progress notifications while w is idle, if it asked
// for them.
func (w *watcher) whileSynced(ctx context.Context) error {
	var progress *time.Timer
	defer func() {
		if progress != nil {
			progress.Stop()
		}
	}()
	for {
		w.mu.Lock()
		synced := w.synced
		w.mu.Unlock()
		if !synced {
			return nil
		}
		var tick <-chan time.Time
		if w.progress {
			due := time.Until(time.Unix(0, w.lastSent.Load()).Add(w.ws.s.progressInterval()))
			if progress == nil {
				progress = time.NewTimer(due)
			} else {
				progress.Reset(due)
			}
			tick = progress.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		case <-tick:
			if err := w.sendProgress(); err != nil {
				return err
			}
		}
	}
}

// sendProgress tells an idle synced watcher's client it has every event
// up to the feed's revision: F is read before w is found idle, and the feed
// hands a round's events to the sender, ahead of this notification in its
// queue, before it moves F past them.
func (w *watcher) sendProgress() error {
	from := w.ws.s.feed.next.Load()
	w.mu.Lock()
	idle := w.synced && w.unsent.Load() == 0
	rev := max(from, w.next) - 1
	w.mu.Unlock()
	if !idle || time.Since(time.Unix(0, w.lastSent.Load())) < w.ws.s.progressInterval() {
		return nil
	}
	w.lastSent.Store(time.Now().UnixNano())
	return w.ws.send(&pb.WatchResponse{Header: w.ws.s.watchHeader(rev), WatchId: w.id})
}

// watchHeader is header(rev) with the raft term read at most every
// termTTL: finding it walks the store's regions, and a store with many
// watchers sends many responses.
func (s *Service) watchHeader(rev int64) *pb.ResponseHeader {
	now := time.Now().UnixNano()
	term := s.term.Load()
	if term == nil || now-term.at > int64(termTTL) {
		term = &cachedTerm{at: now}
		if st, ok := s.regionStatus(); ok {
			term.term = st.Term
		}
		s.term.Store(term)
	}
	return &pb.ResponseHeader{ClusterId: clusterID, MemberId: s.cfg.Store.ID(), Revision: rev, RaftTerm: term.term}
}

const termTTL = 100 * time.Millisecond

type cachedTerm struct {
	at   int64 // UnixNano
	term uint64
}

// batchEnd is how many of evs (in revision order) one response holds:
// whole revisions, at most about watchBatch events.
func batchEnd(evs []*mvccpb.Event) int {
	n := min(len(evs), watchBatch)
	for n < len(evs) && evs[n].Kv.ModRevision == evs[n-1].Kv.ModRevision {
		n++
	}
	return n
}

// eventsFrom reads w's events at and after w.next from this replica's
// state, whole revisions, at most about watchBatch of them, advancing
// w.next past what it returns (filtered-out events included). It also
// returns the replica's current and compaction revisions.
func (s *Service) eventsFrom(ctx context.Context, w *watcher) (evs []*mvccpb.Event, cur, compacted int64, err error) {
	err = s.localView(ctx, func(v view) error {
		if cur, err = v.currentRev(); err != nil {
			return err
		}
		if compacted, err = v.compactRev(); err != nil {
			return err
		}
		if w.next < compacted || w.next > cur {
			return nil
		}
		next := w.next
		var derr error
		n := 0
		ierr := v.r.scan(revIndexKey(etcdmvcc.Revision{Main: w.next}), revEnd, func(k, key []byte) bool {
			r, err := etcdmvcc.ParseRevision(k[len(revPrefix):])
			if err != nil {
				derr = err
				return false
			}
			if r.Main > cur {
				return false
			}
			if r.Main >= next && n >= watchBatch {
				return false // a whole revision per response, at most ~watchBatch events
			}
			next = r.Main + 1
			if bytes.Compare(key, w.start) < 0 || (w.end != nil && bytes.Compare(key, w.end) >= 0) {
				return true
			}
			ev, err := s.event(v, bytes.Clone(key), r, w.prevKV)
			if err != nil {
				derr = err
				return false
			}
			if (ev.Type == mvccpb.PUT && w.noPut) || (ev.Type == mvccpb.DELETE && w.noDelete) {
				return true
			}
			evs = append(evs, ev)
			n++
			return true
		})
		if derr != nil {
			return derr
		}
		if ierr != nil {
			return ierr
		}
		w.next = next
		if len(evs) == 0 && next <= cur {
			w.next = cur + 1 // nothing of w's in the rest: skip to the end
		}
		return nil
	})
	return evs, cur, compacted, err
}

// event is the change of key at r as a watcher sees it.
func (s *Service) event(v view, key []byte, r etcdmvcc.Revision, withPrev bool) (*mvccpb.Event, error) {
	b, ok, err := v.r.get(histKey(key, r))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, status.Errorf(codes.Internal, "etcdserver: hedgekv: history of %q at %v missing", key, r)
	}
	h, err := etcdmvcc.DecodeHistRecord(bytes.Clone(b))
	if err != nil {
		return nil, err
	}
	ev := &mvccpb.Event{Type: mvccpb.PUT, Kv: h.Record(r.Main).KeyValue(key)}
	if h.Kind == etcdmvcc.KindDelete {
		ev.Type, ev.Kv = mvccpb.DELETE, &mvccpb.KeyValue{Key: key, ModRevision: r.Main}
	}
	if withPrev {
		if prev, ok, err := v.GetAt(key, r.Main-1); err != nil {
			return nil, err
		} else if ok {
			ev.PrevKv = prev.KeyValue(key)
		}
	}
	return ev, nil
}

// localView reads this replica's state as it is, with no round trip: a
// watch is served from the store the client called.
func (s *Service) localView(ctx context.Context, fn func(view) error) error {
	read := func(opts raftstore.ReadOptions) error {
		return s.retryRouting(ctx, func() error {
			_, err := s.cfg.Store.ReadView(ctx, opts, []byte(Prefix), func(sv raftstore.StateView) error {
				return fn(readView(ctx, sv))
			})
			return err
		})
	}
	err := read(raftstore.ReadOptions{MaxStaleness: time.Hour})
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return err
		}
		// No safe point (a replica just started, perhaps cut off from
		// every other): its state as it is, as an etcd member serves a
		// watch from its own state, leader or not. A round trip for a
		// fresher start would fail here while the partition lasts, and
		// clientv3 takes a cancelled watch as final.
		if err = read(raftstore.ReadOptions{Local: true}); err != nil {
			if _, ok := status.FromError(err); ok {
				return err
			}
			return toStatus(err)
		}
	}
	return nil
}

// localRevs is this replica's current and compaction revisions.
func (s *Service) localRevs(ctx context.Context) (cur, compacted int64, err error) {
	err = s.localView(ctx, func(v view) error {
		if cur, err = v.currentRev(); err != nil {
			return err
		}
		compacted, err = v.compactRev()
		return err
	})
	return cur, compacted, err
}

func (s *Service) localRev(ctx context.Context) (int64, error) {
	cur, _, err := s.localRevs(ctx)
	return cur, err
}
