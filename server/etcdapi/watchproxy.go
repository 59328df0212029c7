package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A store with no replica of the keyspace's region has no state to serve
// a watch from, so it proxies the Watch stream to a store that has one
// (the region's leader, as elsewhere.go finds it; any replica serves a
// watch), as etcd's grpc-proxy does. The proxy owns the watch IDs its
// client sees; each upstream stream has IDs of its own. It keeps, per
// watch, next: the first revision it has not delivered (known from the
// start revision, the upstream's Created header, the events it relayed
// and progress notifications). When the upstream stream breaks (its
// store stopped, the connection cut, its replica gone) the proxy opens
// another, on whichever store then leads, and creates every watch again
// from its next, as clientv3 does when it reconnects: an upstream serves
// every event at and after a watch's start once, in revision order, so
// the client sees no gap and no duplicate (events below next are dropped
// all the same). The upstream is never this store: one that holds a
// replica by then (it gained one, or had one all along but for a moment,
// while the split that makes the keyspace its own region was published)
// and leads it opens its upstream on another replica's store. One
// goroutine owns the proxy's state; a receiver per stream (the client's,
// the upstream's) feeds it.

const (
	// proxyRetryMin and proxyRetryMax bound the wait before the proxy
	// opens another upstream stream after one broke or could not open.
	proxyRetryMin = 50 * time.Millisecond
	proxyRetryMax = 2 * time.Second
)

// proxiesWatch reports whether a Watch stream with ctx is proxied to
// another store: this one holds no replica of the keyspace, and the
// stream was not itself proxied here (an upstream serves from its own
// state, whatever it is, so a proxy never chains).
func (s *Service) proxiesWatch(ctx context.Context) bool {
	return s.cfg.Conn != nil && s.cfg.Members != nil && !forwarded(ctx) && !s.holdsReplica()
}

// proxiedWatch is one watch of a proxied stream.
type proxiedWatch struct {
	id      int64 // the client's
	req     *pb.WatchCreateRequest
	next    int64 // the first revision not delivered; 0: unknown until the upstream's Created
	created bool  // the client has its Created response
	up      int64 // its ID on the current upstream stream; 0: not created there
}

// watchProxy is one proxied Watch stream.
type watchProxy struct {
	s       *Service
	ctx     context.Context
	stream  pb.Watch_WatchServer
	nextID  int64
	watches map[int64]*proxiedWatch // by the client's ID
	byUp    map[int64]*proxiedWatch // by the current upstream's ID
	upNext  int64
	// progress counts the client's progress requests not answered yet:
	// sent again on the next upstream if this one breaks first.
	progress int
	up       *upstreamWatch // nil: none open
	attempts int            // upstreams opened on another replica (upstreamStore)
}

// upstreamWatch is the stream a proxy opened to another store.
type upstreamWatch struct {
	store  uint64
	ctx    context.Context
	cancel context.CancelFunc
	cl     pb.Watch_WatchClient
	resps  chan *pb.WatchResponse
	errc   chan error // the one error that ended the stream
	done   chan struct{}
}

// errUpstream asks the proxy to drop its upstream and open another.
var errUpstream = errors.New("etcd watch proxy: upstream cannot serve the watch")

// watchElsewhere serves a Watch stream on a store with no replica of the
// keyspace, by proxy.
func (s *Service) watchElsewhere(stream pb.Watch_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	self := s.cfg.Store.ID()
	if fn := s.knobs().OnWatchProxy; fn != nil {
		fn(self, 1)
		defer fn(self, -1) // runs last: after the upstream stopped
	}
	reqs := make(chan *pb.WatchRequest)
	recvErr := make(chan error, 1)
	// The client's receiver ends when the stream does (when this handler
	// returns at the latest): a handler cannot interrupt its own Recv.
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	p := &watchProxy{s: s, ctx: ctx, stream: stream, watches: map[int64]*proxiedWatch{}, byUp: map[int64]*proxiedWatch{}}
	defer p.dropUpstream()

	retry := proxyRetryMin
	var wait <-chan time.Time // set: open no upstream before it fires
	backoff := func() {
		wait = time.After(retry)
		retry = min(2*retry, proxyRetryMax)
	}
	for {
		if p.up == nil && wait == nil {
			if err := p.connect(); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				s.cfg.Logger.Debug("etcd watch proxy: no upstream yet", "err", err)
				backoff()
			}
		}
		var resps <-chan *pb.WatchResponse
		var upErr <-chan error
		if p.up != nil {
			resps, upErr = p.up.resps, p.up.errc
		}
		select {
		case <-wait:
			wait = nil
		case <-ctx.Done():
			return nil
		case <-s.stopc:
			return status.Error(codes.Unavailable, "etcdserver: hedgekv: the store is stopping")
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case req := <-reqs:
			if err := p.handle(req); err != nil {
				return err
			}
		case r := <-resps:
			err := p.relay(r)
			if errors.Is(err, errUpstream) {
				s.cfg.Logger.Info("etcd watch proxy: upstream refused a watch; resuming elsewhere", "store", p.up.store, "reason", r.CancelReason)
				p.failUpstream()
				backoff()
				continue
			}
			if err != nil {
				return err
			}
			retry = proxyRetryMin // the upstream serves
		case err := <-upErr:
			if ctx.Err() != nil {
				return nil
			}
			s.cfg.Logger.Info("etcd watch proxy: upstream stream ended; resuming", "store", p.up.store, "err", err)
			p.failUpstream()
			backoff()
		}
	}
}

