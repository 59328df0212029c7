// Package chaos is the nemesis over real processes: three `hedgekv server`
// processes behind the simulated WAN (scripts/cluster.sh start --topology
// default, one store per zone), concurrent clients in every zone using
// every read mode, hedging and bounded staleness, and random faults:
// partitions of a store (its zone), kill -9 and restart, power loss
// (kill -9 with the store's unsynced writes dropped: every store's data
// directory is a test/lossyfs mount), leadership
// transfers, splits, a replica removed and added back, slow and stalled
// stores. Porcupine checks the whole history (a stale read against its
// bound: it may return any value current at some point since its call
// minus the bound it reported), then `ctl check`'s replica comparison runs.
//
// `make chaos` runs it for CHAOS_SECONDS (default 60); `make test` runs a
// short one. It prints operations, faults injected, failures by kind,
// operations that took a second or more (and how many of them a
// partition does not excuse, see suspects: such a put or leader read
// fails the run) and `linearizable: true|false`; when false it saves the history and
// porcupine's visualisation under CHAOS_OUT (default test/chaos/failures)
// and fails. CHAOS_SEED picks the fault schedule; CHAOS_FOLLOWER_LEASES=1
// starts the stores with --follower-leases.
//
// Before the faults start, CHAOS_PRELOAD_MB of 128 KiB values are written
// over every client key's range (default: 24 MB for a run under 30 s, as
// make test's; 160 MB, about 20 MB per region once the nemesis has split
// at every key, for longer ones, as make chaos's), so that a snapshot
// (a replica added back, a restarted store catching up) and a split have
// real data to move while the clients run.
//
// An operation that fails while its deadline still allowed another try
// (a region error, an unreachable store or anything else the client
// returned early) is a failure of the client, not of the cluster: the
// design says region errors never reach the caller while the deadline
// allows another try. Such failures are counted as "early" and fail the
// run.
package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/replicacheck"
	"github.com/hedgekv/hedgekv/test/kvmodel"
	"github.com/hedgekv/hedgekv/test/lossyfs"
	"github.com/hedgekv/hedgekv/test/testbin"
)

const (
	scriptTimeout = 90 * time.Second
	opTimeout     = 2 * time.Second
	// staleBound is the bounded-staleness sessions' MaxStaleness.
	staleBound = 2 * time.Second
	// slowOp is what an operation may take before it counts as slow:
	// with one store cut off and the other two reachable, a get or put
	// needs a few 28 ms round trips, not a second.
	slowOp = time.Second
	// settle is how long after a fault that moves leaders or replicas (a
	// kill, a transfer, a split, a replica change) a partition starts
	// before the slow operations during it are blamed on the client.
	settle = 2 * time.Second
)

var zones = []string{"dc-a", "dc-b", "dc-c"}

// keys the clients use; the nemesis splits between them.
var keys = []string{"a", "b", "c", "d", "e", "f", "g", "h"}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// cluster is one cluster.sh cluster behind the default topology.
type cluster struct {
	t      *testing.T
	root   string
	bin    string
	env    []string
	direct []string // each store's own listen address
	dir    string   // CLUSTER_DIR: the stores' data and logs
	// disks are the stores' lossyfs mounts (store n at disks[n-1]): a
	// power loss kills the store and drops what it did not sync.
	disks []*lossyfs.FS
}

func (c *cluster) script(args ...string) testbin.Result {
	return testbin.ClusterScript(c.root, scriptTimeout, c.env, args...)
}

