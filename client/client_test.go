package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/client/clienttest"
	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/region"
)

// getRetryCase is a Get that must succeed although the cluster, as setup
// leaves it, fails the client's first guess.
type getRetryCase struct {
	name string
	// setup runs after the client is created (and its cache warmed, if
	// warm is set).
	warm         bool
	setup        func(t *testing.T, cl *clienttest.Cluster)
	policy       ReadPolicy
	wantStore    uint64        // 0: any
	wantNotStore uint64        // 0: none
	wantAttempts int           // 0: don't check
	wantMode     readmode.Mode // "": don't check
}

// runGetRetries runs each case against a fresh three-zone cluster holding
// k=v: the Get must return v within 3 s, as the case wants it served.
func runGetRetries(t *testing.T, tests []getRetryCase) {
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := clienttest.NewCluster(t, threeZones...)
			cl.Put("k", "v")
			c := newTestClient(t, cl, "")
			if tt.warm {
				warm(t, c)
			}
			tt.setup(t, cl)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			v, info, err := c.Session(tt.policy).GetWithInfo(ctx, []byte("k"))
			if err != nil {
				t.Fatalf("get: %v", err)
			}
			if string(v) != "v" {
				t.Errorf("value %q, want %q", v, "v")
			}
			if tt.wantStore != 0 && info.StoreID != tt.wantStore {
				t.Errorf("served by store %d, want %d", info.StoreID, tt.wantStore)
			}
			if tt.wantNotStore != 0 && info.StoreID == tt.wantNotStore {
				t.Errorf("served by store %d, want any other", info.StoreID)
			}
			if tt.wantAttempts != 0 && info.Attempts != tt.wantAttempts {
				t.Errorf("%d attempts, want %d", info.Attempts, tt.wantAttempts)
			}
			if tt.wantMode != "" && info.Mode != tt.wantMode {
				t.Errorf("mode %q, want %q", info.Mode, tt.wantMode)
			}
		})
	}
}

// TestGetRetriesLeaderChanges: the leader the client knows of is not the
// leader (any more, or not yet).
func TestGetRetriesLeaderChanges(t *testing.T) {
	runGetRetries(t, []getRetryCase{
		{
			name: "not leader hint followed",
			setup: func(t *testing.T, cl *clienttest.Cluster) {
				cl.SetLeader(1, 2)
				cl.SetReportedLeader(1, 1) // the client learns a stale leader
			},
			wantStore: 2, wantAttempts: 2, wantMode: "lease",
		},
		{
			name: "leader unknown tries the other peers",
			setup: func(t *testing.T, cl *clienttest.Cluster) {
				cl.SetLeader(1, 3)
				cl.SetReportedLeader(1, 1)
				cl.SetHook(func(_ context.Context, s uint64, m string) error {
					if m == "Get" && s != 3 {
						return notLeader(0)
					}
					return nil
				})
			},
			wantStore: 3, wantAttempts: 3, wantMode: "lease",
		},
		{
			name: "election in progress, then a leader",
			setup: func(t *testing.T, cl *clienttest.Cluster) {
				cl.SetLeader(1, 0)
				time.AfterFunc(150*time.Millisecond, func() { cl.SetLeader(1, 2) })
			},
			wantStore: 2, wantMode: "lease",
		},
	})
}

// TestGetRetriesRegionChanges: the region the warm cache holds for the key
// has changed, or the store no longer has it.
func TestGetRetriesRegionChanges(t *testing.T) {
	runGetRetries(t, []getRetryCase{
		{
			name: "epoch not match refreshes the cache",
			warm: true,
			setup: func(t *testing.T, cl *clienttest.Cluster) {
				if err := cl.Split([]byte("m"), 2); err != nil {
					t.Fatal(err)
				}
			},
			wantStore: 1, wantAttempts: 2, wantMode: "lease",
		},
		{
			name: "region not found drops and reloads",
			warm: true,
			setup: func(t *testing.T, cl *clienttest.Cluster) {
				cl.SetHook(failOnce(1, "Get", clienttest.RegionError(codes.NotFound, &kvpb.RegionError{RegionNotFound: &kvpb.RegionNotFound{RegionId: 1}})))
			},
			wantStore: 1, wantAttempts: 2,
		},
		{
			name: "key not in region drops and reloads",
			warm: true,
			setup: func(t *testing.T, cl *clienttest.Cluster) {
				cl.SetHook(failOnce(1, "Get", clienttest.RegionError(codes.FailedPrecondition, &kvpb.RegionError{KeyNotInRegion: &kvpb.KeyNotInRegion{RegionId: 1, Key: []byte("k")}})))
			},
			wantStore: 1, wantAttempts: 2,
		},
	})
}

