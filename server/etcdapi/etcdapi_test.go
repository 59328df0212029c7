package etcdapi_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"

	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// startCluster starts three in-process stores on loopback ports (with the
// etcd API's testing knobs, if given), with automatic splits off (the etcd
// keyspace is the whole of region 1 until the store keeps it in its own
// region).
func startCluster(t testing.TB, knobs ...*etcdapi.TestingKnobs) *cluster.Local {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := cluster.LocalConfig{NoSync: true, DisableSplit: true}
	if len(knobs) > 0 {
		cfg.EtcdKnobs = knobs[0] // every store's
	}
	c, err := cluster.StartLocal(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// client is a clientv3 client of one endpoint (one store), so that the
// test says which store answers.
func client(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestKVThroughEveryStore: clientv3 against each store in turn (the
// leader's and the followers', whose writes are forwarded): revisions grow
// by one per write, keys carry create/mod revision and version, prefixes,
// deletes with prev_kv, a compare-and-swap Txn.
func TestKVThroughEveryStore(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 60*time.Second)
	var last int64
	for i, ep := range c.Endpoints {
		cli := client(t, ep)
		key := fmt.Sprintf("dir/k%d", i)
		p1, err := cli.Put(ctx, key, "v1")
		if err != nil {
			t.Fatalf("store %d: put: %v", i+1, err)
		}
		if p1.Header.Revision <= last {
			t.Fatalf("store %d: put revision %d after %d", i+1, p1.Header.Revision, last)
		}
		p2, err := cli.Put(ctx, key, "v2", clientv3.WithPrevKV())
		if err != nil {
			t.Fatal(err)
		}
		if p2.Header.Revision != p1.Header.Revision+1 || p2.PrevKv == nil || string(p2.PrevKv.Value) != "v1" {
			t.Fatalf("store %d: second put: revision %d (first %d), prev %v", i+1, p2.Header.Revision, p1.Header.Revision, p2.PrevKv)
		}
		g, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "v2" || g.Kvs[0].Version != 2 ||
			g.Kvs[0].CreateRevision != p1.Header.Revision || g.Kvs[0].ModRevision != p2.Header.Revision || g.Header.Revision < p2.Header.Revision {
			t.Fatalf("store %d: get %s = %+v (header %d)", i+1, key, g.Kvs, g.Header.Revision)
		}
		// The header carries the keyspace region's raft term, as the
		// answering store (the leader, in the default read mode) knows it.
		if g.Header.RaftTerm == 0 || p2.Header.RaftTerm == 0 {
			t.Fatalf("store %d: headers %+v and %+v, want a raft term", i+1, p2.Header, g.Header)
		}
		last = p2.Header.Revision
	}
	cli := client(t, c.Endpoints[len(c.Endpoints)-1])
	all, err := cli.Get(ctx, "dir/", clientv3.WithPrefix())
	if err != nil || len(all.Kvs) != len(c.Endpoints) {
		t.Fatalf("prefix get: %d keys, %v", len(all.Kvs), err)
	}
	// A compare-and-swap: succeeds on the current mod revision, fails after.
	mod := all.Kvs[0].ModRevision
	key := string(all.Kvs[0].Key)
	for _, want := range []bool{true, false} {
		tr, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", mod)).
			Then(clientv3.OpPut(key, "swapped")).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if tr.Succeeded != want {
			t.Fatalf("txn on mod revision %d: succeeded %v, want %v", mod, tr.Succeeded, want)
		}
	}
	d, err := cli.Delete(ctx, "dir/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	if err != nil || d.Deleted != int64(len(c.Endpoints)) || len(d.PrevKvs) != len(c.Endpoints) {
		t.Fatalf("delete prefix: %d deleted, %d prev, %v", d.Deleted, len(d.PrevKvs), err)
	}
	if g, err := cli.Get(ctx, "dir/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || g.Count != 0 {
		t.Fatalf("after delete: count %d, %v", g.Count, err)
	}
}

// TestCompactRefusesOldRevisions: a Range at a revision before the
// compaction is ErrCompacted, one after it reads history.
func TestCompactRefusesOldRevisions(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 60*time.Second)
	cli := client(t, c.Endpoints[0])
	var revs []int64
	for i := range 5 {
		r, err := cli.Put(ctx, "k", fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, r.Header.Revision)
	}
	g, err := cli.Get(ctx, "k", clientv3.WithRev(revs[1]))
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "1" {
		t.Fatalf("get at revision %d: %+v, %v", revs[1], g.Kvs, err)
	}
	if _, err := cli.Compact(ctx, revs[3]); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Get(ctx, "k", clientv3.WithRev(revs[1])); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("get before the compaction: %v, want ErrCompacted", err)
	}
	if g, err := cli.Get(ctx, "k", clientv3.WithRev(revs[3])); err != nil || string(g.Kvs[0].Value) != "3" {
		t.Fatalf("get at the compaction: %+v, %v", g, err)
	}
	if _, err := cli.Get(ctx, "k", clientv3.WithRev(revs[4]+100)); !errors.Is(err, rpctypes.ErrFutureRev) {
		t.Fatalf("get in the future: %v, want ErrFutureRev", err)
	}
}

// TestFollowerReadsAreLinearizable: a session reading in "follower" mode
// from every store sees every write acknowledged before the read began,
// with header revisions that never go back, while writers run.
func TestFollowerReadsAreLinearizable(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 60*time.Second)
	writer := client(t, c.Endpoints[0])
	var mu sync.Mutex
	acked := int64(0) // the highest value acknowledged
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := int64(1); i <= 200; i++ {
			if _, err := writer.Put(ctx, "counter", fmt.Sprint(i)); err != nil {
				t.Errorf("put %d: %v", i, err)
				return
			}
			mu.Lock()
			acked = i
			mu.Unlock()
		}
	}()
	rctx := metadata.AppendToOutgoingContext(ctx, etcdapi.MetadataReadMode, etcdapi.ReadFollower)
	readers := make([]*clientv3.Client, len(c.Endpoints))
	for i, ep := range c.Endpoints {
		readers[i] = client(t, ep)
	}
	var lastRev int64
	for n := 0; ; n++ {
		select {
		case <-done:
			if n == 0 {
				t.Fatal("no read ran")
			}
			return
		default:
		}
		mu.Lock()
		before := acked
		mu.Unlock()
		g, err := readers[n%len(readers)].Get(rctx, "counter")
		if err != nil {
			t.Fatalf("read from store %d: %v", n%len(readers)+1, err)
		}
		var got int64
		if len(g.Kvs) == 1 {
			fmt.Sscan(string(g.Kvs[0].Value), &got)
		}
		if got < before {
			t.Fatalf("read from store %d saw %d after %d was acknowledged", n%len(readers)+1, got, before)
		}
		if g.Header.Revision < lastRev {
			t.Fatalf("header revision went back: %d after %d", g.Header.Revision, lastRev)
		}
		lastRev = g.Header.Revision
	}
}

