package server

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func allowFaults(c *Config) { c.AllowFaults = true }

// startFaultCluster starts stores 1..n that accept fault injection.
func startFaultCluster(t *testing.T, n int) *testCluster {
	t.Helper()
	c := newClusterWith(t, n, nil, nil, allowFaults)
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	c.waitLeader(t)
	return c
}

func TestCheckFaultRequest(t *testing.T) {
	ms := int64(time.Millisecond)
	bad := []*kvpb.FaultRequest{
		{},
		{DelayNanos: -ms, Prob: 1},
		{StallNanos: -ms},
		{DelayNanos: ms, Prob: 1.5},
		{DelayNanos: ms, Prob: -0.1},
		{DelayNanos: ms, Prob: math.NaN()},
		{DelayNanos: ms},
		{Prob: 0.5},
	}
	for _, req := range bad {
		if err := checkFaultRequest(req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: got %v, want InvalidArgument", req, err)
		}
	}
	good := []*kvpb.FaultRequest{
		{Clear: true},
		{DelayNanos: ms, Prob: 1},
		{DelayNanos: ms, Prob: 0.01},
		{StallNanos: ms},
		{Clear: true, StallNanos: ms},
	}
	for _, req := range good {
		if err := checkFaultRequest(req); err != nil {
			t.Errorf("%v: %v", req, err)
		}
	}
}

// TestWithStoreFaultDenied: without AllowFaults, Fault is refused.
func TestWithStoreFaultDenied(t *testing.T) {
	c := startCluster(t, 1, nil)
	_, err := c.admin(t, 1).Fault(testCtx(t), &kvpb.FaultRequest{StallNanos: int64(time.Second)})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("fault without --allow-faults: %v, want PermissionDenied", err)
	}
	if c.server(1).faults.stalled() {
		t.Fatal("store stalled although faults are not allowed")
	}
}

// TestWithStoreFaultDelay: delay with prob 1 holds every read by D, a read
// whose context ends stops waiting, writes are not delayed, clear ends it.
func TestWithStoreFaultDelay(t *testing.T) {
	c := startFaultCluster(t, 1)
	kv, admin := c.kv(t, 1), c.admin(t, 1)
	ctx := testCtx(t)
	for _, req := range []*kvpb.FaultRequest{{}, {DelayNanos: -1, Prob: 1}, {DelayNanos: 1, Prob: 2}, {StallNanos: -1}} {
		if _, err := admin.Fault(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("fault %v: %v, want InvalidArgument", req, err)
		}
	}
	if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatalf("put: %v", err)
	}
	const d = 300 * time.Millisecond
	if _, err := admin.Fault(ctx, &kvpb.FaultRequest{DelayNanos: int64(d), Prob: 1}); err != nil {
		t.Fatalf("fault: %v", err)
	}
	start := time.Now()
	if _, err := kv.Get(ctx, &kvpb.GetRequest{Key: []byte("k")}); err != nil {
		t.Fatalf("get: %v", err)
	}
	if el := time.Since(start); el < d {
		t.Errorf("delayed get took %v, want >= %v", el, d)
	}
	start = time.Now()
	if _, err := kv.Scan(ctx, &kvpb.ScanRequest{Limit: 10}); err != nil {
		t.Fatalf("scan: %v", err)
	}
	if el := time.Since(start); el < d {
		t.Errorf("delayed scan took %v, want >= %v", el, d)
	}

	// A read whose context ends stops waiting.
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	start = time.Now()
	_, err := kv.Get(sctx, &kvpb.GetRequest{Key: []byte("k")})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("get with a short deadline: %v, want DeadlineExceeded", err)
	}
	if el := time.Since(start); el >= d {
		t.Errorf("cancelled get took %v, want well under %v", el, d)
	}
	if n := testutilCounter(c.server(1).metrics.faultReadsDelayed); n < 3 {
		t.Errorf("reads delayed counter %v, want >= 3", n)
	}

	if _, err := admin.Fault(ctx, &kvpb.FaultRequest{Clear: true}); err != nil {
		t.Fatalf("clear: %v", err)
	}
	start = time.Now()
	if _, err := kv.Get(ctx, &kvpb.GetRequest{Key: []byte("k")}); err != nil {
		t.Fatalf("get after clear: %v", err)
	}
	if el := time.Since(start); el >= d {
		t.Errorf("get after clear took %v, want under %v", el, d)
	}
}

