package etcdfaults

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestWatchAcrossRestart: a watcher on each store (a client of that store
// alone), a writer through every store; the store of a follower of the
// etcd region is killed with kill -9 and restarted, then the leader's.
// clientv3 reconnects each watcher to its store once it is back, resuming
// from its last revision + 1; every watcher must deliver every
// acknowledged write once, in revision order, and nothing that was not
// written.
func TestWatchAcrossRestart(t *testing.T) {
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	direct := c.directClient(t)
	first, err := direct.Put(ctx, "w/start", "start")
	if err != nil {
		t.Fatal(err)
	}
	var ws []*watchRecorder
	for s := uint64(1); s <= uint64(len(zones)); s++ {
		cli := c.storeClient(t, zones[s-1], s)
		ws = append(ws, startWatch(ctx, cli, fmt.Sprintf("store %d", s), "w/", first.Header.Revision+1))
	}
	wr := &writes{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { wr.putLoop(ctx, direct, "w/", "w", stop) })

	sleepCtx(ctx, time.Second)
	leader := c.etcdLeader(ctx, direct)
	if leader == 0 {
		t.Fatal("no store names the etcd region's leader")
	}
	follower := leader%uint64(len(zones)) + 1
	for _, s := range []uint64{follower, leader} {
		// The leader may have moved meanwhile: what matters is that a
		// watcher's only store goes down and comes back.
		t.Logf("kill -9 store %d (the etcd region's leader: store %d)", s, c.etcdLeader(ctx, direct))
		if err := c.procs.Kill(s); err != nil {
			t.Fatal(err)
		}
		sleepCtx(ctx, 2*time.Second)
		if err := c.restart(s); err != nil {
			t.Fatal(err)
		}
		sleepCtx(ctx, time.Second)
	}
	end := wr.stopAndEnd(t, ctx, direct, stop, &wg)
	t.Logf("%d writes acknowledged, %d of unknown outcome", len(wr.acked), len(wr.unknown))
	if len(wr.acked) < 20 {
		t.Errorf("only %d writes acknowledged: too few to check anything", len(wr.acked))
	}
	checkWatchers(t, c, ws, wr, first.Header.Revision+1, end)
}

// TestWatchAcrossRestartIntoPartition: a watcher's store is killed and
// restarts cut off from the other stores; once the partition heals the
// watcher must deliver every write. The restarted replica has no safe
// point for a stale read and no leader for a ReadIndex: the watch clientv3
// creates again on it is served from the replica's state as it is
// (ReadOptions.Local), as etcd serves a watch from its member's own state,
// leader or not. It was answered created and cancelled ("etcdserver: no
// leader") before, which ends a clientv3 watch for good.
func TestWatchAcrossRestartIntoPartition(t *testing.T) {
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	direct := c.directClient(t)
	first, err := direct.Put(ctx, "w/start", "start")
	if err != nil {
		t.Fatal(err)
	}
	// Through its own zone's link, which the partition leaves open.
	ws := []*watchRecorder{startWatch(ctx, c.storeClient(t, zones[0], 1), "store 1", "w/", first.Header.Revision+1)}
	wr := &writes{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { wr.putLoop(ctx, direct, "w/", "w", stop) })
	sleepCtx(ctx, time.Second)
	if err := c.procs.Kill(1); err != nil {
		t.Fatal(err)
	}
	if err := c.net.Partition(1); err != nil {
		t.Fatal(err)
	}
	if err := c.procs.Start(1); err != nil {
		t.Fatal(err)
	}
	sleepCtx(ctx, 8*time.Second) // longer than a store's waits for a leader
	c.recover()
	sleepCtx(ctx, time.Second)
	end := wr.stopAndEnd(t, ctx, direct, stop, &wg)
	checkWatchers(t, c, ws, wr, first.Header.Revision+1, end)
}

// event is a watch event as recorded.
type event struct {
	rev        int64
	key, value string
	del        bool
}

// watchRecorder records what one clientv3 watch delivers.
type watchRecorder struct {
	name   string
	mu     sync.Mutex
	events []event
	err    error
	closed bool
}

// startWatch watches prefix from revision from until ctx ends.
func startWatch(ctx context.Context, cli *clientv3.Client, name, prefix string, from int64) *watchRecorder {
	w := &watchRecorder{name: name}
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from))
	go func() {
		for resp := range wch {
			w.mu.Lock()
			if err := resp.Err(); err != nil && w.err == nil {
				w.err = err
			}
			for _, ev := range resp.Events {
				w.events = append(w.events, event{rev: ev.Kv.ModRevision, key: string(ev.Kv.Key), value: string(ev.Kv.Value), del: ev.Type == mvccpb.DELETE})
			}
			w.mu.Unlock()
		}
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
	}()
	return w
}

// last is the revision of the last event delivered, and whether the watch
// has ended.
func (w *watchRecorder) last() (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var r int64
	if n := len(w.events); n > 0 {
		r = w.events[n-1].rev
	}
	return r, w.closed
}

