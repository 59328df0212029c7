package server

import (
	"context"
	"fmt"
	"maps"
	"net"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestWithStoreRefusesRaftFromAnotherCluster: cluster A's store 2 stops
// and cluster B's store 2 binds the address it freed (as a test cluster
// binds a port another just released, or a host is replaced). A's leader,
// whose log store 2 had acknowledged far past anything B holds, goes on
// heartbeating "store 2" there, at a higher term than B's. Taken as B's
// own, the heartbeat's commit index panics B's store 2
// (`tocommit(N) is out of range [lastIndex(M)]`, the bench package's
// crash in CI); refused as another cluster's, B carries on.
func TestWithStoreRefusesRaftFromAnotherCluster(t *testing.T) {
	ctx := testCtx(t)
	a := startCluster(t, 3, nil)
	leader := a.waitLeader(t)
	for i := range 30 {
		if _, err := a.kv(t, leader).Put(ctx, &kvpb.PutRequest{Key: fmt.Appendf(nil, "a%02d", i), Value: []byte("v")}); err != nil {
			t.Fatalf("put on A: %v", err)
		}
	}
	// A's leader on store 1 at a term B's fresh region 1 will not reach,
	// and store 2 caught up (acknowledged all of it) before it stops.
	for _, to := range []uint64{3, 1, 3, 1} {
		if err := a.server(leader).Store().TransferLeader(ctx, 1, to); err != nil {
			t.Fatalf("transfer A's leader to %d: %v", to, err)
		}
		leader = to
		waitFor(t, 10*time.Second, fmt.Sprintf("A's region 1 led by store %d", to), func() bool {
			rs := a.server(to).Store().Regions()
			return len(rs) > 0 && rs[0].IsLeader
		})
	}
	waitFor(t, 10*time.Second, "A's store 2 applied the writes", func() bool {
		return a.server(2).Store().Regions()[0].AppliedIndex >= a.server(1).Store().Regions()[0].AppliedIndex
	})
	addr2 := a.server(2).Addr()
	a.server(2).Stop()

	l2, err := net.Listen("tcp", addr2)
	if err != nil {
		t.Fatalf("bind A's store 2's address for B: %v", err)
	}
	b := newClusterWith(t, 3, nil, func(c *raftstore.Config) { c.ClusterID = ClusterIDOf("cluster B") }, func(c *Config) {
		c.Peers = maps.Clone(c.Peers)
		c.Peers[2] = addr2
		if c.Store.StoreID == 2 {
			_ = c.Listener.Close()
			c.Listener = l2
		}
	})
	for _, s := range b.servers {
		if err := s.Start(); err != nil {
			t.Fatalf("start B: %v", err)
		}
	}
	bLeader := b.waitLeader(t)
	// A's leader redials store 2's address within its reconnect backoff
	// (2 s at most) and is refused there.
	waitFor(t, 15*time.Second, "B's store 2 refusing A's raft", func() bool {
		return b.server(2).cluster.refused.Load() > 0
	})
	time.Sleep(time.Second) // A's heartbeats go on meanwhile
	if _, err := b.kv(t, bLeader).Put(ctx, &kvpb.PutRequest{Key: []byte("b"), Value: []byte("v")}); err != nil {
		t.Fatalf("put on B: %v", err)
	}
	waitFor(t, 10*time.Second, "B's store 2 applying B's write", func() bool {
		rs := b.server(2).Store().Regions()
		return len(rs) > 0 && rs[0].AppliedIndex >= b.server(bLeader).Store().Regions()[0].AppliedIndex
	})
	if got := b.server(2).Store().Regions()[0].Term; got >= a.server(leader).Store().Regions()[0].Term {
		t.Errorf("B's store 2 is at term %d, A's: it took A's traffic", got)
	}
}

// TestClusterGuard: a call naming no cluster (a client's) or this one goes
// on; one naming another is refused with FailedPrecondition.
func TestClusterGuard(t *testing.T) {
	g := &clusterGuard{id: ClusterIDOf("x"), logger: testLogger(t)}
	in := func(v ...string) context.Context {
		if len(v) == 0 {
			return context.Background()
		}
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(clusterIDKey, v[0]))
	}
	for _, tc := range []struct {
		ctx  context.Context
		want codes.Code
	}{
		{in(), codes.OK},
		{in(fmt.Sprintf("%x", ClusterIDOf("x"))), codes.OK},
		{in(fmt.Sprintf("%x", ClusterIDOf("y"))), codes.FailedPrecondition},
		{in("not hex"), codes.FailedPrecondition},
	} {
		if got := status.Code(g.check(tc.ctx, "/m")); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.ctx, got, tc.want)
		}
	}
	if ClusterIDOf("") != ClusterIDOf(DefaultClusterToken) || ClusterIDOf("a") == ClusterIDOf("b") {
		t.Error("ClusterIDOf")
	}
	var nilGuard *clusterGuard
	if err := nilGuard.check(in("1"), "/m"); err != nil {
		t.Errorf("nil guard: %v", err)
	}
}

// TestStoreRefusesAnotherClustersDataDir: a data dir records its cluster
// on first open and refuses to open for another.
func TestStoreRefusesAnotherClustersDataDir(t *testing.T) {
	dir := t.TempDir()
	open := func(id uint64) error {
		s, err := raftstore.NewStore(raftstore.Config{StoreID: 1, InitialStores: []uint64{1}, DataDir: dir, NoSync: true, ClusterID: id, Logger: testLogger(t)}, raftstore.NewInmemNetwork().Transport(1))
		if err == nil {
			_ = s.Stop()
		}
		return err
	}
	if err := open(ClusterIDOf("one")); err != nil {
		t.Fatal(err)
	}
	if err := open(0); err != nil {
		t.Fatalf("reopen naming no cluster: %v", err)
	}
	if err := open(ClusterIDOf("two")); err == nil {
		t.Fatal("opened for another cluster")
	}
	if err := open(ClusterIDOf("one")); err != nil {
		t.Fatalf("reopen for its own: %v", err)
	}
}
