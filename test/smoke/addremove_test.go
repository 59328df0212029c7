package smoke

import (
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/test/testbin"
)

// storeJSON is one store of `ctl stores --json`.
func (c *cluster) stores() ([]storeJSON, error) {
	var ss []storeJSON
	err := testbin.DecodeJSON(c.cli(cliTimeout, "ctl", "stores", "--json"), "ctl stores --json", &ss)
	return ss, err
}

// waitStores polls ctl stores until ok holds, for at most budget.
func (c *cluster) waitStores(what string, budget time.Duration, ok func([]storeJSON) bool) {
	c.t.Helper()
	deadline := time.Now().Add(budget)
	var last string
	for time.Now().Before(deadline) {
		ss, err := c.stores()
		if err == nil && ok(ss) {
			return
		}
		last = fmt.Sprintf("%+v %v", ss, err)
		time.Sleep(300 * time.Millisecond)
	}
	c.t.Fatalf("%s: not within %v (last: %s)", what, budget, last)
}

// TestClusterScriptAddRemove: `cluster.sh add 4` joins a fourth store and
// the balancers give it replicas; `remove 1` moves every replica off a
// founding store, stops it and deletes its data; the data stays whole;
// stop and start bring back stores 2, 3 and 4 (not 1); a removed id
// cannot be added again.
func TestClusterScriptAddRemove(t *testing.T) {
	c := startClusterEnv(t, "BALANCE=500ms", "REMOVE_TIMEOUT=90")
	acked := map[string]string{}
	for i := range 40 {
		c.mustPut(fmt.Sprintf("ar/k%02d", i), fmt.Sprintf("v%02d", i), acked)
	}
	for i, k := range []string{"ar/k10", "ar/k20", "ar/k30"} {
		r := c.cli(cliTimeout, "ctl", "split", k)
		if r.Err != nil {
			t.Fatalf("ctl split %s: %v", k, r)
		}
		// Region IDs read as a sequence: the cluster's splits make 2, 3, 4.
		if want := fmt.Sprintf("right: region %d ", i+2); !strings.Contains(r.Stdout, want) {
			t.Errorf("ctl split %s printed %q, want %q", k, r.Stdout, want)
		}
	}

	ports, err := testbin.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	r := c.script("add", "4", "--grpc-port", strconv.Itoa(ports[0]), "--status-port", strconv.Itoa(ports[1]))
	t.Logf("cluster.sh add 4 (%v):\n%s%s", r.Elapsed.Round(time.Millisecond), r.Stdout, r.Stderr)
	if r.Err != nil {
		t.Fatalf("cluster.sh add 4: %v", r)
	}
	addr4 := testbin.Addrs(ports[:1])[0]
	// Twelve replicas over four stores: the balancers even them out.
	c.waitStores("store 4 up with replicas", 60*time.Second, func(ss []storeJSON) bool {
		return len(ss) == 4 && ss[3].ID == 4 && ss[3].Up && ss[3].RegionCount >= 2
	})
	if r := c.script("status"); r.Err != nil || !strings.Contains(r.Stdout, "store 4  dc-a  up") {
		t.Errorf("cluster.sh status with store 4: %v\n%s", r.Err, r.Stdout)
	}

	r = c.script("remove", "1")
	t.Logf("cluster.sh remove 1 (%v):\n%s%s", r.Elapsed.Round(time.Millisecond), r.Stdout, r.Stderr)
	if r.Err != nil || !strings.Contains(r.Stdout, "store 1 removed: stopped, its data deleted; the cluster's stores are 2 3 4") {
		t.Fatalf("cluster.sh remove 1: %v", r)
	}
	eps := strings.Split(c.endpoints, ",")
	c.endpoints = strings.Join([]string{eps[1], eps[2], addr4}, ",")
	if !strings.Contains(r.Stdout, "export HEDGEKV_ENDPOINTS="+c.endpoints+"\n") {
		t.Errorf("cluster.sh remove 1 does not print the new export line (HEDGEKV_ENDPOINTS=%s):\n%s", c.endpoints, r.Stdout)
	}
	if r := c.script("endpoints"); strings.TrimSpace(r.Stdout) != c.endpoints {
		t.Errorf("cluster.sh endpoints after the removal: %q, want %q", r.Stdout, c.endpoints)
	}
	c.waitStores("store 1 listed removed", 10*time.Second, func(ss []storeJSON) bool {
		return len(ss) == 4 && ss[0].ID == 1 && ss[0].Removed && !ss[0].Up
	})
	rs, err := c.regions()
	if err != nil {
		t.Fatal(err)
	}
	for _, reg := range rs {
		if len(reg.Peers) != 3 {
			t.Errorf("region %d after the removal: peers %+v", reg.ID, reg.Peers)
		}
		for _, p := range reg.Peers {
			if p.StoreID == 1 {
				t.Errorf("region %d still has a replica on store 1: %+v", reg.ID, reg.Peers)
			}
		}
	}
	c.checkScan("ar/", "ar0", acked)
	if r := c.script("status"); r.Err != nil || strings.Contains(r.Stdout, "store 1  ") {
		t.Errorf("cluster.sh status after the removal (exit %v):\n%s", r.Err, r.Stdout)
	}

	// The cluster's membership survives a stop and start.
	if r := c.script("stop"); r.Err != nil || !strings.Contains(r.Stdout, "stopped store(s) 2 3 4") {
		t.Fatalf("cluster.sh stop: %v", r)
	}
	if r := c.script("start"); r.Err != nil || !strings.Contains(r.Stdout, "cluster up: endpoints "+c.endpoints) {
		t.Fatalf("cluster.sh start after the removal: %v", r)
	}
	c.checkScan("ar/", "ar0", acked)

	if r := c.script("add", "1"); exitCode(r) != 2 || !strings.Contains(r.Stderr, "a removed store's id is not reused") {
		t.Errorf("cluster.sh add 1 after its removal: %v, want exit 2", r)
	}
	if r := c.script("remove", "3"); exitCode(r) != 1 || !strings.Contains(r.Stderr, "remove 3 refused; nothing changed") {
		t.Errorf("cluster.sh remove 3 with three stores: %v, want refused", r)
	}
}

// exitCode is the exit status of a script run (-1 if it did not exit).
func exitCode(r result) int {
	var ee *exec.ExitError
	if r.Err == nil {
		return 0
	}
	if errors.As(r.Err, &ee) {
		return ee.ExitCode()
	}
	return -1
}
