// Package rolling restarts every store of a running cluster, one at a
// time, under read and write load, and requires that not one request
// fails: a store stopped with SIGTERM hands the regions it leads to other
// stores and finishes its requests before it exits, and the next store
// goes down only once the restarted one's /readyz says it caught up. Three
// `hedgekv server` processes are started by the cluster package's process
// launcher on free ports.
//
// No failed request alone cannot tell a graceful stop from an abrupt one:
// the operations have 5 s deadlines and the client retries, so a kill -9
// (a region leaderless for an election timeout) passes that too. So the
// test also counts, on every store, the leaderships taken by election
// (hedgekv_store_leaderships_taken_total{cause="election"}): a region
// whose leader stops without handing it over gets its next leader only by
// an election, one handed over (raft's MsgTimeoutNow) by a transfer. Each
// graceful restart must see no election anywhere in the cluster and at
// least one transfer, and each stopping store must lead a region when it
// is stopped (the test hands it one if the balancer gave it none). A
// control then restarts a store abruptly (kill -9, then restart) and
// requires that the same check sees the elections: it discriminates.
package rolling

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/test/testbin"
)

const (
	// readyTimeout bounds the start of the cluster and each restart.
	readyTimeout = 60 * time.Second
	// stopGrace is how long a stopping store may take after SIGTERM
	// before it is killed (and the graceful restart fails).
	stopGrace = 15 * time.Second
	// opTimeout is each operation's deadline: long enough to ride out a
	// leader change and a retry or two, far shorter than the restarts.
	opTimeout = 5 * time.Second
	writers   = 4
	readers   = 4
	// settle is the time after each restart before the next: load on the
	// full cluster again, time for the balancer to give the restarted
	// store leaders, and for any election the restart caused to happen
	// inside the window that counts it.
	settle = 3 * time.Second
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

// phase is one part of the run (the graceful restarts, the abrupt
// control): an operation counts in the phase it started in.
type phase struct {
	name          string
	writes, reads opLog
	running       sync.WaitGroup // operations started in this phase
}

// phases hands operations their phase, and lets the test move to the next
// one and wait for the last phase's operations to end.
type phases struct {
	mu  sync.Mutex
	cur *phase
}

func (p *phases) begin() *phase {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cur.running.Add(1)
	return p.cur
}

func (p *phases) current() *phase {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// next starts phase name and waits (at most 2*opTimeout) until every
// operation of the previous one has ended.
func (p *phases) next(t *testing.T, name string) {
	t.Helper()
	p.mu.Lock()
	prev := p.cur
	p.cur = &phase{name: name}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		prev.running.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * opTimeout):
		t.Fatalf("operations of phase %q still running %v after it ended", prev.name, 2*opTimeout)
	}
}

func (ph *phase) ops() int64 { return ph.writes.ok.Load() + ph.reads.ok.Load() }

// report logs the phase's counts and fails the test for each failed
// operation it kept.
func (ph *phase) report(t *testing.T) {
	t.Helper()
	t.Logf("%s: %d writes and %d reads succeeded, %d writes and %d reads failed", ph.name,
		ph.writes.ok.Load(), ph.reads.ok.Load(), ph.writes.failed.Load(), ph.reads.failed.Load())
	t.Logf("%s: slowest write %v, slowest read %v; %d writes and %d reads took longer than %v", ph.name,
		ph.writes.max.Round(time.Millisecond), ph.reads.max.Round(time.Millisecond), ph.writes.slow.Load(), ph.reads.slow.Load(), slowOp)
	for _, l := range []*opLog{&ph.writes, &ph.reads} {
		for _, f := range l.first {
			t.Errorf("%s: failed: %s", ph.name, f)
		}
	}
	if ph.writes.ok.Load() == 0 || ph.reads.ok.Load() == 0 {
		t.Errorf("%s: no load ran: %d writes, %d reads", ph.name, ph.writes.ok.Load(), ph.reads.ok.Load())
	}
}