func TestChaos(t *testing.T) {
	seconds := envInt("CHAOS_SECONDS", 10)
	seed := uint64(envInt("CHAOS_SEED", int(time.Now().UnixNano()%1000)+1))
	leases := os.Getenv("CHAOS_FOLLOWER_LEASES") == "1"
	c := startChaosCluster(t, leases)
	t.Logf("chaos: seed %d, %ds, follower leases %v, stores %v", seed, seconds, leases, c.direct)
	defPreload := 24
	if seconds >= 30 {
		defPreload = 160
	}
	if err := preload(c.direct, envInt("CHAOS_PRELOAD_MB", defPreload), t.Logf); err != nil {
		t.Fatalf("preload: %v", err)
	}

	r := runChaos(t, c, seed, time.Duration(seconds)*time.Second)
	defer r.nem.cli.Close()

	// Replicas agree once the cluster is whole and quiet.
	cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
	rep, checkErr := replicacheck.Check(cctx, r.nem.cli, 50*time.Millisecond)
	ccancel()

	ops := r.h.Ops()
	reads, writes, unknown := countOps(ops)
	recorded := len(ops)
	ops = kvmodel.Prepare(ops, r.h.Now()+1)
	res, info := porcupine.CheckOperationsVerbose(kvmodel.Model, ops, 2*time.Minute)
	linearizable := res == porcupine.Ok
	t.Logf("operations: %d (%d reads: %s; %d writes, %d of unknown outcome)", recorded, reads, r.modes, writes, unknown)
	t.Logf("faults: %s", r.nem.faults)
	t.Logf("failures by kind: %s", r.fails)
	earlyOps := r.early.list()
	suspects := r.logSlowAndEarly(t, earlyOps)
	if checkErr != nil {
		t.Logf("replicas: %v", checkErr)
	} else {
		t.Logf("replicas: the replicas of all %d regions agree", len(rep.Agreed))
	}
	t.Logf("linearizable: %v", linearizable)
	if reads < 20 {
		t.Errorf("only %d successful reads: too few to check anything", reads)
	}
	if !linearizable {
		html := saveHistory(c.root, seed, ops, info)
		t.Errorf("history is not linearizable (%v); saved to %s and the .json beside it; faults: %s", res, html, strings.Join(r.nem.log, "; "))
	}
	if checkErr != nil {
		// The faults, in order, and the stores' logs are what a
		// divergence is traced back to.
		t.Errorf("replica check after the run: %v; faults: %s; store logs saved to %s",
			checkErr, strings.Join(r.nem.log, "; "), saveStoreLogs(c, seed))
	}
	if n := countInLogs(c, mergeViolationLog); n > 0 {
		t.Errorf("the stores logged %d merge violations (%q): a merge committed over a source replica that had not applied its freeze; store logs saved to %s",
			n, mergeViolationLog, saveStoreLogs(c, seed))
	}
	if n := countInLogs(c, splitOverSnapshotLog); n > 0 {
		t.Errorf("the stores logged %d splits over a snapshot (%q): a snapshot admitted beside one that covers its range; store logs saved to %s",
			n, splitOverSnapshotLog, saveStoreLogs(c, seed))
	}
	if len(earlyOps) > 0 {
		t.Errorf("%d operations failed while their deadline allowed another try: the client let an error through (see \"early:\" above)", len(earlyOps))
	}
	// A put or a leader read that a zone reaching two stores, one of
	// them leading its region since before the cut, waited a second for:
	// nothing but waiting on the cut-off store (a metadata call, or a
	// stale cached leader) explains it. Follower and stale reads are only
	// reported: their replica choice may land on the cut store, which the
	// read path gives up on after an attempt timeout. Follower leases make
	// writes wait for a cut-off lease holder's lease to run out.
	if len(suspects.strict) > 0 && !leases {
		t.Errorf("%d puts or leader reads took %v or more while the client's zone reached a majority and their region's leader was not cut off", len(suspects.strict), slowOp)
	}
}

