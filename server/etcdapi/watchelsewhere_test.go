package etcdapi_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// seen is an event as a test compares it: what changed, at which
// revision, and the value before.
type seen struct {
	rev       int64
	del       bool
	key, val  string
	prev      string
	prevFound bool
}

func (e seen) String() string {
	op := "put"
	if e.del {
		op = "del"
	}
	return fmt.Sprintf("%d %s %s=%q (prev %q, %v)", e.rev, op, e.key, e.val, e.prev, e.prevFound)
}

func seenOf(ev *clientv3.Event) seen {
	e := seen{rev: ev.Kv.ModRevision, del: ev.Type == mvccpb.DELETE, key: string(ev.Kv.Key), val: string(ev.Kv.Value)}
	if ev.PrevKv != nil {
		e.prev, e.prevFound = string(ev.PrevKv.Value), true
	}
	return e
}

// collect reads wc's events until one at or after rev arrived, or d
// passed (an error then).
func collect(t *testing.T, wc clientv3.WatchChan, rev int64, d time.Duration) []seen {
	t.Helper()
	var out []seen
	timeout := time.After(d)
	for len(out) == 0 || out[len(out)-1].rev < rev {
		select {
		case r, ok := <-wc:
			if !ok {
				t.Fatalf("watch closed after %d events, want up to revision %d", len(out), rev)
			}
			if err := r.Err(); err != nil {
				t.Fatalf("watch: %v", err)
			}
			for _, ev := range r.Events {
				out = append(out, seenOf(ev))
			}
		case <-timeout:
			t.Fatalf("after %v: %d events, the last %v; want up to revision %d", d, len(out), out[max(len(out)-1, 0):], rev)
		}
	}
	return out
}

// sameEvents fails t unless got is want, event for event.
func sameEvents(t *testing.T, what string, got, want []seen) {
	t.Helper()
	for i := range max(len(got), len(want)) {
		var g, w seen
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Fatalf("%s: event %d is %v, want %v (%d events, want %d)", what, i, g, w, len(got), len(want))
		}
	}
}

