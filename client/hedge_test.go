package client

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client/clienttest"
	"github.com/hedgekv/hedgekv/readmode"
)

func TestParseHedgePolicies(t *testing.T) {
	tests := []struct {
		in   string
		want Hedge
		str  string // String(); "" if error expected
	}{
		{"off", HedgeOff, "off"},
		{"10ms", HedgeAfter(10 * time.Millisecond), "10ms"},
		{"1.5s", HedgeAfter(1500 * time.Millisecond), "1.5s"},
		{"p90", HedgeAfterPercentile(0.9), "p90"},
		{"p99", HedgeAfterPercentile(0.99), "p99"},
		{"p999", HedgeAfterPercentile(0.999), "p999"},
		{"p99.9", HedgeAfterPercentile(0.999), "p999"},
		{"p50", HedgeAfterPercentile(0.5), "p50"},
		{"min(p99,50ms)", HedgeMin(0.99, 50*time.Millisecond), "min(p99,50ms)"},
		{"max(p99,5ms)", HedgeMax(0.99, 5*time.Millisecond), "max(p99,5ms)"},
		{"min( p999 , 20ms )", HedgeMin(0.999, 20*time.Millisecond), "min(p999,20ms)"},
		{"", HedgeOff, ""},
		{"on", HedgeOff, ""},
		{"0s", HedgeOff, ""},
		{"-10ms", HedgeOff, ""},
		{"p", HedgeOff, ""},
		{"p0", HedgeOff, ""},
		{"p100", HedgeOff, ""},
		{"min(p99)", HedgeOff, ""},
		{"min(p99,-5ms)", HedgeOff, ""},
		{"max(50ms,p99)", HedgeOff, ""},
		{"avg(p99,5ms)", HedgeOff, ""},
	}
	for _, tt := range tests {
		got, err := ParseHedge(tt.in)
		if tt.str == "" {
			if err == nil {
				t.Errorf("ParseHedge(%q) = %v, want an error", tt.in, got)
			} else if strings.Contains(err.Error(), "\n") {
				t.Errorf("ParseHedge(%q) error %q is not one line", tt.in, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseHedge(%q): %v", tt.in, err)
			continue
		}
		if got.String() != tt.str || got.kind != tt.want.kind || got.delay != tt.want.delay || got.q-tt.want.q > 1e-9 || tt.want.q-got.q > 1e-9 {
			t.Errorf("ParseHedge(%q) = %#v (%s), want %#v (%s)", tt.in, got, got, tt.want, tt.str)
		}
		// String round-trips.
		back, err := ParseHedge(got.String())
		if err != nil || back.String() != got.String() {
			t.Errorf("ParseHedge(%q.String() = %q) = %v, %v", tt.in, got.String(), back, err)
		}
	}
}

func TestHedgeDelayFromWindow(t *testing.T) {
	var w latencyWindow
	now := time.Now()
	p99 := HedgeAfterPercentile(0.99)
	if d := w.quantile(0.99, now); d != defaultHedgeDelay {
		t.Errorf("empty window: %v, want the default %v", d, defaultHedgeDelay)
	}
	for i := 1; i <= 100; i++ {
		w.record(time.Duration(i)*time.Millisecond, now)
	}
	got := w.quantile(0.99, now.Add(hedgeMergeEvery))
	if got < 97*time.Millisecond || got > 101*time.Millisecond {
		t.Errorf("p99 of 1..100ms = %v", got)
	}
	if d := p99.delayFor(&w); d < 97*time.Millisecond || d > 101*time.Millisecond {
		t.Errorf("p99 delay %v", d)
	}
	if d := HedgeMin(0.99, 50*time.Millisecond).delayFor(&w); d != 50*time.Millisecond {
		t.Errorf("min(p99,50ms) = %v", d)
	}
	if d := HedgeMax(0.99, 5*time.Millisecond).delayFor(&w); d < 97*time.Millisecond {
		t.Errorf("max(p99,5ms) = %v", d)
	}
	if d := HedgeAfter(7 * time.Millisecond).delayFor(&w); d != 7*time.Millisecond {
		t.Errorf("fixed = %v", d)
	}
	// Old samples slide out of the window.
	later := now.Add(time.Duration(hedgeWindows+1) * hedgeRotateEvery)
	if d := w.quantile(0.99, later); d != defaultHedgeDelay {
		t.Errorf("after the window slid past every sample: %v, want the default", d)
	}
}

func TestHedgeWinsOverSlowLeader(t *testing.T) {
	for _, tc := range []struct {
		name      string
		staleness time.Duration
		wantMode  readmode.Mode
	}{
		{"linearizable", 0, "read-index"},
		{"stale", 5 * time.Second, "stale"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, c := newWarmClient(t)
			cancelled := make(chan error, 1)
			cl.SetHook(slowStore(1, "Get", cancelled))
			cl.ResetRequests()
			s := c.Session(ReadPolicy{Replica: ReplicaLeader, Hedge: HedgeAfter(10 * time.Millisecond), MaxStaleness: tc.staleness})

			start := time.Now()
			v, info, err := s.GetWithInfo(context.Background(), []byte("k"))
			took := time.Since(start)
			if err != nil {
				t.Fatalf("get: %v", err)
			}
			if string(v) != "v" || !info.HedgeWon || info.StoreID == 1 || info.Mode != tc.wantMode {
				t.Errorf("got %q %+v, want v from a hedge to a follower via %s", v, info, tc.wantMode)
			}
			if took > time.Second {
				t.Errorf("hedged get took %v", took)
			}
			select {
			case err := <-cancelled:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("the slow primary ended with %v, want context.Canceled", err)
				}
			case <-time.After(2 * time.Second):
				t.Error("the slow primary was not cancelled")
			}
			for _, r := range cl.Requests() {
				if r.StoreID != 1 && (!r.ReplicaRead || (tc.staleness == 0) != (r.MaxStalenessMs == 0)) {
					t.Errorf("hedge request %+v: want a replica read, stale only if the session allows it", r)
				}
			}
			want := HedgeStats{Primaries: 1, HedgesSent: 1, HedgesWon: 1}
			if got := s.HedgeStats(); got != want {
				t.Errorf("session stats %+v, want %+v", got, want)
			}
			if got := c.HedgeStats(); got != want {
				t.Errorf("client stats %+v, want %+v", got, want)
			}
			if r := s.HedgeStats().ExtraRequestRatio(); r != 1 {
				t.Errorf("extra-request ratio %v, want 1", r)
			}
		})
	}
}

