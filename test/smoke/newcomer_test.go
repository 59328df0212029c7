package smoke

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
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

	// An unknown command: the error first, then a short usage.
	r = c.script("bogus")
	if first, _, _ := strings.Cut(r.Stderr, "\n"); exitCode(r) != 2 || first != "cluster: unknown command 'bogus'" || strings.Count(r.Stderr, "\n") > 20 {
		t.Errorf("cluster.sh bogus: exit %d, want 2 with the error first and a short usage: %v", exitCode(r), r)
	}

	// A dead endpoint in HEDGEKV_ENDPOINTS, one that accepts connections
	// and never answers, costs no 0.5 s per command.
	hung := hungListener(t)
	env = append(c.env[:len(c.env):len(c.env)], "HEDGEKV_ENDPOINTS="+hung+","+c.endpoints)
	fastest := time.Hour
	for range 3 {
		r := run(cliTimeout, env, binPath, "ctl", "regions")
		if r.Err != nil {
			t.Fatalf("ctl regions with a silent endpoint: %v", r)
		}
		fastest = min(fastest, r.Elapsed)
	}
	if fastest > 400*time.Millisecond {
		t.Errorf("ctl regions with a silent endpoint in HEDGEKV_ENDPOINTS took %v at best", fastest)
	}

	// NETSIM_PORT_BASE moves the netsim's control port too (base+999):
	// start behind the netsim fails naming that port when it is taken.
	ctl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	ctlPort := ctl.Addr().(*net.TCPAddr).Port
	ports, err := testbin.FreePorts(6)
	if err != nil {
		t.Fatal(err)
	}
	var moved []string
	for _, kv := range c.env {
		if !strings.HasPrefix(kv, "NETSIM_CONTROL=") {
			moved = append(moved, kv)
		}
	}
	moved = append(moved, "CLUSTER_DIR="+t.TempDir(), "GRPC_PORTS="+testbin.JoinInts(ports[:3]), "STATUS_PORTS="+testbin.JoinInts(ports[3:]),
		"NETSIM_PORT_BASE="+strconv.Itoa(ctlPort-999))
	r = testbin.ClusterScript(repoRoot, clusterTimeout, moved, "start", "--topology", "default")
	if r.Err == nil {
		testbin.ClusterScript(repoRoot, clusterTimeout, moved, "stop")
	}
	if want := fmt.Sprintf("port %d on 127.0.0.1 is already in use", ctlPort); exitCode(r) != 1 || !strings.Contains(r.Stderr, want) {
		t.Errorf("start --topology with NETSIM_PORT_BASE=%d and port %d taken: exit %d, want 1 saying %q: %v", ctlPort-999, ctlPort, exitCode(r), want, r)
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

// hungListener is the address of a listener that accepts connections
// and never answers (as a stopped store does), until the test ends.
func hungListener(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, conn := range conns {
			conn.Close()
		}
	})
	return lis.Addr().String()
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
