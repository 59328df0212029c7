// Package multistore runs five hedgekv stores as separate processes: three
// that bootstrap the cluster and two that join it. It splits the key space
// into eight regions, waits for the stores' balancers to spread the
// replicas over all five stores, then kills one store with SIGKILL and
// checks that every region gets a leader again at once, that the balancers
// replace the dead store's replicas on the live stores, and that every
// acknowledged write is still readable.
//
// The binary comes from $HEDGEKV_BIN when set (the Makefile passes
// bin/hedgekv); otherwise TestMain builds ./cmd/hedgekv into a temporary
// directory, so `go test ./...` works on its own. Like test/smoke it is run
// without -race: the processes under test are the built binary. The store
// logs are printed (last lines) when the test fails and copied to the
// artifact directory: `go test -artifacts -outputdir DIR` keeps them.
package multistore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/test/testbin"
)

const (
	// Server settings: a quick balancer, and a store counts as dead for
	// replica repair after maxStoreDownTime.
	balanceInterval  = 500 * time.Millisecond
	maxStoreDownTime = 3 * time.Second

	// leaderBudget: after the kill every region must have a leader on a
	// live store this soon (a few election timeouts, plus the time the
	// stores need to notice the dead store and wake hibernating regions).
	leaderBudget = 5 * time.Second
	// repairBudget: every region must be back to three voters on live
	// stores this soon after the kill.
	repairBudget = 60 * time.Second
	// balanceBudget bounds the wait for the replicas to spread out after
	// the splits.
	balanceBudget = 45 * time.Second

	// settleFor is how long the placement must stay unchanged to count
	// as settled: several balance rounds.
	settleFor = 4 * balanceInterval

	numKeys    = 400
	numRegions = 8
	// maxSpread is the most the replica counts of two live stores may
	// differ once the balancers have settled.
	maxSpread = 2

	cliTimeout = 10 * time.Second
)

var (
	repoRoot string
	binPath  string
	setupErr error
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	b, err := testbin.Locate("hedgekv-multistore-bin-")
	if err != nil {
		setupErr = err
		return m.Run()
	}
	defer b.Close()
	repoRoot, binPath = b.RepoRoot, b.Path
	return m.Run()
}

// ---------------------------------------------------------------- the test