// TestGetRetriesStoreDown: the store the client asks first is stopped or
// unavailable.
func TestGetRetriesStoreDown(t *testing.T) {
	runGetRetries(t, []getRetryCase{
		{
			name: "leader store down, retried at the new leader",
			warm: true,
			setup: func(t *testing.T, cl *clienttest.Cluster) {
				cl.Store(1).Stop()
				cl.SetLeader(1, 2)
			},
			wantStore: 2, wantAttempts: 2,
		},
		{
			name: "unavailable store, retried elsewhere",
			warm: true,
			setup: func(t *testing.T, cl *clienttest.Cluster) {
				// Store 1 stays unavailable until leadership has moved to 3;
				// hints still naming 1 meanwhile must not strand the request.
				var moved atomic.Bool
				cl.SetHook(func(_ context.Context, s uint64, m string) error {
					if s == 1 && m == "Get" && !moved.Load() {
						return status.Error(codes.Unavailable, "store is restarting")
					}
					return nil
				})
				time.AfterFunc(50*time.Millisecond, func() { cl.SetLeader(1, 3); moved.Store(true) })
			},
			wantStore: 3,
		},
		{
			name:   "follower read with a follower down",
			warm:   true,
			policy: ReadPolicy{Replica: ReplicaFollower},
			setup: func(t *testing.T, cl *clienttest.Cluster) {
				cl.Store(2).Stop()
			},
			wantStore: 3, wantMode: "read-index",
		},
	})
}

// TestGetRetriesStaleNotReady: a bounded-staleness read at a follower
// whose data is not recent enough.
func TestGetRetriesStaleNotReady(t *testing.T) {
	stale := ReadPolicy{Replica: ReplicaFollower, MaxStaleness: 5 * time.Second}
	runGetRetries(t, []getRetryCase{
		{
			name:   "stale read not ready on one follower goes to the other",
			policy: stale,
			setup: func(t *testing.T, cl *clienttest.Cluster) {
				cl.SetNotReady(2, true)
			},
			wantNotStore: 2, wantMode: "stale",
		},
		{
			name:   "stale read not ready on any follower falls back to the leader",
			policy: stale,
			setup: func(t *testing.T, cl *clienttest.Cluster) {
				cl.SetNotReady(2, true)
				cl.SetNotReady(3, true)
			},
			wantStore: 1, wantAttempts: 3, wantMode: "lease",
		},
	})
}

