package raftstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/replica"
	"github.com/hedgekv/hedgekv/storage/engine"
)

// miniCluster is stores on the in-memory network for this package's own
// tests (raftstoretest imports this package), with a cluster view that can
// mark a store being removed.
type miniCluster struct {
	t       *testing.T
	dir     string
	net     *InmemNetwork
	initial []uint64
	mod     func(*Config)

	mu       sync.Mutex
	stores   map[uint64]*Store
	removing map[uint64]bool
}

func newMiniCluster(t *testing.T, n int, mod func(*Config)) *miniCluster {
	t.Helper()
	c := &miniCluster{t: t, dir: t.TempDir(), net: NewInmemNetwork(), mod: mod,
		stores: map[uint64]*Store{}, removing: map[uint64]bool{}}
	for i := 1; i <= n; i++ {
		c.initial = append(c.initial, uint64(i))
	}
	for _, id := range c.initial {
		c.start(id)
	}
	t.Cleanup(c.shutdown)
	c.waitFor(10*time.Second, "region 1 has a leader", func() bool { _, ok := c.leaderOf([]byte("")); return ok })
	return c
}

// open opens store id on its data dir, not yet running.
func (c *miniCluster) open(id uint64) *Store {
	c.t.Helper()
	out := io.Discard
	if testing.Verbose() {
		out = os.Stderr
	}
	cfg := Config{
		StoreID: id, Zone: fmt.Sprintf("z%d", id), DataDir: filepath.Join(c.dir, fmt.Sprint(id)),
		InitialStores: c.initial, TickInterval: 10 * time.Millisecond, ElectionTicks: 10,
		SplitCheckInterval: -1, BalanceInterval: -1, HibernateAfter: -1, NoSync: true,
		Logger: slog.New(slog.NewTextHandler(out, nil)),
	}
	if c.mod != nil {
		c.mod(&cfg)
	}
	s, err := NewStore(cfg, c.net.Transport(id))
	if err != nil {
		c.t.Fatalf("open store %d: %v", id, err)
	}
	s.SetClusterView(c)
	return s
}

// run starts an opened store.
func (c *miniCluster) run(id uint64, s *Store) {
	c.mu.Lock()
	c.stores[id] = s
	c.mu.Unlock()
	c.net.Register(id, s)
	s.Start()
}

func (c *miniCluster) start(id uint64) *Store {
	s := c.open(id)
	c.run(id, s)
	return s
}

func (c *miniCluster) take(id uint64) *Store {
	c.mu.Lock()
	s := c.stores[id]
	delete(c.stores, id)
	c.mu.Unlock()
	c.net.Unregister(id)
	return s
}

// stop stops store id gracefully; kill as kill -9 would: nothing after its
// last checkpoint survives.
func (c *miniCluster) stop(id uint64) {
	if s := c.take(id); s != nil {
		_ = s.Stop()
	}
}

func (c *miniCluster) kill(id uint64) {
	s := c.take(id)
	if s == nil {
		return
	}
	s.stopOnce.Do(func() {
		close(s.stopc)
		<-s.done
		s.bg.Wait()
		s.snaps.close()
		s.eng.Crash()
	})
}

func (c *miniCluster) shutdown() {
	c.mu.Lock()
	var ids []uint64
	for id := range c.stores {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		c.stop(id)
	}
	c.net.ClearFilters()
	c.net.Wait()
}

func (c *miniCluster) store(id uint64) *Store {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stores[id]
}

func (c *miniCluster) all() map[uint64]*Store {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[uint64]*Store{}
	for id, s := range c.stores {
		out[id] = s
	}
	return out
}

// Stores is the cluster view.
func (c *miniCluster) Stores(context.Context) []StoreInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []StoreInfo
	for id := uint64(1); id <= uint64(len(c.initial))+1; id++ {
		_, up := c.stores[id]
		out = append(out, StoreInfo{ID: id, Up: up, Removing: c.removing[id]})
	}
	return out
}

