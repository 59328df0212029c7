// Package smoke runs a real three-store hedgekv cluster as separate
// processes (through scripts/cluster.sh) and drives it with the CLI: writes,
// reads and scans, a kill -9 of the leader of region 1, fail-over, a restart,
// and a read-back of every acknowledged write.
//
// The binary comes from $HEDGEKV_BIN when set (the Makefile passes
// bin/hedgekv); otherwise TestMain builds ./cmd/hedgekv into a temporary
// directory, so `go test ./...` works on its own.
package smoke

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/test/testbin"
)

const (
	// failoverBudget is how soon after the leader's store is killed reads
	// and writes must succeed again.
	failoverBudget = 3 * time.Second
	// failoverGiveUp bounds the wait, so that a slow fail-over is measured
	// and reported rather than only timed out.
	failoverGiveUp = 20 * time.Second
	// cliTimeout bounds every CLI invocation.
	cliTimeout = 10 * time.Second
	// attemptTimeout bounds one attempt inside a retry loop.
	attemptTimeout = 2 * time.Second
	// clusterTimeout bounds cluster.sh start/restart/stop.
	clusterTimeout = 90 * time.Second
)

var (
	repoRoot string // absolute path of the repository
	binPath  string // the hedgekv binary under test
	setupErr error  // why the binary is not available
	skipWhy  string // non-empty: skip every test
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if _, err := exec.LookPath("bash"); err != nil {
		skipWhy = "bash not found: the smoke test drives scripts/cluster.sh"
		return m.Run()
	}
	b, err := testbin.Locate("hedgekv-smoke-bin-")
	if err != nil {
		setupErr = err
		return m.Run()
	}
	defer b.Close()
	repoRoot, binPath = b.RepoRoot, b.Path
	return m.Run()
}

// cluster is one cluster.sh-managed cluster on free ports.
type cluster struct {
	t         *testing.T
	dir       string
	env       []string
	endpoints string
}

type (
	result     = testbin.Result
	regionJSON = testbin.RegionJSON
	storeJSON  = testbin.StoreJSON
)

// run executes name args... in the repository with env, bounded by timeout.
func run(timeout time.Duration, env []string, name string, args ...string) result {
	return testbin.Run(repoRoot, timeout, env, name, args...)
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	return startClusterEnv(t)
}

// startClusterEnv starts a cluster with extra environment for cluster.sh
// (BALANCE=500ms, say).
func startClusterEnv(t *testing.T, extraEnv ...string) *cluster {
	t.Helper()
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	if setupErr != nil {
		t.Fatalf("smoke test setup: %v", setupErr)
	}
	dir := t.TempDir()
	ports, err := testbin.FreePorts(6)
	if err != nil {
		t.Fatal(err)
	}
	grpc, status := ports[:3], ports[3:]
	addrs := testbin.Addrs(grpc)
	c := &cluster{
		t:   t,
		dir: dir,
		env: append(os.Environ(),
			"BIN="+binPath,
			"CLUSTER_DIR="+dir,
			"GRPC_PORTS="+testbin.JoinInts(grpc),
			"STATUS_PORTS="+testbin.JoinInts(status),
			"START_TIMEOUT=60",
		),
		endpoints: strings.Join(addrs, ","),
	}
	c.env = append(c.env, extraEnv...)
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs()
		}
		if r := c.script("stop"); r.Err != nil {
			t.Errorf("cluster.sh stop: %v", r)
		}
	})
	r := c.script("start")
	t.Logf("cluster.sh start (%v):\n%s%s", r.Elapsed.Round(time.Millisecond), r.Stdout, r.Stderr)
	if r.Err != nil {
		t.Fatalf("cluster.sh start failed: %v", r.Err)
	}
	return c
}

func (c *cluster) script(args ...string) result {
	return testbin.ClusterScript(repoRoot, clusterTimeout, c.env, args...)
}

// cli runs the hedgekv CLI against this cluster.
func (c *cluster) cli(timeout time.Duration, args ...string) result {
	return run(timeout, c.env, binPath, append(args, "--endpoints", c.endpoints)...)
}

func (c *cluster) dumpLogs() {
	for n := 1; n <= 5; n++ { // stores 4 and 5: added ones
		f := filepath.Join(c.dir, fmt.Sprintf("store%d.log", n))
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		c.t.Logf("--- store %d log (last %d lines) ---\n%s", n, len(lines), strings.Join(lines, "\n"))
	}
}

func (c *cluster) put(k, v string) result { return c.cli(cliTimeout, "put", k, v) }