// startChaosCluster starts three stores behind the default topology with
// scripts/cluster.sh (faults allowed, follower leases if leases), stopped
// when the test ends.
func startChaosCluster(t *testing.T, leases bool) *cluster {
	t.Helper()
	b, err := testbin.Locate("hedgekv-chaos-bin-")
	if err != nil {
		t.Fatalf("chaos setup: %v", err)
	}
	t.Cleanup(b.Close)
	block, err := testbin.FreeBlock()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := &cluster{t: t, root: b.RepoRoot, bin: b.Path, direct: block.GRPCAddrs, dir: dir}
	// Each store's data directory (cluster.sh: $CLUSTER_DIR/storeN) is a
	// mount that forgets unsynced writes on a cut; mounted before the
	// cluster starts, so unmounted after it stops (cleanups run last in,
	// first out).
	backing := t.TempDir()
	for n := 1; n <= 3; n++ {
		mnt := filepath.Join(dir, fmt.Sprintf("store%d", n))
		bdir := filepath.Join(backing, fmt.Sprintf("store%d", n))
		for _, d := range []string{mnt, bdir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		c.disks = append(c.disks, lossyfs.MountT(t, bdir, mnt, lossyfs.Options{Seed: uint64(n)}))
	}
	c.env = append(append(os.Environ(), "BIN="+b.Path, "CLUSTER_DIR="+dir), block.Env()...)
	c.env = append(c.env, "FAULTS=1", "TICK=", "START_TIMEOUT=60")
	if leases {
		c.env = append(c.env, "FOLLOWER_LEASES=1")
	}
	t.Cleanup(func() {
		if r := c.script("stop"); r.Err != nil {
			t.Errorf("cluster.sh stop: %v", r)
		}
	})
	if r := c.script("start", "--topology", "default"); r.Err != nil {
		t.Fatalf("cluster.sh start --topology default: %v", r)
	}
	return c
}

// chaosRun is what the clients and the nemesis did.
type chaosRun struct {
	h            *kvmodel.History
	fails, modes *counter
	slow         *slowOps
	early        *earlyFailures
	nem          *nemesis // its client stays open for the checks
}

// runChaos runs the clients and the nemesis for d, then stops them and
// brings the cluster back whole.
func runChaos(t *testing.T, c *cluster, seed uint64, d time.Duration) *chaosRun {
	t.Helper()
	r := &chaosRun{h: kvmodel.NewHistory(), fails: &counter{}, modes: &counter{}, slow: &slowOps{}, early: &earlyFailures{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Nine clients that write and read, and three (one per zone) that only
	// read: a client whose store is cut off from the leader spends its
	// writes' deadlines waiting, and a reader keeps asking the cut-off
	// store meanwhile, which is when a stale answer would show.
	for i := range 12 {
		zone := zones[i%len(zones)]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cli, err := client.New(ctx, client.Config{Endpoints: c.direct, Zone: zone, RequestTimeout: opTimeout})
		cancel()
		if err != nil {
			t.Fatalf("client in %s: %v", zone, err)
		}
		defer cli.Close()
		readOnly := i >= 9
		wg.Go(func() { runClient(i, zone, cli, readOnly, seed, r.h, stop, r.fails, r.modes, r.slow, r.early) })
	}
	// One CLI-like client per zone: a new client for every put and get,
	// with nothing cached, as each `hedgekv put` or `get` is. Their keys
	// are outside the checked history; what they show is how long
	// connecting and the metadata lookups take under the faults.
	for _, zone := range zones {
		wg.Go(func() { runFreshClient(zone, c.direct, stop, r.fails, r.slow, r.early) })
	}
	r.nem = &nemesis{c: c, rng: rand.New(rand.NewPCG(seed, seed^0x5bd1e995)), stop: stop, faults: &counter{}}
	ctl, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	var err error
	r.nem.cli, err = client.New(ctl, client.Config{Endpoints: c.direct, RequestTimeout: 5 * time.Second})
	cancel()
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	nemDone := make(chan struct{})
	go func() { defer close(nemDone); r.nem.loop() }()
	time.Sleep(d) // the run's length
	close(stop)
	wg.Wait()
	<-nemDone
	r.nem.recover()
	return r
}

// countOps counts the reads and writes of a history, and the operations
// of unknown outcome.
func countOps(ops []porcupine.Operation) (reads, writes, unknown int) {
	for i := range ops {
		in := ops[i].Input.(kvmodel.Input)
		if in.Put || in.Delete {
			writes++
		} else {
			reads++
		}
		if ops[i].Return == -1 {
			unknown++
		}
	}
	return reads, writes, unknown
}

// logSlowAndEarly logs the operations that failed early and the slow ones
// (those during the partitions that count), and returns the suspects.
func (r *chaosRun) logSlowAndEarly(t *testing.T, earlyOps []slowRecord) suspects {
	t.Helper()
	t.Logf("failed before their deadline (a retryable error surfaced): %d", len(earlyOps))
	for i, o := range earlyOps {
		if i == 20 {
			t.Logf("  ... and %d more", len(earlyOps)-i)
			break
		}
		t.Logf("  early: %s", o)
	}
	slowAll, suspects := r.slow.judge(r.nem.windows)
	fair := 0
	for _, w := range r.nem.windows {
		if w.fair {
			fair++
		}
	}
	t.Logf("slow operations (%v or more, failed ones included): %d; during the %d of %d partitions that began settled, from a zone reaching both other stores, on a region steadily led elsewhere: %d puts and leader reads, %d follower and stale reads",
		slowOp, slowAll, fair, len(r.nem.windows), len(suspects.strict), len(suspects.replica))
	for _, o := range suspects.strict {
		t.Logf("  slow: %s", o)
	}
	return suspects
}

// saveHistory writes a history that is not linearizable, and porcupine's
// picture of it, under CHAOS_OUT (default test/chaos/failures of the
// repository at root); it returns the picture's path.
// failuresDir is where a failed run's history and logs go: $CHAOS_OUT, or
// test/chaos/failures.
func failuresDir(root string) string {
	if out := os.Getenv("CHAOS_OUT"); out != "" {
		return out
	}
	return filepath.Join(root, "test", "chaos", "failures")
}

func saveHistory(root string, seed uint64, ops []porcupine.Operation, info porcupine.LinearizationInfo) string {
	out := failuresDir(root)
	_ = os.MkdirAll(out, 0o755)
	html := filepath.Join(out, fmt.Sprintf("chaos-seed-%d.html", seed))
	_ = porcupine.VisualizePath(kvmodel.Model, info, html)
	raw, _ := json.MarshalIndent(ops, "", " ")
	_ = os.WriteFile(filepath.Join(out, fmt.Sprintf("chaos-seed-%d.json", seed)), raw, 0o644)
	return html
}

// mergeViolationLog is what a store logs when a merge commits over a
// replica of the source that had not applied its freeze.
const mergeViolationLog = "merge committed where the source's freeze was not applied"

// splitOverSnapshotLog is what a store logs when a split finds its new
// region's snapshot under way (raftstore's snapshot claims rule it out).
const splitOverSnapshotLog = "a split found its new region's snapshot under way"

// countInLogs counts the lines of the stores' logs that hold s.
func countInLogs(c *cluster, s string) int {
	logs, _ := filepath.Glob(filepath.Join(c.dir, "store*.log"))
	n := 0
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		n += bytes.Count(b, []byte(s))
	}
	return n
}

// saveStoreLogs copies the stores' logs beside the saved histories (the
// cluster's directory goes with the test) and returns where.
func saveStoreLogs(c *cluster, seed uint64) string {
	out := filepath.Join(failuresDir(c.root), fmt.Sprintf("chaos-seed-%d-logs", seed))
	_ = os.MkdirAll(out, 0o755)
	logs, _ := filepath.Glob(filepath.Join(c.dir, "*.log"))
	for _, l := range logs {
		if b, err := os.ReadFile(l); err == nil {
			_ = os.WriteFile(filepath.Join(out, filepath.Base(l)), b, 0o644)
		}
	}
	return out
}

// slowRecord is one operation that took slowOp or more.
type slowRecord struct {
	client int
	zone   string
	kind   string // "put", "delete", or "get:" and the session's name
	key    string
	start  time.Time
	took   time.Duration
	err    error
}

func (o slowRecord) String() string {
	s := fmt.Sprintf("client %d (%s) %s %q at %s took %v", o.client, o.zone, o.kind, o.key, o.start.Format("15:04:05.000"), o.took.Round(time.Millisecond))
	if o.err != nil {
		s += fmt.Sprintf(" (%v)", o.err)
	}
	return s
}

// slowOps collects the slow operations of every client.
type slowOps struct {
	mu  sync.Mutex
	ops []slowRecord
}

func (s *slowOps) add(o slowRecord) {
	if o.took < slowOp {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops = append(s.ops, o)
}

// suspects are slow operations that a partition does not excuse: they
// started while one store was cut off, no store was down and no fault
// had moved leaders or replicas for settle, from a zone other than the
// cut store's (so two stores were reachable), on a key whose region had
// a leader other than the cut store when the cut began.
type suspects struct {
	strict  []slowRecord // puts and leader reads
	replica []slowRecord // follower, mixed, closest and stale reads
}

func (s *slowOps) judge(windows []partitionWindow) (int, suspects) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out suspects
	for _, o := range s.ops {
		for _, w := range windows {
			if o.start.Before(w.start) || !o.start.Before(w.end) || !w.fair || o.zone == zones[w.store-1] {
				continue
			}
			leader, ok := w.leaderOf([]byte(o.key))
			if !ok || leader == uint64(w.store) {
				continue
			}
			if o.kind == "put" || o.kind == "delete" || o.kind == "get:leader" || o.kind == "get:hedged" || strings.HasPrefix(o.kind, "fresh ") {
				out.strict = append(out.strict, o)
			} else {
				out.replica = append(out.replica, o)
			}
		}
	}
	return len(s.ops), out
}

// partitionWindow is one partition the nemesis made.
type partitionWindow struct {
	store      int
	start, end time.Time
	// fair: no store was down and nothing moved leaders or replicas for
	// settle before the cut; regions is the cluster's view just before.
	fair    bool
	regions []client.RegionInfo
}

// leaderOf is the leader of the region holding key when the cut began;
// false if no region was known to hold it, or it had no leader.
func (w partitionWindow) leaderOf(key []byte) (uint64, bool) {
	for _, r := range w.regions {
		if r.Region.Contains(key) {
			return r.LeaderStoreID, r.LeaderStoreID != 0
		}
	}
	return 0, false
}

// counter counts by kind.
type counter struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counter) add(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[kind]++
}

func (c *counter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ks := make([]string, 0, len(c.m))
	for k := range c.m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = fmt.Sprintf("%s=%d", k, c.m[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// failKind classifies a failed operation for the summary.
func failKind(err error) string {
	var nl *region.NotLeaderError
	var dr *region.DataIsNotReadyError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.As(err, &nl):
		return "not-leader"
	case errors.As(err, &dr):
		return "stale-not-ready"
	}
	if s, ok := status.FromError(errors.Unwrap(err)); ok && s.Code() != codes.Unknown {
		return s.Code().String()
	}
	return "other"
}

// runClient issues puts and gets (only gets if readOnly) under every read
// policy until stop.
func runClient(id int, zone string, cli *client.Client, readOnly bool, seed uint64, h *kvmodel.History, stop <-chan struct{}, fails, modes *counter, slow *slowOps, early *earlyFailures) {
	rng := rand.New(rand.NewPCG(seed+uint64(id), uint64(id)))
	sessions := []struct {
		name string
		s    *client.Session
	}{
		{"leader", cli.Session(client.ReadPolicy{Replica: client.ReplicaLeader})},
		{"follower", cli.Session(client.ReadPolicy{Replica: client.ReplicaFollower})},
		{"mixed", cli.Session(client.ReadPolicy{Replica: client.ReplicaMixed})},
		{"closest", cli.Session(client.ReadPolicy{Replica: client.ReplicaClosest})},
		{"hedged", cli.Session(client.ReadPolicy{Replica: client.ReplicaLeader, Hedge: client.HedgeAfterPercentile(0.9), HedgeBudget: 0.2})},
		{"stale", cli.Session(client.ReadPolicy{Replica: client.ReplicaClosest, MaxStaleness: staleBound})},
		{"stale-hedged", cli.Session(client.ReadPolicy{Replica: client.ReplicaLeader, MaxStaleness: staleBound, Hedge: client.HedgeAfter(20 * time.Millisecond), HedgeBudget: 0.2})},
	}
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		key := keys[rng.IntN(len(keys))]
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		call := h.Now()
		begin := time.Now()
		// write records a put or delete: a failed one may still take
		// effect at any later time.
		write := func(kind string, in kvmodel.Input, err error) {
			rec := slowRecord{client: id, zone: zone, kind: kind, key: key, start: begin, took: time.Since(begin), err: err}
			slow.add(rec)
			if err != nil {
				fails.add(kind + ":" + failKind(err))
				early.check(ctx, rec)
				h.Add(porcupine.Operation{ClientId: id, Input: in, Call: call, Output: kvmodel.Output{Unknown: true}, Return: -1})
			} else {
				h.Add(porcupine.Operation{ClientId: id, Input: in, Call: call, Output: kvmodel.Output{}, Return: h.Now()})
			}
		}
		dice := rng.IntN(100)
		if !readOnly && dice < 4 {
			// Deletes: a store that keeps a key its region deleted (a
			// snapshot over a merge's source did) shows as a stale read
			// and a replica difference.
			write("delete", kvmodel.Input{Delete: true, Key: key}, cli.Delete(ctx, []byte(key)))
		} else if !readOnly && dice < 30 {
			val := fmt.Sprintf("%d.%d", id, n)
			write("put", kvmodel.Input{Put: true, Key: key, Value: val}, cli.Put(ctx, []byte(key), []byte(val)))
		} else {
			sess := sessions[rng.IntN(len(sessions))]
			v, info, err := sess.s.GetWithInfo(ctx, []byte(key))
			slow.add(slowRecord{client: id, zone: zone, kind: "get:" + sess.name, key: key, start: begin, took: time.Since(begin), err: err})
			found := err == nil
			if errors.Is(err, client.ErrNotFound) {
				err = nil
			}
			if err != nil {
				fails.add("get:" + failKind(err))
				early.check(ctx, slowRecord{client: id, zone: zone, kind: "get:" + sess.name, key: key, start: begin, took: time.Since(begin), err: err})
			} else {
				modes.add(string(info.Mode))
				// A stale answer may be as old as its bound: it may
				// return what was current at any point since then.
				c := call
				if info.Mode == "stale" {
					c -= int64(info.StalenessBound)
				}
				h.Add(porcupine.Operation{ClientId: id, Input: kvmodel.Input{Key: key, Mode: sess.name}, Call: c,
					Output: kvmodel.Output{Value: string(v), Found: found}, Return: h.Now()})
			}
		}
		cancel()
	}
}

// runFreshClient puts and gets one key of its own through a new client
// each time (connecting counts in the op's time) until stop.
func runFreshClient(zone string, endpoints []string, stop <-chan struct{}, fails *counter, slow *slowOps, early *earlyFailures) {
	key := "fresh/" + zone
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		put := n%2 == 0
		kind := "fresh get"
		if put {
			kind = "fresh put"
		}
		begin := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		cli, err := client.New(ctx, client.Config{Endpoints: endpoints, Zone: zone, RequestTimeout: opTimeout})
		if err == nil {
			if put {
				err = cli.Put(ctx, []byte(key), []byte(strconv.Itoa(n)))
			} else if _, err = cli.Get(ctx, []byte(key)); errors.Is(err, client.ErrNotFound) {
				err = nil
			}
			_ = cli.Close()
		}
		rec := slowRecord{client: -1, zone: zone, kind: kind, key: key, start: begin, took: time.Since(begin), err: err}
		slow.add(rec)
		if err != nil {
			fails.add(strings.ReplaceAll(kind, " ", "-") + ":" + failKind(err))
			early.check(ctx, rec)
		}
		cancel()
	}
}

// earlyFailures are operations that failed while their context was still
// alive: the client returned an error instead of retrying within the
// deadline.
type earlyFailures struct {
	mu  sync.Mutex
	ops []slowRecord
}

// check records o, which failed, unless its deadline had run out (ctx is
// the operation's, still uncancelled when called).
func (e *earlyFailures) check(ctx context.Context, o slowRecord) {
	if ctx.Err() != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ops = append(e.ops, o)
}

func (e *earlyFailures) list() []slowRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]slowRecord(nil), e.ops...)
}

