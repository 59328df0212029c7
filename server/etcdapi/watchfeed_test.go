package etcdapi_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// write is one change a test's writer made: its revision, key, and value
// (del: a delete).
type write struct {
	rev      int64
	key, val string
	del      bool
}

// writeLog is what a writer changed, in revision order (one writer, one
// change per revision).
type writeLog struct {
	mu     sync.Mutex
	writes []write
}

func (l *writeLog) add(w write) {
	l.mu.Lock()
	l.writes = append(l.writes, w)
	l.mu.Unlock()
}

func (l *writeLog) last() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.writes) == 0 {
		return 0
	}
	return l.writes[len(l.writes)-1].rev
}

func (l *writeLog) all() []write {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]write(nil), l.writes...)
}

// writeKeys puts (mostly) and deletes keys chosen from keys, one at a
// time, until stop is closed or n writes are done; every write it makes
// is logged. A delete is only of a key that exists, so every write makes
// one revision.
func writeKeys(t *testing.T, ctx context.Context, cli *clientv3.Client, keys []string, n int, stop <-chan struct{}, log *writeLog) {
	t.Helper()
	exists := map[string]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < n; i++ {
		select {
		case <-stop:
			return
		default:
		}
		key := keys[rng.IntN(len(keys))]
		if exists[key] && rng.IntN(4) == 0 {
			r, err := cli.Delete(ctx, key)
			if err != nil {
				t.Errorf("delete %s: %v", key, err)
				return
			}
			exists[key] = false
			log.add(write{rev: r.Header.Revision, key: key, del: true})
			continue
		}
		val := fmt.Sprintf("v%d", i)
		r, err := cli.Put(ctx, key, val)
		if err != nil {
			t.Errorf("put %s: %v", key, err)
			return
		}
		exists[key] = true
		log.add(write{rev: r.Header.Revision, key: key, val: val})
	}
}

// watchSpec is a watch a test makes, and what it should see.
type watchSpec struct {
	key, end        string // end "": one key; "\x00": from key on
	prefix          bool
	start           int64 // 0: from the revision after its creation
	prevKV          bool
	noPut, noDelete bool
}

func (s watchSpec) opts() []clientv3.OpOption {
	opts := []clientv3.OpOption{clientv3.WithCreatedNotify()}
	switch {
	case s.prefix:
		opts = append(opts, clientv3.WithPrefix())
	case s.end == "\x00":
		opts = append(opts, clientv3.WithFromKey())
	case s.end != "":
		opts = append(opts, clientv3.WithRange(s.end))
	}
	if s.start > 0 {
		opts = append(opts, clientv3.WithRev(s.start))
	}
	if s.prevKV {
		opts = append(opts, clientv3.WithPrevKV())
	}
	if s.noPut {
		opts = append(opts, clientv3.WithFilterPut())
	}
	if s.noDelete {
		opts = append(opts, clientv3.WithFilterDelete())
	}
	return opts
}

func (s watchSpec) holds(key string) bool {
	switch {
	case s.prefix:
		return strings.HasPrefix(key, s.key)
	case s.end == "\x00":
		return key >= s.key
	case s.end != "":
		return key >= s.key && key < s.end
	}
	return key == s.key
}

// expect is what a watch from start should see of log.
func (s watchSpec) expect(log []write, start int64) []write {
	var out []write
	for _, w := range log {
		if w.rev >= start && s.holds(w.key) && !(w.del && s.noDelete) && !(!w.del && s.noPut) {
			out = append(out, w)
		}
	}
	return out
}

// watched is a watch being collected.
type watched struct {
	spec  watchSpec
	start int64 // the first revision it should see
	mu    sync.Mutex
	evs   []*clientv3.Event
	err   error
}

func (w *watched) events() []*clientv3.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*clientv3.Event(nil), w.evs...)
}