// created waits for wc's created notification.
func created(t *testing.T, wc clientv3.WatchChan) {
	t.Helper()
	select {
	case r := <-wc:
		if !r.Created || r.Err() != nil {
			t.Fatalf("first watch response %+v (%v), want created", r, r.Err())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("watch not created in 20s")
	}
}

// A Watch on a store with no replica of the keyspace is proxied to one
// that has: it sees the puts and deletes made through the other stores
// once, in order, with prev_kv, and history from an old revision; when
// the store it is proxied to stops, the proxy resumes elsewhere from the
// last revision it delivered, and the client sees no gap and no
// duplicate. Once the client leaves, the proxy has stopped everything it
// started.
func TestWatchOnAStoreWithoutAReplica(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 150*time.Second)
	var upstream atomic.Uint64
	var proxies atomic.Int64
	knobs := &etcdapi.TestingKnobs{
		OnWatchUpstream: func(from, to uint64, _ func()) {
			if from == outsider {
				upstream.Store(to)
			}
		},
		OnWatchProxy: func(store uint64, delta int) {
			if store == outsider {
				proxies.Add(int64(delta))
			}
		},
	}
	c := outsiderCluster(t, ctx, knobs)
	var clis []*clientv3.Client
	for _, ep := range c.Endpoints[:outsider-1] {
		clis = append(clis, client(t, ep))
	}

	// History first: a put, another, a delete.
	p, err := clis[0].Put(ctx, "w/a", "1")
	if err != nil {
		t.Fatal(err)
	}
	from := p.Header.Revision
	if _, err := clis[1].Put(ctx, "w/a", "2"); err != nil {
		t.Fatal(err)
	}
	d, err := clis[2].Delete(ctx, "w/a")
	if err != nil {
		t.Fatal(err)
	}
	cli := client(t, c.Endpoints[outsider-1])
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	hist := cli.Watch(wctx, "w/", clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV())
	sameEvents(t, "watch from an old revision", collect(t, hist, d.Header.Revision, 20*time.Second), []seen{
		{rev: from, key: "w/a", val: "1"},
		{rev: from + 1, key: "w/a", val: "2", prev: "1", prevFound: true},
		{rev: from + 2, del: true, key: "w/a", prev: "2", prevFound: true},
	})

	// A live watch on the same stream, and writes through the other
	// stores in turn.
	live := cli.Watch(wctx, "w/", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
	created(t, live)
	var want []seen
	vals := map[string]string{}
	var last int64
	write := func(cli *clientv3.Client, i int) error {
		key := fmt.Sprintf("w/%d", i%5)
		if prev, ok := vals[key]; ok && i%3 == 0 {
			r, err := cli.Delete(ctx, key)
			if err != nil {
				return err
			}
			want = append(want, seen{rev: r.Header.Revision, del: true, key: key, prev: prev, prevFound: true})
			delete(vals, key)
			last = r.Header.Revision
			return nil
		}
		val := fmt.Sprint(i)
		r, err := cli.Put(ctx, key, val)
		if err != nil {
			return err
		}
		prev, ok := vals[key]
		want = append(want, seen{rev: r.Header.Revision, key: key, val: val, prev: prev, prevFound: ok})
		vals[key] = val
		last = r.Header.Revision
		return nil
	}
	for i := range 30 {
		if err := write(clis[i%len(clis)], i); err != nil {
			t.Fatal(err)
		}
	}
	got := collect(t, live, last, 20*time.Second)
	sameEvents(t, "live watch", got, want)
	mark, phase1 := last, append([]seen(nil), want...)

	// Stop the store the watches are proxied to, and write on through
	// the others meanwhile and after. A write refused while the region
	// elects a leader is tried again; one whose outcome is unknown may
	// have applied, so what the watches must see from here on is read
	// from a replica's own watch.
	gone := upstream.Load()
	if gone == 0 || gone == outsider {
		t.Fatalf("the proxy's upstream store is %d", gone)
	}
	var writers []*clientv3.Client
	for i, cl := range clis {
		if uint64(i+1) != gone {
			writers = append(writers, cl)
		}
	}
	var stopped sync.WaitGroup
	stopped.Go(func() { c.Server(gone).Stop() })
	for i := 30; i < 60; i++ {
		for attempt := 0; ; attempt++ {
			err := write(writers[i%len(writers)], i)
			if err == nil {
				break
			}
			if attempt > 50 || ctx.Err() != nil {
				t.Fatalf("write %d: %v", i, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	stopped.Wait()
	truth := collect(t, writers[0].Watch(wctx, "w/", clientv3.WithPrefix(), clientv3.WithRev(mark+1), clientv3.WithPrevKV()), last, 30*time.Second)
	sameEvents(t, "live watch across its upstream's stop", collect(t, live, last, 30*time.Second), truth)
	if up := upstream.Load(); up == gone {
		t.Errorf("the proxy still names store %d, stopped, as its upstream", gone)
	}
	// The watch from history, on the same stream, resumed too.
	sameEvents(t, "old watch across its upstream's stop", collect(t, hist, last, 10*time.Second), append(phase1, truth...))

	// Nothing more arrives (no duplicate sent late).
	select {
	case r := <-live:
		if len(r.Events) > 0 {
			t.Fatalf("unexpected events after the last write: %v", r.Events)
		}
	case <-time.After(500 * time.Millisecond):
	}

	wcancel()
	_ = cli.Close()
	for deadline := time.Now().Add(10 * time.Second); proxies.Load() != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d watch proxies still running after their client left", proxies.Load())
		}
	}
}

// rawWatch is a Watch stream of etcd's own protocol, read in the
// background so each wait is bounded.
type rawWatch struct {
	t      *testing.T
	stream pb.Watch_WatchClient
	resps  chan *pb.WatchResponse
	errc   chan error
}

func openRawWatch(t *testing.T, ctx context.Context, endpoint string) *rawWatch {
	t.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	stream, err := pb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := &rawWatch{t: t, stream: stream, resps: make(chan *pb.WatchResponse, 100), errc: make(chan error, 1)}
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				w.errc <- err
				return
			}
			w.resps <- r
		}
	}()
	return w
}