func TestEpochNotMatchUpdatesCache(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	c := newTestClient(t, cl, "")
	warm(t, c)
	if err := cl.Split([]byte("m"), 2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(context.Background(), []byte("x")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get: %v, want ErrNotFound", err)
	}
	got := c.cache.all()
	if len(got) != 2 || got[0].ID != 1 || got[1].ID != 2 || string(got[1].StartKey) != "m" {
		t.Fatalf("cache after split: %v, want regions 1 [,m) and 2 [m,)", got)
	}
	if got[1].Epoch.Version != 2 {
		t.Errorf("region 2 version %d, want 2", got[1].Epoch.Version)
	}
}

func TestWritesFollowLeader(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	c := newTestClient(t, cl, "")
	warm(t, c)
	cl.SetLeader(1, 3)
	ctx := context.Background()
	if err := c.Put(ctx, []byte("a"), []byte("1")); err != nil {
		t.Fatalf("put: %v", err)
	}
	if v, ok := cl.Value("a"); !ok || string(v) != "1" {
		t.Fatalf("stored %q %v, want \"1\"", v, ok)
	}
	cl.Store(3).Stop()
	cl.SetLeader(1, 1)
	if err := c.Delete(ctx, []byte("a")); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, ok := cl.Value("a"); ok {
		t.Fatal("key still present after delete")
	}
	for _, r := range cl.Requests() {
		if r.RegionID != 1 {
			t.Errorf("write routed with region id %d, want 1", r.RegionID)
		}
	}
}

func TestDeadline(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(cl *clienttest.Cluster)
		timeout time.Duration
		wantAs  func(err error) bool
	}{
		{
			name:    "no leader ever",
			setup:   func(cl *clienttest.Cluster) { cl.SetLeader(1, 0) },
			timeout: 300 * time.Millisecond,
			wantAs: func(err error) bool {
				var nl *region.NotLeaderError
				return errors.As(err, &nl)
			},
		},
		{
			name: "every store stalls",
			setup: func(cl *clienttest.Cluster) {
				cl.SetHook(func(ctx context.Context, _ uint64, m string) error {
					if m == "Get" {
						<-ctx.Done()
						return ctx.Err()
					}
					return nil
				})
			},
			timeout: 300 * time.Millisecond,
			wantAs:  func(err error) bool { return true },
		},
		{
			name: "every store down",
			setup: func(cl *clienttest.Cluster) {
				for id := uint64(1); id <= 3; id++ {
					cl.Store(id).Stop()
				}
			},
			timeout: 300 * time.Millisecond,
			wantAs:  func(err error) bool { return status.Code(err) == codes.Unavailable },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := clienttest.NewCluster(t, threeZones...)
			c := newTestClient(t, cl, "")
			warm(t, c)
			tt.setup(cl)
			ctx, cancel := context.WithTimeout(context.Background(), tt.timeout)
			defer cancel()
			start := time.Now()
			_, err := c.Get(ctx, []byte("k"))
			elapsed := time.Since(start)
			if err == nil {
				t.Fatal("get succeeded, want an error")
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
			}
			if !tt.wantAs(err) {
				t.Errorf("error %v does not carry the last attempt's cause", err)
			}
			if elapsed > tt.timeout+500*time.Millisecond {
				t.Errorf("returned after %v, deadline was %v", elapsed, tt.timeout)
			}
		})
	}
}

func TestNonRetryableErrorReturnedAtOnce(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	c := newTestClient(t, cl, "")
	cl.SetHook(func(_ context.Context, _ uint64, m string) error {
		if m == "Get" {
			return status.Error(codes.InvalidArgument, "key too large")
		}
		return nil
	})
	_, info, err := c.Session(ReadPolicy{}).GetWithInfo(context.Background(), []byte("k"))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("error %v, want InvalidArgument", err)
	}
	if info.Attempts != 1 {
		t.Errorf("%d attempts, want 1", info.Attempts)
	}
}

func TestNotFound(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	c := newTestClient(t, cl, "")
	ctx := context.Background()
	if _, err := c.Get(ctx, []byte("missing")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get missing: %v, want ErrNotFound", err)
	}
	if _, err := c.Session(ReadPolicy{Replica: ReplicaFollower}).Get(ctx, []byte("missing")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("follower get missing: %v, want ErrNotFound", err)
	}
	if _, err := c.Get(ctx, nil); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("get empty key: %v, want an error other than ErrNotFound", err)
	}
}

// splitThree makes regions 1 [,g) 2 [g,p) 3 [p,) and puts keys a..z.
func splitThree(t *testing.T, cl *clienttest.Cluster) {
	t.Helper()
	for i, k := range []string{"g", "p"} {
		if err := cl.Split([]byte(k), uint64(i+2)); err != nil {
			t.Fatal(err)
		}
	}
	for ch := 'a'; ch <= 'z'; ch++ {
		cl.Put(string(ch), "v"+string(ch))
	}
}

func keysOf(kvs []KV) string {
	var s string
	for _, kv := range kvs {
		s += string(kv.Key)
	}
	return s
}