// TestStatusAndMembers: what etcdctl endpoint status and member list read.
func TestStatusAndMembers(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 30*time.Second)
	cli := client(t, c.Endpoints[1])
	st, err := cli.Status(ctx, c.Endpoints[1])
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != etcdapi.Version || st.Leader == 0 || st.Header.MemberId == 0 || st.DbSize == 0 {
		t.Fatalf("status = %+v", st)
	}
	ml, err := cli.MemberList(ctx)
	if err != nil || len(ml.Members) != len(c.Endpoints) {
		t.Fatalf("member list = %+v, %v", ml, err)
	}
	for _, m := range ml.Members {
		if len(m.ClientURLs) != 1 || m.Name == "" {
			t.Fatalf("member %+v", m)
		}
	}
}

// TestWatchDeliversEveryEventOnceInOrder: watches on every store, one from
// the start and one of a prefix with prev_kv, see every change in revision
// order exactly once, while a writer changes keys through another store;
// a watch from an old revision replays history, and one from before a
// compaction is cancelled with the compaction revision.
func TestWatchDeliversEveryEventOnceInOrder(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 60*time.Second)
	writer := client(t, c.Endpoints[0])
	first, err := writer.Put(ctx, "w/seed", "0")
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	type got struct {
		revs  []int64
		kinds []string
	}
	results := make([]got, len(c.Endpoints))
	var wg sync.WaitGroup
	for i, ep := range c.Endpoints {
		cli := client(t, ep)
		wch := cli.Watch(ctx, "w/", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(first.Header.Revision+1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for wr := range wch {
				if err := wr.Err(); err != nil {
					t.Errorf("store %d: watch: %v", i+1, err)
					return
				}
				for _, ev := range wr.Events {
					results[i].revs = append(results[i].revs, ev.Kv.ModRevision)
					results[i].kinds = append(results[i].kinds, ev.Type.String())
					if ev.Type == clientv3.EventTypePut && ev.Kv.Version > 1 && ev.PrevKv == nil {
						t.Errorf("store %d: put of %s at %d without prev_kv", i+1, ev.Kv.Key, ev.Kv.ModRevision)
					}
				}
				if len(results[i].revs) >= n {
					return
				}
			}
		}()
	}
	var revs []int64
	for i := range n {
		var rev int64
		key := func(i int) string { return fmt.Sprintf("w/k%d", i-i%4+i%2) }
		if i%4 == 3 { // the key the last put wrote: every step is one event
			r, err := writer.Delete(ctx, key(i-1))
			if err != nil {
				t.Fatal(err)
			}
			rev = r.Header.Revision
		} else {
			r, err := writer.Put(ctx, key(i), fmt.Sprint(i))
			if err != nil {
				t.Fatal(err)
			}
			rev = r.Header.Revision
		}
		revs = append(revs, rev)
	}
	wg.Wait()
	for i := range results {
		if fmt.Sprint(results[i].revs) != fmt.Sprint(revs) {
			t.Fatalf("store %d: watched revisions %v, want %v", i+1, results[i].revs, revs)
		}
	}
	// History: a watch from the first revision replays it all.
	cli := client(t, c.Endpoints[2])
	hctx, cancel := context.WithCancel(ctx)
	var replay []int64
	for wr := range cli.Watch(hctx, "w/", clientv3.WithPrefix(), clientv3.WithRev(first.Header.Revision)) {
		for _, ev := range wr.Events {
			replay = append(replay, ev.Kv.ModRevision)
		}
		if len(replay) >= n+1 {
			break
		}
	}
	cancel()
	if want := append([]int64{first.Header.Revision}, revs...); fmt.Sprint(replay) != fmt.Sprint(want) {
		t.Fatalf("replayed %v, want %v", replay, want)
	}
	// Compacted history cancels the watch with the compaction revision.
	if _, err := writer.Compact(ctx, revs[n/2]); err != nil {
		t.Fatal(err)
	}
	// The watch is served from the called store's own state: wait until
	// it has applied the compaction (a follower-mode read there is
	// linearizable).
	fctx := metadata.AppendToOutgoingContext(ctx, etcdapi.MetadataReadMode, etcdapi.ReadFollower)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := cli.Get(fctx, "w/seed", clientv3.WithRev(first.Header.Revision)); errors.Is(err, rpctypes.ErrCompacted) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the compaction never reached the watch's store")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cctx, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	wr := <-cli.Watch(cctx, "w/", clientv3.WithPrefix(), clientv3.WithRev(first.Header.Revision))
	if wr.CompactRevision != revs[n/2] || !wr.Canceled {
		t.Fatalf("watch before the compaction: %+v, want cancelled at %d", wr, revs[n/2])
	}
}

