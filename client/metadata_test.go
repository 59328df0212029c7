package client

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/client/clienttest"
	"github.com/hedgekv/hedgekv/kvpb"
)

// TestMetadataNotHeldUpBySilentStore: store 1, first among the endpoints,
// answers who it is but never answers a metadata call (as a store cut off
// from the client's zone, whose own address the client bootstrapped from,
// does). Connecting, the first put and get, and the store and region
// lists all finish well within one DialTimeout, and the silent store is
// remembered.
func TestMetadataNotHeldUpBySilentStore(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	var silentCalls atomic.Int64
	cl.SetHook(func(ctx context.Context, storeID uint64, method string) error {
		switch {
		case storeID == 1 && (method == "Stores" || method == "Regions"):
			silentCalls.Add(1)
			<-ctx.Done()
			return ctx.Err()
		case storeID != 1 && method == "Status":
			// Store 1 answers first, so it leads the endpoint list.
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	})
	const dialTimeout = 3 * time.Second
	ctx := context.Background()
	begin := time.Now()
	c, err := New(ctx, Config{Endpoints: cl.Endpoints(), DialTimeout: dialTimeout, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer c.Close()
	took := map[string]time.Duration{"new": time.Since(begin)}
	step := func(name string, fn func() error) {
		t.Helper()
		begin := time.Now()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		took[name] = time.Since(begin)
	}
	step("put", func() error { return c.Put(ctx, []byte("k"), []byte("v")) })
	step("get", func() error { _, err := c.Get(ctx, []byte("k")); return err })
	step("stores", func() error { _, err := c.Stores(ctx); return err })
	step("regions", func() error { _, err := c.Regions(ctx); return err })
	if silentCalls.Load() == 0 {
		t.Fatal("no metadata call went to store 1: the test proves nothing")
	}
	for name, d := range took {
		// Regions waits gatherGrace for the silent store; the others a
		// hedge delay at most.
		if d > time.Second {
			t.Errorf("%s took %v with store 1 silent (DialTimeout %v): %v", name, d, dialTimeout, took)
		}
	}
	if c.meta.get(cl.Store(1).Addr()).failures.Load() == 0 {
		t.Errorf("store 1 stayed silent while others answered, but is not remembered as failing")
	}
	// The next lookup asks store 1 last.
	if got := c.orderTargets(c.adminTargets()); len(got) != 3 || got[2] != cl.Store(1).Addr() {
		t.Errorf("admin targets %v: store 1 (%s) not last", got, cl.Store(1).Addr())
	}
}

// TestRegionByKeyNotFoundIsNoAnswer: stores that host no region holding
// the key (NotFound, as a store that has not applied a split yet answers)
// give no answer: the client asks another store, and when none knows the
// region yet, retries within the request's deadline instead of failing.
func TestRegionByKeyNotFoundIsNoAnswer(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	var refusals atomic.Int64
	cl.SetHook(func(ctx context.Context, storeID uint64, method string) error {
		if method == "Regions" && refusals.Add(1) <= 5 {
			return status.Errorf(codes.NotFound, "store %d hosts no region holding key", storeID)
		}
		return nil
	})
	c := newTestClient(t, cl, "")
	if err := c.Put(context.Background(), []byte("k"), []byte("v")); err != nil {
		t.Fatalf("put while the stores do not know the key's region yet: %v", err)
	}
	if n := refusals.Load(); n <= 5 {
		t.Fatalf("%d region lookups: the refusals were not all seen", n)
	}
	if v, ok := cl.Value("k"); !ok || string(v) != "v" {
		t.Fatalf("value %q, %v", v, ok)
	}
}

// TestMetadataOwnZoneFirst: a client with a zone asks its own zone's
// store for metadata first, and nobody else when it answers in time.
func TestMetadataOwnZoneFirst(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	var asked [4]atomic.Int64
	cl.SetHook(func(ctx context.Context, storeID uint64, method string) error {
		if method == "Stores" || method == "Regions" {
			asked[storeID].Add(1)
		}
		return nil
	})
	c := newTestClient(t, cl, "dc-c")
	if err := c.Put(context.Background(), []byte("k"), []byte("v")); err != nil {
		t.Fatalf("put: %v", err)
	}
	if asked[3].Load() == 0 || asked[1].Load()+asked[2].Load() != 0 {
		t.Errorf("metadata calls by store: 1:%d 2:%d 3:%d; want all on store 3 (dc-c)", asked[1].Load(), asked[2].Load(), asked[3].Load())
	}
}

// TestLeaderMovedThenCutOff: the client's cached leader lost its
// leadership and then stopped answering (cut off). A put and a get do not
// wait out their attempt's timeout there: the client asks the other
// stores who leads now and goes there.
func TestLeaderMovedThenCutOff(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	c, err := New(context.Background(), Config{Endpoints: cl.Endpoints(), DialTimeout: 3 * time.Second, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer c.Close()
	ctx := context.Background()
	if err := c.Put(ctx, []byte("k"), []byte("v0")); err != nil {
		t.Fatalf("put: %v", err)
	}
	cl.SetLeader(1, 2)
	cl.SetHook(func(ctx context.Context, storeID uint64, method string) error {
		if storeID == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	for i, op := range []func() error{
		func() error { return c.Put(ctx, []byte("k"), []byte("v1")) },
		func() error { _, err := c.Get(ctx, []byte("k")); return err },
	} {
		begin := time.Now()
		if err := op(); err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
		if d := time.Since(begin); d > time.Second {
			t.Errorf("op %d took %v with the cached leader cut off and another leading", i, d)
		}
	}
	if v, _ := cl.Value("k"); string(v) != "v1" {
		t.Errorf("value %q, want v1", v)
	}
}

// TestRegionsNotHeldUpBySilentEndpoint: an endpoint that accepts
// connections and never answers (a stopped store, a wrong address)
// does not hold up the region list, which a fan-out to every store
// would otherwise wait gatherGrace for on every command-line call: New
// found it silent, and the stores that answered cover every key.
func TestRegionsNotHeldUpBySilentEndpoint(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	cl.Put("k", "v")
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never answered
		}
	}()
	c, err := New(context.Background(), Config{
		Endpoints:   append([]string{hung.Addr().String()}, cl.Endpoints()...),
		DialTimeout: 3 * time.Second, RequestTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer c.Close()
	begin := time.Now()
	regions, err := c.Regions(context.Background())
	took := time.Since(begin)
	if err != nil || len(regions) != 1 {
		t.Fatalf("Regions: %v, %v", regions, err)
	}
	if took >= gatherGrace {
		t.Errorf("Regions took %v with a silent endpoint: it waited for it (gatherGrace %v)", took, gatherGrace)
	}
}

func TestCoverEveryKey(t *testing.T) {
	reg := func(start, end string) *kvpb.RegionInfo {
		return &kvpb.RegionInfo{Region: &kvpb.Region{StartKey: []byte(start), EndKey: []byte(end)}}
	}
	for _, tc := range []struct {
		answers [][]*kvpb.RegionInfo
		want    bool
	}{
		{nil, false},
		{[][]*kvpb.RegionInfo{{reg("", "")}}, true},
		{[][]*kvpb.RegionInfo{{reg("", "m")}}, false},
		{[][]*kvpb.RegionInfo{{reg("", "m")}, {reg("m", "")}}, true},
		{[][]*kvpb.RegionInfo{{reg("", "m"), reg("n", "")}}, false},
		{[][]*kvpb.RegionInfo{{reg("a", "")}}, false},
		// A lagging store's unsplit region overlaps its halves.
		{[][]*kvpb.RegionInfo{{reg("", "x")}, {reg("", "m"), reg("m", "")}}, true},
	} {
		if got := coverEveryKey(tc.answers); got != tc.want {
			t.Errorf("coverEveryKey(%v) = %v, want %v", tc.answers, got, tc.want)
		}
	}
}