func TestScanAcrossRegions(t *testing.T) {
	tests := []struct {
		name       string
		start, end string
		limit      int
		want       string
	}{
		{"everything", "", "", 0, "abcdefghijklmnopqrstuvwxyz"},
		{"limit within first region", "", "", 5, "abcde"},
		{"limit across regions", "e", "", 6, "efghij"},
		{"bounded across all three", "f", "q", 0, "fghijklmnop"},
		{"bounded and limited", "f", "q", 3, "fgh"},
		{"end at a region boundary", "a", "g", 0, "abcdef"},
		{"start at a region boundary", "p", "", 0, "pqrstuvwxyz"},
		{"empty range", "q", "f", 0, ""},
		{"limit larger than data", "x", "", 100, "xyz"},
	}
	cl := clienttest.NewCluster(t, threeZones...)
	splitThree(t, cl)
	c := newTestClient(t, cl, "")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var end []byte
			if tt.end != "" {
				end = []byte(tt.end)
			}
			kvs, err := c.Scan(context.Background(), []byte(tt.start), end, tt.limit)
			if err != nil {
				t.Fatalf("scan: %v", err)
			}
			if got := keysOf(kvs); got != tt.want {
				t.Errorf("keys %q, want %q", got, tt.want)
			}
			for _, kv := range kvs {
				if string(kv.Value) != "v"+string(kv.Key) {
					t.Errorf("value of %q is %q", kv.Key, kv.Value)
				}
			}
		})
	}
}

func TestScanAfterSplitWithStaleCache(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	c := newTestClient(t, cl, "")
	warm(t, c) // the cache holds one region covering everything
	splitThree(t, cl)
	kvs, err := c.Session(ReadPolicy{Replica: ReplicaFollower}).Scan(context.Background(), nil, nil, 0)
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	if got := keysOf(kvs); got != "abcdefghijklmnopqrstuvwxyz" {
		t.Errorf("keys %q", got)
	}
}

