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
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

// ---------------------------------------------------------------- processes

// store is one hedgekv server process.
type store struct {
	id      uint64
	addr    string // gRPC
	status  string // status HTTP
	dataDir string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	exitErr error         // set before done is closed
	killed  bool          // by the test, on purpose
}

func (s *store) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// cluster is the set of store processes of one test.
type cluster struct {
	t      *testing.T
	dir    string
	mu     sync.Mutex
	stores map[uint64]*store
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	if setupErr != nil {
		t.Fatalf("multistore test setup: %v", setupErr)
	}
	c := &cluster{t: t, dir: t.TempDir(), stores: map[uint64]*store{}}
	// Registered after t.TempDir, so it runs before the directory goes.
	t.Cleanup(func() {
		c.killAll()
		if t.Failed() {
			c.dumpLogs(80)
		}
		c.saveLogs()
	})
	return c
}

// freeAddrs returns n distinct 127.0.0.1 addresses that were free a moment
// ago.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	ports, err := testbin.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return testbin.Addrs(ports)
}

// start launches store s with the common flags plus extra.
func (c *cluster) start(s *store, zone string, extra ...string) {
	c.t.Helper()
	s.dataDir = filepath.Join(c.dir, fmt.Sprintf("store%d", s.id))
	s.logPath = filepath.Join(c.dir, fmt.Sprintf("store%d.log", s.id))
	args := append([]string{"server",
		"--id", strconv.FormatUint(s.id, 10),
		"--listen", s.addr,
		"--status", s.status,
		"--zone", zone,
		"--data-dir", s.dataDir,
		"--balance-interval", balanceInterval.String(),
		"--max-store-down-time", maxStoreDownTime.String(),
	}, extra...)
	logf, err := os.Create(s.logPath)
	if err != nil {
		c.t.Fatal(err)
	}
	fmt.Fprintf(logf, "=== %s %s\n", binPath, strings.Join(args, " "))
	cmd := exec.Command(binPath, args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		c.t.Fatalf("start store %d: %v", s.id, err)
	}
	s.cmd = cmd
	s.done = make(chan struct{})
	go func() {
		s.exitErr = cmd.Wait()
		logf.Close()
		close(s.done)
	}()
	c.mu.Lock()
	c.stores[s.id] = s
	c.mu.Unlock()
	c.t.Logf("store %d started: pid %d, %s, zone %s", s.id, cmd.Process.Pid, s.addr, zone)
}

// kill sends SIGKILL to store id and waits for it to be gone.
func (c *cluster) kill(id uint64) {
	c.t.Helper()
	s := c.stores[id]
	s.killed = true
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil && !s.exited() {
		c.t.Fatalf("kill -9 store %d: %v", id, err)
	}
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		c.t.Fatalf("store %d (pid %d) survived kill -9 for 10s", id, s.cmd.Process.Pid)
	}
}

func (c *cluster) killAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.stores {
		if s.cmd == nil || s.exited() {
			continue
		}
		_ = s.cmd.Process.Kill()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			c.t.Errorf("store %d (pid %d) still running 10s after SIGKILL", s.id, s.cmd.Process.Pid)
		}
	}
}

// checkAlive fails the test if a store the test did not kill has exited.
func (c *cluster) checkAlive() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.stores {
		if !s.killed && s.exited() {
			c.t.Fatalf("store %d exited unexpectedly: %v (log %s)", s.id, s.exitErr, s.logPath)
		}
	}
}

func (c *cluster) dumpLogs(lines int) {
	ids := make([]uint64, 0, len(c.stores))
	for id := range c.stores {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		s := c.stores[id]
		b, err := os.ReadFile(s.logPath)
		if err != nil {
			continue
		}
		ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(ls) > lines {
			ls = ls[len(ls)-lines:]
		}
		c.t.Logf("--- store %d log (last %d lines of %s) ---\n%s", id, len(ls), s.logPath, strings.Join(ls, "\n"))
	}
}

