package etcdapi_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// unservingStore is a store whose replica of the keyspace holds no data
// for its first reads: raftstore then answers RegionNotFound with the
// region's id, as while a snapshot from the leader is being applied (a
// store restarted after its leader compacted the log past it).
type unservingStore struct {
	*raftstore.Store
	fails atomic.Int32
}

func (s *unservingStore) ReadView(ctx context.Context, opts raftstore.ReadOptions, key []byte, fn func(raftstore.StateView) error) (raftstore.ReadInfo, error) {
	if s.fails.Add(-1) >= 0 {
		return raftstore.ReadInfo{}, &region.RegionNotFoundError{RegionID: 1}
	}
	return s.Store.ReadView(ctx, opts, key, fn)
}

// TestWatchWaitsForReplicaApplyingSnapshot: a watch created on a store
// whose replica is applying a snapshot for a moment, as clientv3 creates
// one again when it reconnects to a restarted store, waits for it. It used to be cancelled at once ("the etcd keyspace
// is not served here now"), which ends a clientv3 watch for good; found by
// test/etcdfaults.
func TestWatchWaitsForReplicaApplyingSnapshot(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 30*time.Second)
	put, err := client(t, c.Endpoints[0]).Put(ctx, "snap/a", "1")
	if err != nil {
		t.Fatal(err)
	}
	store := &unservingStore{Store: c.Server(1).Store()}
	cli := client(t, serveAPI(t, store))

	store.fails.Store(4)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	select {
	case wr := <-cli.Watch(wctx, "snap/", clientv3.WithPrefix(), clientv3.WithRev(put.Header.Revision)):
		if wr.Canceled || wr.Err() != nil || len(wr.Events) != 1 || string(wr.Events[0].Kv.Key) != "snap/a" {
			t.Fatalf("watch created while the replica cannot serve: canceled %v, err %v, events %v", wr.Canceled, wr.Err(), wr.Events)
		}
	case <-ctx.Done():
		t.Fatal("no watch response")
	}
}

// unroutedStore is a store that finds no region for the keyspace's keys
// for its first proposals: raftstore answers RegionNotFound with no region
// id, as for a moment while the split that makes the keyspace its own
// region is published (the shrunk region's range is in, the new one's not
// yet).
type unroutedStore struct {
	*raftstore.Store
	fails atomic.Int32
}

func (s *unroutedStore) Propose(ctx context.Context, opts raftstore.WriteOptions, key, payload []byte) ([]byte, error) {
	if s.fails.Add(-1) >= 0 {
		return nil, &region.RegionNotFoundError{}
	}
	return s.Store.Propose(ctx, opts, key, payload)
}

// TestWriteWaitsForTheKeyspaceRoute: a Put that finds no region for its
// key on the store (nothing proposed) is tried again while the split
// settles. It used to be answered Unavailable ("region 0 not found"),
// which clientv3 does not retry for a write: TestCompactRefusesOldRevisions
// failed so in CI, its first Put racing the keyspace's split.
func TestWriteWaitsForTheKeyspaceRoute(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := ctxFor(t, 30*time.Second)
	if _, err := client(t, c.Endpoints[0]).Put(ctx, "route/seed", "0"); err != nil {
		t.Fatal(err)
	}
	leader := c.LeaderStore(etcdRegion(t, c).ID)
	store := &unroutedStore{Store: c.Server(leader).Store()}
	addr := serveAPI(t, store)
	store.fails.Store(3)
	if _, err := client(t, addr).Put(ctx, "route/a", "1"); err != nil {
		t.Fatalf("put while the store finds no region for the key: %v", err)
	}
	if n := store.fails.Load(); n >= 0 {
		t.Fatalf("the store was asked %d times, want more than 3", 3-n)
	}
}

// serveAPI serves the etcd API over store, alone, on a free loopback port
// until the test ends, and returns its address.
func serveAPI(t *testing.T, store etcdapi.Store) string {
	t.Helper()
	g := grpc.NewServer()
	svc := etcdapi.Register(g, etcdapi.Config{Store: store})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(func() { svc.Stop(); g.Stop() })
	return lis.Addr().String()
}
