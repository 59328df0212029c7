package multistore

// The test's harness: the store processes, the CLI and its JSON, the
// checks of placement and leaders, the acknowledged writes.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	launch "github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/test/testbin"
)

// ---------------------------------------------------------------- processes

// cluster is the store processes of one test (started by startFive).
type cluster struct {
	t      *testing.T
	dir    string
	procs  *launch.Processes
	mu     sync.Mutex
	killed map[uint64]bool // by the test, on purpose
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	if setupErr != nil {
		t.Fatalf("multistore test setup: %v", setupErr)
	}
	c := &cluster{t: t, dir: t.TempDir(), killed: map[uint64]bool{}}
	// Registered after t.TempDir, so it runs before the directory goes.
	t.Cleanup(func() {
		if c.procs == nil {
			return
		}
		c.procs.Stop()
		if t.Failed() {
			c.dumpLogs(80)
		}
		c.saveLogs()
	})
	return c
}

// startFounders starts stores 1..len(zones), which bootstrap the cluster
// together, one per zone, on free ports, and waits until they agree on
// region 1's leader.
func (c *cluster) startFounders(zones []string) {
	c.t.Helper()
	ports, err := testbin.FreePorts(2 * len(zones))
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.procs, err = launch.StartProcesses(ctx, launch.ProcessesConfig{
		Binary: binPath, Dir: c.dir, Zones: zones, Ports: ports, ReadyTimeout: 30 * time.Second,
		LogLevel:        "info", // the balancer's steps are counted from the logs
		BalanceInterval: balanceInterval,
		ExtraArgs:       []string{"--max-store-down-time", maxStoreDownTime.String()},
	})
	if err != nil {
		c.t.Fatalf("start stores 1-%d: %v", len(zones), err)
	}
	for _, id := range c.procs.StoreIDs() {
		c.t.Logf("store %d started: pid %d, %s, zone %s", id, c.procs.PID(id), c.procs.Endpoints[id-1], zones[id-1])
	}
}

// join starts store id in zone, joining the cluster through its stores.
func (c *cluster) join(id uint64, zone string) {
	c.t.Helper()
	if err := c.procs.Join(id, zone); err != nil {
		c.t.Fatalf("start store %d: %v", id, err)
	}
	c.t.Logf("store %d started: pid %d, zone %s", id, c.procs.PID(id), zone)
}

// kill sends SIGKILL to store id and waits for it to be gone.
func (c *cluster) kill(id uint64) {
	c.t.Helper()
	c.mu.Lock()
	c.killed[id] = true
	c.mu.Unlock()
	if err := c.procs.Kill(id); err != nil {
		c.t.Fatalf("kill -9 store %d: %v", id, err)
	}
}

// checkAlive fails the test if a store the test did not kill has exited.
func (c *cluster) checkAlive() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range c.procs.StoreIDs() {
		if !c.killed[id] && !c.procs.Running(id) {
			c.t.Fatalf("store %d exited unexpectedly: %v (log %s)", id, c.procs.ExitErr(id), c.procs.LogPath(id))
		}
	}
}

func (c *cluster) dumpLogs(lines int) {
	for _, id := range c.procs.StoreIDs() {
		path := c.procs.LogPath(id)
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(ls) > lines {
			ls = ls[len(ls)-lines:]
		}
		c.t.Logf("--- store %d log (last %d lines of %s) ---\n%s", id, len(ls), path, strings.Join(ls, "\n"))
	}
}

// balancerActions counts, over every store's log, the steps the balancers
// logged ("balancing", with why: see raftstore/balance.go and placement).
func (c *cluster) balancerActions() string {
	kinds := []struct{ name, why string }{
		{"replica moves", "spread regions"},
		{"leader transfers", "spread leaders"},
		{"down-store replacements", "replica on a down store"},
		{"missing replicas added", "missing replica"},
	}
	var out []string
	for _, k := range kinds {
		n := 0
		for _, id := range c.procs.StoreIDs() {
			b, _ := os.ReadFile(c.procs.LogPath(id))
			for line := range bytes.Lines(b) {
				if bytes.Contains(line, []byte("msg=balancing ")) && bytes.Contains(line, []byte(`why="`+k.why+`"`)) {
					n++
				}
			}
		}
		out = append(out, fmt.Sprintf("%d %s", n, k.name))
	}
	return strings.Join(out, ", ")
}

// saveLogs copies the store logs into the test's artifact directory, kept
// with `go test -artifacts [-outputdir DIR]`.
func (c *cluster) saveLogs() {
	dir := c.t.ArtifactDir()
	for _, id := range c.procs.StoreIDs() {
		path := c.procs.LogPath(id)
		if b, err := os.ReadFile(path); err == nil {
			_ = os.WriteFile(filepath.Join(dir, filepath.Base(path)), b, 0o644)
		}
	}
}

// liveEndpoints lists the gRPC addresses of the stores not killed.
func (c *cluster) liveEndpoints() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for i, id := range c.procs.StoreIDs() {
		if !c.killed[id] {
			out = append(out, c.procs.Endpoints[i])
		}
	}
	return strings.Join(out, ",")
}

// ---------------------------------------------------------------- CLI

type (
	result     = testbin.Result
	peerJSON   = testbin.PeerJSON
	regionJSON = testbin.RegionJSON
	storeJSON  = testbin.StoreJSON
)

// cli runs the hedgekv CLI against the live stores.
func (c *cluster) cli(args ...string) result {
	return testbin.Run("", cliTimeout, nil, binPath, append(args, "--endpoints", c.liveEndpoints())...)
}

func (c *cluster) regions() ([]regionJSON, error) {
	var rs []regionJSON
	err := testbin.DecodeJSON(c.cli("ctl", "regions", "--json"), "ctl regions --json", &rs)
	return rs, err
}

func (c *cluster) storesJSON() ([]storeJSON, error) {
	var ss []storeJSON
	err := testbin.DecodeJSON(c.cli("ctl", "stores", "--json"), "ctl stores --json", &ss)
	return ss, err
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