// startWatch creates spec's watch on cli and collects its events until
// ctx ends (a failure is the watch's err, for checkWatched).
func startWatch(t *testing.T, ctx context.Context, cli *clientv3.Client, spec watchSpec, wg *sync.WaitGroup) *watched {
	t.Helper()
	ch := cli.Watch(ctx, spec.key, spec.opts()...)
	created, ok := <-ch
	w := &watched{spec: spec, start: spec.start}
	if !ok || !created.Created || created.Err() != nil {
		w.err = fmt.Errorf("create: %v (closed: %v)", created.Err(), !ok)
		return w
	}
	if w.start == 0 {
		w.start = created.Header.Revision + 1
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for wr := range ch {
			w.mu.Lock()
			if err := wr.Err(); err != nil && w.err == nil {
				w.err = err
			}
			w.evs = append(w.evs, wr.Events...)
			w.mu.Unlock()
		}
	}()
	return w
}

// checkWatched waits for every watch to have its events of log, then
// checks each saw exactly them, once, in revision order, with the right
// values and previous values.
func checkWatched(t *testing.T, ws []*watched, log []write) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, w := range ws {
		want := w.spec.expect(log, w.start)
		for len(w.events()) < len(want) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(200 * time.Millisecond) // a duplicate or stray event would arrive meanwhile
	prev := map[int64]write{}          // the write before each one to its key
	last := map[string]write{}
	for _, w := range log {
		if p, ok := last[w.key]; ok && !p.del {
			prev[w.rev] = p
		}
		last[w.key] = w
	}
	for i, w := range ws {
		want := w.spec.expect(log, w.start)
		got := w.events()
		w.mu.Lock()
		err := w.err
		w.mu.Unlock()
		if err != nil {
			t.Errorf("watch %d %+v: %v", i, w.spec, err)
		}
		bad := len(got) != len(want)
		for j := 0; !bad && j < len(got); j++ {
			g, e := got[j], want[j]
			bad = g.Kv.ModRevision != e.rev || string(g.Kv.Key) != e.key || (g.Type == mvccpb.DELETE) != e.del ||
				(!e.del && string(g.Kv.Value) != e.val)
			if w.spec.prevKV && !bad {
				p, ok := prev[e.rev]
				bad = ok != (g.PrevKv != nil) || (ok && string(g.PrevKv.Value) != p.val)
			}
		}
		if bad {
			t.Errorf("watch %d %+v from %d: got %s\nwant %s", i, w.spec, w.start, fmtEvents(got), fmtWrites(want))
		}
	}
}

func fmtEvents(evs []*clientv3.Event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%d:%s:%s ", e.Kv.ModRevision, e.Type, e.Kv.Key)
	}
	return fmt.Sprintf("%d events: %s", len(evs), b.String())
}

func fmtWrites(ws []write) string {
	var b strings.Builder
	for _, w := range ws {
		kind := "PUT"
		if w.del {
			kind = "DELETE"
		}
		fmt.Fprintf(&b, "%d:%s:%s ", w.rev, kind, w.key)
	}
	return fmt.Sprintf("%d events: %s", len(ws), b.String())
}