// balancerActions counts, over every store's log, the steps the balancers
// logged (see raftstore/balance.go).
func (c *cluster) balancerActions() string {
	kinds := []struct{ name, msg string }{
		{"replica moves", "moving replica to spread regions"},
		{"leader transfers", "transferring leader to spread leaders"},
		{"down-store replacements", "replacing replica on down store"},
		{"missing replicas added", "adding missing replica"},
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, k := range kinds {
		n := 0
		for _, s := range c.stores {
			b, _ := os.ReadFile(s.logPath)
			n += bytes.Count(b, []byte(`msg="`+k.msg+`"`))
		}
		out = append(out, fmt.Sprintf("%d %s", n, k.name))
	}
	return strings.Join(out, ", ")
}

// saveLogs copies the store logs into the test's artifact directory, kept
// with `go test -artifacts [-outputdir DIR]`.
func (c *cluster) saveLogs() {
	dir := c.t.ArtifactDir()
	for _, s := range c.stores {
		if b, err := os.ReadFile(s.logPath); err == nil {
			_ = os.WriteFile(filepath.Join(dir, filepath.Base(s.logPath)), b, 0o644)
		}
	}
}

// liveEndpoints lists the gRPC addresses of the stores not killed.
func (c *cluster) liveEndpoints() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []uint64
	for id, s := range c.stores {
		if !s.killed {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = c.stores[id].addr
	}
	return strings.Join(out, ",")
}

// ---------------------------------------------------------------- CLI

type result = testbin.Result

// cli runs the hedgekv CLI against the live stores.
func (c *cluster) cli(args ...string) result {
	return testbin.Run("", cliTimeout, nil, binPath, append(args, "--endpoints", c.liveEndpoints())...)
}

type peerJSON struct {
	ID        uint64 `json:"id"`
	StoreID   uint64 `json:"store_id"`
	IsLearner bool   `json:"is_learner"`
}

type regionJSON struct {
	ID            uint64     `json:"id"`
	StartKey      string     `json:"start_key"`
	EndKey        string     `json:"end_key"`
	Peers         []peerJSON `json:"peers"`
	LeaderStoreID uint64     `json:"leader_store_id"`
}

func (r regionJSON) String() string {
	ps := make([]string, len(r.Peers))
	for i, p := range r.Peers {
		ps[i] = fmt.Sprintf("%d@%d", p.ID, p.StoreID)
		if p.IsLearner {
			ps[i] += "(L)"
		}
	}
	return fmt.Sprintf("region %d [%q,%q) peers %s leader %d", r.ID, r.StartKey, r.EndKey, strings.Join(ps, ","), r.LeaderStoreID)
}

type storeJSON struct {
	ID          uint64 `json:"id"`
	Address     string `json:"address"`
	Zone        string `json:"zone"`
	Up          bool   `json:"up"`
	LeaderCount uint64 `json:"leader_count"`
	RegionCount uint64 `json:"region_count"`
}

func (c *cluster) regions() ([]regionJSON, error) {
	r := c.cli("ctl", "regions", "--json")
	if r.Err != nil {
		return nil, fmt.Errorf("ctl regions --json: %v", r)
	}
	var rs []regionJSON
	if err := json.Unmarshal([]byte(r.Stdout), &rs); err != nil {
		return nil, fmt.Errorf("ctl regions --json: %v in %q", err, r.Stdout)
	}
	return rs, nil
}

func (c *cluster) storesJSON() ([]storeJSON, error) {
	r := c.cli("ctl", "stores", "--json")
	if r.Err != nil {
		return nil, fmt.Errorf("ctl stores --json: %v", r)
	}
	var ss []storeJSON
	if err := json.Unmarshal([]byte(r.Stdout), &ss); err != nil {
		return nil, fmt.Errorf("ctl stores --json: %v in %q", err, r.Stdout)
	}
	return ss, nil
}

// waitUntil polls check every interval until it returns nil, failing the
// test with the last error after budget. It returns how long it took.
func (c *cluster) waitUntil(what string, budget, interval time.Duration, check func() error) time.Duration {
	c.t.Helper()
	start := time.Now()
	deadline := start.Add(budget)
	var last error
	for {
		c.checkAlive()
		if last = check(); last == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not reached within %v; last: %v", what, budget, last)
		}
		time.Sleep(interval)
	}
}

// ---------------------------------------------------------------- checks

// replicaCounts counts, per store, the regions with a peer there.
func replicaCounts(rs []regionJSON) map[uint64]int {
	n := map[uint64]int{}
	for _, r := range rs {
		for _, p := range r.Peers {
			n[p.StoreID]++
		}
	}
	return n
}

