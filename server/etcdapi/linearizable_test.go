package etcdapi_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/hedgekv/hedgekv/server/etcdapi"
	"github.com/hedgekv/hedgekv/test/etcdmodel"
)

// TestClientv3Linearizable: five clientv3 clients, each on its own store
// and read mode, put, get and compare-and-set three keys while the etcd
// region's leadership moves every 300 ms; porcupine checks the history,
// and a watch from the first revision must hold every acknowledged put
// exactly once, in revision order.
func TestClientv3Linearizable(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 90*time.Second)
	seconds := 8 * time.Second
	if testing.Short() {
		seconds = 3 * time.Second
	}
	first, err := client(t, c.Endpoints[0]).Put(ctx, "lin/start", "x")
	if err != nil {
		t.Fatal(err)
	}
	watcher := client(t, c.Endpoints[1])
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	wch := watcher.Watch(wctx, "lin/k", clientv3.WithPrefix(), clientv3.WithRev(first.Header.Revision))

	var mu sync.Mutex
	var ops []porcupine.Operation
	type ackedPut struct {
		key, value string
		rev        int64
	}
	var puts []ackedPut
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	record := func(op porcupine.Operation) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	}

	deadline := time.Now().Add(seconds)
	var wg sync.WaitGroup
	modes := []string{etcdapi.ReadLeader, etcdapi.ReadFollower, etcdapi.ReadLeader, etcdapi.ReadFollower, etcdapi.ReadFollower}
	for id := range len(modes) {
		cli := client(t, c.Endpoints[id%len(c.Endpoints)])
		mode := modes[id]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(id), 30))
			for n := 0; time.Now().Before(deadline); n++ {
				key := fmt.Sprintf("lin/k%d", rng.IntN(3))
				octx, cancel := context.WithTimeout(ctx, 3*time.Second)
				call := now()
				switch rng.IntN(3) {
				case 0:
					v := fmt.Sprintf("c%d-%d", id, n)
					r, err := cli.Put(octx, key, v)
					if err != nil {
						record(porcupine.Operation{ClientId: id, Input: etcdmodel.Input{Op: etcdmodel.OpPut, Key: key, Value: v}, Call: call, Output: etcdmodel.Output{Unknown: true}, Return: -1})
					} else {
						record(porcupine.Operation{ClientId: id, Input: etcdmodel.Input{Op: etcdmodel.OpPut, Key: key, Value: v}, Call: call, Output: etcdmodel.Output{}, Return: now()})
						mu.Lock()
						puts = append(puts, ackedPut{key, v, r.Header.Revision})
						mu.Unlock()
					}
				case 1:
					g, err := cli.Get(metadata.AppendToOutgoingContext(octx, etcdapi.MetadataReadMode, mode), key)
					if err == nil {
						out := etcdmodel.Output{}
						if len(g.Kvs) == 1 {
							out.Value, out.Found = string(g.Kvs[0].Value), true
						}
						record(porcupine.Operation{ClientId: id, Input: etcdmodel.Input{Op: etcdmodel.OpGet, Key: key, Mode: mode}, Call: call, Output: out, Return: now()})
					}
				case 2:
					g, err := cli.Get(octx, key)
					if err != nil || len(g.Kvs) == 0 {
						cancel()
						continue
					}
					old, v := string(g.Kvs[0].Value), fmt.Sprintf("s%d-%d", id, n)
					call = now()
					tr, err := cli.Txn(octx).If(clientv3.Compare(clientv3.Value(key), "=", old)).Then(clientv3.OpPut(key, v)).Commit()
					in := etcdmodel.Input{Op: etcdmodel.OpCAS, Key: key, Value: v, Old: old}
					if err != nil {
						record(porcupine.Operation{ClientId: id, Input: in, Call: call, Output: etcdmodel.Output{Unknown: true}, Return: -1})
					} else {
						record(porcupine.Operation{ClientId: id, Input: in, Call: call, Output: etcdmodel.Output{Succeeded: tr.Succeeded}, Return: now()})
						if tr.Succeeded {
							mu.Lock()
							puts = append(puts, ackedPut{key, v, tr.Header.Revision})
							mu.Unlock()
						}
					}
				}
				cancel()
			}
		}()
	}
	// The fault: leadership of the etcd region moves every 300 ms.
	moves := 0
	for time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		to := c.StoreIDs()[moves%len(c.StoreIDs())]
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := c.MoveLeader(mctx, etcdRegion(t, c).ID, to); err == nil {
			moves++
		}
		cancel()
	}
	wg.Wait()
	end := now()
	for i := range ops {
		if ops[i].Return == -1 {
			ops[i].Return = end + int64(time.Hour)
		}
	}
	t.Logf("%d operations, %d acknowledged puts, %d leader moves", len(ops), len(puts), moves)
	if moves == 0 {
		t.Fatal("no leader move happened: the fault never ran")
	}
	res, info := porcupine.CheckOperationsVerbose(etcdmodel.Model, ops, 60*time.Second)
	if res != porcupine.Ok {
		f := filepath.Join(os.TempDir(), "etcd-linearizability.html")
		_ = porcupine.VisualizePath(etcdmodel.Model, info, f)
		t.Fatalf("history not linearizable (%v); visualization: %s", res, f)
	}

	// Watch completeness: every acknowledged put once, in revision order.
	want := map[int64]ackedPut{}
	var maxRev int64
	for _, p := range puts {
		want[p.rev] = p
		maxRev = max(maxRev, p.rev)
	}
	seen := map[int64]bool{}
	var last int64
	for maxRev > 0 && last < maxRev {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				t.Fatalf("watch ended: %v", wr.Err())
			}
			for _, ev := range wr.Events {
				r := ev.Kv.ModRevision
				if r < last {
					t.Fatalf("watch event at %d after %d", r, last)
				}
				if p, ok := want[r]; ok {
					if seen[r] {
						t.Fatalf("put at %d delivered twice", r)
					}
					if string(ev.Kv.Key) != p.key || string(ev.Kv.Value) != p.value {
						t.Fatalf("event at %d is %s=%s, want %s=%s", r, ev.Kv.Key, ev.Kv.Value, p.key, p.value)
					}
					seen[r] = true
				}
				last = r
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("watch stalled at revision %d of %d", last, maxRev)
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("watch delivered %d of %d acknowledged puts", len(seen), len(want))
	}
}
