package multistore

// The test's harness: the store processes, the CLI and its JSON, the
// checks of placement and leaders, the acknowledged writes.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/test/testbin"
)

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