func (c *cluster) mustPut(k, v string, acked map[string]string) {
	c.t.Helper()
	if r := c.put(k, v); r.Err != nil {
		c.t.Fatalf("put %s: %v", k, r)
	}
	acked[k] = v
}

func (c *cluster) mustGet(k, want string) {
	c.t.Helper()
	r := c.cli(cliTimeout, "get", k)
	if r.Err != nil {
		c.t.Fatalf("get %s: %v", k, r)
	}
	if got := strings.TrimSuffix(r.Stdout, "\n"); got != want {
		c.t.Fatalf("get %s = %q, want %q", k, got, want)
	}
}

// scan returns the KEY<TAB>VALUE lines of `scan START END` in order.
func (c *cluster) scan(start, end string) ([][2]string, error) {
	r := c.cli(cliTimeout, "scan", start, end, "--limit", "10000")
	if r.Err != nil {
		return nil, fmt.Errorf("scan %s %s: %v", start, end, r)
	}
	var kvs [][2]string
	for line := range strings.SplitSeq(strings.TrimRight(r.Stdout, "\n"), "\n") {
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "\t")
		if !ok {
			return nil, fmt.Errorf("scan line %q has no tab", line)
		}
		kvs = append(kvs, [2]string{k, v})
	}
	return kvs, nil
}

// checkScan compares a scan of [start, end) with the acked map.
func (c *cluster) checkScan(start, end string, acked map[string]string) {
	c.t.Helper()
	kvs, err := c.scan(start, end)
	if err != nil {
		c.t.Fatal(err)
	}
	var want []string
	for k := range acked {
		if k >= start && k < end {
			want = append(want, k)
		}
	}
	sort.Strings(want)
	if len(kvs) != len(want) {
		c.t.Fatalf("scan %s..%s returned %d pairs, want %d: %v", start, end, len(kvs), len(want), kvs)
	}
	for i, kv := range kvs {
		if kv[0] != want[i] || kv[1] != acked[want[i]] {
			c.t.Fatalf("scan %s..%s pair %d = %q=%q, want %q=%q", start, end, i, kv[0], kv[1], want[i], acked[want[i]])
		}
	}
}

func (c *cluster) regions() ([]regionJSON, error) {
	var rs []regionJSON
	err := testbin.DecodeJSON(c.cli(cliTimeout, "ctl", "regions", "--json"), "ctl regions --json", &rs)
	return rs, err
}