// TestWatchFeedMixedWatchers: watchers on one store, on single keys,
// prefixes, ranges and open ranges, with prev_kv and filters, some created
// from an old revision (they read history, then join the feed) and some
// from now (they join at once), created before and while a writer changes
// the keys through another store; a follower's store serves another set.
// Each sees exactly its own events, once, in revision order, with their
// values and previous values.
func TestWatchFeedMixedWatchers(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 90*time.Second)
	writer := client(t, c.Endpoints[0])
	var keys []string
	for g := range 5 {
		for k := range 8 {
			keys = append(keys, fmt.Sprintf("mix/%d/%02d", g, k))
		}
	}
	// History before any watcher: the old-revision watchers read it.
	var log writeLog
	writeKeys(t, ctx, writer, keys, 60, nil, &log)
	first := log.all()[0].rev
	specs := func(i int) watchSpec {
		s := watchSpec{key: keys[(i*7)%len(keys)]}
		switch i % 6 {
		case 1:
			s = watchSpec{key: fmt.Sprintf("mix/%d/", i%5), prefix: true}
		case 2:
			s = watchSpec{key: fmt.Sprintf("mix/%d/03", i%5), end: fmt.Sprintf("mix/%d/06", i%5)}
		case 3:
			s = watchSpec{key: "mix/3/", end: "\x00"}
		case 4:
			s.prevKV = true
		case 5:
			s = watchSpec{key: "mix/", prefix: true, noPut: i%2 == 0, noDelete: i%2 == 1, prevKV: true}
		}
		switch {
		case i%3 == 0:
			s.start = first + int64(i%40) // behind: unsynced first
		case i%10 == 7:
			s.start = first + 250 // ahead: the feed skips what is before it
		}
		return s
	}
	wctx, stopWatches := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var ws []*watched
	clis := []*clientv3.Client{client(t, c.Endpoints[1]), client(t, c.Endpoints[1]), client(t, c.Endpoints[2])}
	for i := range 30 {
		ws = append(ws, startWatch(t, wctx, clis[i%len(clis)], specs(i), &wg))
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		writeKeys(t, ctx, writer, keys, 400, stop, &log)
	}()
	// More watchers while the writer writes, a few milliseconds apart.
	for i := 30; i < 90; i++ {
		ws = append(ws, startWatch(t, wctx, clis[i%len(clis)], specs(i), &wg))
		time.Sleep(3 * time.Millisecond)
	}
	<-done
	checkWatched(t, ws, log.all())
	stopWatches()
	wg.Wait()
}

// TestWatchFeedHandOver: watchers join the feed while a writer writes as
// fast as it can, each from a revision just behind the last one
// acknowledged (so it reads a little history first, and the feed moves
// on meanwhile), many times: each sees every event from its start on,
// once, in order. None may be lost or repeated at the hand-over.
func TestWatchFeedHandOver(t *testing.T) {
	t.Parallel()
	// Half the watchers pause up to 5 ms before they join: the feed,
	// woken by every write, moves on meanwhile, and they must read the
	// revisions between from history at the join.
	var pauses, joins, joinReads atomic.Int64
	c := startCluster(t, &etcdapi.TestingKnobs{
		BeforeJoin: func() {
			if pauses.Add(1)%2 == 0 {
				time.Sleep(time.Duration(rand.IntN(5000)) * time.Microsecond)
			}
		},
		OnJoin: func(readRest bool) {
			joins.Add(1)
			if readRest {
				joinReads.Add(1)
			}
		},
	})
	ctx := ctxFor(t, 90*time.Second)
	writer := client(t, c.Endpoints[0])
	keys := []string{"ho/a", "ho/b", "ho/c", "ho/d"}
	var log writeLog
	writeKeys(t, ctx, writer, keys, 10, nil, &log)
	joinsBefore, readsBefore := joins.Load(), joinReads.Load()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		writeKeys(t, ctx, writer, keys, 1<<30, stop, &log)
	}()
	wctx, stopWatches := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var ws []*watched
	// Two streams per store the watchers use: the watch store is a
	// follower's (endpoint 1) and the leader's (endpoint 0).
	clis := []*clientv3.Client{client(t, c.Endpoints[1]), client(t, c.Endpoints[0])}
	const n = 150
	for i := range n {
		spec := watchSpec{key: "ho/", prefix: true, prevKV: i%2 == 0}
		if i%5 == 4 {
			spec = watchSpec{key: keys[i%len(keys)]}
		}
		spec.start = max(log.last()-int64(i%4), 1)
		if i%7 == 6 {
			spec.start = 0 // from now
		}
		ws = append(ws, startWatch(t, wctx, clis[i%len(clis)], spec, &wg))
	}
	close(stop)
	<-done
	checkWatched(t, ws, log.all())
	if joined := joins.Load() - joinsBefore; joined < n {
		t.Errorf("%d watchers joined the feed, want at least %d", joined, n)
	}
	reads := joinReads.Load() - readsBefore
	t.Logf("%d joins found the feed ahead and read the rest at the join", reads)
	if reads == 0 {
		t.Error("no join found the feed ahead: the hand-over's race never ran")
	}
	stopWatches()
	wg.Wait()
}