func TestRollingRestartFailsNoRequest(t *testing.T) {
	c := startStores(t)
	regions := c.regionCount(t)
	ld := startLoad(c.cli)
	defer ld.halt()
	// Load on every region, and a few balance rounds to spread the
	// leaders, before the first store goes down.
	ld.waitOps(t, 100)
	time.Sleep(3 * time.Second)

	t.Run("graceful", func(t *testing.T) {
		for n := 1; n <= 3; n++ {
			w := c.restart(t, ld.ph, n, true)
			// Every region store n led went to another store by a
			// handover: not one election anywhere, and some transfer.
			if w.elections != 0 {
				t.Errorf("restarting store %d: %d leaderships taken by election, want 0: a region lost its leader without a handover", n, w.elections)
			}
			if w.transfers < w.led {
				t.Errorf("restarting store %d, which led %d regions: %d leaderships taken by transfer, want at least %d", n, w.led, w.transfers, w.led)
			}
		}
		graceful := ld.ph.current()
		ld.ph.next(t, "abrupt control")
		graceful.report(t)
		c.checkStoppedGracefully(t)
	})

	// The control: the same restart, abrupt. Store 1 leads a region and is
	// killed; the region waits out an election timeout and elects a new
	// leader. The check must see it, or it proves nothing above.
	t.Run("abrupt control", func(t *testing.T) {
		w := c.restart(t, ld.ph, 1, false)
		if w.elections < 1 {
			t.Errorf("store 1 was killed leading %d regions, yet no leadership was taken by election: the check cannot tell an abrupt stop from a graceful one", w.led)
		} else {
			t.Logf("detected: store 1 was killed leading %d regions, and %d leaderships were taken by election", w.led, w.elections)
		}
		// Requests may fail here or not (the client retries past an
		// election timeout): that is why the graceful test cannot rest on
		// them alone. Only logged.
		ld.halt()
		ctl := ld.ph.current()
		t.Logf("%s: %d writes and %d reads succeeded, %d writes and %d reads failed; slowest write %v, slowest read %v",
			ctl.name, ctl.writes.ok.Load(), ctl.reads.ok.Load(), ctl.writes.failed.Load(), ctl.reads.failed.Load(),
			ctl.writes.max.Round(time.Millisecond), ctl.reads.max.Round(time.Millisecond))
	})
	ld.halt()

	// No split happened meanwhile (a split-born region's first leader is
	// elected, which the check would take for a lost leadership).
	if n := c.regionCount(t); n != regions {
		t.Errorf("%d regions at the end, %d at the start: a split during the test", n, regions)
	}
	ld.readBack(t)
	for i, addr := range c.statusAddrs {
		if code, body := httpGet("http://" + addr + "/healthz"); code != http.StatusOK {
			t.Errorf("store %d /healthz = %d %q", i+1, code, body)
		}
	}
}

