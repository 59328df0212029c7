// Package etcdctl drives etcd's own CLI, etcdctl (built by `make
// etcdctl` into bin/etcdctl), against a three-store cluster started with
// scripts/cluster.sh: a client nobody here wrote, speaking etcd's v3 API to
// hedgekv's stores.
package etcdctl

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/test/testbin"
)

const (
	clusterTimeout = 90 * time.Second
	ctlTimeout     = 15 * time.Second
)

var (
	repoRoot, binPath, ctlPath string
	setupErr                   error
)

func TestMain(m *testing.M) {
	b, err := testbin.Locate("hedgekv-etcdctl-bin-")
	if err != nil {
		setupErr = err
		os.Exit(m.Run())
	}
	repoRoot, binPath = b.RepoRoot, b.Path
	ctlPath = os.Getenv("ETCDCTL_BIN")
	if ctlPath == "" {
		ctlPath = filepath.Join(repoRoot, "bin", "etcdctl")
	}
	if _, err := os.Stat(ctlPath); err != nil {
		setupErr = fmt.Errorf("etcdctl not found at %s (run `make etcdctl`, or set ETCDCTL_BIN): %w", ctlPath, err)
	}
	code := m.Run()
	b.Close()
	os.Exit(code)
}

type cluster struct {
	t         *testing.T
	env       []string
	endpoints string
	dir       string
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	dir := t.TempDir()
	ports, err := testbin.FreePorts(6)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, dir: dir, endpoints: strings.Join(testbin.Addrs(ports[:3]), ","),
		env: append(os.Environ(), "BIN="+binPath, "CLUSTER_DIR="+dir,
			"GRPC_PORTS="+testbin.JoinInts(ports[:3]), "STATUS_PORTS="+testbin.JoinInts(ports[3:]), "START_TIMEOUT=60")}
	t.Cleanup(func() {
		if t.Failed() {
			for n := 1; n <= 3; n++ {
				if b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("store%d.log", n))); err == nil {
					t.Logf("store%d.log (tail):\n%s", n, tail(string(b), 40))
				}
			}
		}
		if r := testbin.ClusterScript(repoRoot, clusterTimeout, c.env, "stop"); r.Err != nil {
			t.Errorf("cluster.sh stop: %v", r)
		}
	})
	if r := testbin.ClusterScript(repoRoot, clusterTimeout, c.env, "start"); r.Err != nil {
		t.Fatalf("cluster.sh start: %v", r)
	}
	return c
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ctl runs etcdctl against endpoint (all of the cluster's if empty) and
// fails the test if it fails.
func (c *cluster) ctl(endpoint string, args ...string) string {
	c.t.Helper()
	out, err := c.try(endpoint, args...)
	if err != nil {
		c.t.Fatalf("etcdctl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func (c *cluster) try(endpoint string, args ...string) (string, error) {
	if endpoint == "" {
		endpoint = c.endpoints
	}
	r := testbin.Run(repoRoot, ctlTimeout, c.env, ctlPath, append([]string{"--endpoints", endpoint, "--command-timeout", "10s"}, args...)...)
	if r.Err != nil {
		return r.Stdout + r.Stderr, fmt.Errorf("%v: %s%s", r.Err, r.Stdout, r.Stderr)
	}
	return r.Stdout, nil
}

func (c *cluster) endpoint(i int) string { return strings.Split(c.endpoints, ",")[i] }

// TestEtcdctl: put, get with prefixes, del, txn, watch, endpoint status
// and health, member list, each through etcdctl against every store.
func TestEtcdctl(t *testing.T) {
	c := startCluster(t)
	for i := range 3 {
		ep := c.endpoint(i)
		if out := c.ctl(ep, "put", fmt.Sprintf("app/k%d", i), fmt.Sprintf("v%d", i)); strings.TrimSpace(out) != "OK" {
			t.Fatalf("put through store %d: %q", i+1, out)
		}
	}
	for i := range 3 {
		out := c.ctl(c.endpoint(i), "get", "app/", "--prefix")
		if want := "app/k0\nv0\napp/k1\nv1\napp/k2\nv2\n"; out != want {
			t.Fatalf("get --prefix through store %d: %q, want %q", i+1, out, want)
		}
	}
	// JSON output carries revisions: versions and mod revisions as etcd's.
	var resp struct {
		Header struct{ Revision int64 } `json:"header"`
		Kvs    []struct {
			CreateRevision int64 `json:"create_revision"`
			ModRevision    int64 `json:"mod_revision"`
			Version        int64 `json:"version"`
		} `json:"kvs"`
	}
	c.ctl("", "put", "app/k0", "again")
	if err := json.Unmarshal([]byte(c.ctl("", "get", "app/k0", "-w", "json")), &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Version != 2 || resp.Kvs[0].ModRevision != resp.Header.Revision || resp.Kvs[0].CreateRevision >= resp.Kvs[0].ModRevision {
		t.Fatalf("get -w json: %+v", resp)
	}

	// txn: compare-and-swap on the value, through a follower's store.
	txn := func(ep, script string) string {
		t.Helper()
		in := filepath.Join(c.dir, "txn.in")
		if err := os.WriteFile(in, []byte(script), 0o600); err != nil {
			t.Fatal(err)
		}
		r := testbin.Run(repoRoot, ctlTimeout, c.env, "bash", "-c", fmt.Sprintf("%q --endpoints %s txn < %q", ctlPath, ep, in))
		if r.Err != nil {
			t.Fatalf("etcdctl txn: %v", r)
		}
		return r.Stdout
	}
	if out := txn(c.endpoint(2), "value(\"app/k1\") = \"v1\"\n\nput app/k1 swapped\n\nput app/k1 failed\n\n"); !strings.HasPrefix(out, "SUCCESS") {
		t.Fatalf("txn that should succeed: %q", out)
	}
	if out := txn(c.endpoint(1), "value(\"app/k1\") = \"v1\"\n\nput app/k1 nope\n\nget app/k1\n\n"); !strings.HasPrefix(out, "FAILURE") || !strings.Contains(out, "swapped") {
		t.Fatalf("txn that should fail: %q", out)
	}

	// watch: etcdctl watch --prefix sees the changes made after it started.
	watchOut := filepath.Join(c.dir, "watch.out")
	w := testbin.Run(repoRoot, 2*time.Second, c.env, "bash", "-c",
		fmt.Sprintf("(%q --endpoints %s watch app/ --prefix > %q 2>&1 &) ; sleep 1", ctlPath, c.endpoint(1), watchOut))
	if w.Err != nil {
		t.Fatalf("start etcdctl watch: %v", w)
	}
	c.ctl(c.endpoint(0), "put", "app/w", "1")
	c.ctl(c.endpoint(2), "del", "app/w")
	deadline := time.Now().Add(10 * time.Second)
	var seen string
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(watchOut)
		if seen = string(b); strings.Contains(seen, "PUT\napp/w\n1\nDELETE\napp/w\n") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	_ = testbin.Run(repoRoot, 5*time.Second, c.env, "pkill", "-f", ctlPath+" --endpoints "+c.endpoint(1)+" watch")
	if !strings.Contains(seen, "PUT\napp/w\n1\nDELETE\napp/w\n") {
		t.Fatalf("etcdctl watch printed %q", seen)
	}

	if out := strings.TrimSpace(c.ctl("", "del", "app/", "--prefix")); out != "3" {
		t.Fatalf("del --prefix: %q, want 3", out)
	}
	if out := c.ctl("", "get", "app/", "--prefix", "--count-only", "-w", "fields"); !strings.Contains(out, "\"Count\" : 0") {
		t.Fatalf("count after del: %q", out)
	}

	// endpoint status and health, member list: what operators run first.
	out := c.ctl("", "endpoint", "status", "-w", "table")
	if strings.Count(out, "3.7.3") != 3 {
		t.Fatalf("endpoint status: %q", out)
	}
	if out := c.ctl("", "endpoint", "health"); strings.Count(out, "is healthy") != 3 {
		t.Fatalf("endpoint health: %q", out)
	}
	if out := c.ctl("", "member", "list"); strings.Count(out, "store-") != 3 {
		t.Fatalf("member list: %q", out)
	}
}