func TestKillStoreOfFive(t *testing.T) {
	testStart := time.Now()
	c := newCluster(t)
	endpoints := c.startFive()
	t.Logf("stores 4 and 5 joined after %v", time.Since(testStart).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli, err := client.New(ctx, client.Config{Endpoints: endpoints})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cli.Close()

	acks := newAcked()
	c.writeAndSplit(ctx, cli, acks)
	t.Logf("%d keys written, split into %d regions, after %v", numKeys, numRegions, time.Since(testStart).Round(time.Millisecond))
	c.waitSpread()

	t.Logf("balancer so far: %s", c.balancerActions())
	w := startWriter(ctx, cli, acks)
	defer w.halt() // also when the test fails half-way
	w.waitAcked(t, 20)
	victim := c.killBusiestLeader(w)
	c.waitRepaired(victim, w.killed())

	w.halt()
	acks.mu.Lock()
	t.Logf("writer: %d writes acked after the kill, %d failed (last error: %v); slowest acknowledged put %v",
		len(w.afterKill), acks.failed, acks.lastErr, acks.slowest.Round(time.Millisecond))
	acks.mu.Unlock()
	if len(w.afterKill) == 0 {
		t.Errorf("no write was acknowledged after store %d was killed", victim)
	}

	verifyReads(ctx, t, c, cli, acks)
	t.Logf("balancer in all: %s", c.balancerActions())
	t.Logf("%d acknowledged writes read back; whole test %v", len(acks.kv), time.Since(testStart).Round(time.Millisecond))
	c.checkAlive()
}

// startFive starts stores 1-3, which bootstrap the cluster, waits until
// region 1 has a leader, then stores 4 and 5, which join it, and waits
// until all five are up. It returns their gRPC addresses.
func (c *cluster) startFive() []string {
	t := c.t
	t.Helper()
	c.startFounders([]string{"dc-a", "dc-b", "dc-c"})
	took := c.waitUntil("region 1 has a leader", 30*time.Second, 200*time.Millisecond, func() error {
		rs, err := c.regions()
		if err != nil {
			return err
		}
		return checkLeaders(rs, nil)
	})
	t.Logf("three stores up, region 1 led, after %v", took.Round(time.Millisecond))

	c.join(4, "dc-a")
	c.join(5, "dc-b")
	c.waitUntil("five stores up", 30*time.Second, 200*time.Millisecond, func() error {
		ss, err := c.storesJSON()
		if err != nil {
			return err
		}
		up := 0
		for _, s := range ss {
			if s.Up {
				up++
			}
		}
		if len(ss) != 5 || up != 5 {
			return fmt.Errorf("stores: %+v", ss)
		}
		return nil
	})
	return c.procs.Endpoints
}

// writeAndSplit writes numKeys keys, then splits the key space into
// numRegions regions at keys spread evenly over them.
func (c *cluster) writeAndSplit(ctx context.Context, cli *client.Client, acks *acked) {
	t := c.t
	t.Helper()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < numKeys; i += 8 {
				if err := acks.put(ctx, cli, key(i), fmt.Sprintf("v%d", i)); err != nil {
					t.Errorf("put %s: %v", key(i), err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for i := 1; i < numRegions; i++ {
		k := key(i * numKeys / numRegions)
		if r := c.cli("ctl", "split", k); r.Err != nil {
			t.Fatalf("ctl split %s: %v", k, r)
		}
	}
}

// waitSpread waits until the balancers have spread the 24 replicas over
// the five stores. The spread must hold for settleFor without a region
// moving (a snapshot of a move in progress can look balanced), and the
// stores' own region counts (ctl stores) must agree with the regions'
// peer lists.
func (c *cluster) waitSpread() {
	t := c.t
	t.Helper()
	var settled []regionJSON
	var since time.Time
	allIDs := []uint64{1, 2, 3, 4, 5}
	took := c.waitUntil("replicas spread over five stores", balanceBudget, 300*time.Millisecond, func() error {
		rs, err := c.regions()
		if err == nil {
			err = checkVoters(rs, numRegions, nil)
		}
		if err == nil {
			err = checkSpread(rs, allIDs)
		}
		if err == nil {
			err = checkStoreCounts(c, rs)
		}
		if err != nil {
			since = time.Time{}
			return err
		}
		if since.IsZero() || !samePlacement(rs, settled) {
			settled, since = rs, time.Now()
		}
		if d := time.Since(since); d < settleFor {
			return fmt.Errorf("balanced for %v only", d.Round(time.Millisecond))
		}
		return nil
	})
	t.Logf("replicas spread and steady for %v after %v: per store %v", settleFor, took.Round(time.Millisecond), replicaCounts(settled))
	for _, r := range settled {
		t.Logf("  %v", r)
	}
	if ss, err := c.storesJSON(); err == nil {
		t.Logf("ctl stores: %+v", ss)
	}
}

// writer writes in the background over every region, through the kill,
// and keeps the keys acknowledged after it.
type writer struct {
	acks      *acked
	done      chan struct{}
	wg        sync.WaitGroup
	halt      func() // stops the writer and waits for it; more than once is fine
	mu        sync.Mutex
	killedAt  time.Time
	afterKill []string // keys acked after the kill
	written   atomic.Int64
}

func startWriter(ctx context.Context, cli *client.Client, acks *acked) *writer {
	w := &writer{acks: acks, done: make(chan struct{})}
	w.halt = sync.OnceFunc(func() {
		close(w.done)
		w.wg.Wait()
	})
	w.wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-w.done:
				return
			default:
			}
			// Spread over every region: k0037/w00001, k0074/w00002, ...
			k := fmt.Sprintf("%s/w%05d", key(i*37%numKeys), i)
			if acks.put(ctx, cli, k, fmt.Sprintf("w%d", i)) == nil {
				w.written.Add(1)
				w.mu.Lock()
				if !w.killedAt.IsZero() {
					w.afterKill = append(w.afterKill, k)
				}
				w.mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	return w
}

// waitAcked waits (at most 10 s) until the writer has had n writes
// acknowledged, so that the kill lands on a running load.
func (w *writer) waitAcked(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for w.written.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the writer has %d writes acknowledged after 10s, want %d", w.written.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// kill marks the moment of the kill; killed returns it.
func (w *writer) kill() {
	w.mu.Lock()
	w.killedAt = time.Now()
	w.mu.Unlock()
}

func (w *writer) killed() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.killedAt
}

// killBusiestLeader kills (kill -9) the store leading the most regions
// right now: it holds replicas, and its regions must elect new leaders.
func (c *cluster) killBusiestLeader(w *writer) uint64 {
	t := c.t
	t.Helper()
	rs, err := c.regions()
	if err != nil {
		t.Fatal(err)
	}
	victim, led := busiestLeader(rs)
	t.Logf("killing store %d (kill -9), which leads %d of %d regions and holds %d replicas",
		victim, led, len(rs), replicaCounts(rs)[victim])
	w.kill()
	c.kill(victim)
	return victim
}

// waitRepaired waits until every region is led by a live store (within
// leaderBudget of the kill) and then has three voters on live stores
// (within repairBudget).
func (c *cluster) waitRepaired(victim uint64, killedAt time.Time) {
	t := c.t
	t.Helper()
	bad := map[uint64]bool{victim: true}
	c.waitUntil("every region led by a live store", leaderBudget, 100*time.Millisecond, func() error {
		rs, err := c.regions()
		if err != nil {
			return err
		}
		if len(rs) != numRegions {
			return fmt.Errorf("%d regions, want %d", len(rs), numRegions)
		}
		return checkLeaders(rs, bad)
	})
	t.Logf("every region led by a live store %v after the kill", time.Since(killedAt).Round(time.Millisecond))

	var repaired []regionJSON
	c.waitUntil("dead store's replicas replaced", repairBudget, 300*time.Millisecond, func() error {
		rs, err := c.regions()
		if err != nil {
			return err
		}
		if err := checkVoters(rs, numRegions, bad); err != nil {
			return err
		}
		if err := checkLeaders(rs, bad); err != nil {
			return err
		}
		repaired = rs
		return nil
	})
	t.Logf("every region has 3 voters on live stores %v after the kill: per store %v",
		time.Since(killedAt).Round(time.Millisecond), replicaCounts(repaired))
	for _, r := range repaired {
		t.Logf("  %v", r)
	}
}

// verifyReads: every acknowledged write reads back, by a scan of the whole
// key space from the leaders, a Get of each key, follower reads of a
// sample, and the CLI against the live stores only.
func verifyReads(ctx context.Context, t *testing.T, c *cluster, cli *client.Client, acks *acked) {
	t.Helper()
	verifyAcked(ctx, t, cli, acks)
	fol := cli.Session(client.ReadPolicy{Replica: client.ReplicaFollower})
	n := 0
	for k, v := range acks.kv {
		if n++; n > 100 {
			break
		}
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := fol.Get(gctx, []byte(k))
		cancel()
		if err != nil || string(got) != v {
			t.Errorf("follower read of %s = %q, %v; want %q", k, got, err, v)
		}
	}
	for _, k := range []string{key(0), key(numKeys / 2), key(numKeys - 1)} {
		r := c.cli("get", k)
		if want := acks.kv[k]; r.Err != nil || strings.TrimSuffix(r.Stdout, "\n") != want {
			t.Errorf("CLI get %s: %v, want %q", k, r, want)
		}
	}
}

// verifyAcked reads every acknowledged key back, by Get and by one scan of
// the whole key space; a scan may also return keys whose put failed (the
// write may have landed), never keys no one wrote.
func verifyAcked(ctx context.Context, t *testing.T, cli *client.Client, a *acked) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	keys := make([]string, 0, len(a.kv))
	for k := range a.kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := cli.Get(gctx, []byte(k))
		cancel()
		if err != nil || string(got) != a.kv[k] {
			errs = append(errs, fmt.Errorf("get %s = %q, %v; want %q", k, got, err, a.kv[k]))
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	kvs, err := cli.Scan(sctx, []byte("\x00"), nil, 10000)
	cancel()
	if err != nil {
		errs = append(errs, fmt.Errorf("scan: %w", err))
	} else {
		seen := map[string]bool{}
		for _, kv := range kvs {
			k := string(kv.Key)
			seen[k] = true
			if want, ok := a.kv[k]; ok && string(kv.Value) != want {
				errs = append(errs, fmt.Errorf("scan: %s = %q, want %q", k, kv.Value, want))
			} else if !ok && !a.tried[k] {
				errs = append(errs, fmt.Errorf("scan: %s = %q was never written", k, kv.Value))
			}
		}
		for _, k := range keys {
			if !seen[k] {
				errs = append(errs, fmt.Errorf("scan: acknowledged key %s missing", k))
			}
		}
		if !slices.IsSortedFunc(kvs, func(x, y client.KV) int { return bytes.Compare(x.Key, y.Key) }) {
			errs = append(errs, errors.New("scan: keys out of order"))
		}
	}
	if len(errs) > 0 {
		if len(errs) > 20 {
			errs = append(errs[:20], fmt.Errorf("... and %d more", len(errs)-20))
		}
		t.Errorf("acknowledged writes not read back:\n%v", errors.Join(errs...))
	}
}