// preloadValue is the size of each preloaded value: large enough that a
// few hundred make tens of MB, small enough for one raft entry.
const preloadValue = 128 << 10

// preload writes mb MiB of preloadValue-sized values, spread evenly over
// the ranges of the client keys (the nemesis splits at them), through a
// client without a zone: it dials the stores' own addresses, past the
// simulated WAN, though replication still crosses it.
func preload(endpoints []string, mb int, logf func(string, ...any)) error {
	if mb <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(30+mb)*time.Second)
	defer cancel()
	cli, err := client.New(ctx, client.Config{Endpoints: endpoints, RequestTimeout: 20 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	n := mb << 20 / preloadValue
	begin := time.Now()
	val := make([]byte, preloadValue)
	for i := range val {
		val[i] = byte('a' + i%26)
	}
	next := make(chan int)
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range next {
				// keys[i%8] + "/pre/...": inside [keys[j], keys[j+1]).
				k := fmt.Sprintf("%s/pre/%06d", keys[i%len(keys)], i)
				if err := cli.Put(ctx, []byte(k), val); err != nil {
					errc <- fmt.Errorf("put %s: %w", k, err)
					return
				}
			}
		})
	}
	var perr error
feed:
	for i := range n {
		select {
		case next <- i:
		case perr = <-errc:
			break feed
		}
	}
	close(next)
	wg.Wait()
	if perr == nil {
		select {
		case perr = <-errc:
		default:
		}
	}
	if perr != nil {
		return perr
	}
	logf("preload: %d MiB (%d values of %d KiB) in %v", mb, n, preloadValue>>10, time.Since(begin).Round(time.Millisecond))
	return nil
}

