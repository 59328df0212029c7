package client

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/hedgekv/hedgekv/client/clienttest"
	"github.com/hedgekv/hedgekv/kvpb"
)

// The harness the package's tests share: a client against clienttest's
// fake stores, hooks that script how the stores answer, and a fake clock
// for the hedge budget.

var threeZones = []string{"dc-a", "dc-b", "dc-c"}

func newTestClient(t *testing.T, cl *clienttest.Cluster, zone string) *Client {
	t.Helper()
	c, err := New(context.Background(), Config{
		Endpoints:      cl.Endpoints(),
		Zone:           zone,
		DialTimeout:    time.Second,
		RequestTimeout: 3 * time.Second,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// warm loads region metadata into the client's cache, so a later change in
// the cluster makes the cache stale.
func warm(t *testing.T, c *Client) {
	t.Helper()
	if _, err := c.Get(context.Background(), []byte("warm")); err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatalf("warm-up get: %v", err)
	}
}

// newWarmClient starts a three-zone fake cluster (store 1 leads its one
// region) holding k=v, and a client with no zone whose cache is warm.
func newWarmClient(t *testing.T) (*clienttest.Cluster, *Client) {
	t.Helper()
	cl := clienttest.NewCluster(t, threeZones...)
	cl.Put("k", "v")
	c := newTestClient(t, cl, "")
	warm(t, c)
	return cl, c
}

// failOnce returns a hook that answers err to the first call of method on
// store, and lets everything else through.
func failOnce(store uint64, method string, err error) clienttest.Hook {
	var once sync.Once
	return func(_ context.Context, s uint64, m string) error {
		var out error
		if s == store && m == method {
			once.Do(func() { out = err })
		}
		return out
	}
}

// slowStore returns a hook that holds method on store until its ctx ends
// (recording on cancelled, if it is not nil and has room, that it was
// cancelled), and lets the rest through.
func slowStore(store uint64, method string, cancelled chan<- error) clienttest.Hook {
	return func(ctx context.Context, s uint64, m string) error {
		if s != store || m != method {
			return nil
		}
		<-ctx.Done()
		select {
		case cancelled <- ctx.Err():
		default:
		}
		return ctx.Err()
	}
}

// newLateLeader is newWarmClient with a leader that answers every Get
// 400 ms late (sooner if the read is cancelled): a hedge sent after a few
// milliseconds wins the race whenever the budget allows it, even under
// -race on a loaded machine (at 40 ms, CI saw the follower's answer lose).
func newLateLeader(t *testing.T) (*clienttest.Cluster, *Client) {
	t.Helper()
	cl, c := newWarmClient(t)
	cl.SetHook(func(ctx context.Context, s uint64, m string) error {
		if s == 1 && m == "Get" {
			select {
			case <-time.After(400 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	return cl, c
}

// notLeader is region 1's NotLeader answer, naming store hint as its
// leader (0: no hint, an election is in progress).
func notLeader(hint uint64) error {
	nl := &kvpb.NotLeader{RegionId: 1}
	if hint != 0 {
		nl.Leader = &kvpb.Peer{Id: hint, StoreId: hint}
	}
	return clienttest.RegionError(codes.FailedPrecondition, &kvpb.RegionError{NotLeader: nl})
}

// fakeClock is the hedge budget's clock in tests: it moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_000_000, 0)} }

// onFakeClock puts h's budget (a session's: Session.hedger) on a new fake
// clock, and returns the clock.
func onFakeClock(h *hedger) *fakeClock {
	clk := newFakeClock()
	h.now = clk.now
	return clk
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
