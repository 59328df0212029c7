// Package rolling restarts every store of a running cluster, one at a
// time, under read and write load, and requires that not one request
// fails: a store stopped with SIGTERM hands the regions it leads to other
// stores and finishes its requests before it exits, and `cluster.sh
// restart N` waits until the restarted store's /readyz says it caught up
// before the next store goes down. Three `hedgekv server` processes are
// started by scripts/cluster.sh on free ports.
package rolling

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/test/testbin"
)

const (
	scriptTimeout = 90 * time.Second
	// opTimeout is each operation's deadline: long enough to ride out a
	// leader change and a retry or two, far shorter than the restarts.
	opTimeout = 5 * time.Second
	writers   = 4
	readers   = 4
)

// opLog counts operations and keeps the first failures.
type opLog struct {
	ok, failed atomic.Int64
	// slow counts operations that took longer than an election timeout
	// (what a region without a leader makes them wait); max is the longest.
	slow  atomic.Int64
	mu    sync.Mutex
	max   time.Duration
	first []string
}

// slowOp is the default election timeout (10 ticks of 50ms).
const slowOp = 500 * time.Millisecond

func (l *opLog) took(d time.Duration) {
	if d > slowOp {
		l.slow.Add(1)
	}
	l.mu.Lock()
	l.max = max(l.max, d)
	l.mu.Unlock()
}

func (l *opLog) fail(what string) {
	l.failed.Add(1)
	l.mu.Lock()
	if len(l.first) < 20 {
		l.first = append(l.first, time.Now().Format("15:04:05.000")+" "+what)
	}
	l.mu.Unlock()
}