// connect opens an upstream stream to the store leading the keyspace's
// region (or another replica's, see upstreamStore) and creates every
// watch there, each from its next revision.
func (p *watchProxy) connect() error {
	store := p.upstreamStore()
	conn, out, err := p.s.forwardConn(p.ctx, store, nil)
	if err != nil {
		return fmt.Errorf("watch upstream (store %d): %w", store, err)
	}
	uctx, cancel := context.WithCancel(out)
	cl, err := pb.NewWatchClient(conn).Watch(uctx)
	if err != nil {
		cancel()
		p.s.forgetLeader(store)
		return fmt.Errorf("watch upstream on store %d: %w", store, err)
	}
	u := &upstreamWatch{store: store, ctx: uctx, cancel: cancel, cl: cl,
		resps: make(chan *pb.WatchResponse), errc: make(chan error, 1), done: make(chan struct{})}
	go u.recv()
	p.up = u
	if fn := p.s.knobs().OnWatchUpstream; fn != nil {
		fn(p.s.cfg.Store.ID(), store, cancel)
	}
	// In the client's ID order: the upstream's responses to them are
	// then in the order the client created them.
	for _, id := range slices.Sorted(maps.Keys(p.watches)) {
		p.createUp(p.watches[id])
	}
	for range p.progress {
		p.sendUp(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})
	}
	return nil
}

// upstreamStore is the store to open the upstream on: the keyspace's
// leader, unless that is this store (it gained a replica since the stream
// began, and the leadership), which a proxy never asks; then another
// store with a replica, a different one at each attempt (any replica
// serves a watch). 0: none known.
func (p *watchProxy) upstreamStore() uint64 {
	self := p.s.cfg.Store.ID()
	if id := p.s.leaderFor(p.ctx, nil); id != self {
		return id
	}
	st, ok := p.s.regionStatus()
	if !ok {
		return 0
	}
	var others []uint64
	for _, peer := range st.Region.Peers {
		if peer.StoreID != self && !peer.IsLearner {
			others = append(others, peer.StoreID)
		}
	}
	if len(others) == 0 {
		return 0
	}
	p.attempts++
	return others[p.attempts%len(others)]
}

// recv hands the proxy what the upstream sends, then why it ended (its
// context too: a stream cut from this side must be resumed as well).
func (u *upstreamWatch) recv() {
	defer close(u.done)
	for {
		r, err := u.cl.Recv()
		if err == nil {
			select {
			case u.resps <- r:
				continue
			case <-u.ctx.Done():
				err = u.ctx.Err()
			}
		}
		u.errc <- err
		return
	}
}

// dropUpstream closes the upstream stream, if any, and waits for its
// receiver; the watches are to be created again on the next one.
func (p *watchProxy) dropUpstream() {
	if p.up == nil {
		return
	}
	p.up.cancel()
	<-p.up.done
	p.up = nil
	clear(p.byUp)
	for _, w := range p.watches {
		w.up = 0
	}
}

// failUpstream is dropUpstream for a stream that broke: its store is not
// asked again before the leader is looked up again.
func (p *watchProxy) failUpstream() {
	if p.up != nil {
		p.s.forgetLeader(p.up.store)
	}
	p.dropUpstream()
}

// sendUp sends req upstream. An error is not returned: the stream broke,
// and its receiver reports why.
func (p *watchProxy) sendUp(req *pb.WatchRequest) {
	if p.up == nil {
		return
	}
	_ = p.up.cl.Send(req)
}