// TestWatchFeedSlowConsumer: a watch whose client stops reading (its gRPC
// flow-control windows fill, so the server's sends block) falls behind
// the feed, drops back to reading history, and still gets every event,
// once, in order, when it reads again; a watcher of the same keys on
// another connection of the same store gets every event meanwhile.
func TestWatchFeedSlowConsumer(t *testing.T) {
	t.Parallel()
	var fellBack atomic.Int64
	c := startCluster(t, &etcdapi.TestingKnobs{WatchBuffer: 8, OnFallback: func() { fellBack.Add(1) }})
	ctx := ctxFor(t, 90*time.Second)
	writer := client(t, c.Endpoints[0])
	first, err := writer.Put(ctx, "slow/seed", "")
	if err != nil {
		t.Fatal(err)
	}
	// The slow client: a raw stream on a connection whose windows are
	// small and fixed (no BDP growth), which reads nothing until told.
	conn, err := grpc.NewClient(c.Endpoints[1], grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := pb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
		Key: []byte("slow/"), RangeEnd: []byte("slow0"), StartRevision: first.Header.Revision + 1}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || !r.Created {
		t.Fatalf("create: %+v %v", r, err)
	}
	var wg sync.WaitGroup
	fast := startWatch(t, ctx, client(t, c.Endpoints[1]), watchSpec{key: "slow/", prefix: true, start: first.Header.Revision + 1}, &wg)

	fallbacks := fellBack.Load()
	var log writeLog
	val := strings.Repeat("x", 4<<10)
	const n = 300 // 1.2 MB of values: far past both windows
	for i := range n {
		key := fmt.Sprintf("slow/%d", i%10)
		r, err := writer.Put(ctx, key, val)
		if err != nil {
			t.Fatal(err)
		}
		log.add(write{rev: r.Header.Revision, key: key, val: val})
	}
	// The fast watcher is not held up by the slow one.
	for deadline := time.Now().Add(20 * time.Second); len(fast.events()) < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the fast watcher got %d of %d events while the slow one read nothing", len(fast.events()), n)
		}
	}
	if fellBack.Load() == fallbacks {
		t.Fatal("the slow watcher never fell behind the feed")
	}
	// Now the slow client reads, and gets everything.
	var got []int64
	for len(got) < n {
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("after %d events: %v", len(got), err)
		}
		for _, ev := range r.Events {
			if !bytes.Equal(ev.Kv.Value, []byte(val)) {
				t.Fatalf("event %d: value of %d bytes", ev.Kv.ModRevision, len(ev.Kv.Value))
			}
			got = append(got, ev.Kv.ModRevision)
		}
	}
	for i, w := range log.all() {
		if got[i] != w.rev {
			t.Fatalf("slow watcher: event %d at revision %d, want %d (got %v)", i, got[i], w.rev, got)
		}
	}
	checkWatched(t, []*watched{fast}, log.all())
	_ = stream.CloseSend()
}

