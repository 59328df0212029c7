package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestNetsimErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[[zone]]\nname = \"dc-a\"\nstores = [1]\n[[zone]]\nname = \"dc-b\"\nstores = [2]\n[[link]]\nbetween = [\"dc-a\", \"dc-b\"]\nlatency = \"14\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dead := closedAddr(t)
	tests := []struct {
		name string
		args []string
		code int
		want string // the whole stderr
	}{
		{"unknown subcommand", []string{"netsim", "partiton", "1"}, exitUsage, `hedgekv: unknown netsim command "partiton" (partition, heal or status; none to run the proxies) (usage: hedgekv netsim --topology FILE|default [--upstream 1=ADDR,2=ADDR,3=ADDR] [--port-base 21000] [--control ADDR] [flags])` + "\n"},
		{"no topology", []string{"netsim"}, exitUsage, `hedgekv: --topology is required: a topology file or "default" (usage: hedgekv netsim --topology FILE|default [--upstream 1=ADDR,2=ADDR,3=ADDR] [--port-base 21000] [--control ADDR] [flags])` + "\n"},
		{"bad upstream", []string{"netsim", "--topology", "default", "--upstream", "1=a:1,two=a:2"}, exitUsage, `hedgekv: --upstream: store id "two" must be a positive integer`},
		{"upstream without port", []string{"netsim", "--topology", "default", "--upstream", "1=localhost"}, exitUsage, `hedgekv: --upstream: store 1: "localhost" is not HOST:PORT`},
		{"upstream twice", []string{"netsim", "--topology", "default", "--upstream", "1=a:1,1=a:2"}, exitUsage, `hedgekv: --upstream: store 1 listed twice`},
		{"bad port base", []string{"netsim", "--topology", "default", "--port-base", "-5"}, exitUsage, `hedgekv: --port-base -5 is not a port`},
		{"bad partition mode", []string{"netsim", "--topology", "default", "--partition-mode", "drop"}, exitUsage, `hedgekv: --partition-mode: partition mode "drop": want blackhole or disconnect`},
		{"bad topology file", []string{"netsim", "--topology", bad}, exitFailure, `hedgekv: topology: link[1].latency: "14" is not a duration (e.g. "14ms") (in ` + bad + ")\n"},
		{"missing topology file", []string{"netsim", "--topology", filepath.Join(dir, "nope.toml")}, exitFailure, "hedgekv: topology: " + filepath.Join(dir, "nope.toml") + ": no such file or directory\n"},
		{"upstream missing a store", []string{"netsim", "--topology", "default", "--upstream", "1=127.0.0.1:1,2=127.0.0.1:2"}, exitFailure, "hedgekv: netsim: store 3 of the topology has no upstream address\n"},
		{"partition without store", []string{"netsim", "partition"}, exitUsage, "hedgekv: partition takes 1 argument(s) (STORE_ID), got 0"},
		{"partition store not a number", []string{"netsim", "partition", "one"}, exitUsage, `hedgekv: STORE_ID must be a positive integer, got "one"`},
		{"partition bad mode", []string{"netsim", "partition", "1", "--mode", "drop"}, exitUsage, `hedgekv: --mode: partition mode "drop": want blackhole or disconnect`},
		{"heal with an argument", []string{"netsim", "heal", "1"}, exitUsage, "hedgekv: heal takes no arguments, got 1"},
		{"empty control", []string{"netsim", "status", "--control", ""}, exitUsage, "hedgekv: --control is empty"},
		{"nothing at control", []string{"netsim", "heal", "--control", dead}, exitFailure, "hedgekv: netsim control " + dead + `: nothing listens there (is "hedgekv netsim" running?)` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			oneLine(t, stderr)
			if !strings.HasPrefix(stderr, tt.want) {
				t.Errorf("stderr\n got  %q\n want %q", stderr, tt.want)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe to read while a command (or a
// server) writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestNetsimRun runs "hedgekv netsim" in the foreground against an echo
// server and drives it with the partition, status and heal subcommands.
func TestNetsimRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := startNetsim(ctx, t, echoServer(t))
	lines := strings.Split(strings.TrimSpace(n.stdout.String()), "\n")
	if len(lines) != 4 || lines[0] != "netsim: 2 zones, 1 stores, 2 links; a partition is a blackhole" ||
		!strings.HasPrefix(lines[1], "here → store 1: 127.0.0.1:") || !strings.HasSuffix(lines[1], " (nothing added)") ||
		!strings.HasPrefix(lines[2], "there → store 1: 127.0.0.1:") || !strings.HasSuffix(lines[2], " (5ms one way, 100 Mbit/s)") {
		t.Errorf("stdout:\n%s", n.stdout.String())
	}

	ctl := "--control=" + n.control
	partitionAndHeal(t, ctl)

	cancel() // SIGINT or SIGTERM
	select {
	case code := <-n.done:
		if code != 0 || n.stderr.String() != "" {
			t.Errorf("netsim exited %d, stderr %q", code, n.stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("netsim did not stop")
	}
	if code, _, _ := runCLI(t, "netsim", "status", ctl); code != exitFailure {
		t.Errorf("status after stop: exit %d", code)
	}
}

// echoServer listens on a free port and echoes back what each connection
// sends, until the test ends; it returns its address.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// netsimRun is a "hedgekv netsim" running in the foreground.
type netsimRun struct {
	control        string // its control address
	done           chan int
	stdout, stderr syncBuffer
}

// startNetsim runs "hedgekv netsim" until ctx ends, store 1 (in zone
// "here"; zone "there" 5 ms away) at upstream, and waits (at most 10 s)
// until it prints its control address.
func startNetsim(ctx context.Context, t *testing.T, upstream string) *netsimRun {
	t.Helper()
	topo := filepath.Join(t.TempDir(), "topo.toml")
	if err := os.WriteFile(topo, []byte(`
[[zone]]
name = "here"
stores = [1]
[[zone]]
name = "there"
[default]
latency = "5ms"
bandwidth_mbit = 100
`), 0o644); err != nil {
		t.Fatal(err)
	}
	n := &netsimRun{done: make(chan int, 1)}
	go func() {
		n.done <- run(ctx, []string{"netsim", "--topology", topo, "--upstream", "1=" + upstream,
			"--port-base", "0", "--control", "127.0.0.1:0"}, &n.stdout, &n.stderr)
	}()
	for deadline := time.Now().Add(10 * time.Second); n.control == ""; {
		if _, after, ok := strings.Cut(n.stdout.String(), "control: "); ok && strings.HasSuffix(after, "\n") {
			n.control = strings.TrimSpace(after)
		}
		select {
		case code := <-n.done:
			t.Fatalf("netsim exited %d: %s", code, n.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no control line; stdout %q stderr %q", n.stdout.String(), n.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

// partitionAndHeal partitions store 1 (blackhole, then disconnect) through
// the netsim at control flag ctl, checks the status in JSON and as a
// table, heals, and checks that an unknown store is refused.
func partitionAndHeal(t *testing.T, ctl string) {
	t.Helper()
	expect := func(wantOut string, args ...string) string {
		t.Helper()
		code, out, errs := runCLI(t, append(args, ctl)...)
		if code != 0 || errs != "" || (wantOut != "" && out != wantOut) {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
		return out
	}
	expect("OK\n", "netsim", "partition", "1")
	var st struct {
		Partitioned []uint64 `json:"partitioned"`
		Links       []struct {
			Zone string `json:"zone"`
			Cut  string `json:"cut"`
		} `json:"links"`
	}
	if err := json.Unmarshal([]byte(expect("", "netsim", "status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Partitioned) != 1 || st.Partitioned[0] != 1 || len(st.Links) != 2 || st.Links[0].Cut != "" || st.Links[1].Cut != "blackhole" {
		t.Errorf("status after partition: %+v", st)
	}
	table := expect("", "netsim", "status")
	if !strings.HasPrefix(table, "partitioned: stores 1 (default mode blackhole)\nWAN bytes: 0\nZONE ") || !strings.Contains(table, "blackhole  0\n") {
		t.Errorf("status table:\n%s", table)
	}
	expect("OK\n", "netsim", "partition", "1", "--mode", "disconnect")
	expect("OK\n", "netsim", "heal")
	if table := expect("", "netsim", "status"); !strings.HasPrefix(table, "partitioned: none") {
		t.Errorf("status after heal:\n%s", table)
	}
	code, _, errs := runCLI(t, "netsim", "partition", "2", ctl)
	if code != exitFailure || !strings.Contains(errs, "store 2 is not in the topology (stores [1]) (HTTP 404)") {
		t.Errorf("partition 2: exit %d, stderr %q", code, errs)
	}
	oneLine(t, errs)
}