// etcdRegion is the region holding the etcd keyspace, as store 1 sees it.
func etcdRegion(t *testing.T, c *cluster.Local) region.Region {
	t.Helper()
	for _, st := range c.Server(c.StoreIDs()[0]).Store().Regions() {
		if st.Region.Contains([]byte(etcdapi.Prefix)) {
			return st.Region
		}
	}
	t.Fatal("no region holds the etcd keyspace")
	return region.Region{}
}

// TestKeyspaceBecomesItsOwnRegion: the stores split the etcd keyspace off
// into a region of its own, and keys written before and after the split
// stay readable.
func TestKeyspaceBecomesItsOwnRegion(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 60*time.Second)
	cli := client(t, c.Endpoints[0])
	if _, err := cli.Put(ctx, "before", "1"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := etcdRegion(t, c)
		if string(r.StartKey) == etcdapi.Prefix && string(r.EndKey) == etcdapi.End {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the etcd keyspace is still in %v", r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := cli.Put(ctx, "after", "2"); err != nil {
		t.Fatal(err)
	}
	g, err := client(t, c.Endpoints[2]).Get(ctx, "", clientv3.WithFromKey())
	if err != nil || len(g.Kvs) != 2 {
		t.Fatalf("get all: %+v, %v", g, err)
	}
}