// createUp creates w on the upstream stream, from where it stopped.
func (p *watchProxy) createUp(w *proxiedWatch) {
	if p.up == nil {
		return
	}
	p.upNext++
	w.up = p.upNext
	p.byUp[w.up] = w
	cr := proto.CloneOf(w.req)
	cr.WatchId = w.up
	if w.next > 0 {
		cr.StartRevision = w.next
	}
	p.sendUp(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: cr}})
}

// handle is one request of the client's.
func (p *watchProxy) handle(req *pb.WatchRequest) error {
	switch r := req.RequestUnion.(type) {
	case *pb.WatchRequest_CreateRequest:
		cr := r.CreateRequest
		id := cr.WatchId
		if id == 0 { // clientv3's AutoWatchID: the server picks
			for {
				id = p.nextID
				p.nextID++
				if _, used := p.watches[id]; !used {
					break
				}
			}
		} else if _, used := p.watches[id]; used {
			return p.stream.Send(&pb.WatchResponse{WatchId: id, Created: true, Canceled: true, CancelReason: "etcdserver: duplicate watch ID"})
		}
		w := &proxiedWatch{id: id, req: proto.CloneOf(cr)}
		if cr.StartRevision > 0 {
			w.next = cr.StartRevision
		}
		p.watches[id] = w
		p.createUp(w)
	case *pb.WatchRequest_CancelRequest:
		id := r.CancelRequest.WatchId
		w, ok := p.watches[id]
		if !ok {
			return nil
		}
		p.forget(w)
		return p.stream.Send(&pb.WatchResponse{WatchId: id, Canceled: true})
	case *pb.WatchRequest_ProgressRequest:
		p.progress++
		p.sendUp(req)
	}
	return nil
}

// forget drops w, and cancels it upstream: what the upstream still
// sends of it is dropped.
func (p *watchProxy) forget(w *proxiedWatch) {
	delete(p.watches, w.id)
	if w.up != 0 {
		delete(p.byUp, w.up)
		p.sendUp(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: w.up}}})
	}
}

// relay hands the client what the upstream sent, under the client's
// watch ID, once; errUpstream: the upstream cannot serve a watch now.
func (p *watchProxy) relay(r *pb.WatchResponse) error {
	if r.WatchId == -1 && !r.Created && !r.Canceled {
		// A progress request's answer: for the stream, not a watch.
		if p.progress == 0 {
			return nil // one sent twice (an upstream broke before it answered)
		}
		p.progress--
		return p.stream.Send(r)
	}
	w, ok := p.byUp[r.WatchId]
	if !ok {
		return nil // cancelled by the client meanwhile
	}
	switch {
	case r.Canceled && unavailable(r.CancelReason):
		// The upstream cannot serve the keyspace now (its replica is
		// being removed, a snapshot applies): another store may.
		return errUpstream
	case r.Canceled:
		// Compacted, or refused for good: the client's watch ends.
		delete(p.watches, w.id)
		delete(p.byUp, w.up)
		r.WatchId, r.Created = w.id, r.Created && !w.created
		return p.stream.Send(r)
	case r.Created:
		if w.next == 0 {
			w.next = r.GetHeader().GetRevision() + 1
		}
		if w.created {
			return nil // created again on another upstream
		}
		w.created = true
		r.WatchId = w.id
		return p.stream.Send(r)
	}
	if len(r.Events) > 0 {
		evs := r.Events[:0]
		for _, ev := range r.Events {
			if ev.GetKv().GetModRevision() >= w.next {
				evs = append(evs, ev)
			}
		}
		if len(evs) == 0 {
			return nil // delivered already
		}
		r.Events = evs
		w.next = lastRev(evs) + 1
	} else if r.Header != nil {
		// A progress notification: every event up to its revision is
		// delivered. An upstream behind the last one never says less.
		if r.Header.Revision >= w.next {
			w.next = r.Header.Revision + 1
		} else {
			r.Header.Revision = w.next - 1
		}
	}
	r.WatchId = w.id
	return p.stream.Send(r)
}

func lastRev(evs []*mvccpb.Event) int64 {
	return evs[len(evs)-1].GetKv().GetModRevision()
}

// unavailable reports whether a cancelled watch's reason is an
// Unavailable status (toStatus's, for a store that cannot serve the
// keyspace now).
func unavailable(reason string) bool {
	return strings.Contains(reason, "code = "+codes.Unavailable.String())
}