func (w *rawWatch) send(req *pb.WatchRequest) {
	w.t.Helper()
	if err := w.stream.Send(req); err != nil {
		w.t.Fatalf("send %v: %v", req, err)
	}
}

func (w *rawWatch) create(cr *pb.WatchCreateRequest) {
	w.t.Helper()
	w.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: cr}})
}

// next is the stream's next response, within d.
func (w *rawWatch) next(d time.Duration) *pb.WatchResponse {
	w.t.Helper()
	select {
	case r := <-w.resps:
		return r
	case err := <-w.errc:
		w.t.Fatalf("watch stream ended: %v", err)
	case <-time.After(d):
		w.t.Fatalf("no watch response in %v", d)
	}
	return nil
}

// quiet fails unless nothing arrives for d.
func (w *rawWatch) quiet(d time.Duration) {
	w.t.Helper()
	select {
	case r := <-w.resps:
		w.t.Fatalf("unexpected watch response %v", r)
	case <-time.After(d):
	}
}

// A proxied Watch stream has a replica's semantics: the client's watch
// IDs (its own and the server's picks), a duplicate ID refused, filters,
// prev_kv, cancel, progress requests and notifications, a watch from
// compacted history cancelled with the compaction revision; closing the
// stream stops the proxy.
func TestWatchOnAStoreWithoutAReplicaSemantics(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 120*time.Second)
	var proxies atomic.Int64
	// Progress notifications every 2 s, not 10: the spec waits for one.
	c := outsiderCluster(t, ctx, &etcdapi.TestingKnobs{ProgressEvery: 2 * time.Second, OnWatchProxy: func(store uint64, delta int) {
		if store == outsider {
			proxies.Add(int64(delta))
		}
	}})
	writer := client(t, c.Endpoints[0])
	const d = 20 * time.Second
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	w := openRawWatch(t, sctx, c.Endpoints[outsider-1])

	// Deletes of s/ only, with the value before; s/x alone, its ID the
	// server's pick; a duplicate ID.
	w.create(&pb.WatchCreateRequest{WatchId: 7, Key: []byte("s/"), RangeEnd: []byte("s0"), PrevKv: true,
		Filters: []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT}})
	if r := w.next(d); !r.Created || r.Canceled || r.WatchId != 7 {
		t.Fatalf("create 7: %v", r)
	}
	w.create(&pb.WatchCreateRequest{Key: []byte("s/x")})
	if r := w.next(d); !r.Created || r.Canceled || r.WatchId != 0 {
		t.Fatalf("create with no ID: %v, want ID 0", r)
	}
	w.create(&pb.WatchCreateRequest{WatchId: 7, Key: []byte("other")})
	if r := w.next(d); !r.Created || !r.Canceled || r.WatchId != 7 {
		t.Fatalf("create 7 again: %v, want refused", r)
	}

	put := func(k, v string) int64 {
		t.Helper()
		r, err := writer.Put(ctx, k, v)
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	del := func(k string) int64 {
		t.Helper()
		r, err := writer.Delete(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	putX := put("s/x", "1")
	put("s/y", "1")
	delX := del("s/x")
	byID := map[int64][]*mvccpb.Event{}
	for len(byID[0]) < 2 || len(byID[7]) < 1 {
		r := w.next(d)
		if r.Created || r.Canceled {
			t.Fatalf("unexpected %v", r)
		}
		byID[r.WatchId] = append(byID[r.WatchId], r.Events...)
	}
	if ev := byID[0]; len(ev) != 2 || ev[0].Kv.ModRevision != putX || ev[0].Type != mvccpb.PUT || ev[1].Kv.ModRevision != delX || ev[1].Type != mvccpb.DELETE || ev[0].PrevKv != nil {
		t.Fatalf("watch 0 got %v; want the put at %d and the delete at %d of s/x, no prev_kv", ev, putX, delX)
	}
	if ev := byID[7]; len(ev) != 1 || ev[0].Type != mvccpb.DELETE || ev[0].Kv.ModRevision != delX || string(ev[0].PrevKv.GetValue()) != "1" {
		t.Fatalf("watch 7 got %v; want the delete of s/x at %d with its value before", ev, delX)
	}

	// A progress request is answered for the stream (ID -1).
	w.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})
	if r := w.next(d); r.WatchId != -1 || len(r.Events) > 0 || r.Header.GetRevision() < delX {
		t.Fatalf("progress: %v, want ID -1 at %d or later", r, delX)
	}

	// Cancelled, watch 0 sees nothing more; 7 still sees deletes.
	w.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: 0}}})
	if r := w.next(d); !r.Canceled || r.WatchId != 0 {
		t.Fatalf("cancel 0: %v", r)
	}
	put("s/x", "2")
	delY := del("s/y")
	if r := w.next(d); r.WatchId != 7 || len(r.Events) != 1 || r.Events[0].Kv.ModRevision != delY {
		t.Fatalf("after the cancel: %v, want watch 7's delete of s/y at %d", r, delY)
	}

	// History before the compaction is gone: the watch is created, then
	// cancelled with the compaction revision.
	if _, err := writer.Compact(ctx, delY); err != nil {
		t.Fatal(err)
	}
	w.create(&pb.WatchCreateRequest{WatchId: 9, Key: []byte("s/"), RangeEnd: []byte("s0"), StartRevision: putX})
	if r := w.next(d); !r.Created || r.WatchId != 9 {
		t.Fatalf("create from compacted history: %v", r)
	}
	if r := w.next(d); !r.Canceled || r.Created || r.WatchId != 9 || r.CompactRevision != delY {
		t.Fatalf("watch from compacted history: %v, want cancelled with compact_revision %d", r, delY)
	}

	// An idle watch that asked for progress notifications gets one.
	w.create(&pb.WatchCreateRequest{WatchId: 11, Key: []byte("quiet"), ProgressNotify: true})
	if r := w.next(d); !r.Created || r.WatchId != 11 {
		t.Fatalf("create 11: %v", r)
	}
	if r := w.next(15 * time.Second); r.WatchId != 11 || len(r.Events) > 0 || r.Header.GetRevision() < delY {
		t.Fatalf("progress notification: %v, want watch 11's at %d or later", r, delY)
	}
	w.quiet(200 * time.Millisecond)

	// The client leaves: the proxy stops everything it started.
	if err := w.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	scancel()
	for deadline := time.Now().Add(10 * time.Second); proxies.Load() != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d watch proxies still running after their client left", proxies.Load())
		}
	}
}