// TestWithStoreFaultStall: a stall holds reads, writes and admin calls for
// D, then they succeed; a call whose context ends stops waiting; clear
// ends a stall early.
func TestWithStoreFaultStall(t *testing.T) {
	c := startFaultCluster(t, 1)
	kv, admin := c.kv(t, 1), c.admin(t, 1)
	ctx := testCtx(t)
	if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatalf("put: %v", err)
	}
	const d = 800 * time.Millisecond
	start := time.Now()
	if _, err := admin.Fault(ctx, &kvpb.FaultRequest{StallNanos: int64(d)}); err != nil {
		t.Fatalf("fault: %v", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	wg.Go(func() {
		if _, err := kv.Get(ctx, &kvpb.GetRequest{Key: []byte("k")}); err != nil {
			errs <- fmt.Errorf("get: %w", err)
		} else if el := time.Since(start); el < d {
			errs <- fmt.Errorf("get during stall took %v, want >= %v", el, d)
		}
	})
	wg.Go(func() {
		if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte("k2"), Value: []byte("v2")}); err != nil {
			errs <- fmt.Errorf("put: %w", err)
		} else if el := time.Since(start); el < d {
			errs <- fmt.Errorf("put during stall took %v, want >= %v", el, d)
		}
	})
	wg.Go(func() {
		if _, err := admin.Status(ctx, &kvpb.StatusRequest{}); err != nil {
			errs <- fmt.Errorf("status: %w", err)
		} else if el := time.Since(start); el < d {
			errs <- fmt.Errorf("status during stall took %v, want >= %v", el, d)
		}
	})
	// A call whose context ends stops waiting.
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := kv.Get(sctx, &kvpb.GetRequest{Key: []byte("k")})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("get with a short deadline during stall: %v, want DeadlineExceeded", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if el := time.Since(start); el > d+5*time.Second {
		t.Errorf("stall of %v held calls for %v", d, el)
	}

	// clear ends a long stall early.
	if _, err := admin.Fault(ctx, &kvpb.FaultRequest{StallNanos: int64(time.Minute)}); err != nil {
		t.Fatalf("fault: %v", err)
	}
	done := make(chan error, 1)
	start = time.Now()
	go func() {
		_, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte("k3"), Value: []byte("v3")})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("put returned during a stall: %v", err)
	default:
	}
	if _, err := admin.Fault(ctx, &kvpb.FaultRequest{Clear: true}); err != nil {
		t.Fatalf("clear: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("put after clear: %v", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("put after clear took %v", el)
	}
	if n := testutilCounter(c.server(1).metrics.faultStalls); n != 2 {
		t.Errorf("stalls counter %v, want 2", n)
	}
}

// TestWithStoreFaultStallRaft: a stalled follower takes in no raft traffic
// (its applied index stays put while the others commit), serves a replica
// read once the stall ends, and catches up.
func TestWithStoreFaultStallRaft(t *testing.T) {
	c := startFaultCluster(t, 3)
	leader := c.waitLeader(t)
	follower := leader%3 + 1
	ctx := testCtx(t)
	lkv := c.kv(t, leader)
	if _, err := lkv.Put(ctx, &kvpb.PutRequest{Key: []byte("a"), Value: []byte("1")}); err != nil {
		t.Fatalf("put: %v", err)
	}
	applied := func(id uint64) uint64 { return c.server(id).Store().Regions()[0].AppliedIndex }
	waitFor(t, 10*time.Second, "the follower to catch up", func() bool { return applied(follower) >= applied(leader) })

	const d = 1500 * time.Millisecond
	start := time.Now()
	if _, err := c.admin(t, follower).Fault(ctx, &kvpb.FaultRequest{StallNanos: int64(d)}); err != nil {
		t.Fatalf("fault: %v", err)
	}
	fkv := c.kv(t, follower)
	replicaRead := func() error {
		_, err := fkv.Get(ctx, &kvpb.GetRequest{Key: []byte("a"), Context: &kvpb.ReadContext{ReplicaRead: true}})
		return err
	}
	// The read is held for the stall; then it may find the leader not yet
	// known again (the store stopped hearing it, as after a GC pause).
	readDone := make(chan error, 1)
	go func() {
		err := replicaRead()
		if el := time.Since(start); el < d {
			err = fmt.Errorf("replica read during stall returned after %v (err %v), want >= %v", el, err, d)
		} else if err != nil && status.Code(err) != codes.FailedPrecondition {
			err = fmt.Errorf("replica read after stall: %w", err)
		} else {
			err = nil
		}
		readDone <- err
	}()
	time.Sleep(100 * time.Millisecond) // let messages already being delivered land
	before := applied(follower)
	for i := range 5 {
		if _, err := lkv.Put(ctx, &kvpb.PutRequest{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}); err != nil {
			t.Fatalf("put during stall: %v", err)
		}
	}
	if time.Since(start) >= d-200*time.Millisecond {
		t.Skipf("puts took too long (%v) to observe the stall", time.Since(start))
	}
	if got := applied(follower); got != before {
		t.Errorf("stalled follower's applied index moved %d -> %d during the stall", before, got)
	}
	if applied(leader) <= before {
		t.Errorf("leader applied %d, want > %d", applied(leader), before)
	}
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "a replica read on the follower after the stall", func() bool { return replicaRead() == nil })
	waitFor(t, 15*time.Second, "the follower to catch up after the stall", func() bool { return applied(follower) >= applied(leader) })
}

func TestObserveReadFailedCountsCancelledOnly(t *testing.T) {
	m := newMetrics(func() float64 { return 0 })
	live := context.Background()
	m.observeReadFailed(live, true) // a failure not caused by the caller
	expired, cancel1 := context.WithTimeout(live, 0)
	defer cancel1()
	<-expired.Done()
	m.observeReadFailed(expired, true) // a deadline is not a cancel
	cancelled, cancel2 := context.WithCancel(live)
	cancel2()
	m.observeReadFailed(cancelled, false)
	m.observeReadFailed(cancelled, true) // a cancelled hedge counts in both
	if got := m.readsCancelledN.Load(); got != 2 {
		t.Fatalf("reads cancelled = %d, want 2", got)
	}
	if got := m.hedgeReadsCancelledN.Load(); got != 1 {
		t.Fatalf("hedge reads cancelled = %d, want 1", got)
	}
	var pm dto.Metric
	if err := m.readsCancelled.Write(&pm); err != nil {
		t.Fatal(err)
	}
	if got := pm.GetCounter().GetValue(); got != 2 {
		t.Fatalf("hedgekv_reads_cancelled_total = %v, want 2", got)
	}
}
