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
	addrs := freeAddrs(t, 10)
	zones := []string{"dc-a", "dc-b", "dc-c", "dc-a", "dc-b"}
	all := make([]*store, 5)
	for i := range all {
		all[i] = &store{id: uint64(i + 1), addr: addrs[i], status: addrs[5+i]}
	}
	peers := fmt.Sprintf("1=%s,2=%s,3=%s", addrs[0], addrs[1], addrs[2])
	for _, s := range all[:3] {
		c.start(s, zones[s.id-1], "--peers", peers)
	}
	took := c.waitUntil("region 1 has a leader", 30*time.Second, 200*time.Millisecond, func() error {
		rs, err := c.regions()
		if err != nil {
			return err
		}
		return checkLeaders(rs, nil)
	})
	t.Logf("three stores up, region 1 led, after %v", took.Round(time.Millisecond))

	join := strings.Join(addrs[:3], ",")
	for _, s := range all[3:] {
		c.start(s, zones[s.id-1], "--join", join)
	}
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
	t.Logf("stores 4 and 5 joined after %v", time.Since(testStart).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli, err := client.New(ctx, client.Config{Endpoints: addrs[:5]})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cli.Close()

	// A few hundred keys, then eight regions split at keys spread evenly
	// over them.
	acks := newAcked()
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
	t.Logf("%d keys written, split into %d regions, after %v", numKeys, numRegions, time.Since(testStart).Round(time.Millisecond))

	// The balancers spread the 24 replicas over the five stores. The spread
	// must hold for settleFor without a region moving (a snapshot of a
	// move in progress can look balanced), and the stores' own region
	// counts (ctl stores) must agree with the regions' peer lists.
	var settled []regionJSON
	var since time.Time
	allIDs := []uint64{1, 2, 3, 4, 5}
	took = c.waitUntil("replicas spread over five stores", balanceBudget, 300*time.Millisecond, func() error {
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

	t.Logf("balancer so far: %s", c.balancerActions())
	stopWriter := make(chan struct{})
	var writerWG sync.WaitGroup
	haltWriter := sync.OnceFunc(func() { close(stopWriter); writerWG.Wait() })
	defer haltWriter()     // also when the test fails half-way
	var afterKill []string // keys acked after the kill
	var killedAt time.Time
	var killMu sync.Mutex
	writerWG.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stopWriter:
				return
			default:
			}
			// Spread over every region: k0037/w00001, k0074/w00002, ...
			k := fmt.Sprintf("%s/w%05d", key(i*37%numKeys), i)
			if acks.put(ctx, cli, k, fmt.Sprintf("w%d", i)) == nil {
				killMu.Lock()
				if !killedAt.IsZero() {
					afterKill = append(afterKill, k)
				}
				killMu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	time.Sleep(300 * time.Millisecond)

	// Kill the store leading the most regions right now: it holds
	// replicas, and its regions must elect new leaders.
	rs, err := c.regions()
	if err != nil {
		t.Fatal(err)
	}
	victim, led := busiestLeader(rs)
	bad := map[uint64]bool{victim: true}
	t.Logf("killing store %d (kill -9), which leads %d of %d regions and holds %d replicas",
		victim, led, len(rs), replicaCounts(rs)[victim])
	killMu.Lock()
	killedAt = time.Now()
	killMu.Unlock()
	c.kill(victim)

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

	haltWriter()
	acks.mu.Lock()
	t.Logf("writer: %d writes acked after the kill, %d failed (last error: %v); slowest acknowledged put %v",
		len(afterKill), acks.failed, acks.lastErr, acks.slowest.Round(time.Millisecond))
	acks.mu.Unlock()
	if len(afterKill) == 0 {
		t.Errorf("no write was acknowledged after store %d was killed", victim)
	}

	// Every acknowledged write reads back: a scan of the whole key space
	// from the leaders, a Get of each key, and follower reads of a sample.
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
	// And through the CLI, against the live stores only.
	for _, k := range []string{key(0), key(numKeys / 2), key(numKeys - 1)} {
		r := c.cli("get", k)
		if want := acks.kv[k]; r.Err != nil || strings.TrimSuffix(r.Stdout, "\n") != want {
			t.Errorf("CLI get %s: %v, want %q", k, r, want)
		}
	}
	t.Logf("balancer in all: %s", c.balancerActions())
	t.Logf("%d acknowledged writes read back; whole test %v", len(acks.kv), time.Since(testStart).Round(time.Millisecond))
	c.checkAlive()
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