// TestWatchProxyResumesAcrossCuts: the proxy's upstream stream is cut
// again and again while a writer writes; watches through the store with
// no replica (of a prefix with prev_kv, of one key, filtered, from
// history, on one stream) still see every event once, in revision order.
func TestWatchProxyResumesAcrossCuts(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 120*time.Second)
	var mu sync.Mutex
	var cut func()
	opened := 0
	c := outsiderCluster(t, ctx, &etcdapi.TestingKnobs{OnWatchUpstream: func(from, _ uint64, c func()) {
		if from == outsider {
			mu.Lock()
			cut, opened = c, opened+1
			mu.Unlock()
		}
	}})
	writer := client(t, c.Endpoints[0])
	first, err := writer.Put(ctx, "cut", "")
	if err != nil {
		t.Fatal(err)
	}
	cli := client(t, c.Endpoints[outsider-1])
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var wg sync.WaitGroup
	var ws []*watched
	for _, spec := range []watchSpec{
		{key: "c/", prefix: true, prevKV: true},
		{key: "c/3"},
		{key: "c/", prefix: true, noPut: true, prevKV: true},
	} {
		ws = append(ws, startWatch(t, wctx, cli, spec, &wg))
	}

	var keys []string
	for i := range 10 {
		keys = append(keys, fmt.Sprintf("c/%d", i))
	}
	var log writeLog
	stop := make(chan struct{})
	var writing sync.WaitGroup
	writing.Go(func() { writeKeys(t, ctx, writer, keys, 100000, stop, &log) })
	for deadline := time.Now().Add(20 * time.Second); log.last() < first.Header.Revision+20; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the writer made fewer than 20 writes in 20s")
		}
	}
	ws = append(ws, startWatch(t, wctx, cli, watchSpec{key: "c/", prefix: true, start: first.Header.Revision + 1, prevKV: true}, &wg))
	// Each cut once the proxy resumed from the last one, while the
	// writer writes.
	for i := range 10 {
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		n := opened
		cut()
		mu.Unlock()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			resumed := opened > n
			mu.Unlock()
			if resumed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the proxy did not resume within 10s of cut %d", i+1)
			}
		}
	}
	close(stop)
	writing.Wait()
	checkWatched(t, ws, log.all())
	wcancel()
	wg.Wait()
}

