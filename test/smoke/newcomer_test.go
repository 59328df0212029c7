package smoke

import (
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/test/testbin"
)

// TestNewcomer: what issue 21 found in a newcomer's first hour with
// cluster.sh: start prints the export line for HEDGEKV_ENDPOINTS, which
// the CLI honours; stop N stops store N alone; arguments a command does
// not take are refused; a port held by another process is named as such;
// ctl status right after restart N printed ready sees store N up.
func TestNewcomer(t *testing.T) {
	c := startCluster(t)
	r := c.script("start") // already running: says so, with the export line again
	export := "export HEDGEKV_ENDPOINTS=" + c.endpoints + "\n"
	if r.Err != nil || !strings.Contains(r.Stdout, export) {
		t.Errorf("cluster.sh start (running) does not print %q: %v\n%s", export, r, r.Stdout)
	}

	// The CLI reaches the cluster through the variable alone.
	env := append(c.env[:len(c.env):len(c.env)], "HEDGEKV_ENDPOINTS="+c.endpoints)
	if r := run(cliTimeout, env, binPath, "put", "newcomer", "ada"); r.Err != nil || r.Stdout != "OK\n" {
		t.Fatalf("put with HEDGEKV_ENDPOINTS: %v", r)
	}
	if r := run(cliTimeout, env, binPath, "get", "newcomer"); r.Err != nil || r.Stdout != "ada\n" {
		t.Fatalf("get with HEDGEKV_ENDPOINTS: %v", r)
	}

	// Arguments a command does not take are refused (exit 2), and nothing
	// is stopped.
	for _, args := range [][]string{{"stop", "1", "2"}, {"status", "2"}, {"kill", "1", "2"}, {"restart", "1", "2"}, {"endpoints", "x"}, {"stop", "9"}} {
		r := c.script(args...)
		if exitCode(r) != 2 || !strings.Contains(r.Stderr, "cluster: ") {
			t.Errorf("cluster.sh %v: exit %d, want 2 with a reason: %v", args, exitCode(r), r)
		}
	}
	if r := c.script("status"); r.Err != nil || storesUp(r.Stdout) != 3 {
		t.Fatalf("after the refused commands every store should still run: %v\n%s", r, r.Stdout)
	}

	// stop 2 stops store 2 alone.
	r = c.script("stop", "2")
	if r.Err != nil || !strings.Contains(r.Stdout, "stopped store 2") {
		t.Fatalf("cluster.sh stop 2: %v", r)
	}
	r = c.script("status")
	if storesUp(r.Stdout) != 2 || !regexpLine(r.Stdout, "store 2 ", " down ") {
		t.Errorf("status after stop 2: want stores 1 and 3 up, 2 down:\n%s", r.Stdout)
	}
	if r := c.cli(cliTimeout, "get", "newcomer"); r.Err != nil || r.Stdout != "ada\n" {
		t.Errorf("get with store 2 stopped: %v", r)
	}

	// restart 2 returns once store 2 is ready; ctl status at once agrees.
	if r := c.script("restart", "2"); r.Err != nil {
		t.Fatalf("cluster.sh restart 2: %v", r)
	}
	if r := c.cli(cliTimeout, "ctl", "status"); r.Err != nil {
		t.Errorf("ctl status right after restart 2 printed ready: %v\n%s", r, r.Stdout)
	}
	// The same after a kill -9 (the others' connections to it back off).
	if r := c.script("kill", "2"); r.Err != nil {
		t.Fatalf("cluster.sh kill 2: %v", r)
	}
	time.Sleep(3 * time.Second) // long enough for the reconnect back-off to grow
	if r := c.script("restart", "2"); r.Err != nil {
		t.Fatalf("cluster.sh restart 2: %v", r)
	}
	if r := c.cli(cliTimeout, "ctl", "status"); r.Err != nil {
		t.Errorf("ctl status right after kill 2, restart 2: %v\n%s", r, r.Stdout)
	}

	// Another cluster dir on this cluster's ports: the port is named as
	// taken by another process, not by a store of that cluster.
	other := append(c.env[:len(c.env):len(c.env)], "CLUSTER_DIR="+t.TempDir())
	r = testbin.ClusterScript(repoRoot, clusterTimeout, other, "start")
	if r.Err == nil {
		testbin.ClusterScript(repoRoot, clusterTimeout, other, "stop")
	}
	if exitCode(r) != 1 || !strings.Contains(r.Stderr, "already in use by another process") || !strings.Contains(r.Stderr, "GRPC_PORT_BASE=") {
		t.Errorf("start on ports another cluster holds: exit %d: %v", exitCode(r), r)
	}
}

// storesUp counts the "store N ... up" lines of cluster.sh status.
func storesUp(text string) int {
	n := 0
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(line, "store ") && strings.Contains(line, " up ") {
			n++
		}
	}
	return n
}

// regexpLine reports whether a line of text contains every part.
func regexpLine(text string, parts ...string) bool {
	for line := range strings.SplitSeq(text, "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return true
		}
	}
	return false
}