func TestRollingRestartFailsNoRequest(t *testing.T) {
	b, err := testbin.Locate("hedgekv-rolling-bin-")
	if err != nil {
		t.Fatalf("rolling setup: %v", err)
	}
	defer b.Close()
	block, err := testbin.FreeBlock()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	env := append(append(os.Environ(), "BIN="+b.Path, "CLUSTER_DIR="+dir), block.Env()...)
	// BALANCE=1s: the balancer spreads the leaders (and gives a restarted
	// store some back) within the test, so most stores stop as leaders.
	env = append(env, "FAULTS=0", "TICK=", "START_TIMEOUT=60", "STOP_TIMEOUT=15", "BALANCE=1s")
	script := func(args ...string) testbin.Result {
		return testbin.ClusterScript(b.RepoRoot, scriptTimeout, env, args...)
	}
	t.Cleanup(func() {
		if r := script("stop"); r.Err != nil {
			t.Errorf("cluster.sh stop: %v", r)
		}
	})
	if r := script("start"); r.Err != nil {
		t.Fatalf("cluster.sh start: %v", r)
	}
	for i, addr := range block.StatusAddrs {
		waitReady(t, i+1, addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cli, err := client.New(ctx, client.Config{Endpoints: block.GRPCAddrs, RequestTimeout: opTimeout})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// Four regions, so that a stopping store usually leads several and
	// hands them over at once; the balancer spreads their leaders.
	for _, at := range []string{"rolling/1", "rolling/2", "rolling/3"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, _, err := cli.Split(ctx, []byte(at))
		cancel()
		if err != nil {
			t.Fatalf("split at %s: %v", at, err)
		}
	}

	// Writers write each key once, with its own value; readers read keys
	// already acknowledged, from the leader and from followers (ReadIndex),
	// and check the value. Nothing may fail, and nothing may read wrong.
	var (
		writes, reads opLog
		mu            sync.Mutex
		acked         []string // keys; key i's value is value(key)
		stop          = make(chan struct{})
		wg            sync.WaitGroup
	)
	value := func(key string) string { return "v:" + key }
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for w := range writers {
		wg.Go(func() {
			for n := 0; !stopped(); n++ {
				key := fmt.Sprintf("rolling/%d/%07d", w, n)
				ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
				start := time.Now()
				err := cli.Put(ctx, []byte(key), []byte(value(key)))
				writes.took(time.Since(start))
				cancel()
				if err != nil {
					writes.fail(fmt.Sprintf("put %s: %v", key, err))
					continue
				}
				writes.ok.Add(1)
				mu.Lock()
				acked = append(acked, key)
				mu.Unlock()
			}
		})
	}
	for r := range readers {
		policy := client.ReadPolicy{Replica: client.ReplicaLeader}
		if r%2 == 1 {
			policy.Replica = client.ReplicaFollower
		}
		sess := cli.Session(policy)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), uint64(time.Now().UnixNano())))
			for !stopped() {
				mu.Lock()
				n := len(acked)
				var key string
				if n > 0 {
					key = acked[rng.IntN(n)]
				}
				mu.Unlock()
				if key == "" {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
				start := time.Now()
				got, err := sess.Get(ctx, []byte(key))
				reads.took(time.Since(start))
				cancel()
				switch {
				case err != nil:
					reads.fail(fmt.Sprintf("get %s (%s): %v", key, policy.Replica, err))
				case string(got) != value(key):
					reads.fail(fmt.Sprintf("get %s (%s) = %q, want %q", key, policy.Replica, got, value(key)))
				default:
					reads.ok.Add(1)
				}
			}
		})
	}

	time.Sleep(3 * time.Second)
	for n := 1; n <= 3; n++ {
		before := writes.ok.Load() + reads.ok.Load()
		start := time.Now()
		r := script("restart", strconv.Itoa(n))
		if r.Err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("restart store %d: %v", n, r)
		}
		if strings.Contains(r.Stderr+r.Stdout, "SIGKILL") {
			t.Errorf("store %d needed SIGKILL to stop:\n%s", n, r)
		}
		t.Logf("store %d restarted and ready in %v (%d operations meanwhile)", n, time.Since(start).Round(time.Millisecond),
			writes.ok.Load()+reads.ok.Load()-before)
		// Load on the full cluster again, and time for the balancer to
		// give the restarted store leaders, before the next store goes.
		time.Sleep(3 * time.Second)
	}
	close(stop)
	wg.Wait()

	t.Logf("rolling restart of stores 1, 2, 3: %d writes and %d reads succeeded, %d writes and %d reads failed",
		writes.ok.Load(), reads.ok.Load(), writes.failed.Load(), reads.failed.Load())
	t.Logf("slowest write %v, slowest read %v; %d writes and %d reads took longer than %v",
		writes.max.Round(time.Millisecond), reads.max.Round(time.Millisecond), writes.slow.Load(), reads.slow.Load(), slowOp)
	for _, l := range []*opLog{&writes, &reads} {
		for _, f := range l.first {
			t.Errorf("failed: %s", f)
		}
	}
	if writes.ok.Load() == 0 || reads.ok.Load() == 0 {
		t.Fatalf("no load ran: %d writes, %d reads", writes.ok.Load(), reads.ok.Load())
	}

	// Each store stopped gracefully, and handed over every region it led.
	handovers := 0
	for n := 1; n <= 3; n++ {
		log, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("store%d.log", n)))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !strings.Contains(string(log), "server stopped"):
			t.Errorf("store %d's log does not show a graceful stop", n)
		case strings.Contains(string(log), "leadership not handed over"):
			t.Errorf("store %d stopped without handing over a leadership", n)
		}
		handovers += strings.Count(string(log), "shutdown: leaderships handed over")
	}
	t.Logf("%d of the 3 stopping stores led regions and handed them over", handovers)

	// Every acknowledged write reads back, linearizably.
	mu.Lock()
	defer mu.Unlock()
	lost := 0
	for _, key := range acked {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		got, err := cli.Get(ctx, []byte(key))
		cancel()
		if err != nil || string(got) != value(key) {
			if lost++; lost <= 10 {
				t.Errorf("acknowledged %s: read %q, %v", key, got, err)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged writes do not read back", lost, len(acked))
	}
	for i, addr := range block.StatusAddrs {
		if code, body := httpGet(t, "http://"+addr+"/healthz"); code != http.StatusOK {
			t.Errorf("store %d /healthz = %d %q", i+1, code, body)
		}
	}
}

// waitReady waits for store n's /readyz to answer 200.
func waitReady(t *testing.T, n int, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := httpGet(t, "http://"+addr+"/readyz")
		if code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("store %d /readyz = %d %q after 30s", n, code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// httpGet answers code and body, or 0 and the error.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, err.Error()
	}
	return resp.StatusCode, string(b)
}