// nemesis injects one fault at a time until stop closes.
type nemesis struct {
	c      *cluster
	cli    *client.Client
	rng    *rand.Rand
	stop   <-chan struct{}
	faults *counter
	log    []string
	killed map[int]bool
	// impostors counts the impostor faults (impostor_test.go).
	impostors int
	// windows are the partitions made; lastMove is when a fault that
	// moves leaders or replicas last ended.
	windows  []partitionWindow
	lastMove time.Time
}

func (n *nemesis) sleep(d time.Duration) bool {
	select {
	case <-n.stop:
		return false
	case <-time.After(d):
		return true
	}
}

func (n *nemesis) record(kind, format string, a ...any) {
	n.faults.add(kind)
	if len(n.log) < 200 {
		n.log = append(n.log, kind+" "+fmt.Sprintf(format, a...))
	}
}

func (n *nemesis) loop() {
	n.killed = map[int]bool{}
	for {
		if !n.sleep(time.Duration(300+n.rng.IntN(700)) * time.Millisecond) {
			return
		}
		store := 1 + n.rng.IntN(3)
		hold := time.Duration(300+n.rng.IntN(1200)) * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		switch n.rng.IntN(10) {
		case 0:
			n.record("partition", "store %d (zone %s) for %v", store, zones[store-1], hold)
			w := partitionWindow{store: store, fair: len(n.killed) == 0 && time.Since(n.lastMove) >= settle}
			if w.fair {
				// Who led what as the cut begins (the nemesis's client
				// reaches every store at its own address).
				rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
				infos, err := n.cli.Regions(rctx)
				rcancel()
				w.regions, w.fair = infos, err == nil
			}
			n.c.script("partition", strconv.Itoa(store))
			w.start = time.Now()
			n.sleep(hold)
			n.c.script("heal")
			w.end = time.Now()
			n.windows = append(n.windows, w)
		case 1:
			n.record("kill", "store %d (kill -9) for %v", store, hold)
			n.c.script("kill", strconv.Itoa(store))
			n.sleep(hold)
			if r := n.c.script("restart", strconv.Itoa(store)); r.Err != nil {
				n.killed[store] = true // recover tries again
			}
			n.lastMove = time.Now()
		case 2:
			r, ok := n.randomRegion(ctx)
			if ok {
				n.record("transfer", "region %d to store %d", r.ID, store)
				_ = n.cli.TransferLeader(ctx, r.ID, uint64(store))
				n.lastMove = time.Now()
			}
		case 3:
			key := keys[1+n.rng.IntN(len(keys)-1)]
			n.record("split", "at %q", key)
			_, _, _ = n.cli.Split(ctx, []byte(key))
			n.lastMove = time.Now()
		case 4:
			r, ok := n.randomRegion(ctx)
			if ok {
				n.record("replica", "region %d: remove store %d's replica and add it back", r.ID, store)
				if n.cli.RemovePeer(ctx, r.ID, uint64(store)) == nil {
					actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
					_ = n.cli.AddPeer(actx, r.ID, uint64(store))
					acancel()
				}
				n.lastMove = time.Now()
			}
		case 5:
			n.record("slow", "store %d: reads delayed 100ms with probability 0.5 for %v", store, hold)
			_ = n.cli.Fault(ctx, uint64(store), client.Fault{Delay: 100 * time.Millisecond, Prob: 0.5})
			n.sleep(hold)
			_ = n.cli.Fault(ctx, uint64(store), client.Fault{Clear: true})
		case 6:
			n.record("stall", "store %d stalls 400ms", store)
			_ = n.cli.Fault(ctx, uint64(store), client.Fault{Stall: 400 * time.Millisecond})
			n.sleep(500 * time.Millisecond)
		case 7:
			mode := lossyfs.CutMode(n.rng.IntN(3))
			n.record("power-loss", "store %d (kill -9, unsynced writes dropped: %s) for %v", store, mode, hold)
			n.c.script("kill", strconv.Itoa(store))
			if err := n.c.disks[store-1].Cut(mode); err != nil {
				n.c.t.Errorf("power loss of store %d: cut: %v", store, err)
			}
			n.sleep(hold)
			if r := n.c.script("restart", strconv.Itoa(store)); r.Err != nil {
				n.killed[store] = true // recover tries again
			}
			n.lastMove = time.Now()
		case 8:
			// The splits keep cutting the key space; merges join it
			// again, racing them, the transfers and the kills.
			r, ok := n.randomRegion(ctx)
			if ok && len(r.EndKey) > 0 {
				merged, err := n.cli.Merge(ctx, r.ID)
				if err == nil {
					n.record("merge", "region %d absorbed its right neighbour: %s", r.ID, merged.String())
				} else {
					n.record("merge-failed", "region %d: %v", r.ID, err)
				}
				n.lastMove = time.Now()
			}
		case 9:
			n.record("impostor", "store %d's address served by a store of another cluster for %v", store, hold)
			n.c.script("kill", strconv.Itoa(store))
			n.impostors++
			n.impostor(store, hold, n.impostors)
			if r := n.c.script("restart", strconv.Itoa(store)); r.Err != nil {
				n.killed[store] = true // recover tries again
			}
			n.lastMove = time.Now()
		}
		cancel()
	}
}

// randomRegion picks one of the cluster's regions.
func (n *nemesis) randomRegion(ctx context.Context) (region.Region, bool) {
	infos, err := n.cli.Regions(ctx)
	if err != nil || len(infos) == 0 {
		return region.Region{}, false
	}
	return infos[n.rng.IntN(len(infos))].Region, true
}

// recover ends every fault: heals the network, clears injected faults,
// restarts any store that is down, and gives every region's replica set
// back its three voters.
func (n *nemesis) recover() {
	n.c.script("heal")
	for s := 1; s <= 3; s++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = n.cli.Fault(ctx, uint64(s), client.Fault{Clear: true})
		cancel()
	}
	for s := range n.killed {
		if r := n.c.script("restart", strconv.Itoa(s)); r.Err != nil {
			n.c.t.Logf("restart store %d after the run: %v", s, r)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	infos, err := n.cli.Regions(ctx)
	if err != nil {
		return
	}
	for _, info := range infos {
		r := info.Region
		for s := uint64(1); s <= 3; s++ {
			if _, ok := r.PeerOnStore(s); !ok {
				_ = n.cli.AddPeer(ctx, r.ID, s)
			}
		}
	}
}
