package docker

// The partition of the scenario: region 1's leader cut off the network,
// what it and the majority answer meanwhile, and its return.

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// cutKey is the key whose value the cut-off store must never return once
// it is overwritten.
const cutKey = "docker/cut"

// cutOff is a store cut off the network, and the majority left.
type cutOff struct {
	cut      int
	zone     string // the cut store's
	majority []int
	majEPs   string
	at       time.Time
}

// cutLeader writes "old" to cutKey, then cuts region 1's leader's
// container off the network, the store having "old".
func (c *cluster) cutLeader(all string) cutOff {
	t := c.t
	t.Helper()
	c.mustPut(1, all, cutKey, "old")
	// The balancer may have moved the leader since: ask again, right
	// before the cut, and make sure the store to be cut off has "old".
	leader, _ := c.leaderOfRegion1(1, all, leaderWait)
	p := cutOff{cut: leader}
	for _, n := range allStores() {
		if n != p.cut {
			p.majority = append(p.majority, n)
		}
	}
	p.majEPs = endpoints(p.majority...)
	p.zone = c.zoneOf(p.cut)
	c.mustGet(p.cut, local, cutKey, "old")

	if r := c.docker("network", "disconnect", c.network, c.ids[p.cut]); r.err != nil {
		t.Fatalf("docker network disconnect: %v", r)
	}
	p.at = time.Now()
	t.Logf("store %d (region 1's leader) disconnected from %s", p.cut, c.network)
	return p
}

// majorityTakesWrite: the majority elects a leader and takes the write of
// "new". Once it is acknowledged, the old leader's lease has run out (a
// new leader cannot be elected before it does), so from here on nothing
// may read "old".
func (c *cluster) majorityTakesWrite(p cutOff) {
	c.t.Helper()
	_, r, ok := c.untilOK(failoverWait, func() result {
		return c.cli(p.majority[0], p.majEPs, cutOffTimeout, "put", cutKey, "new")
	})
	if !ok {
		c.t.Fatalf("the majority (stores %v) took no write within %v of the cut: %v", p.majority, failoverWait, r)
	}
	c.t.Logf("majority took its first write %v after the cut", time.Since(p.at).Round(time.Millisecond))
}