// A store that proxies a Watch stream (it held no replica of the keyspace
// when the stream began) and then gains a replica and the leadership: when
// the upstream breaks, the proxy must not look for it on its own store,
// where the leader now is, but on another replica's: no gap, no duplicate.
// Before, the proxy asked its own store for a connection to the leader,
// was refused, and tried again every 2 s for good, the client's watch
// silent (a CI failure of test/etcdfaults: a store whose watch began while
// the split that makes the keyspace its own region was published, then
// won the election).
func TestWatchProxyOnAStoreThatGainsAReplica(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 120*time.Second)
	var mu sync.Mutex
	var cut func()
	var upstreams []uint64
	c := outsiderCluster(t, ctx, &etcdapi.TestingKnobs{OnWatchUpstream: func(from, to uint64, c func()) {
		if from == outsider {
			mu.Lock()
			cut, upstreams = c, append(upstreams, to)
			mu.Unlock()
		}
	}})
	rid := etcdRegion(t, c).ID
	writer := client(t, c.Endpoints[0])
	var want []seen
	put := func(key, val string) int64 {
		t.Helper()
		r, err := writer.Put(ctx, key, val)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, seen{rev: r.Header.Revision, key: key, val: val})
		return r.Header.Revision
	}
	cli := client(t, c.Endpoints[outsider-1])
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wc := cli.Watch(wctx, "g/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	created(t, wc)
	got := collect(t, wc, put("g/0", "proxied"), 20*time.Second)

	// The outsider gains a replica, then the leadership.
	for deadline := time.Now().Add(30 * time.Second); !leads(c.Server(outsider).Store().Regions(), rid); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("store %d did not become the leader of region %d", outsider, rid)
		}
		has := holds(c, outsider, rid)
		for _, id := range c.StoreIDs() { // only the leader's call succeeds
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if has {
				_ = c.Server(id).Store().TransferLeader(actx, rid, outsider)
			} else {
				_ = c.Server(id).Store().AddPeer(actx, rid, outsider)
			}
			cancel()
		}
	}
	mu.Lock()
	if cut == nil {
		mu.Unlock()
		t.Fatal("the watch was never proxied")
	}
	cut()
	mu.Unlock()
	var last int64
	for i := range 20 {
		last = put(fmt.Sprintf("g/%d", i%3), fmt.Sprint(i))
	}
	got = append(got, collect(t, wc, last, 20*time.Second)...)
	sameEvents(t, "watch across the cut", got, want)
	mu.Lock()
	defer mu.Unlock()
	if n := len(upstreams); n < 2 || slices.Contains(upstreams, outsider) {
		t.Errorf("upstreams opened %v: want at least two, none on store %d itself", upstreams, outsider)
	}
}

// leads reports whether the statuses show region rid led here.
func leads(sts []raftstore.RegionStatus, rid uint64) bool {
	for _, st := range sts {
		if st.Region.ID == rid {
			return st.IsLeader
		}
	}
	return false
}