// leaderOf returns the store leading the region that holds key, in the
// highest term seen.
func (c *miniCluster) leaderOf(key []byte) (*Store, bool) {
	var best *Store
	var term uint64
	for _, s := range c.all() {
		for _, st := range s.Regions() {
			if st.IsLeader && st.Region.Contains(key) && st.Term >= term {
				best, term = s, st.Term
			}
		}
	}
	return best, best != nil
}

// mustLeaderOf waits for the leader of key's region: one that was just
// split off, or whose leader just moved, may have none for a moment.
func (c *miniCluster) mustLeaderOf(key []byte) *Store {
	c.t.Helper()
	var s *Store
	c.waitFor(10*time.Second, fmt.Sprintf("a leader for %q's region", key), func() bool {
		var ok bool
		s, ok = c.leaderOf(key)
		return ok
	})
	return s
}

func (c *miniCluster) waitFor(d time.Duration, what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// do runs op on the leader of key's region until it succeeds or ctx ends.
func (c *miniCluster) do(ctx context.Context, key []byte, op func(context.Context, *Store) error) error {
	var last error
	for {
		if s, ok := c.leaderOf(key); ok {
			octx, cancel := context.WithTimeout(ctx, 2*time.Second)
			last = op(octx, s)
			cancel()
			if last == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (c *miniCluster) put(ctx context.Context, key, value []byte) {
	c.t.Helper()
	id := rand.Uint64() | 1
	if err := c.do(ctx, key, func(ctx context.Context, s *Store) error {
		return s.Put(ctx, WriteOptions{RequestID: id}, key, value)
	}); err != nil {
		c.t.Fatalf("put %q: %v", key, err)
	}
}

// load writes n values of size bytes under prefix, from 16 writers.
func (c *miniCluster) load(ctx context.Context, prefix string, n, size int) {
	c.t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				k := fmt.Appendf(nil, "%s%05d", prefix, i)
				v := bytes.Repeat([]byte{byte('a' + i%26)}, size)
				id := rand.Uint64() | 1
				if err := c.do(ctx, k, func(ctx context.Context, s *Store) error {
					return s.Put(ctx, WriteOptions{RequestID: id}, k, v)
				}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		c.t.Fatal(err)
	}
}

// splitInto splits the key space into n regions, at "r01" .. "r<n-1>"
// (two digits): region i holds the keys "r<i>/...".
func (c *miniCluster) splitInto(ctx context.Context, n int) {
	c.t.Helper()
	for i := 1; i < n; i++ {
		key := fmt.Appendf(nil, "r%02d", i)
		if err := c.do(ctx, key, func(ctx context.Context, s *Store) error { _, _, err := s.Split(ctx, key); return err }); err != nil {
			c.t.Fatalf("split at %q: %v", key, err)
		}
	}
}

// agree waits until every running store's replica of regionID is at one
// applied index with the same data.
func (c *miniCluster) agree(regionID uint64, stores int) {
	c.t.Helper()
	var last []replica.Digest
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		last = last[:0]
		for _, s := range c.all() {
			if d, err := s.RegionDigest(regionID); err == nil {
				last = append(last, d)
			}
		}
		ok := len(last) == stores
		for _, d := range last {
			ok = ok && d.AppliedIndex == last[0].AppliedIndex && d.Hash == last[0].Hash && d.Keys == last[0].Keys
		}
		if ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("region %d: replicas never agreed: %v", regionID, last)
}

// applyGate blocks the apply worker at its nth transaction (counted over
// every apply) until released.
type applyGate struct {
	mu      sync.Mutex
	calls   int
	at      int
	reached chan struct{}
	release chan struct{}
}

func (g *applyGate) hook(uint64) {
	g.mu.Lock()
	g.calls++
	if g.calls != g.at {
		g.mu.Unlock()
		return
	}
	reached, release := g.reached, g.release
	g.mu.Unlock()
	close(reached)
	<-release
}

// arm blocks the worker at its at-th transaction from the first.
func (g *applyGate) arm(at int) (reached, release chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.at, g.reached, g.release = at, make(chan struct{}), make(chan struct{})
	return g.reached, g.release
}

func (g *applyGate) waitReached(t *testing.T, reached chan struct{}) {
	t.Helper()
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the snapshot apply never reached the gate")
	}
}

// smallBatches makes applies and clears take many transactions, each
// passing the gate, on every store its config is given to.
func smallBatches(t *testing.T) *applyGate {
	t.Helper()
	return &applyGate{}
}

// config gives a store the small transactions (its Config's).
func (g *applyGate) config(cfg *Config) {
	cfg.applyBatchBytes, cfg.clearBatchKeys = 64<<10, 128
	cfg.Knobs.beforeApplyBatch = g.hook
}

// An apply's transactions: the first stop check, one each to clear the
// range's pairs, its dedup records and the region's log (each fits in one
// here), then one per batch written.
const gateBeforeWrites = 4

func countData(t *testing.T, s *Store) (pairs, records int) {
	t.Helper()
	err := s.eng.View(func(tx *engine.Tx) error {
		tx.ForEachData(nil, nil, func(k, v []byte) bool { pairs++; return true })
		return tx.ForEachDedup(nil, nil, func(engine.DedupRecord) error { records++; return nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	return pairs, records
}

// A new replica's snapshot applies outside the loop in bounded
// transactions. Killed half-way (after a checkpoint that holds the marker
// and part of the data, and with batches written after it that the crash
// loses), the store finishes the apply from the file when it opens, before
// any peer loads: the replica is whole at the snapshot's index, and the add
// completes with every replica agreeing.
func TestSnapshotApplyKilledHalfwayFinishesFromItsFile(t *testing.T) {
	g := smallBatches(t)
	c := newMiniCluster(t, 3, g.config)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 2000
	c.load(ctx, "k", n, 1000)
	c.start(4)
	reached, release := g.arm(gateBeforeWrites + 3)
	go func() {
		_ = c.do(ctx, []byte("k"), func(ctx context.Context, s *Store) error { return s.AddPeer(ctx, 1, 4) })
	}()
	g.waitReached(t, reached)
	s4 := c.store(4)
	if err := s4.eng.CheckpointIfDue(true); err != nil {
		t.Fatal(err)
	}
	if a, _ := s4.eng.MarkerCount(); a != 1 {
		t.Fatalf("%d apply markers checkpointed, want 1", a)
	}
	reached, release2 := g.arm(gateBeforeWrites + 8)
	close(release)
	g.waitReached(t, reached)
	// Killed between two transactions: halt the worker, then crash.
	s4.snaps.mu.Lock()
	s4.snaps.halted = true
	s4.snaps.mu.Unlock()
	close(release2)
	c.kill(4)

	s4 = c.open(4)
	if a, cl := s4.eng.MarkerCount(); a != 0 || cl != 0 {
		t.Fatalf("after open: %d apply and %d clear markers left", a, cl)
	}
	d, err := s4.RegionDigest(1)
	if err != nil {
		t.Fatalf("store 4 after open: %v", err)
	}
	if d.Keys != n || d.AppliedIndex == 0 {
		t.Fatalf("store 4 after open: %v; want %d keys", d, n)
	}
	c.run(4, s4)
	if err := c.do(ctx, []byte("k"), func(ctx context.Context, s *Store) error { return s.AddPeer(ctx, 1, 4) }); err != nil {
		t.Fatal(err)
	}
	c.put(ctx, []byte("after"), []byte("v"))
	c.agree(1, 4)
}

// A follower that fell behind the log gets a snapshot; while it is applied
// the follower serves no read (it holds part of it), the region goes on
// taking writes, and a graceful stop half-way leaves the apply to be
// finished from its file at the next open.
func TestSnapshotApplyToAFollowerServesNothingUntilDone(t *testing.T) {
	g := smallBatches(t)
	c := newMiniCluster(t, 3, func(cfg *Config) { g.config(cfg); cfg.LogGCThreshold = 50 })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 100 {
		c.put(ctx, fmt.Appendf(nil, "a%04d", i), []byte("old"))
	}
	c.agree(1, 3)
	leader := c.mustLeaderOf([]byte("a"))
	var victim uint64
	for id := range c.all() {
		if id != leader.ID() {
			victim = id
		}
	}
	heal := c.net.AddFilter(IsolateFilter(victim))
	const n = 2000
	c.load(ctx, "k", n, 1000)
	// Snapshots are built from the leader's committed state (batch.go):
	// commit the load, so that the snapshot holds all of it.
	if err := c.store(leader.ID()).eng.CheckpointIfDue(true); err != nil {
		t.Fatal(err)
	}
	reached, release := g.arm(gateBeforeWrites + 3)
	heal()
	g.waitReached(t, reached)
	vs := c.store(victim)
	for _, opts := range []ReadOptions{{ReplicaRead: true}, {ReplicaRead: true, MaxStaleness: time.Hour}} {
		rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		v, found, _, err := vs.Get(rctx, opts, []byte("a0001"))
		rcancel()
		var nf *region.RegionNotFoundError
		if !errors.As(err, &nf) {
			t.Fatalf("read %+v from the follower applying a snapshot: %q %v, err %v; want RegionNotFound", opts, v, found, err)
		}
	}
	if _, err := vs.RegionDigest(1); !IsReplicaNotFound(err) {
		t.Fatalf("digest of a replica applying a snapshot: %v", err)
	}
	c.put(ctx, []byte("during"), []byte("v")) // the region takes writes meanwhile
	stopped := make(chan struct{})
	go func() { c.stop(victim); close(stopped) }()
	// Release the apply only once the stop is under way, so that it finds
	// the store stopping half-way.
	c.waitFor(5*time.Second, "the victim's stop begins", vs.stopped)
	close(release)
	<-stopped

	vs = c.open(victim)
	d, err := vs.RegionDigest(1)
	if err != nil || d.Keys < n+100 {
		t.Fatalf("store %d after open: %v, %v; want at least %d keys", victim, d, err, n+100)
	}
	c.run(victim, vs)
	c.put(ctx, []byte("after"), []byte("v"))
	c.agree(1, 3)
	v, found, _, err := vs.Get(ctx, ReadOptions{ReplicaRead: true}, []byte("k01999"))
	if err != nil || !found || len(v) != 1000 {
		t.Fatalf("follower read after the apply: %d bytes, %v, %v", len(v), found, err)
	}
}

// A replica removed while its snapshot applies: the worker stops and clears
// what it wrote, and no marker is left.
func TestSnapshotApplyOfAPeerRemovedHalfwayIsCleared(t *testing.T) {
	g := smallBatches(t)
	c := newMiniCluster(t, 3, g.config)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.load(ctx, "k", 1000, 1000)
	c.start(4)
	reached, release := g.arm(gateBeforeWrites + 3)
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	go func() {
		_ = c.do(actx, []byte("k"), func(ctx context.Context, s *Store) error { return s.AddPeer(ctx, 1, 4) })
	}()
	g.waitReached(t, reached)
	acancel()
	if err := c.do(ctx, []byte("k"), func(ctx context.Context, s *Store) error { return s.RemovePeer(ctx, 1, 4) }); err != nil {
		t.Fatal(err)
	}
	s4 := c.store(4)
	c.waitFor(10*time.Second, "store 4's replica destroyed", func() bool {
		p, ok := s4.peer(1)
		return !ok || p.isRemoved()
	})
	close(release)
	c.waitFor(10*time.Second, "store 4's partial apply cleared", func() bool {
		pairs, records := countData(t, s4)
		a, cl := s4.eng.MarkerCount()
		return pairs == 0 && records == 0 && a == 0 && cl == 0
	})
}