// TestWatchFeedManyKeys: a thousand watchers on one store, on 500 single
// keys, 200 prefixes and overlapping ranges, while keys nobody watches
// change too: each gets exactly its own keys' events.
func TestWatchFeedManyKeys(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 90*time.Second)
	writer := client(t, c.Endpoints[0])
	first, err := writer.Put(ctx, "many-start", "")
	if err != nil {
		t.Fatal(err)
	}
	start := first.Header.Revision + 1
	key := func(i int) string { return fmt.Sprintf("many/%03d/%d", i/10, i%10) }
	var specs []watchSpec
	for i := range 500 {
		specs = append(specs, watchSpec{key: key(i * 2), start: start}) // the even keys of 1000
	}
	for i := range 200 {
		specs = append(specs, watchSpec{key: fmt.Sprintf("many/%03d/", i*3%100), prefix: true, start: start})
	}
	for i := range 300 {
		lo := i * 3 % 1000
		specs = append(specs, watchSpec{key: key(lo), end: key(min(lo+5+i%40, 999)), start: start, noDelete: true})
	}
	wctx, stopWatches := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var ws []*watched
	clis := make([]*clientv3.Client, 4)
	for i := range clis {
		clis[i] = client(t, c.Endpoints[2])
	}
	var mu sync.Mutex
	var cg sync.WaitGroup
	for s := range len(clis) {
		cg.Go(func() {
			for i := s; i < len(specs); i += len(clis) {
				w := startWatch(t, wctx, clis[s], specs[i], &wg)
				mu.Lock()
				ws = append(ws, w)
				mu.Unlock()
			}
		})
	}
	cg.Wait()
	var keys []string
	for i := range 1000 {
		keys = append(keys, key(i))
	}
	keys = append(keys, "other/a", "other/b", "manz")
	var log writeLog
	writeKeys(t, ctx, writer, keys, 600, nil, &log)
	checkWatched(t, ws, log.all())
	stopWatches()
	wg.Wait()
}

// BenchmarkWatchFeed: N watchers on one store (a follower's), each on one
// of N/2 keys, over 20 clients of 5 streams; b.N puts of random keys, 32
// at a time, through another store. Each op is one put and its delivery
// to every watcher of its key: the clock stops when every watcher has its
// events. Reports events delivered per second.
func BenchmarkWatchFeed(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) { benchWatchFeed(b, n) })
	}
}

func benchWatchFeed(b *testing.B, n int) {
	c := startCluster(b)
	ctx := ctxFor(b, 10*time.Minute)
	writer := client(b, c.Endpoints[0])
	first, err := writer.Put(ctx, "bench-start", "")
	if err != nil {
		b.Fatal(err)
	}
	keys := max(n/2, 1)
	key := func(i int) string { return fmt.Sprintf("bench/%06d", i) }
	per := make([]int64, keys) // watchers of each key
	for i := range n {
		per[i%keys]++
	}
	var got atomic.Int64
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	const clients, streams = 20, 5
	clis := make([]*clientv3.Client, clients)
	for i := range clis {
		clis[i] = client(b, c.Endpoints[1])
	}
	var cg sync.WaitGroup
	for s := range clients * streams {
		sctx := metadata.AppendToOutgoingContext(wctx, "stream", fmt.Sprint(s))
		cg.Go(func() {
			for i := s; i < n; i += clients * streams {
				wch := clis[s%clients].Watch(sctx, key(i%keys), clientv3.WithRev(first.Header.Revision+1), clientv3.WithCreatedNotify())
				<-wch
				wg.Go(func() {
					for wr := range wch {
						got.Add(int64(len(wr.Events)))
					}
				})
			}
		})
	}
	cg.Wait()
	rng := rand.New(rand.NewPCG(5, 6))
	targets := make([]int, b.N)
	var want int64
	for i := range targets {
		targets[i] = rng.IntN(keys)
		want += per[targets[i]]
	}
	b.ResetTimer()
	sem := make(chan struct{}, 32)
	var ww sync.WaitGroup
	for _, k := range targets {
		sem <- struct{}{}
		ww.Go(func() {
			defer func() { <-sem }()
			if _, err := writer.Put(ctx, key(k), "v"); err != nil {
				b.Error(err)
			}
		})
	}
	ww.Wait()
	for got.Load() < want && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	if g := got.Load(); g != want {
		b.Fatalf("%d events delivered, want %d", g, want)
	}
	b.ReportMetric(float64(want)/b.Elapsed().Seconds(), "events/s")
}