// startStores starts three stores, waits until each is ready, and splits the key space into four regions, so that a
// stopping store usually leads several and hands them over at once.
func startStores(t *testing.T) *stores {
	t.Helper()
	// Info: the test reads the stores' shutdown lines. A balancer every
	// second spreads the leaders (and gives a restarted store some back)
	// within the test, so most stores stop as leaders of several regions
	// (leadSome sees to the others).
	procs := testbin.StartProcesses(t, "hedgekv-rolling-bin-", cluster.ProcessesConfig{
		Dir: t.TempDir(), LogLevel: "info", BalanceInterval: time.Second, ReadyTimeout: readyTimeout,
	})
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for _, id := range procs.StoreIDs() {
		if err := procs.WaitReady(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	cli, err := client.New(cctx, client.Config{Endpoints: procs.Endpoints, RequestTimeout: opTimeout})
	ccancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	for _, at := range []string{"rolling/1", "rolling/2", "rolling/3"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, _, err := cli.Split(ctx, []byte(at))
		cancel()
		if err != nil {
			t.Fatalf("split at %s: %v", at, err)
		}
	}
	return &stores{procs: procs, cli: cli, statusAddrs: procs.StatusAddrs}
}

// load is the writers and readers. Writers write each key once, with its
// own value; readers read keys already acknowledged, from the leader and
// from followers (ReadIndex), and check the value. Nothing may fail, and
// nothing may read wrong.
type load struct {
	cli   *client.Client
	ph    *phases
	mu    sync.Mutex
	acked []string // keys; each one's value is value(key)
	done  chan struct{}
	wg    sync.WaitGroup
	// halt stops the load and waits for it; more than once is fine.
	halt func()
}

func value(key string) string { return "v:" + key }

func startLoad(cli *client.Client) *load {
	ld := &load{cli: cli, ph: &phases{cur: &phase{name: "graceful rolling restart"}}, done: make(chan struct{})}
	ld.halt = sync.OnceFunc(func() {
		close(ld.done)
		ld.wg.Wait()
	})
	for w := range writers {
		ld.wg.Go(func() { ld.write(w) })
	}
	for r := range readers {
		policy := client.ReadPolicy{Replica: client.ReplicaLeader}
		if r%2 == 1 {
			policy.Replica = client.ReplicaFollower
		}
		ld.wg.Go(func() { ld.read(cli.Session(policy), policy.Replica, r) })
	}
	return ld
}

func (ld *load) stopped() bool {
	select {
	case <-ld.done:
		return true
	default:
		return false
	}
}

func (ld *load) write(w int) {
	for n := 0; !ld.stopped(); n++ {
		key := fmt.Sprintf("rolling/%d/%07d", w, n)
		p := ld.ph.begin()
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		start := time.Now()
		err := ld.cli.Put(ctx, []byte(key), []byte(value(key)))
		p.writes.took(time.Since(start))
		cancel()
		if err != nil {
			p.writes.fail(fmt.Sprintf("put %s: %v", key, err))
		} else {
			p.writes.ok.Add(1)
			ld.mu.Lock()
			ld.acked = append(ld.acked, key)
			ld.mu.Unlock()
		}
		p.running.Done()
	}
}

// randomAcked is a key already acknowledged, "" if none is yet.
func (ld *load) randomAcked(rng *rand.Rand) string {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if len(ld.acked) == 0 {
		return ""
	}
	return ld.acked[rng.IntN(len(ld.acked))]
}

func (ld *load) read(sess *client.Session, replica client.ReplicaPolicy, r int) {
	rng := rand.New(rand.NewPCG(uint64(r), uint64(time.Now().UnixNano())))
	for !ld.stopped() {
		key := ld.randomAcked(rng)
		if key == "" {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		p := ld.ph.begin()
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		start := time.Now()
		got, err := sess.Get(ctx, []byte(key))
		p.reads.took(time.Since(start))
		cancel()
		switch {
		case err != nil:
			p.reads.fail(fmt.Sprintf("get %s (%s): %v", key, replica, err))
		case string(got) != value(key):
			p.reads.fail(fmt.Sprintf("get %s (%s) = %q, want %q", key, replica, got, value(key)))
		default:
			p.reads.ok.Add(1)
		}
		p.running.Done()
	}
}

// waitOps waits (at most 30 s) until the current phase has seen at least
// n successful writes and n successful reads.
func (ld *load) waitOps(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p := ld.ph.current()
		w, r := p.writes.ok.Load(), p.reads.ok.Load()
		if w >= n && r >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the load has not started: %d writes, %d reads after 30s", w, r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readBack reads every acknowledged write back, linearizably.
func (ld *load) readBack(t *testing.T) {
	t.Helper()
	ld.mu.Lock()
	defer ld.mu.Unlock()
	lost := 0
	for _, key := range ld.acked {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		got, err := ld.cli.Get(ctx, []byte(key))
		cancel()
		if err != nil || string(got) != value(key) {
			if lost++; lost <= 10 {
				t.Errorf("acknowledged %s: read %q, %v", key, got, err)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged writes do not read back", lost, len(ld.acked))
	}
}

// window is what the stores did while one of them restarted.
type window struct {
	// led is how many regions the restarted store led just before.
	led int
	// transfers and elections are the leaderships all stores took,
	// by cause.
	transfers, elections int
}

// counts are one store's counters.
type counts struct {
	led, transfers, elections int
}

// stores are the store processes and what the test reads of their state.
type stores struct {
	procs       *cluster.Processes
	cli         *client.Client
	statusAddrs []string
}

// restart restarts store n, gracefully (SIGTERM: it must exit cleanly
// within stopGrace) or not (kill -9), store n leading at least one region
// when it goes down, and waits until it is ready again. It returns the
// leaderships the stores took from just before until settle after.
func (c *stores) restart(t *testing.T, ph *phases, n int, graceful bool) window {
	t.Helper()
	id := uint64(n)
	c.leadSome(t, n)
	before := c.scrape(t)
	start, ops := time.Now(), ph.current().ops()
	how := "kill -9, restart"
	if graceful {
		how = "graceful restart"
		if err := c.procs.StopStore(id, stopGrace); err != nil {
			t.Fatalf("stop store %d: %v", n, err)
		}
		if err := c.procs.ExitErr(id); err != nil {
			t.Errorf("store %d did not exit cleanly within %v of SIGTERM: %v", n, stopGrace, err)
		}
	} else if err := c.procs.Kill(id); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := c.procs.Start(id); err != nil {
		t.Fatal(err)
	}
	if err := c.procs.WaitReady(ctx, id); err != nil {
		t.Fatal(err)
	}
	t.Logf("store %d: %s: ready again in %v (%d operations meanwhile)", n, how,
		time.Since(start).Round(time.Millisecond), ph.current().ops()-ops)
	// Paces the test: the window that counts elections runs until settle
	// after the restart.
	time.Sleep(settle)
	w := c.window(n, before, c.scrape(t))
	t.Logf("store %d led %d regions when stopped; from then until %v after it was ready, the stores took %d leaderships by transfer, %d by election",
		n, w.led, settle, w.transfers, w.elections)
	return w
}

// checkStoppedGracefully: each store says it stopped gracefully, once,
// having handed over every region it led and let every request in flight
// finish.
func (c *stores) checkStoppedGracefully(t *testing.T) {
	t.Helper()
	for _, id := range c.procs.StoreIDs() {
		log, err := os.ReadFile(c.procs.LogPath(id))
		if err != nil {
			t.Fatal(err)
		}
		stops, handovers := strings.Count(string(log), "server stopped"), strings.Count(string(log), "shutdown: leaderships handed over")
		switch {
		case stops != 1:
			t.Errorf("store %d's log shows %d graceful stops, want 1", id, stops)
		case handovers != 1:
			t.Errorf("store %d's log shows %d handovers of its leaderships, want 1 (it led a region when stopped)", id, handovers)
		case strings.Contains(string(log), "leadership not handed over"):
			t.Errorf("store %d stopped without handing over a leadership", id)
		case !strings.Contains(stoppedLine(string(log)), " requests_unfinished=0"):
			t.Errorf("store %d's drain cut requests in flight: %q", id, stoppedLine(string(log)))
		}
	}
}

var (
	reTransfers = regexp.MustCompile(`(?m)^hedgekv_store_leaderships_taken_total\{cause="transfer"\} (\S+)$`)
	reElections = regexp.MustCompile(`(?m)^hedgekv_store_leaderships_taken_total\{cause="election"\} (\S+)$`)
	reLed       = regexp.MustCompile(`(?m)^hedgekv_store_leader_regions (\S+)$`)
)

// scrape reads every store's leadership counters from /metrics.
func (c *stores) scrape(t *testing.T) []counts {
	t.Helper()
	out := make([]counts, len(c.statusAddrs))
	for i, addr := range c.statusAddrs {
		code, body := httpGet("http://" + addr + "/metrics")
		if code != http.StatusOK {
			t.Fatalf("store %d /metrics = %d %q", i+1, code, body)
		}
		for _, m := range []struct {
			re  *regexp.Regexp
			dst *int
		}{{reTransfers, &out[i].transfers}, {reElections, &out[i].elections}, {reLed, &out[i].led}} {
			sub := m.re.FindStringSubmatch(body)
			if sub == nil {
				t.Fatalf("store %d /metrics has no %s", i+1, m.re)
			}
			v, err := strconv.ParseFloat(sub[1], 64)
			if err != nil {
				t.Fatalf("store %d /metrics: %s: %v", i+1, sub[0], err)
			}
			*m.dst = int(v)
		}
	}
	return out
}

// window sums what the stores took between two scrapes around store n's
// restart: the others' counters went on, n's started again from zero.
func (c *stores) window(n int, before, after []counts) window {
	w := window{led: before[n-1].led}
	for i := range after {
		d := after[i]
		if i != n-1 {
			d.transfers -= before[i].transfers
			d.elections -= before[i].elections
		}
		w.transfers += d.transfers
		w.elections += d.elections
	}
	return w
}

// leadSome makes sure store n leads a region: if it leads none, it is
// handed one from the store that leads the most. (The balancer moves a
// leadership only to a store that leads two fewer, so it never takes a
// store's last one.)
func (c *stores) leadSome(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c.scrape(t)[n-1].led > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("store %d leads no region after 20s", n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		infos, err := c.cli.Regions(ctx)
		cancel()
		if err != nil {
			t.Logf("regions: %v", err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		byStore := map[uint64]int{}
		for _, r := range infos {
			byStore[r.LeaderStoreID]++
		}
		var pick client.RegionInfo
		for _, r := range infos {
			if _, ok := r.Region.PeerOnStore(uint64(n)); ok && r.LeaderStoreID != 0 && r.LeaderStoreID != uint64(n) &&
				(pick.Region.ID == 0 || byStore[r.LeaderStoreID] > byStore[pick.LeaderStoreID]) {
				pick = r
			}
		}
		if pick.Region.ID != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			err := c.cli.TransferLeader(ctx, pick.Region.ID, uint64(n))
			cancel()
			t.Logf("store %d led no region: region %d handed to it from store %d: %v", n, pick.Region.ID, pick.LeaderStoreID, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// regionCount is how many regions the cluster has.
func (c *stores) regionCount(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	infos, err := c.cli.Regions(ctx)
	if err != nil {
		t.Fatalf("regions: %v", err)
	}
	return len(infos)
}

// stoppedLine is the "server stopped" line of a store's log.
func stoppedLine(log string) string {
	for line := range strings.Lines(log) {
		if strings.Contains(line, "server stopped") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// httpGet answers code and body, or 0 and the error.
func httpGet(url string) (int, string) {
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