// leaderOfRegion1 returns the store leading region 1, waiting (bounded) for
// it to have one.
func (c *cluster) leaderOfRegion1() int {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		rs, err := c.regions()
		if err != nil {
			last = err.Error()
		} else {
			for _, r := range rs {
				if r.ID == 1 && r.LeaderStoreID != 0 {
					return int(r.LeaderStoreID)
				}
			}
			last = fmt.Sprintf("regions: %+v", rs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.t.Fatalf("region 1 has no leader after 30s (last: %s)", last)
	return 0
}

// transferLeader moves region's leadership to store and waits (bounded)
// until `ctl regions` reports it there. A just-restarted store may need a
// moment to catch up before raft lets the transfer through, so it retries.
func (c *cluster) transferLeader(region uint64, store int) {
	c.t.Helper()
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		r := c.cli(cliTimeout, "ctl", "transfer-leader", strconv.FormatUint(region, 10), strconv.Itoa(store))
		if r.Err != nil {
			last = r.String()
		}
		for range 10 {
			rs, err := c.regions()
			if err != nil {
				last = err.Error()
				break
			}
			for _, reg := range rs {
				if reg.ID == region && int(reg.LeaderStoreID) == store {
					c.t.Logf("region %d led by store %d again after %v", region, store, time.Since(start).Round(time.Millisecond))
					return
				}
				if reg.ID == region {
					last = fmt.Sprintf("region %d led by store %d", region, reg.LeaderStoreID)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	c.t.Fatalf("could not move region %d's leadership to store %d within 30s (last: %s)", region, store, last)
}

// untilOK retries f (each attempt bounded by attemptTimeout) until it
// succeeds or giveUp has passed since start; it returns when it succeeded,
// measured from start, and the last failure.
func untilOK(start time.Time, giveUp time.Duration, f func(time.Duration) result) (time.Duration, result, bool) {
	var r result
	for {
		r = f(attemptTimeout)
		if r.Err == nil {
			return time.Since(start), r, true
		}
		if time.Since(start) > giveUp {
			return time.Since(start), r, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killLeaderAndFailOver kills (kill -9) the store leading region 1 and
// waits until writes and reads succeed again, within failoverBudget; it
// returns the killed store.
func (c *cluster) killLeaderAndFailOver(acked map[string]string) int {
	t := c.t
	t.Helper()
	leader := c.leaderOfRegion1()
	t.Logf("region 1 is led by store %d; killing it", leader)
	if r := c.script("kill", strconv.Itoa(leader)); r.Err != nil {
		t.Fatalf("cluster.sh kill %d: %v", leader, r)
	}
	killed := time.Now()

	// Writes succeed again...
	key, val := "smoke/after-kill", "written-without-the-old-leader"
	writeAt, r, ok := untilOK(killed, failoverGiveUp, func(d time.Duration) result {
		return c.cli(d, "put", key, val)
	})
	if !ok {
		t.Fatalf("no write succeeded within %v of killing store %d: %v", failoverGiveUp, leader, r)
	}
	acked[key] = val
	// ...and so do reads, of the new write and of one from before the kill.
	readAt, r, ok := untilOK(killed, failoverGiveUp, func(d time.Duration) result {
		r := c.cli(d, "get", "smoke/k00")
		if r.Err == nil && strings.TrimSuffix(r.Stdout, "\n") != "v00" {
			r.Err = fmt.Errorf("get smoke/k00 = %q, want v00", r.Stdout)
		}
		return r
	})
	if !ok {
		t.Fatalf("no read succeeded within %v of killing store %d: %v", failoverGiveUp, leader, r)
	}
	t.Logf("after kill -9 of store %d: first write acked after %v, first read after %v",
		leader, writeAt.Round(time.Millisecond), readAt.Round(time.Millisecond))
	if recovered := max(writeAt, readAt); recovered > failoverBudget {
		t.Errorf("fail-over took %v, want reads and writes back within %v", recovered.Round(time.Millisecond), failoverBudget)
	}
	c.mustGet(key, val)
	return leader
}

func TestSmoke(t *testing.T) {
	c := startCluster(t)
	acked := map[string]string{}

	// Writes, reads, scans.
	for i := range 10 {
		c.mustPut(fmt.Sprintf("smoke/k%02d", i), fmt.Sprintf("v%02d", i), acked)
	}
	for i := range 10 {
		c.mustGet(fmt.Sprintf("smoke/k%02d", i), fmt.Sprintf("v%02d", i))
	}
	c.checkScan("smoke/", "smoke0", acked)
	c.checkScan("smoke/k03", "smoke/k07", acked)

	// Delete, and a missing key: `key not found` on stderr, exit 1.
	c.mustPut("smoke/deleted", "x", map[string]string{})
	if r := c.cli(cliTimeout, "delete", "smoke/deleted"); r.Err != nil {
		t.Fatalf("delete: %v", r)
	}
	r := c.cli(cliTimeout, "get", "smoke/deleted")
	var exitErr *exec.ExitError
	if !errors.As(r.Err, &exitErr) || exitErr.ExitCode() != 1 || !strings.Contains(r.Stderr, "key not found") {
		t.Fatalf("get of a deleted key: want exit 1 and 'key not found' on stderr, got %v", r)
	}
	c.checkScan("smoke/", "smoke0", acked)

	leader := c.killLeaderAndFailOver(acked)

	// More writes while the store is down.
	for i := range 5 {
		c.mustPut(fmt.Sprintf("smoke/down%02d", i), fmt.Sprintf("d%02d", i), acked)
	}

	// Restart it; everything acknowledged is still there.
	if r := c.script("restart", strconv.Itoa(leader)); r.Err != nil {
		t.Fatalf("cluster.sh restart %d: %v", leader, r)
	}
	t.Logf("store %d restarted", leader)
	for i := range 5 {
		c.mustPut(fmt.Sprintf("smoke/up%02d", i), fmt.Sprintf("u%02d", i), acked)
	}

	// Hand region 1 back to the restarted store, so that the reads below are
	// served from its own state: it must have caught up on what it missed.
	c.transferLeader(1, leader)
	if r := c.cli(cliTimeout, "get", "smoke/down00", "-v"); r.Err != nil {
		t.Fatalf("get -v after the transfer: %v", r)
	} else {
		t.Logf("get -v smoke/down00 with store %d leading: %s", leader, strings.TrimSpace(r.Stderr))
	}

	keys := make([]string, 0, len(acked))
	for k := range acked {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		c.mustGet(k, acked[k])
	}
	c.checkScan("smoke/", "smoke0", acked)

	if r := c.script("status"); r.Err != nil {
		t.Errorf("cluster.sh status after restart: %v", r)
	} else {
		t.Logf("cluster.sh status:\n%s", r.Stdout)
	}
	t.Logf("%d acknowledged writes read back", len(acked))
}
