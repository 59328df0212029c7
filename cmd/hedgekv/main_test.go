package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/client/clienttest"
	"github.com/hedgekv/hedgekv/region"
)

// runCLI runs the command line and returns its exit code and output.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// oneLine checks the contract for errors: one line on stderr.
func oneLine(t *testing.T, stderr string) {
	t.Helper()
	if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "hedgekv: ") {
		t.Errorf("stderr %q, want one line starting with \"hedgekv: \"", stderr)
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // substring of the message
	}{
		{"get without key", []string{"get"}, "get takes 1 argument"},
		{"put without value", []string{"put", "k"}, "put takes 2 argument"},
		{"delete with two keys", []string{"delete", "a", "b"}, "delete takes 1 argument"},
		{"scan without start", []string{"scan"}, "scan takes START"},
		{"scan with three args", []string{"scan", "a", "b", "c"}, "scan takes START"},
		{"negative limit", []string{"scan", "a", "--limit", "-1"}, "--limit"},
		{"limit not a number", []string{"scan", "a", "--limit", "ten"}, "invalid argument"},
		{"unknown policy", []string{"get", "k", "--read", "nearest"}, "unknown replica policy"},
		{"bad hedge", []string{"get", "k", "--hedge", "soon"}, "--hedge"},
		{"bad staleness", []string{"get", "k", "--max-staleness", "5"}, "max-staleness"},
		{"unknown flag", []string{"get", "k", "--bogus"}, "unknown flag"},
		{"unknown command", []string{"gte", "k"}, "unknown command"},
		{"bad region id", []string{"ctl", "transfer-leader", "x", "1"}, "REGION_ID must be a positive integer"},
		{"zero store id", []string{"ctl", "transfer-leader", "1", "0"}, "STORE_ID must be a positive integer"},
		{"ctl stores with an argument", []string{"ctl", "stores", "x"}, "takes no arguments"},
		{"unknown ctl command", []string{"ctl", "nope"}, "unknown command"},
		{"zero timeout", []string{"get", "k", "--timeout", "0s"}, "--timeout"},
		{"server without peers", []string{"server", "--id", "1", "--data-dir", "/tmp/x"}, "--peers is required"},
		{"server id not a peer", []string{"server", "--id", "4", "--peers", "1=a:1,2=a:2", "--data-dir", "/tmp/x"}, "not among --peers"},
		{"server bad peers", []string{"server", "--id", "1", "--peers", "1=a:1,two=a:2", "--data-dir", "/tmp/x"}, "store id"},
		{"server without data dir", []string{"server", "--id", "1", "--peers", "1=a:1"}, "--data-dir"},
		{"server bad log level", []string{"server", "--id", "1", "--peers", "1=a:1", "--data-dir", "d", "--log-level", "loud"}, "--log-level"},
		{"split without key", []string{"ctl", "split"}, "split takes 1 argument(s) (KEY)"},
		{"split with two keys", []string{"ctl", "split", "a", "b"}, "split takes 1 argument(s) (KEY)"},
		{"split empty key", []string{"ctl", "split", ""}, "KEY must not be empty"},
		{"merge without region", []string{"ctl", "merge"}, "merge takes 1 argument(s) (REGION_ID)"},
		{"merge zero region", []string{"ctl", "merge", "0"}, "REGION_ID must be a positive integer"},
		{"add-peer one arg", []string{"ctl", "add-peer", "1"}, "add-peer takes 2 argument(s) (REGION_ID STORE_ID)"},
		{"add-peer bad region", []string{"ctl", "add-peer", "one", "4"}, "REGION_ID must be a positive integer"},
		{"add-peer zero store", []string{"ctl", "add-peer", "1", "0"}, "STORE_ID must be a positive integer"},
		{"remove-peer three args", []string{"ctl", "remove-peer", "1", "2", "3"}, "remove-peer takes 2 argument(s)"},
		{"remove-peer zero region", []string{"ctl", "remove-peer", "0", "2"}, "REGION_ID must be a positive integer"},
		{"server join and peers", []string{"server", "--id", "4", "--join", "a:1", "--peers", "1=a:1", "--listen", "a:4", "--data-dir", "d"}, "exclude each other"},
		{"server join without listen", []string{"server", "--id", "4", "--join", "a:1", "--data-dir", "d"}, "--listen is required with --join"},
		{"server join wildcard listen", []string{"server", "--id", "4", "--join", "a:1", "--listen", "0.0.0.0:4", "--data-dir", "d"}, "not a wildcard"},
		{"server join bad address", []string{"server", "--id", "4", "--join", "nohostport", "--listen", "a:4", "--data-dir", "d"}, "--join: \"nohostport\" is not HOST:PORT"},
		{"server join no address", []string{"server", "--id", "4", "--join", ",", "--listen", "a:4", "--data-dir", "d"}, "--join names no address"},
		{"server join without id", []string{"server", "--join", "a:1", "--listen", "a:4", "--data-dir", "d"}, "--id is required"},
		{"server join id too big", []string{"server", "--id", "70000", "--join", "a:1", "--listen", "a:4", "--data-dir", "d"}, "65535"},
		{"server join without data dir", []string{"server", "--id", "4", "--join", "a:1", "--listen", "a:4"}, "--data-dir"},
		{"lease duration without leases", []string{"server", "--id", "1", "--peers", "1=a:1", "--data-dir", "d", "--follower-lease-duration", "100ms"}, "need --follower-leases"},
		{"negative lease duration", []string{"server", "--id", "1", "--peers", "1=a:1", "--data-dir", "d", "--follower-leases", "--follower-lease-duration", "-1s"}, "must not be negative"},
		{"lease longer than the leader's", []string{"server", "--id", "1", "--peers", "1=a:1", "--data-dir", "d", "--follower-leases", "--follower-lease-duration", "1s"}, "longer than the leader lease"},
		{"lease stores not ids", []string{"server", "--id", "1", "--peers", "1=a:1", "--data-dir", "d", "--follower-leases", "--follower-lease-stores", "1,x"}, "not a store id"},
		{"negative busy threshold", []string{"get", "k", "--busy-threshold", "-1ms"}, "--busy-threshold"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tt.args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d (stderr %q)", code, exitUsage, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			oneLine(t, stderr)
			if !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr %q does not mention %q", stderr, tt.want)
			}
		})
	}
}

