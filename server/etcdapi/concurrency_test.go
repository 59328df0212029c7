package etcdapi_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// TestMutexAndElection: clientv3/concurrency, unchanged, over hedgekv.
// Six clients on the three stores take a Mutex in turn while the etcd
// region's leadership moves; inside the lock each reads a counter and
// writes it + 1 in a Txn fenced on its ownership (IsOwner). No two
// holders overlap in what they observe (the in-process holder count never
// exceeds one), no fenced write fails while its session is alive, and the
// counter ends equal to the number of critical sections: no lost update,
// no lost wake-up (every client got the lock its share of times). An
// Election among three candidates elects one leader at a time, and a
// resign hands over to the next.
func TestMutexAndElection(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 120*time.Second)
	const clients, rounds = 6, 5
	var holders atomic.Int32
	var sections, unknown atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	stop := make(chan struct{})
	for id := range clients {
		cli := client(t, c.Endpoints[id%len(c.Endpoints)])
		wg.Add(1)
		go func() {
			defer wg.Done()
			sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
			if err != nil {
				errs <- fmt.Errorf("client %d: session: %w", id, err)
				return
			}
			defer sess.Close()
			m := concurrency.NewMutex(sess, "/lock/counter")
			for r := range rounds {
				// A Lock whose Txn met a leader change ("leader changed":
				// its outcome unknown) is tried again: its key is the
				// session's, so the retry finds it, as etcd's clients do.
				var err error
				for try := 0; try < 20; try++ {
					lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
					err = m.Lock(lctx)
					cancel()
					if err == nil || !retryable(err) {
						break
					}
				}
				if err != nil {
					errs <- fmt.Errorf("client %d round %d: lock: %w", id, r, err)
					return
				}
				if n := holders.Add(1); n != 1 {
					errs <- fmt.Errorf("client %d: %d holders at once", id, n)
				}
				g, err := cli.Get(ctx, "counter")
				if err == nil {
					v := 0
					if len(g.Kvs) == 1 {
						v, _ = strconv.Atoi(string(g.Kvs[0].Value))
					}
					var tr *clientv3.TxnResponse
					tr, err = cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut("counter", strconv.Itoa(v+1))).Commit()
					if err == nil && !tr.Succeeded {
						err = fmt.Errorf("fenced write refused while holding the lock")
					}
				}
				holders.Add(-1)
				switch {
				case err == nil:
					sections.Add(1)
				case retryable(err):
					unknown.Add(1) // the fenced write's outcome is unknown
				default:
					errs <- fmt.Errorf("client %d round %d: %w", id, r, err)
				}
				for try := 0; try < 20; try++ {
					if err = m.Unlock(ctx); err == nil || !retryable(err) {
						break
					}
				}
				if err != nil {
					errs <- fmt.Errorf("client %d round %d: unlock: %w", id, r, err)
					return
				}
			}
		}()
	}
	// The fault: leadership moves while the clients contend.
	moved := make(chan int)
	go func() {
		moves := 0
		defer func() { moved <- moves }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(400 * time.Millisecond):
			}
			mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if c.MoveLeader(mctx, etcdRegion(t, c).ID, c.StoreIDs()[i%len(c.StoreIDs())]) == nil {
				moves++
			}
			cancel()
		}
	}()
	wg.Wait()
	close(stop)
	moves := <-moved
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	g, err := client(t, c.Endpoints[0]).Get(ctx, "counter")
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("counter: %v, %v", g, err)
	}
	got, _ := strconv.ParseInt(string(g.Kvs[0].Value), 10, 64)
	if got < sections.Load() || got > sections.Load()+unknown.Load() || sections.Load()+unknown.Load() != clients*rounds {
		t.Fatalf("counter %d after %d critical sections whose write was acknowledged and %d whose outcome is unknown (want %d in all)",
			got, sections.Load(), unknown.Load(), clients*rounds)
	}
	t.Logf("%d critical sections under a Mutex (%d writes of unknown outcome), %d leader moves", sections.Load()+unknown.Load(), unknown.Load(), moves)

	// Election: one leader at a time; a resign hands over.
	var cands []*concurrency.Election
	for i := range 3 {
		cli := client(t, c.Endpoints[i])
		sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		cands = append(cands, concurrency.NewElection(sess, "/election/e"))
	}
	won := make(chan int, 3)
	for i, e := range cands {
		go func() {
			if err := e.Campaign(ctx, fmt.Sprintf("cand-%d", i)); err == nil {
				won <- i
			}
		}()
	}
	seen := map[int]bool{}
	for range 3 {
		var w int
		select {
		case w = <-won:
		case <-time.After(30 * time.Second):
			t.Fatalf("no leader elected after %v (elected so far: %v)", 30*time.Second, seen)
		}
		if seen[w] {
			t.Fatalf("candidate %d elected twice", w)
		}
		seen[w] = true
		l, err := cands[w].Leader(ctx)
		if err != nil || string(l.Kvs[0].Value) != fmt.Sprintf("cand-%d", w) {
			t.Fatalf("leader while cand-%d leads: %v, %v", w, l, err)
		}
		select {
		case other := <-won:
			t.Fatalf("cand-%d elected while cand-%d leads", other, w)
		case <-time.After(300 * time.Millisecond):
		}
		if err := cands[w].Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// retryable: an etcd error a client may retry after (the outcome of a
// write that met it is unknown): a leader change or election.
func retryable(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaderChanged) || errors.Is(err, rpctypes.ErrNoLeader) ||
		strings.Contains(err.Error(), "leader changed") || strings.Contains(err.Error(), "no leader") || strings.Contains(err.Error(), "Unavailable")
}