func TestHedgeBatchGetAndScan(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	cl.Put("a", "1")
	cl.Put("b", "2")
	c := newTestClient(t, cl, "")
	warm(t, c)
	cancelled := make(chan error, 4)
	hook := func(ctx context.Context, s uint64, m string) error {
		if s == 1 && (m == "BatchGet" || m == "Scan") {
			return slowStore(1, m, cancelled)(ctx, s, m)
		}
		return nil
	}
	cl.SetHook(hook)
	s := c.Session(ReadPolicy{Hedge: HedgeAfter(10 * time.Millisecond)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	got, err := s.BatchGet(ctx, [][]byte{[]byte("a"), []byte("b"), []byte("c")})
	if err != nil || len(got) != 2 || string(got["a"]) != "1" || string(got["b"]) != "2" {
		t.Errorf("batch get = %v, %v", got, err)
	}
	kvs, err := s.Scan(ctx, []byte("a"), nil, 0)
	if err != nil || len(kvs) != 2 {
		t.Errorf("scan = %v, %v", kvs, err)
	}
	if st := s.HedgeStats(); st.HedgesWon != 2 || st.HedgesSent != 2 {
		t.Errorf("stats %+v, want 2 hedges sent and won", st)
	}
}

func TestHedgeZeroBudgetNeverHedges(t *testing.T) {
	cl, c := newLateLeader(t)
	s := c.Session(ReadPolicy{Hedge: HedgeAfter(5 * time.Millisecond), HedgeBudget: -1})
	for range 3 {
		_, info, err := s.GetWithInfo(context.Background(), []byte("k"))
		if err != nil {
			t.Fatal(err)
		}
		if info.HedgeWon || info.StoreID != 1 {
			t.Errorf("info %+v, want the leader's answer, no hedge", info)
		}
	}
	want := HedgeStats{Primaries: 3, DeniedByBudget: 3}
	if got := s.HedgeStats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	for _, r := range cl.Requests() {
		if r.StoreID != 1 {
			t.Errorf("request to store %d with a zero budget: %+v", r.StoreID, r)
		}
	}
}

func TestHedgeRegionErrorDoesNotEndRace(t *testing.T) {
	cl, c := newWarmClient(t)
	var hedgeErrs atomic.Int32
	cl.SetHook(func(ctx context.Context, s uint64, m string) error {
		if m != "Get" {
			return nil
		}
		if s == 1 {
			time.Sleep(60 * time.Millisecond)
			return nil
		}
		hedgeErrs.Add(1)
		return notLeader(1)
	})
	s := c.Session(ReadPolicy{Hedge: HedgeAfter(5 * time.Millisecond)})
	v, info, err := s.GetWithInfo(context.Background(), []byte("k"))
	if err != nil || string(v) != "v" {
		t.Fatalf("get = %q, %v", v, err)
	}
	if info.HedgeWon || info.StoreID != 1 || info.Attempts != 1 {
		t.Errorf("info %+v, want the primary's answer on the first try", info)
	}
	if hedgeErrs.Load() != 1 {
		t.Errorf("%d hedges failed, want 1", hedgeErrs.Load())
	}
}

func TestWritesNeverHedged(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	c := newTestClient(t, cl, "")
	warm(t, c)
	var (
		mu    sync.Mutex
		calls = map[uint64]int{}
	)
	cl.SetHook(func(ctx context.Context, s uint64, m string) error {
		if m == "Put" || m == "Delete" {
			mu.Lock()
			calls[s]++
			mu.Unlock()
			time.Sleep(30 * time.Millisecond)
		}
		return nil
	})
	// A hedging session exists on the client; writes go through the client.
	s := c.Session(ReadPolicy{Hedge: HedgeAfter(time.Millisecond)})
	if err := c.Put(context.Background(), []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(context.Background(), []byte("k")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 1 || calls[1] != 2 {
		t.Errorf("write calls per store %v, want 2 on the leader only", calls)
	}
	if st := c.HedgeStats(); st != (HedgeStats{}) || s.HedgeStats() != (HedgeStats{}) {
		t.Errorf("stats %+v, want none", st)
	}
}

// TestReadInfoHedge: ReadInfo.Hedge says what became of a read's hedge:
// not due, sent and won, sent and lost, denied by the budget, or off.
func TestReadInfoHedge(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	cl.Put("k", "v")
	c := newTestClient(t, cl, "")
	ctx := context.Background()
	// leaderDelay holds the leader's (store 1's) Gets; followersSilent
	// makes the other stores' Gets wait until their context ends.
	var leaderDelay atomic.Int64
	var followersSilent atomic.Bool
	cl.SetHook(func(ctx context.Context, storeID uint64, method string) error {
		if method != "Get" {
			return nil
		}
		if storeID == 1 {
			select {
			case <-time.After(time.Duration(leaderDelay.Load())):
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}
		if followersSilent.Load() {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	get := func(p ReadPolicy) ReadInfo {
		t.Helper()
		_, info, err := c.Session(p).GetWithInfo(ctx, []byte("k"))
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		return info
	}
	hedge10 := ReadPolicy{Hedge: HedgeAfter(10 * time.Millisecond)}

	if info := get(ReadPolicy{}); info.Hedge != (HedgeInfo{}) {
		t.Errorf("no hedge policy: Hedge %+v, want the zero value", info.Hedge)
	}
	if info := get(ReadPolicy{Hedge: HedgeAfter(time.Second)}); info.Hedge.Outcome != HedgeNotDue || info.Hedge.Delay != time.Second || info.Hedge.PrimaryStoreID != 1 || info.Hedge.StoreID != 0 {
		t.Errorf("answered within the delay: Hedge %+v, want not-due, delay 1s, primary store 1", info.Hedge)
	}
	leaderDelay.Store(int64(time.Second))
	if info := get(hedge10); info.Hedge.Outcome != HedgeWonRace || info.Hedge.StoreID == 1 || info.Hedge.StoreID == 0 || !info.HedgeWon || info.StoreID != info.Hedge.StoreID {
		t.Errorf("slow leader: Hedge %+v (served by %d, won %v), want won at a follower", info.Hedge, info.StoreID, info.HedgeWon)
	}
	leaderDelay.Store(int64(50 * time.Millisecond))
	followersSilent.Store(true)
	if info := get(hedge10); info.Hedge.Outcome != HedgeLost || info.Hedge.StoreID == 1 || info.Hedge.StoreID == 0 || info.HedgeWon {
		t.Errorf("silent followers: Hedge %+v, want lost, sent to a follower", info.Hedge)
	}
	followersSilent.Store(false)
	if info := get(ReadPolicy{Hedge: HedgeAfter(10 * time.Millisecond), HedgeBudget: -1}); info.Hedge.Outcome != HedgeDenied || info.Hedge.StoreID != 0 {
		t.Errorf("no budget: Hedge %+v, want denied", info.Hedge)
	}
}