func TestKVCommands(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")
	steps := []struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr []string // substrings; nil: stderr must be empty
	}{
		{args: []string{"put", "b", "2"}, wantStdout: "OK\n"},
		{args: []string{"put", "a", "hello world"}, wantStdout: "OK\n"},
		{args: []string{"put", "c", "3"}, wantStdout: "OK\n"},
		{args: []string{"get", "a"}, wantStdout: "hello world\n"},
		{args: []string{"get", "a", "-v"}, wantStdout: "hello world\n", wantStderr: []string{"served by store 1 via lease in ", "s\nhedge: no (--hedge off)\n"}},
		{args: []string{"get", "a", "-v", "--read", "closest", "--zone", "dc-c"}, wantStdout: "hello world\n", wantStderr: []string{"served by store 3 via read-index in "}},
		{args: []string{"get", "a", "-v", "--read", "follower", "--max-staleness", "5s"}, wantStdout: "hello world\n", wantStderr: []string{"via stale in ", "s (at most 5s stale)"}},
		{args: []string{"get", "missing"}, wantCode: exitNotFound, wantStderr: []string{"key not found\n"}},
		{args: []string{"scan", "a"}, wantStdout: "a\thello world\nb\t2\nc\t3\n"},
		{args: []string{"scan", "a", "c"}, wantStdout: "a\thello world\nb\t2\n"},
		{args: []string{"scan", "", "--limit", "1", "--read", "mixed"}, wantStdout: "a\thello world\n"},
		{args: []string{"delete", "a"}, wantStdout: "OK\n"},
		{args: []string{"get", "a"}, wantCode: exitNotFound, wantStderr: []string{"key not found\n"}},
		{args: []string{"ctl", "transfer-leader", "1", "2"}, wantStdout: "OK\n"},
		{args: []string{"get", "b", "-v"}, wantStdout: "2\n", wantStderr: []string{"served by store 2 via lease in "}},
	}
	for _, s := range steps {
		code, stdout, stderr := runCLI(t, append(s.args, ep)...)
		if code != s.wantCode {
			t.Fatalf("%v: exit %d, want %d (stderr %q)", s.args, code, s.wantCode, stderr)
		}
		if stdout != s.wantStdout {
			t.Errorf("%v: stdout %q, want %q", s.args, stdout, s.wantStdout)
		}
		if s.wantStderr == nil && stderr != "" {
			t.Errorf("%v: stderr %q, want nothing", s.args, stderr)
		}
		for _, w := range s.wantStderr {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr %q does not contain %q", s.args, stderr, w)
			}
		}
	}
}