// writes are the writes of a test: acknowledged (with their revision) and
// of unknown outcome, by value (values are unique).
type writes struct {
	mu      sync.Mutex
	acked   map[string]event
	unknown map[string]string // value -> key
}

func (wr *writes) ack(key, value string, rev int64) {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	if wr.acked == nil {
		wr.acked = map[string]event{}
	}
	wr.acked[value] = event{rev: rev, key: key, value: value}
}

func (wr *writes) maybe(key, value string) {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	if wr.unknown == nil {
		wr.unknown = map[string]string{}
	}
	wr.unknown[value] = key
}

// putLoop puts keys under prefix, values tag.N, until stop.
func (wr *writes) putLoop(ctx context.Context, cli *clientv3.Client, prefix, tag string, stop <-chan struct{}) {
	for n := 0; n < 1_000_000; n++ {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		key, val := fmt.Sprintf("%sk%d", prefix, n%5), fmt.Sprintf("%s.%d", tag, n)
		pctx, cancel := context.WithTimeout(ctx, opTimeout)
		r, err := cli.Put(pctx, key, val)
		cancel()
		if err != nil {
			wr.maybe(key, val)
			sleepCtx(ctx, 20*time.Millisecond)
			continue
		}
		wr.ack(key, val, r.Header.Revision)
	}
}

// checkWatchers waits until every watcher has delivered end (the last
// write), then checks what each delivered after from: every acknowledged
// write once, at its revision, in revision order; nothing else but writes
// of unknown outcome; and the same events as every other watcher.
func checkWatchers(t *testing.T, c *faultCluster, ws []*watchRecorder, wr *writes, from, end int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, w := range ws {
		for {
			last, closed := w.last()
			if last >= end {
				break
			}
			if closed || time.Now().After(deadline) {
				t.Errorf("watcher on %s stopped at revision %d of %d (closed %v, error %v)", w.name, last, end, closed, w.err)
				c.diagnoseWatch(context.Background())
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var ref []event
	for i, w := range ws {
		w.mu.Lock()
		evs := w.events
		werr := w.err
		w.mu.Unlock()
		if werr != nil {
			t.Errorf("watcher on %s: %v", w.name, werr)
		}
		seen := map[string]bool{}
		var prev int64
		var got []event
		bad := 0
		for _, ev := range evs {
			if ev.rev > end {
				break
			}
			got = append(got, ev)
			if ev.rev <= prev || ev.rev < from {
				t.Errorf("watcher on %s: event at revision %d after %d (from %d)", w.name, ev.rev, prev, from)
				bad++
			}
			prev = ev.rev
			if seen[ev.value] {
				t.Errorf("watcher on %s: %s=%s delivered twice", w.name, ev.key, ev.value)
				bad++
			}
			seen[ev.value] = true
			if a, ok := wr.acked[ev.value]; ok {
				if a.rev != ev.rev || a.key != ev.key || ev.del {
					t.Errorf("watcher on %s: %s=%s at %d (deleted %v), acknowledged as %s at %d", w.name, ev.key, ev.value, ev.rev, ev.del, a.key, a.rev)
					bad++
				}
			} else if k, ok := wr.unknown[ev.value]; !ok || k != ev.key {
				t.Errorf("watcher on %s: %s=%s at %d was never written", w.name, ev.key, ev.value, ev.rev)
				bad++
			}
			if bad > 10 {
				break
			}
		}
		missing := 0
		for v, a := range wr.acked {
			if a.rev >= from && !seen[v] {
				if missing < 5 {
					t.Errorf("watcher on %s: acknowledged %s=%s at %d never delivered", w.name, a.key, v, a.rev)
				}
				missing++
			}
		}
		if missing > 0 {
			t.Errorf("watcher on %s: %d acknowledged writes never delivered", w.name, missing)
		}
		if i == 0 {
			ref = got
		} else if !sameEvents(ref, got) {
			t.Errorf("watcher on %s delivered %d events, watcher on %s %d, not the same ones: %s", w.name, len(got), ws[0].name, len(ref), firstDiff(ref, got))
		}
		t.Logf("watcher on %s: %d events up to revision %d", w.name, len(got), end)
	}
}

func sameEvents(a, b []event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func firstDiff(a, b []event) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("event %d: %+v vs %+v", i, a[i], b[i])
		}
	}
	return fmt.Sprintf("one is a prefix of the other (%d, %d events)", len(a), len(b))
}

// stopAndEnd stops the writers (closing stop, waiting for wg), writes
// the end marker every watcher must reach, and returns its revision.
func (wr *writes) stopAndEnd(t *testing.T, ctx context.Context, direct *clientv3.Client, stop chan struct{}, wg *sync.WaitGroup) int64 {
	t.Helper()
	close(stop)
	wg.Wait()
	end, err := direct.Put(ctx, "w/end", "end")
	if err != nil {
		t.Fatal(err)
	}
	wr.ack("w/end", "end", end.Header.Revision)
	return end.Header.Revision
}