func TestBatchGetAcrossRegions(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	c := newTestClient(t, cl, "")
	warm(t, c) // stale after the split below: the batch must regroup
	splitThree(t, cl)
	keys := [][]byte{[]byte("z"), []byte("a"), []byte("missing"), []byte("h"), []byte("a"), []byte("q")}
	got, err := c.BatchGet(context.Background(), keys)
	if err != nil {
		t.Fatalf("batch get: %v", err)
	}
	want := map[string]string{"z": "vz", "a": "va", "h": "vh", "q": "vq"}
	if len(got) != len(want) {
		t.Errorf("got %d keys, want %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if string(got[k]) != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	var batchGets int
	for _, r := range cl.Requests() {
		if r.Method == "BatchGet" {
			batchGets++
		}
	}
	if batchGets != 3 {
		t.Errorf("%d BatchGet requests reached stores, want one per region (3)", batchGets)
	}
}

func TestAdmin(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	splitThree(t, cl)
	cl.SetLeader(2, 2)
	c := newTestClient(t, cl, "")
	ctx := context.Background()

	stores, err := c.Stores(ctx)
	if err != nil {
		t.Fatalf("stores: %v", err)
	}
	if len(stores) != 3 || stores[0].ID != 1 || stores[2].Zone != "dc-c" || !stores[1].Up {
		t.Fatalf("stores: %v", stores)
	}

	regions, err := c.Regions(ctx)
	if err != nil {
		t.Fatalf("regions: %v", err)
	}
	var ids []uint64
	for _, r := range regions {
		ids = append(ids, r.Region.ID)
	}
	if fmt.Sprint(ids) != "[1 2 3]" || regions[1].LeaderStoreID != 2 {
		t.Fatalf("regions %v (leader of 2: %d), want 1 2 3 in key order, region 2 led by store 2", ids, regions[1].LeaderStoreID)
	}

	// The cache now says store 2 leads region 2; move it behind the
	// client's back so the transfer must follow a NotLeader hint.
	cl.SetLeader(2, 1)
	if err := c.TransferLeader(ctx, 2, 3); err != nil {
		t.Fatalf("transfer leader: %v", err)
	}
	if got := cl.Leader(2); got != 3 {
		t.Fatalf("leader of region 2 is store %d, want 3", got)
	}
	if err := c.TransferLeader(ctx, 99, 1); err == nil {
		t.Fatal("transfer leader of an unknown region succeeded")
	}
}

func TestNew(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	dead := cl.Store(3).Addr()
	cl.Store(3).Stop()

	start := time.Now()
	c, err := New(context.Background(), Config{Endpoints: []string{dead, cl.Store(1).Addr()}, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("New with one live endpoint: %v", err)
	}
	defer c.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("New took %v with one dead endpoint", d)
	}
	// Store 2 was never an endpoint: it is learned from Admin.Stores.
	if _, ok := c.cache.store(2); !ok {
		t.Error("store 2 unknown after New")
	}

	if _, err := New(context.Background(), Config{Endpoints: []string{dead}, DialTimeout: 300 * time.Millisecond}); err == nil {
		t.Fatal("New with only a dead endpoint succeeded")
	}
	if _, err := New(context.Background(), Config{}); err == nil {
		t.Fatal("New without endpoints succeeded")
	}
}

func TestClosedClient(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	c := newTestClient(t, cl, "")
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Put(context.Background(), []byte("k"), []byte("v")) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("put on a closed client succeeded")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("put on a closed client hangs")
	}
}

func TestScanPagesLargeRegions(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	const n = maxScanPage + 50
	for i := range n {
		cl.Put(fmt.Sprintf("k%06d", i), "v")
	}
	c := newTestClient(t, cl, "")
	for _, limit := range []int{0, maxScanPage + 20} {
		cl.ResetRequests()
		kvs, err := c.Scan(context.Background(), nil, nil, limit)
		if err != nil {
			t.Fatalf("scan limit %d: %v", limit, err)
		}
		want := n
		if limit > 0 {
			want = limit
		}
		if len(kvs) != want {
			t.Fatalf("scan limit %d: %d pairs, want %d", limit, len(kvs), want)
		}
		for i, kv := range kvs {
			if string(kv.Key) != fmt.Sprintf("k%06d", i) {
				t.Fatalf("pair %d is %q", i, kv.Key)
			}
		}
		if got := len(cl.Requests()); got != 2 {
			t.Errorf("scan limit %d took %d requests, want 2 pages", limit, got)
		}
	}
}

func TestServerIsBusy(t *testing.T) {
	busy := func(store uint64) error {
		return clienttest.RegionError(codes.ResourceExhausted, &kvpb.RegionError{ServerIsBusy: &kvpb.ServerIsBusy{StoreId: store, EstimatedWaitUs: 80000}})
	}
	t.Run("a busy leader sends the read to a follower", func(t *testing.T) {
		cl, c := newWarmClient(t)
		cl.SetHook(func(_ context.Context, s uint64, m string) error {
			if s == 1 && m == "Get" {
				return busy(s)
			}
			return nil
		})
		cl.ResetRequests()
		_, info, err := c.Session(ReadPolicy{Replica: ReplicaLeader, BusyThreshold: 10 * time.Millisecond}).GetWithInfo(context.Background(), []byte("k"))
		if err != nil {
			t.Fatal(err)
		}
		if info.StoreID == 1 || info.Mode != "read-index" || info.Attempts != 2 {
			t.Errorf("served by store %d (%s) after %d attempts, want a follower's read-index read after 2", info.StoreID, info.Mode, info.Attempts)
		}
		for _, r := range cl.Requests() {
			if r.Method == "Get" && r.BusyThresholdMs != 10 {
				t.Errorf("request to store %d carried busy threshold %dms, want 10ms", r.StoreID, r.BusyThresholdMs)
			}
		}
		// The reported wait counts against the store in replica selection.
		if got := c.stats.get(1).score(); got < float64(80*time.Millisecond) {
			t.Errorf("store 1 score %v after reporting an 80ms wait", time.Duration(got))
		}
	})
	t.Run("when every replica is busy the read waits at one without the threshold", func(t *testing.T) {
		cl, c := newWarmClient(t)
		var (
			mu      sync.Mutex
			refused = map[uint64]int{}
		)
		cl.SetHook(func(_ context.Context, s uint64, m string) error {
			mu.Lock()
			defer mu.Unlock()
			if n := len(refused); m == "Get" && n < 3 {
				refused[s]++
				return busy(s)
			}
			return nil
		})
		cl.ResetRequests()
		v, info, err := c.Session(ReadPolicy{Replica: ReplicaMixed, BusyThreshold: 10 * time.Millisecond}).GetWithInfo(context.Background(), []byte("k"))
		if err != nil || string(v) != "v" {
			t.Fatalf("get: %q, %v", v, err)
		}
		if info.Attempts != 4 {
			t.Errorf("%d attempts, want 4 (three refused, then one without a threshold)", info.Attempts)
		}
		// Refused requests never reach the fake's log: only the last did.
		reqs := cl.Requests()
		if len(reqs) != 1 || reqs[0].BusyThresholdMs != 0 {
			t.Errorf("requests served %+v: want one, without a busy threshold", reqs)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(refused) != 3 {
			t.Errorf("refused on stores %v: want each of the three once", refused)
		}
	})
}

func TestStoreBackoffAndProbe(t *testing.T) {
	var s storeStats
	if !s.usable() {
		t.Fatal("a store never failed is not usable")
	}
	s.markFailure()
	if s.usable() || !s.failedRecently() {
		t.Fatal("a store that just failed is usable")
	}
	// Let the back-off pass (it is at most failureBackoff after one failure).
	s.avoidUntil.Store(time.Now().Add(-time.Millisecond).UnixNano())
	if !s.usable() {
		t.Fatal("no probe allowed after the back-off")
	}
	if s.usable() {
		t.Fatal("a second request allowed while the first probes")
	}
	// The probe fails: the back-off doubles.
	s.markFailure()
	if got := time.Until(time.Unix(0, s.avoidUntil.Load())); got < failureBackoff/2 || got > 2*failureBackoff {
		t.Errorf("second back-off %v, want within [%v, %v]", got, failureBackoff/2, 2*failureBackoff)
	}
	// A success ends the back-off at once.
	done := s.start()
	done(true, nil)
	if !s.usable() || s.failedRecently() {
		t.Fatal("a store that answered is still avoided")
	}
}

func TestLatencyFades(t *testing.T) {
	var s storeStats
	s.observeLatency(200 * time.Millisecond)
	if lat, _ := s.latency(); lat < 190*time.Millisecond {
		t.Fatalf("fresh latency %v, want about 200ms", lat)
	}
	// Measured eight half-lives ago: nearly back to the default, so power
	// of two choices tries the store again.
	s.latencyAt.Store(time.Now().Add(-8 * latencyHalfLife).UnixNano())
	if lat, measured := s.latency(); !measured || lat > 2*defaultLatency {
		t.Fatalf("latency %v (measured %v) after 8 half-lives, want under %v", lat, measured, 2*defaultLatency)
	}
}

func TestLeaderDownStaleReadsLearnNewLeader(t *testing.T) {
	cl, c := newWarmClient(t)
	s := c.Session(ReadPolicy{Replica: ReplicaLeader, MaxStaleness: 5 * time.Second})
	// The leader's store dies; store 3 is elected, but store 2 still names
	// the dead store 1 as leader (it has not timed out yet).
	cl.Store(1).Stop()
	cl.SetLeader(1, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for i := range 5 {
		v, info, err := s.GetWithInfo(ctx, []byte("k"))
		if err != nil || string(v) != "v" {
			t.Fatalf("read %d: %q, %v", i, v, err)
		}
		if i == 4 && (info.StoreID != 3 || info.Mode != "lease") {
			t.Errorf("read %d served by store %d (%s): the stale answers named store 3 as leader, so reads should be back on it", i, info.StoreID, info.Mode)
		}
	}
}

func TestHintToFailedStoreNotFollowed(t *testing.T) {
	cl, c := newWarmClient(t)
	// Store 1, the leader, is down (every call Unavailable). Stores 2 and
	// 3 keep naming it as leader until store 3 wins the election 400ms
	// later.
	var elected atomic.Bool
	var toDead atomic.Int32
	cl.SetHook(func(_ context.Context, s uint64, m string) error {
		switch {
		case s == 1:
			toDead.Add(1)
			return status.Error(codes.Unavailable, "connection refused")
		case m == "Get" && !elected.Load():
			return notLeader(1)
		}
		return nil
	})
	time.AfterFunc(400*time.Millisecond, func() { cl.SetLeader(1, 3); elected.Store(true) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	v, info, err := c.Session(ReadPolicy{}).GetWithInfo(ctx, []byte("k"))
	if err != nil || string(v) != "v" {
		t.Fatalf("get: %q, %v", v, err)
	}
	if info.StoreID != 3 {
		t.Errorf("served by store %d, want 3", info.StoreID)
	}
	// The first refusal puts store 1 in its back-off; a hint naming it
	// while it lasts is not followed. Only a probe after the back-off
	// (200ms, then 400ms, jittered) may reach it again.
	if n := toDead.Load(); n > 3 {
		t.Errorf("%d calls to the dead store in %d attempts: hints to it were followed", n, info.Attempts)
	}
}