func TestGetHedgeWon(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	cl.Put("a", "1")
	// The leader (store 1) never answers a Get: only a hedge can.
	cl.SetHook(func(ctx context.Context, s uint64, m string) error {
		if s == 1 && m == "Get" {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")
	code, stdout, stderr := runCLI(t, "get", "a", "-v", "--hedge", "10ms", ep)
	if code != 0 || stdout != "1\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "via read-index") || !strings.Contains(stderr, "hedge: won: sent to store ") || strings.Contains(stderr, "store 1 ") {
		t.Errorf("stderr %q, want a read-index read from a follower and hedge: won", stderr)
	}
	code, _, stderr = runCLI(t, "get", "a", "--hedge", "10ms", "--hedge-budget", "2", ep)
	if code != exitUsage || !strings.Contains(stderr, "--hedge-budget") {
		t.Errorf("--hedge-budget 2: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, "get", "a", "--busy-threshold", "-5ms", ep)
	if code != exitUsage || !strings.Contains(stderr, "--busy-threshold") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("--busy-threshold -5ms: exit %d, stderr %q", code, stderr)
	}
}

func TestCtlJSON(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	if err := cl.Split([]byte("m"), 2); err != nil {
		t.Fatal(err)
	}
	cl.SetLeader(2, 3)
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")

	code, stdout, stderr := runCLI(t, "ctl", "regions", "--json", ep)
	if code != 0 {
		t.Fatalf("ctl regions: exit %d: %s", code, stderr)
	}
	var regions []map[string]any
	if err := json.Unmarshal([]byte(stdout), &regions); err != nil {
		t.Fatalf("ctl regions --json is not a JSON array: %v\n%s", err, stdout)
	}
	if len(regions) != 2 || regions[1]["start_key"] != "m" || regions[0]["end_key"] != "m" || regions[1]["leader_store_id"] != 3.0 {
		t.Errorf("regions: %s", stdout)
	}

	code, stdout, stderr = runCLI(t, "ctl", "stores", "--json", ep)
	if code != 0 {
		t.Fatalf("ctl stores: exit %d: %s", code, stderr)
	}
	var stores []map[string]any
	if err := json.Unmarshal([]byte(stdout), &stores); err != nil {
		t.Fatalf("ctl stores --json is not a JSON array: %v\n%s", err, stdout)
	}
	want := []string{"address", "id", "leader_count", "region_count", "up", "zone"}
	if len(stores) != 3 || strings.Join(sortedKeys(stores[0]), ",") != strings.Join(want, ",") || stores[2]["zone"] != "dc-c" || stores[0]["up"] != true {
		t.Errorf("stores: %s", stdout)
	}

	for _, args := range [][]string{{"ctl", "regions"}, {"ctl", "stores"}} {
		code, stdout, stderr := runCLI(t, append(args, ep)...)
		if code != 0 || !strings.HasPrefix(stdout, "ID ") || len(strings.Split(strings.TrimSpace(stdout), "\n")) < 3 {
			t.Errorf("%v: exit %d, table %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

// TestCtlMerge: ctl merge through the client's routing against the fake
// cluster: a merge, -w json, and the refusals (exit 4).
func TestCtlMerge(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	cl.SetLeader(1, 2)
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")
	runSteps(t, false, []cliStep{
		{args: []string{"ctl", "split", "m"}, wantStdout: "left:  region 1 [-inf, m) epoch 1/2 peers 1@1,2@2,3@3\n" +
			"right: region 1001 [m, +inf) epoch 1/2 peers 100101@1,100102@2,100103@3\n"},
		{args: []string{"ctl", "merge", "1"}, wantStdout: "merged: region 1 [-inf, +inf) epoch 1/3 peers 1@1,2@2,3@3\n"},
		{args: []string{"ctl", "merge", "1"}, wantCode: exitFailure, wantStderr: "it has no right neighbour"},
		{args: []string{"ctl", "merge", "77"}, wantCode: exitFailure, wantStderr: "region 77: not found"},
		{args: []string{"ctl", "split", "m"}, wantStdout: "left:  region 1 [-inf, m) epoch 1/4 peers 1@1,2@2,3@3\n" +
			"right: region 1002 [m, +inf) epoch 1/4 peers 100201@1,100202@2,100203@3\n"},
		{args: []string{"ctl", "remove-peer", "1002", "3"}, wantStdout: "OK: region 1002 has no replica on store 3 any more\n"},
		{args: []string{"ctl", "merge", "1"}, wantCode: exitFailure, wantStderr: "same stores"},
	}, ep)
	code, stdout, stderr := runCLI(t, "ctl", "add-peer", "1002", "3", ep)
	if code != 0 {
		t.Fatalf("add-peer: exit %d: %s", code, stderr)
	}
	code, stdout, stderr = runCLI(t, "ctl", "merge", "1", "-w", "json", ep)
	if code != 0 {
		t.Fatalf("ctl merge -w json: exit %d: %s", code, stderr)
	}
	var doc struct {
		Merged map[string]any `json:"merged"`
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil || doc.Merged["id"] != float64(1) {
		t.Fatalf("ctl merge -w json: %v\n%s", err, stdout)
	}
	if rs := cl.Regions(); len(rs) != 1 {
		t.Fatalf("regions after the merges: %v", rs)
	}
}

// TestCtlMembership: split, add-peer and remove-peer through the client's
// routing (NotLeader hints included) against the fake cluster.
func TestCtlMembership(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c", "dc-d")
	cl.SetLeader(1, 2) // the CLI learns the leader from a NotLeader hint or the region listing
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")
	runSteps(t, false, []cliStep{
		{args: []string{"ctl", "split", "m"}, wantStdout: "left:  region 1 [-inf, m) epoch 1/2 peers 1@1,2@2,3@3,4@4\n" +
			"right: region 1001 [m, +inf) epoch 1/2 peers 100101@1,100102@2,100103@3,100104@4\n"},
		{args: []string{"ctl", "split", "m"}, wantCode: exitFailure, wantStderr: "already a region boundary"},
		{args: []string{"ctl", "remove-peer", "1", "4"}, wantStdout: "OK: region 1 has no replica on store 4 any more\n"},
		// Already gone: said, not an OK that claims a change.
		{args: []string{"ctl", "remove-peer", "1", "4"}, wantCode: exitFailure, wantStderr: "region 1 has no replica on store 4 (its replicas: stores 1, 2, 3)"},
		{args: []string{"ctl", "add-peer", "1", "4"}, wantStdout: "OK: region 1 has a voter on store 4\n"},
		// What the balancer may already have done: a no-op, said so.
		{args: []string{"ctl", "add-peer", "1", "4"}, wantStdout: "already there: region 1 has a voter (peer 1002) on store 4; nothing changed\n"},
		{args: []string{"ctl", "remove-peer", "1", "2"}, wantStdout: "OK: region 1 has no replica on store 2 any more\n"}, // the leader's own: follows the hint
		{args: []string{"ctl", "add-peer", "1", "9"}, wantCode: exitFailure, wantStderr: "add-peer: store 9 does not exist"},
		{args: []string{"ctl", "remove-peer", "1", "99"}, wantCode: exitFailure, wantStderr: "remove-peer: store 99 does not exist"},
		{args: []string{"ctl", "add-peer", "77", "1"}, wantCode: exitFailure, wantStderr: "region 77 does not exist"},
		{args: []string{"ctl", "remove-peer", "77", "1"}, wantCode: exitFailure, wantStderr: "region 77 does not exist"},
	}, ep)
	rs := cl.Regions()
	if len(rs) != 2 {
		t.Fatalf("regions after the split: %v", rs)
	}
	var stores []uint64
	for _, p := range rs[0].Peers {
		stores = append(stores, p.StoreID)
	}
	if !slices.Equal(stores, []uint64{1, 3, 4}) || rs[0].Epoch.ConfVer != 4 {
		t.Errorf("region 1 after remove 4, add 4, remove 2: peers on stores %v, epoch %v", stores, rs[0].Epoch)
	}
	if l := cl.Leader(1); l == 2 || l == 0 {
		t.Errorf("region 1 leader %d after its leader's replica was removed", l)
	}

	// A learner shows in ctl regions, marked, and only there.
	cl.SetLearner(1, 4, true)
	code, stdout, stderr := runCLI(t, "ctl", "regions", "--json", ep)
	if code != 0 {
		t.Fatalf("ctl regions: exit %d: %s", code, stderr)
	}
	if strings.Count(stdout, `"is_learner": true`) != 1 || strings.Contains(stdout, `"is_learner": false`) {
		t.Errorf("regions --json with one learner:\n%s", stdout)
	}
	code, stdout, _ = runCLI(t, "ctl", "regions", ep)
	if code != 0 || !strings.Contains(stdout, "@4(learner)") {
		t.Errorf("regions table with one learner (exit %d):\n%s", code, stdout)
	}
}

// cliStep is one command of a scripted CLI session and what it must do.
type cliStep struct {
	args       []string
	wantCode   int
	wantStdout string // all of stdout, or with runSteps' contains a part
	wantStderr string // a part of the one line; "": stderr must be empty
}

// runSteps runs the steps in order with extra args (--endpoints) and
// --timeout 5s unless a step sets its own; a wrong exit code ends the test.
func runSteps(t *testing.T, contains bool, steps []cliStep, extra ...string) {
	t.Helper()
	for _, s := range steps {
		args := append(slices.Clone(s.args), extra...)
		if !slices.Contains(args, "--timeout") {
			args = append(args, "--timeout", "5s")
		}
		code, stdout, stderr := runCLI(t, args...)
		if code != s.wantCode {
			t.Fatalf("%v: exit %d, want %d (stdout %q, stderr %q)", s.args, code, s.wantCode, stdout, stderr)
		}
		if contains && !strings.Contains(stdout, s.wantStdout) {
			t.Errorf("%v: stdout %q, want it to contain %q", s.args, stdout, s.wantStdout)
		} else if !contains && stdout != s.wantStdout {
			t.Errorf("%v: stdout %q, want %q", s.args, stdout, s.wantStdout)
		}
		if s.wantStderr == "" && stderr != "" {
			t.Errorf("%v: stderr %q, want nothing", s.args, stderr)
		}
		if s.wantStderr != "" {
			oneLine(t, stderr)
			if !strings.Contains(stderr, s.wantStderr) {
				t.Errorf("%v: stderr %q does not contain %q", s.args, stderr, s.wantStderr)
			}
		}
	}
}

func sortedKeys(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}

// The JSON of ctl regions is a contract; compare it byte for byte.
func TestRegionsJSONShape(t *testing.T) {
	regions := []client.RegionInfo{
		{
			Region: region.Region{ID: 1, EndKey: []byte("m"), Epoch: region.Epoch{ConfVer: 1, Version: 2},
				Peers: []region.Peer{{ID: 1, StoreID: 1}, {ID: 2, StoreID: 2}, {ID: 9, StoreID: 4, IsLearner: true}}},
			LeaderStoreID: 2, Term: 7, AppliedIndex: 42,
		},
		{Region: region.Region{ID: 5, StartKey: []byte("m"), Epoch: region.Epoch{ConfVer: 1, Version: 2}}},
	}
	var buf bytes.Buffer
	// Store 2 is down: its replica and the leader on it are marked, as
	// the table marks them.
	if err := writeJSON(&buf, regionsJSON(regions, map[uint64]bool{1: false, 2: true}, nil)); err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	want := `[{"id":1,"start_key":"","end_key":"m","epoch":{"conf_ver":1,"version":2},"peers":[{"id":1,"store_id":1},{"id":2,"store_id":2,"down":true},{"id":9,"store_id":4,"is_learner":true}],"leader_store_id":2,"leader_down":true,"term":7,"applied_index":42},` +
		`{"id":5,"start_key":"m","end_key":"","epoch":{"conf_ver":1,"version":2},"peers":[],"leader_store_id":0,"term":0,"applied_index":0}]`
	if compact.String() != want {
		t.Errorf("got  %s\nwant %s", compact.String(), want)
	}

	buf.Reset()
	if err := writeStoresJSON(&buf, []client.StoreInfo{{ID: 1, Address: "127.0.0.1:20161", Zone: "dc-a", Up: true, LeaderCount: 2, RegionCount: 3}}); err != nil {
		t.Fatal(err)
	}
	compact.Reset()
	if err := json.Compact(&compact, buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	want = `[{"id":1,"address":"127.0.0.1:20161","zone":"dc-a","up":true,"leader_count":2,"region_count":3}]`
	if compact.String() != want {
		t.Errorf("got  %s\nwant %s", compact.String(), want)
	}

	buf.Reset()
	if err := writeJSON(&buf, regionsJSON(nil, nil, nil)); err != nil || strings.TrimSpace(buf.String()) != "[]" {
		t.Errorf("no regions print %q (%v), want []", buf.String(), err)
	}
}

func TestUnreachableCluster(t *testing.T) {
	// A port nothing listens on.
	addr, addr2 := closedAddr(t), closedAddr(t)
	for _, args := range [][]string{
		{"get", "k"}, {"put", "k", "v"}, {"delete", "k"}, {"scan", "a"},
		{"ctl", "stores"}, {"ctl", "regions", "-w", "json"}, {"ctl", "status"}, {"ctl", "transfer-leader", "1", "9"},
	} {
		start := time.Now()
		code, stdout, stderr := runCLI(t, append(args, "--endpoints", addr+","+addr2)...)
		if code != exitUnreachable || stdout != "" {
			t.Errorf("%v: exit %d stdout %q, want exit %d and nothing", args, code, stdout, exitUnreachable)
		}
		oneLine(t, stderr)
		want := "hedgekv: no store reachable at " + addr + "," + addr2 + " (connection refused): is the cluster running?"
		if !strings.HasPrefix(stderr, want) || len(stderr) > 200 {
			t.Errorf("%v: stderr %q (%d bytes), want it short, starting %q", args, stderr, len(stderr), want)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%v: took %v, want a few seconds at most", args, d)
		}
	}
}

func TestParseHedge(t *testing.T) {
	tests := []struct {
		in      string
		want    string // String() of the result
		wantErr bool
	}{
		{in: "off", want: "off"},
		{in: "10ms", want: "10ms"},
		{in: "p99", want: "p99"},
		{in: "p999", want: "p999"},
		{in: "p99.9", want: "p999"},
		{in: "p50", want: "p50"},
		{in: "min(p99,50ms)", want: "min(p99,50ms)"},
		{in: "max(p99,5ms)", want: "max(p99,5ms)"},
		{in: "p100", wantErr: true},
		{in: "p0", wantErr: true},
		{in: "0s", wantErr: true},
		{in: "-1ms", wantErr: true},
		{in: "on", wantErr: true},
		{in: "p", wantErr: true},
	}
	for _, tt := range tests {
		f := readFlags{read: "leader", hedge: tt.in, hedgeBudget: 0.05}
		got, err := f.policy()
		if (err != nil) != tt.wantErr {
			t.Errorf("--hedge %q: error %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if err == nil && got.Hedge.String() != tt.want {
			t.Errorf("--hedge %q = %v, want %v", tt.in, got.Hedge, tt.want)
		}
	}
}

func TestServerConfig(t *testing.T) {
	f := serverFlags{id: 2, peers: "3=h:3, 1=h:1,2=h:2", zone: "dc-b", dataDir: "/d", tick: 20 * time.Millisecond, logLevel: "debug"}
	cfg, _, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ListenAddr != "h:2" || cfg.Store.StoreID != 2 || cfg.Store.Zone != "dc-b" || cfg.Store.TickInterval != 20*time.Millisecond {
		t.Errorf("config %+v", cfg)
	}
	if got := cfg.Store.InitialStores; len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Errorf("initial stores %v, want [1 2 3]", got)
	}
	if len(cfg.Peers) != 3 || cfg.Peers[3] != "h:3" {
		t.Errorf("peers %v", cfg.Peers)
	}
}

func TestServerJoinConfig(t *testing.T) {
	f := serverFlags{id: 4, join: "h:1, h:2", listen: "127.0.0.1:20164", zone: "dc-a", dataDir: "/d", tick: 50 * time.Millisecond, logLevel: "info"}
	cfg, _, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Join, []string{"h:1", "h:2"}) || cfg.ListenAddr != "127.0.0.1:20164" || cfg.Store.StoreID != 4 || cfg.Store.Zone != "dc-a" {
		t.Errorf("config %+v", cfg)
	}
	if len(cfg.Store.InitialStores) != 0 || len(cfg.Peers) != 0 {
		t.Errorf("a joining store bootstraps nothing: initial stores %v, peers %v", cfg.Store.InitialStores, cfg.Peers)
	}
}

func TestCPUProfile(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	if code, _, stderr := runCLI(t, "put", "k", "v", ep, "--cpuprofile", path); code != exitOK {
		t.Fatalf("put with --cpuprofile: exit %d, stderr %q", code, stderr)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A pprof profile is gzip-compressed protobuf.
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("profile of %d bytes is not gzip", len(b))
	}
	code, _, stderr := runCLI(t, "put", "k", "v", ep, "--cpuprofile", filepath.Join(t.TempDir(), "no", "such", "dir"))
	if code != exitFailure {
		t.Errorf("unwritable profile: exit %d, want %d", code, exitFailure)
	}
	oneLine(t, stderr)
}

// runCLIStdin is runCLI with standard input.
func runCLIStdin(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = runWithStdin(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

// TestPutValueSources: a value from standard input or a file, byte for
// byte, including one too big for a command line.
func TestPutValueSources(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")
	big := strings.Repeat("0123456789abcdef", 32<<10) // 512 KiB: over the ~128 KiB one argument may hold
	if code, stdout, stderr := runCLIStdin(t, big+"\n", "put", "big", "-", ep); code != 0 || stdout != "OK\n" {
		t.Fatalf("put big -: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if v, _ := cl.Value("big"); string(v) != big+"\n" {
		t.Errorf("value from stdin: %d bytes, want %d (the trailing newline kept)", len(v), len(big)+1)
	}
	path := filepath.Join(t.TempDir(), "v.bin")
	bin := []byte{0, 0xff, '\t', '\n', 'x'}
	if err := os.WriteFile(path, bin, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCLI(t, "put", "bin", "--value-file", path, ep); code != 0 {
		t.Fatalf("put --value-file: exit %d, stderr %q", code, stderr)
	}
	if v, _ := cl.Value("bin"); !bytes.Equal(v, bin) {
		t.Errorf("value from file %q, want %q", v, bin)
	}

	for _, tt := range []struct {
		args     []string
		stdin    string
		wantCode int
		want     string
	}{
		{[]string{"put", "k", "v", "--value-file", path}, "", exitUsage, "put with --value-file takes KEY only"},
		{[]string{"put", "k"}, "", exitUsage, "VALUE - for standard input"},
		{[]string{"put", "k", "--value-file", filepath.Join(t.TempDir(), "missing")}, "", exitUsage, "--value-file: open"},
		{[]string{"put", "k", "-"}, strings.Repeat("x", 8<<20+1), exitUsage, "the value from standard input is over the 8 MiB limit"},
	} {
		code, stdout, stderr := runCLIStdin(t, tt.stdin, append(tt.args, ep)...)
		if code != tt.wantCode || stdout != "" || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d (want %d), stdout %q, stderr %q (want %q)", tt.args, code, tt.wantCode, stdout, stderr, tt.want)
		}
		oneLine(t, stderr)
	}
}

// TestJSONOutputAndPrefix: -w json is lossless for any bytes, --keys-only
// and --prefix select what they say.
func TestJSONOutputAndPrefix(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")
	cl.Put("user/ada", "Ada")
	cl.Put("user/al\tan", "line1\nline2")
	cl.Put("user/\xff", "\xfe\\")
	cl.Put("user0", "after the prefix")
	cl.Put("usea", "before the prefix")

	// One JSON form for get and scan (pretty-printed, as ctl's), bytes
	// escaped one way: JSON's own escapes for UTF-8, base64 for the rest.
	// get adds "found" (false for a missing key, which prints a document
	// too); scan's pairs are get's without it.
	code, stdout, stderr := runCLI(t, "get", "user/\xff", "-w", "json", ep)
	if code != 0 || stdout != "{\n  \"key_base64\": \"dXNlci//\",\n  \"value_base64\": \"/lw=\",\n  \"found\": true\n}\n" {
		t.Errorf("get -w json: exit %d, stdout %s, stderr %q", code, stdout, stderr)
	}
	code, stdout, stderr = runCLI(t, "get", "user/al\tan", "-w", "json", ep)
	if code != 0 || stdout != "{\n  \"key\": \"user/al\\tan\",\n  \"value\": \"line1\\nline2\",\n  \"found\": true\n}\n" {
		t.Errorf("get -w json of text with a tab and a newline: exit %d, stdout %s, stderr %q", code, stdout, stderr)
	}
	pair := strings.Replace(stdout, ",\n  \"found\": true", "", 1)
	code, stdout2, _ := runCLI(t, "scan", "user/al\tan", "user/al\tao", "-w", "json", ep)
	if code != 0 || stdout2 != "[\n  "+strings.ReplaceAll(strings.TrimSuffix(pair, "\n"), "\n", "\n  ")+"\n]\n" {
		t.Errorf("scan -w json of the same pair %q, want get's form (without found) in an array, get's:\n%s", stdout2, stdout)
	}
	code, _, stderr = runCLI(t, "get", "nope", "-w", "json", ep)
	if code != exitNotFound || stderr != "key not found\n" {
		t.Errorf("get -w json of a missing key: exit %d, stderr %q", code, stderr)
	}

	code, stdout, stderr = runCLI(t, "scan", "--prefix", "user/", "-w", "json", ep)
	if code != 0 {
		t.Fatalf("scan --prefix -w json: exit %d, stderr %q", code, stderr)
	}
	var pairs []struct {
		Key         *string `json:"key"`
		KeyBase64   []byte  `json:"key_base64"`
		Value       *string `json:"value"`
		ValueBase64 []byte  `json:"value_base64"`
	}
	if err := json.Unmarshal([]byte(stdout), &pairs); err != nil {
		t.Fatalf("scan -w json is not JSON: %v\n%s", err, stdout)
	}
	got := map[string]string{}
	for _, p := range pairs {
		if (p.Key == nil) == (p.KeyBase64 == nil) || (p.Value == nil) == (p.ValueBase64 == nil) {
			t.Fatalf("pair %+v: want exactly one of key/key_base64 and of value/value_base64", p)
		}
		k, v := string(p.KeyBase64), string(p.ValueBase64)
		if p.Key != nil {
			k = *p.Key
		}
		if p.Value != nil {
			v = *p.Value
		}
		got[k] = v
	}
	want := map[string]string{"user/ada": "Ada", "user/al\tan": "line1\nline2", "user/\xff": "\xfe\\"}
	if !maps.Equal(got, want) {
		t.Errorf("scan --prefix user/ -w json decodes to %q, want %q", got, want)
	}

	code, stdout, _ = runCLI(t, "scan", "--prefix", "user/", "--keys-only", ep)
	if code != 0 || stdout != "user/ada\nuser/al\tan\nuser/\xff\n" {
		t.Errorf("scan --prefix --keys-only: exit %d, stdout %q", code, stdout)
	}
	code, stdout, _ = runCLI(t, "scan", "--prefix", "user/", "--keys-only", "-w", "json", "--limit", "1", ep)
	if code != 0 || strings.Contains(stdout, "value") || !strings.Contains(stdout, `"key": "user/ada"`) {
		t.Errorf("scan --keys-only -w json: exit %d, stdout %s", code, stdout)
	}

	code, stdout, stderr = runCLI(t, "delete", "--prefix", "user/", ep)
	if code != 0 || stdout != "OK: deleted 3 keys\n" {
		t.Errorf("delete --prefix: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	for k, present := range map[string]bool{"user/ada": false, "user/\xff": false, "user0": true, "usea": true} {
		if _, ok := cl.Value(k); ok != present {
			t.Errorf("after delete --prefix user/: %q present %v, want %v", k, ok, present)
		}
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"get", "k", "-w", "yaml"}, "--write-out must be table or json"},
		{[]string{"scan", "a", "b", "--prefix"}, "scan --prefix takes PREFIX only"},
		{[]string{"delete", "", "--prefix"}, "non-empty prefix"},
	} {
		code, _, stderr := runCLI(t, append(tt.args, ep)...)
		if code != exitUsage || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q, want usage error %q", tt.args, code, stderr, tt.want)
		}
	}
}

func TestPrefixEnd(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"a", "b"}, {"user/", "user0"}, {"a\xff", "b"}, {"\xff\xff", ""}, {"", ""},
	} {
		if got := string(prefixEnd([]byte(tt.in))); got != tt.want {
			t.Errorf("prefixEnd(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestCtlRegionAndStatus: ctl region KEY, ctl status healthy and not, and
// the regions table marking the replicas of a down store; binary keys
// print the same, losslessly, in the table and the JSON.
func TestCtlRegionAndStatus(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	for i, k := range []string{"m", "\xff", "\xfe"} {
		if err := cl.Split([]byte(k), uint64(10+i)); err != nil {
			t.Fatal(err)
		}
	}
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")

	code, stdout, stderr := runCLI(t, "ctl", "status", ep)
	if code != 0 || !strings.HasPrefix(stdout, "OK: 3 stores up; 4 regions, each with a leader and 3 voters on up stores") {
		t.Errorf("ctl status, healthy: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	code, stdout, _ = runCLI(t, "ctl", "region", "q", "--json", ep)
	var one map[string]any
	if err := json.Unmarshal([]byte(stdout), &one); code != 0 || err != nil || one["id"] != 10.0 || one["start_key"] != "m" || one["end_key_base64"] != "/g==" || one["end_key"] != nil {
		t.Errorf("ctl region q --json: exit %d, %v\n%s", code, err, stdout)
	}
	code, stdout, _ = runCLI(t, "ctl", "region", "\xfe\x01", ep)
	if code != 0 || !strings.Contains(stdout, `\xfe`) || !strings.Contains(stdout, `\xff`) || strings.Count(stdout, "\n") != 2 {
		t.Errorf("ctl region \\xfe\\x01: exit %d\n%s", code, stdout)
	}

	code, stdout, _ = runCLI(t, "ctl", "regions", "--json", ep)
	var regions []struct {
		StartKeyBase64 []byte `json:"start_key_base64"`
	}
	if err := json.Unmarshal([]byte(stdout), &regions); code != 0 || err != nil || len(regions) != 4 {
		t.Fatalf("ctl regions --json: exit %d, %v\n%s", code, err, stdout)
	}
	if string(regions[2].StartKeyBase64) != "\xfe" || string(regions[3].StartKeyBase64) != "\xff" {
		t.Errorf("binary start keys %q and %q, want \\xfe and \\xff", regions[2].StartKeyBase64, regions[3].StartKeyBase64)
	}

	cl.Store(3).Stop()
	cl.SetLeader(10, 0)
	code, stdout, stderr = runCLI(t, "ctl", "regions", ep, "--endpoints", strings.Join(cl.Endpoints()[:2], ","))
	if code != 0 || !strings.Contains(stdout, "@3(down)") || !strings.Contains(stdout, "LEADER") {
		t.Errorf("ctl regions with store 3 down: exit %d, stderr %q\n%s", code, stderr, stdout)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 5 || strings.Index(lines[0], "LEADER") != strings.Index(lines[1], "store 1") {
		t.Errorf("ctl regions table not aligned:\n%s", stdout)
	}

	code, stdout, stderr = runCLI(t, "ctl", "status", "--endpoints", strings.Join(cl.Endpoints()[:2], ","))
	if code != exitNotFound {
		t.Errorf("ctl status with a store down: exit %d, want %d", code, exitNotFound)
	}
	oneLine(t, stderr)
	for _, w := range []string{"store 3 (", "): down\n", "region 10 [m, \\xfe): no leader; voter 1003 on store 3, which is down\n", "region 1 [-inf, m): voter 3 on store 3, which is down\n"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("ctl status does not say %q:\n%s", w, stdout)
		}
	}
	if !strings.Contains(stderr, "not healthy: 1 of 3 stores down, 4 of 4 regions") {
		t.Errorf("ctl status stderr %q", stderr)
	}
}

// TestStaleReadRefusedSaysSo: a stale read no replica could serve within
// its bound says so, not only the leader's connection error.
func TestStaleReadRefusedSaysSo(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	cl.Put("a", "1")
	cl.SetNotReady(2, true)
	cl.SetNotReady(3, true)
	cl.Store(1).Stop()
	code, stdout, stderr := runCLI(t, "get", "a", "--read", "follower", "--max-staleness", "1s", "--timeout", "1s",
		"--endpoints", strings.Join(cl.Endpoints()[1:], ","))
	if code != exitFailure || stdout != "" {
		t.Errorf("exit %d, stdout %q", code, stdout)
	}
	oneLine(t, stderr)
	if !strings.Contains(stderr, "no replica could serve it within its staleness bound (1s)") || !strings.Contains(stderr, "data is not ready") {
		t.Errorf("stderr %q does not say the read was refused for its bound", stderr)
	}
}

// TestCtlRemoveStore: remove-store marks a store removing (refused when
// too few stores would be left), ctl stores shows it removing and then
// removed once no region has a replica on it, --wait waits for that, and
// ctl status no longer counts a removed store.
func TestCtlRemoveStore(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c", "dc-d")
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")
	runSteps(t, true, []cliStep{
		{args: []string{"ctl", "remove-store", "9"}, wantCode: exitFailure, wantStderr: "store 9 is unknown"},
		{args: []string{"ctl", "remove-store", "0"}, wantCode: exitUsage, wantStderr: "STORE_ID must be a positive integer"},
		{args: []string{"ctl", "remove-store", "4"}, wantStdout: "OK: store 4 is being removed; its replicas move to the other stores\n"},
		{args: []string{"ctl", "remove-store", "4"}, wantStdout: "store 4 was already being removed\n"},
		{args: []string{"ctl", "remove-store", "3"}, wantCode: exitFailure, wantStderr: "removing store 3 would leave 2 stores up"},
		{args: []string{"ctl", "stores"}, wantStdout: "up, removing"},
		{args: []string{"ctl", "remove-store", "4", "--wait", "--timeout", "1s"}, wantCode: exitFailure, wantStderr: "store 4 not removed yet (replicas left: 1 when"},
	}, ep)

	// What the balancers do on real stores: the replica moves off.
	if code, _, stderr := runCLI(t, "ctl", "remove-peer", "1", "4", ep); code != 0 {
		t.Fatalf("remove-peer 1 4: exit %d: %s", code, stderr)
	}
	code, stdout, stderr := runCLI(t, "ctl", "remove-store", "4", "--wait", ep)
	if code != 0 || !strings.HasSuffix(stdout, "store 4: replicas left: 0\nOK: store 4 is removed: it may be stopped and its data deleted\n") {
		t.Errorf("remove-store --wait after the move: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, _ = runCLI(t, "ctl", "stores", "--json", ep)
	var stores []storeJSON
	if err := json.Unmarshal([]byte(stdout), &stores); code != 0 || err != nil || len(stores) != 4 {
		t.Fatalf("ctl stores --json: exit %d, %v\n%s", code, err, stdout)
	}
	if !stores[3].Removing || !stores[3].Removed || stores[0].Removing || strings.Count(stdout, `"removed"`) != 1 {
		t.Errorf("ctl stores --json after the removal:\n%s", stdout)
	}

	// Stopped for good: ctl status counts three stores and is healthy.
	cl.Store(4).Stop()
	code, stdout, stderr = runCLI(t, "ctl", "status", "--endpoints", strings.Join(cl.Endpoints()[:3], ","))
	if code != 0 || !strings.HasPrefix(stdout, "OK: 3 stores up; 1 region, each") {
		t.Errorf("ctl status with store 4 removed and stopped: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestCtlRegionsSize: the table and JSON show the size and key count the
// leader reports, "-" (and no JSON field) before it has counted.
func TestCtlRegionsSize(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	if err := cl.Split([]byte("m"), 2); err != nil {
		t.Fatal(err)
	}
	cl.SetSize(2, 42, 3<<10)
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")
	code, stdout, stderr := runCLI(t, "ctl", "regions", ep)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasSuffix(lines[0], "SIZE    KEYS") ||
		!strings.HasSuffix(lines[1], "-       -") || !strings.HasSuffix(lines[2], "3.0KiB  42") {
		t.Errorf("ctl regions: exit %d, stderr %q\n%s", code, stderr, stdout)
	}
	code, stdout, _ = runCLI(t, "ctl", "regions", "--json", ep)
	var regions []map[string]any
	if err := json.Unmarshal([]byte(stdout), &regions); code != 0 || err != nil || len(regions) != 2 {
		t.Fatalf("ctl regions --json: exit %d, %v\n%s", code, err, stdout)
	}
	if _, ok := regions[0]["approximate_keys"]; ok || regions[1]["approximate_keys"] != 42.0 || regions[1]["approximate_size"] != 3072.0 {
		t.Errorf("ctl regions --json sizes:\n%s", stdout)
	}
}
