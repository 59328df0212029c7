package etcdfaults

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
	"github.com/hedgekv/hedgekv/test/kvmodel"
)

// TestLinearizableUnderFaults: six clientv3 clients (two per zone, each
// dialling every store through its zone's links) put, get (leader and
// follower read modes) and compare-and-set four keys while the nemesis
// kills and cuts off stores; porcupine checks the history. Six watchers,
// two per store (one through the store's own zone, one through another
// zone's link, which partitions cut), each a client of that store alone,
// watch the keys from before the first write: once the faults are over
// each must have delivered every acknowledged write once, in revision
// order, nothing that was not written, and the same events as the others
// (a watcher whose store was killed resumes from its last revision + 1,
// as clientv3 does). More watchers, from the same revision, are created
// on random stores while the faults go on.
func TestLinearizableUnderFaults(t *testing.T) {
	c := startCluster(t)
	s := seed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	direct := c.directClient(t)
	first, err := direct.Put(ctx, "lin/start", "start")
	if err != nil {
		t.Fatal(err)
	}
	from := first.Header.Revision + 1
	var ws []*watchRecorder
	for st := uint64(1); st <= uint64(len(zones)); st++ {
		for _, z := range []string{zones[st-1], zones[int(st)%len(zones)]} {
			ws = append(ws, startWatch(ctx, c.storeClient(t, z, st), fmt.Sprintf("store %d from %s", st, z), "lin/", from))
		}
	}

	h := kvmodel.NewHistory() // its clock and its record
	wr := &writes{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for id := range 6 {
		cli := c.zoneClient(t, zones[id%len(zones)])
		mode := etcdapi.ReadLeader
		if id%2 == 1 {
			mode = etcdapi.ReadFollower
		}
		wg.Go(func() { runLinClient(ctx, id, cli, mode, s, h, wr, stop) })
	}
	// Watchers created during the faults too, on a store chosen at
	// random, from the same revision: a watch created while its store
	// restarts, is cut off, or just lost or won the leadership must
	// deliver the same events as the others.
	var lateMu sync.Mutex
	var late []*watchRecorder
	lateClients := map[[2]int]*clientv3.Client{} // by store, zone
	for st := range len(zones) {
		for z := range zones {
			lateClients[[2]int{st, z}] = c.storeClient(t, zones[z], uint64(st+1))
		}
	}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(s, 1000))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(500+rng.IntN(1500)) * time.Millisecond):
			}
			st, z := rng.IntN(len(zones)), rng.IntN(len(zones))
			w := startWatch(ctx, lateClients[[2]int{st, z}], fmt.Sprintf("late watcher %d on store %d from %s", i, st+1, zones[z]), "lin/", from)
			lateMu.Lock()
			late = append(late, w)
			lateMu.Unlock()
		}
	})
	nem := newNemesis(c, s)
	nem.run(ctx, faultTime(15*time.Second))
	close(stop)
	wg.Wait()
	ws = append(ws, late...)
	t.Logf("%d watchers, %d of them created during the faults", len(ws), len(late))
	c.recover()
	t.Logf("faults: %s", nem.summary())
	for _, l := range nem.log {
		t.Log("  " + l)
	}

	end, err := direct.Put(ctx, "lin/end", "end")
	if err != nil {
		t.Fatal(err)
	}
	wr.ack("lin/end", "end", end.Header.Revision)
	ops := h.Ops()
	var reads, unknown int
	for _, op := range ops {
		if op.Input.(etcdmodel.Input).Op == etcdmodel.OpGet {
			reads++
		}
		if op.Return == -1 {
			unknown++
		}
	}
	t.Logf("%d operations: %d gets, %d writes acknowledged, %d of unknown outcome", len(ops), reads, len(wr.acked)-1, unknown)
	if reads < 50 || len(wr.acked) < 50 {
		t.Errorf("too few operations succeeded to check anything")
	}
	prepared := etcdmodel.Prepare(ops, h.Now()+1)
	res, info := porcupine.CheckOperationsVerbose(etcdmodel.Model, prepared, 60*time.Second)
	switch res {
	case porcupine.Ok:
		t.Logf("linearizable: %d operations checked", len(prepared))
	default:
		f := filepath.Join(os.TempDir(), fmt.Sprintf("etcdfaults-seed-%d.html", s))
		_ = porcupine.VisualizePath(etcdmodel.Model, info, f)
		t.Errorf("history not linearizable (%v); visualization: %s; faults: %v", res, f, nem.log)
	}
	checkWatchers(t, c, ws, wr, from, end.Header.Revision)
}

// runLinClient puts, gets and compare-and-sets until stop, recording
// every operation in h and every write in wr.
func runLinClient(ctx context.Context, id int, cli *clientv3.Client, mode string, seed uint64, h *kvmodel.History, wr *writes, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(seed, uint64(id)))
	get := func(key string) (string, bool, error) {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		call := h.Now()
		g, err := cli.Get(metadata.AppendToOutgoingContext(octx, etcdapi.MetadataReadMode, mode), key)
		if err != nil {
			return "", false, err
		}
		out := etcdmodel.Output{}
		if len(g.Kvs) == 1 {
			out.Value, out.Found = string(g.Kvs[0].Value), true
		}
		h.Add(porcupine.Operation{ClientId: id, Input: etcdmodel.Input{Op: etcdmodel.OpGet, Key: key, Mode: mode}, Call: call, Output: out, Return: h.Now()})
		return out.Value, out.Found, nil
	}
	for n := 0; n < 1_000_000; n++ {
		select {
		case <-stop:
			return
		default:
		}
		key := fmt.Sprintf("lin/k%d", rng.IntN(4))
		val := fmt.Sprintf("c%d-%d", id, n)
		var err error
		switch rng.IntN(3) {
		case 0:
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			in := etcdmodel.Input{Op: etcdmodel.OpPut, Key: key, Value: val}
			call := h.Now()
			var r *clientv3.PutResponse
			r, err = cli.Put(octx, key, val)
			cancel()
			if err != nil {
				wr.maybe(key, val)
				h.Add(porcupine.Operation{ClientId: id, Input: in, Call: call, Output: etcdmodel.Output{Unknown: true}, Return: -1})
			} else {
				wr.ack(key, val, r.Header.Revision)
				h.Add(porcupine.Operation{ClientId: id, Input: in, Call: call, Output: etcdmodel.Output{}, Return: h.Now()})
			}
		case 1:
			_, _, err = get(key)
		case 2:
			var old string
			var found bool
			if old, found, err = get(key); err != nil || !found {
				break
			}
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			in := etcdmodel.Input{Op: etcdmodel.OpCAS, Key: key, Value: val, Old: old}
			call := h.Now()
			var tr *clientv3.TxnResponse
			tr, err = cli.Txn(octx).If(clientv3.Compare(clientv3.Value(key), "=", old)).Then(clientv3.OpPut(key, val)).Commit()
			cancel()
			switch {
			case err != nil:
				wr.maybe(key, val)
				h.Add(porcupine.Operation{ClientId: id, Input: in, Call: call, Output: etcdmodel.Output{Unknown: true}, Return: -1})
			case tr.Succeeded:
				wr.ack(key, val, tr.Header.Revision)
				h.Add(porcupine.Operation{ClientId: id, Input: in, Call: call, Output: etcdmodel.Output{Succeeded: true}, Return: h.Now()})
			default:
				h.Add(porcupine.Operation{ClientId: id, Input: in, Call: call, Output: etcdmodel.Output{}, Return: h.Now()})
			}
		}
		if err != nil {
			sleepCtx(ctx, 20*time.Millisecond) // the store may be down: do not spin
		}
	}
}