// probeCutOff asks the cut-off store directly, each read mode that
// promises linearizability, and a write, all at once (each takes
// cutOffTimeout to fail). Every one must fail; a read returning "old" is a
// stale read, and anything succeeding means the cut did not cut.
func (c *cluster) probeCutOff(p cutOff) {
	t := c.t
	t.Helper()
	probes := map[string][]string{
		"leader read":   {"get", cutKey, "-v"},
		"follower read": {"get", cutKey, "--read", "follower", "-v"},
		"closest read":  {"get", cutKey, "--read", "closest", "--zone", p.zone, "-v"},
		"write":         {"put", "docker/cut-write", "from-the-minority"},
	}
	probeResults := make(map[string]result, len(probes))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, args := range probes {
		wg.Go(func() {
			r := c.cli(p.cut, local, cutOffTimeout, args...)
			mu.Lock()
			probeResults[name] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	for name, r := range probeResults {
		switch {
		case r.err != nil && !refusedByCLI(r):
			t.Errorf("cut-off store %d, %s: the probe itself did not run (no answer from the CLI): %v", p.cut, name, r)
		case r.err != nil:
			t.Logf("cut-off store %d, %s: failed as it must (%v): %s", p.cut, name, r.elapsed.Round(time.Millisecond), firstLine(r.stderr))
		case r.out() == "old":
			t.Errorf("STALE: cut-off store %d answered a %s with %q after the majority acknowledged %q: %v", p.cut, name, "old", "new", r)
		default:
			t.Errorf("cut-off store %d: %s succeeded, but it cannot reach a quorum: %v", p.cut, name, r)
		}
	}
}

// majorityServes: the majority keeps serving writes and linearizable
// reads.
func (c *cluster) majorityServes(p cutOff) {
	c.t.Helper()
	for i := range 3 {
		c.mustPut(p.majority[i%2], p.majEPs, fmt.Sprintf("docker/during%d", i), fmt.Sprintf("d%d", i))
	}
	for i, n := range p.majority {
		c.mustGet(n, p.majEPs, cutKey, "new")
		c.mustGet(n, p.majEPs, cutKey, "new", "--read", "follower")
		c.mustGet(n, p.majEPs, fmt.Sprintf("docker/during%d", i), fmt.Sprintf("d%d", i))
	}
}

// staleReadRefused: a bounded-staleness read at the cut-off store: its
// last safe point is from before the cut, more than the bound (plus the
// stores' assumed 50 ms clock offset) ago, so it must be refused too.
func (c *cluster) staleReadRefused(p cutOff) {
	t := c.t
	t.Helper()
	since := time.Since(p.at)
	if since <= 1500*time.Millisecond {
		return
	}
	r := c.cli(p.cut, local, cutOffTimeout, "get", cutKey, "--read", "closest", "--zone", p.zone, "--max-staleness", "1s", "-v")
	switch {
	case r.err != nil && !refusedByCLI(r):
		t.Errorf("cut-off store %d, read bounded to 1s of staleness: the probe itself did not run: %v", p.cut, r)
	case r.err == nil:
		t.Errorf("cut-off store %d answered a read bounded to 1s of staleness %v after the cut: %v", p.cut, since.Round(time.Millisecond), r)
	default:
		t.Logf("cut-off store %d, read bounded to 1s of staleness, %v after the cut: failed as it must: %s", p.cut, since.Round(time.Millisecond), firstLine(r.stderr))
	}
}

// reconnect connects the cut store again under its old names; its peers
// dial it by name, and Docker may give it another address.
func (c *cluster) reconnect(p cutOff) {
	c.t.Helper()
	connect := []string{"network", "connect"}
	for _, a := range c.aliases[p.cut] {
		connect = append(connect, "--alias", a)
	}
	if r := c.docker(append(connect, c.network, c.ids[p.cut])...); r.err != nil {
		c.t.Fatalf("docker network connect: %v", r)
	}
}

// catchesUp: the reconnected store catches up: a linearizable read
// answered by the store itself (a client in its zone reading the closest
// replica) returns the new value; the write it was asked for while cut
// off was never applied; the whole cluster takes writes through it again.
func (c *cluster) catchesUp(p cutOff, all string) {
	t := c.t
	t.Helper()
	served := fmt.Sprintf("served by store %d ", p.cut)
	took, r, ok := c.untilOK(catchUpWait, func() result {
		r := c.cli(p.cut, local, cutOffTimeout, "get", cutKey, "--read", "closest", "--zone", p.zone, "-v")
		switch {
		case r.err != nil:
		case r.out() == "old":
			// Stale: stop retrying, it is checked below.
		case r.out() != "new":
			r.err = fmt.Errorf("got %q, want %q", r.out(), "new")
		case !strings.Contains(r.stderr, served):
			r.err = fmt.Errorf("answered by another store, not %d", p.cut)
		}
		return r
	})
	if r.err == nil && r.out() == "old" {
		t.Fatalf("STALE: store %d answered a linearizable read with %q after the reconnect: %v", p.cut, "old", r)
	}
	if !ok {
		t.Fatalf("store %d did not serve the new value within %v of the reconnect: %v", p.cut, catchUpWait, r)
	}
	t.Logf("store %d served the new value %v after the reconnect: %s", p.cut, took.Round(time.Millisecond), firstLine(r.stderr))
	for i := range 3 {
		c.mustGet(p.cut, local, fmt.Sprintf("docker/during%d", i), fmt.Sprintf("d%d", i), "--read", "closest", "--zone", p.zone)
	}
	// The write the cut-off store was asked for was never acknowledged and
	// never committed: its log entry, if it made one, was from a term the
	// majority has moved past, and is overwritten.
	if r := c.cli(p.cut, all, cliTimeout, "get", "docker/cut-write"); r.err == nil {
		t.Errorf("the write sent to the cut-off store was applied after all: %v", r)
	} else if !strings.Contains(r.stderr, "key not found") {
		t.Errorf("get docker/cut-write: want 'key not found', got %v", r)
	}
	c.mustPut(p.cut, all, "docker/after", "healed")
	for _, n := range allStores() {
		c.mustGet(n, all, "docker/after", "healed")
	}
}

// refusedByCLI tells a request the CLI made and saw fail (it says why, as
// "hedgekv: ...") from a docker exec that could not run it (the container
// gone, the exec timed out), which proves nothing about the store.
func refusedByCLI(r result) bool {
	var exit *exec.ExitError
	return errors.As(r.err, &exit) && strings.HasPrefix(r.stderr, "hedgekv: ")
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