// checkVoters: there are want regions, each with exactly three voters on
// three distinct stores, no learners, none on a store in bad.
func checkVoters(rs []regionJSON, want int, bad map[uint64]bool) error {
	if len(rs) != want {
		return fmt.Errorf("%d regions, want %d: %v", len(rs), want, rs)
	}
	for _, r := range rs {
		stores := map[uint64]bool{}
		for _, p := range r.Peers {
			if p.IsLearner {
				return fmt.Errorf("%v has a learner", r)
			}
			if bad[p.StoreID] {
				return fmt.Errorf("%v has a replica on dead store %d", r, p.StoreID)
			}
			stores[p.StoreID] = true
		}
		if len(r.Peers) != 3 || len(stores) != 3 {
			return fmt.Errorf("%v: want exactly 3 voters on 3 stores", r)
		}
	}
	return nil
}

// checkSpread: every store in ids holds replicas, and the counts differ
// by at most maxSpread.
func checkSpread(rs []regionJSON, ids []uint64) error {
	n := replicaCounts(rs)
	lo, hi := -1, -1
	for _, id := range ids {
		if lo < 0 || n[id] < lo {
			lo = n[id]
		}
		if n[id] > hi {
			hi = n[id]
		}
	}
	if lo == 0 || hi-lo > maxSpread {
		return fmt.Errorf("replicas per store %v: want every store of %v within %d of each other", n, ids, maxSpread)
	}
	return nil
}

// checkStoreCounts: ctl stores' region_count of every live store equals
// the number of regions rs places a replica on it (no leftover or missing
// replicas in the stores' own accounts).
func checkStoreCounts(c *cluster, rs []regionJSON) error {
	ss, err := c.storesJSON()
	if err != nil {
		return err
	}
	n := replicaCounts(rs)
	for _, s := range ss {
		if s.Up && int(s.RegionCount) != n[s.ID] {
			return fmt.Errorf("store %d reports %d regions, the regions place %d replicas on it (stores %+v)", s.ID, s.RegionCount, n[s.ID], ss)
		}
	}
	return nil
}

// samePlacement: the same regions with the same peers (leaders may move).
func samePlacement(a, b []regionJSON) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || !slices.Equal(a[i].Peers, b[i].Peers) {
			return false
		}
	}
	return true
}

// busiestLeader returns the store leading the most regions (the lowest id
// on a tie) and how many it leads.
func busiestLeader(rs []regionJSON) (uint64, int) {
	n := map[uint64]int{}
	for _, r := range rs {
		if r.LeaderStoreID != 0 {
			n[r.LeaderStoreID]++
		}
	}
	var best uint64
	for id, k := range n {
		if best == 0 || k > n[best] || (k == n[best] && id < best) {
			best = id
		}
	}
	return best, n[best]
}

// checkLeaders: every region has a leader, on a store not in bad, that
// hosts one of its peers.
func checkLeaders(rs []regionJSON, bad map[uint64]bool) error {
	for _, r := range rs {
		if r.LeaderStoreID == 0 || bad[r.LeaderStoreID] {
			return fmt.Errorf("%v: no leader on a live store", r)
		}
		if !slices.ContainsFunc(r.Peers, func(p peerJSON) bool { return p.StoreID == r.LeaderStoreID }) {
			return fmt.Errorf("%v: leader on a store without a peer", r)
		}
	}
	return nil
}

// ---------------------------------------------------------------- writes

// acked records the writes the cluster acknowledged.
type acked struct {
	mu      sync.Mutex
	kv      map[string]string
	tried   map[string]bool // every key a put was attempted for
	failed  int
	lastErr error
	slowest time.Duration // the longest an acknowledged put took
}

func newAcked() *acked { return &acked{kv: map[string]string{}, tried: map[string]bool{}} }

func (a *acked) put(ctx context.Context, cli *client.Client, k, v string) error {
	a.mu.Lock()
	a.tried[k] = true
	a.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	start := time.Now()
	err := cli.Put(pctx, []byte(k), []byte(v))
	took := time.Since(start)
	cancel()
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.failed++
		a.lastErr = err
		return err
	}
	a.kv[k] = v
	a.slowest = max(a.slowest, took)
	return nil
}

func key(i int) string { return fmt.Sprintf("k%04d", i) }

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
