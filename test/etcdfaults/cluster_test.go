// Package etcdfaults runs clients nobody here wrote (clientv3 and its
// concurrency package, unchanged) against real `hedgekv server` processes
// while stores are killed with kill -9 and restarted, and cut off by the
// simulated WAN's partitions:
//
//   - TestMutexAndElectionUnderFaults: clients contend on a Mutex and an
//     Election; inside, each holder appends to a log key with Txns fenced
//     on its ownership; the log shows critical sections that never
//     overlap, every acknowledged append, and a counter with no lost
//     update; every client gets the lock again once the faults end, a
//     client whose session expired making a new one.
//   - TestLinearizableUnderFaults: Put, Range and compare-and-set Txns,
//     checked by porcupine, and watchers on every store that must deliver
//     every write once, in revision order.
//   - TestWatchAcrossRestart: watchers connected to one store each, that
//     store killed and restarted (a follower's, then the leader's): they
//     resume and miss nothing, also when the store restarts cut off from
//     the others (TestWatchAcrossRestartIntoPartition).
//
// The stores run behind netsim (package netsim, in this process, links
// without latency: they are here to be cut) as scripts/cluster.sh runs
// them behind `hedgekv netsim`: each store advertises its zone addresses,
// and a client in zone Z dials every store through Z's links, so a
// partition of a store cuts it off from the other stores and from the
// clients of other zones, and cuts the clients of its zone off from the
// other stores. Like the other multi-process tests it runs without -race
// against $HEDGEKV_BIN (make test passes bin/hedgekv), else a fresh build.
// ETCDFAULTS_SEED picks the fault schedules, ETCDFAULTS_SECONDS stretches
// them.
package etcdfaults

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/netsim"
	"github.com/hedgekv/hedgekv/test/testbin"
)

const (
	// readyTimeout bounds the cluster's start, a store's restart and the
	// cluster settling after the faults.
	readyTimeout = 60 * time.Second
	// opTimeout bounds one client call.
	opTimeout = 3 * time.Second
	// sessionTTL (seconds) of the concurrency sessions: short, so that a
	// partition outlasts it and sessions expire.
	sessionTTL = 2
)

var zones = []string{"dc-a", "dc-b", "dc-c"}

// seed is the run's fault-schedule seed: ETCDFAULTS_SEED, else random.
func seed(t *testing.T) uint64 {
	s := uint64(time.Now().UnixNano()%100000) + 1
	if v, err := strconv.ParseUint(os.Getenv("ETCDFAULTS_SEED"), 10, 64); err == nil && v > 0 {
		s = v
	}
	t.Logf("ETCDFAULTS_SEED=%d", s)
	return s
}

// faultTime is how long a test's nemesis runs: def, times
// ETCDFAULTS_SECONDS/10 when that is set.
func faultTime(def time.Duration) time.Duration {
	if v, err := strconv.Atoi(os.Getenv("ETCDFAULTS_SECONDS")); err == nil && v > 0 {
		return def * time.Duration(v) / 10
	}
	return def
}

// faultCluster is three store processes, one per zone, behind netsim.
type faultCluster struct {
	t     *testing.T
	procs *cluster.Processes
	net   *netsim.Network
	dir   string
}

// startCluster starts the network and the stores, waits until every store
// reaches its peers through the network and the etcd keyspace takes
// writes. Everything stops when the test ends; store logs are printed if
// it failed.
func startCluster(t *testing.T) *faultCluster {
	t.Helper()
	block, err := testbin.FreeBlock()
	if err != nil {
		t.Fatal(err)
	}
	topo := &netsim.Topology{Zones: netsim.Default().Zones}
	upstream := map[uint64]string{}
	for i, a := range block.GRPCAddrs {
		upstream[uint64(i+1)] = a
	}
	n, err := netsim.Start(topo, upstream, netsim.Options{PortBase: block.Base})
	if err != nil {
		t.Fatal(err)
	}
	// Registered first: closed after the stores stop.
	t.Cleanup(func() { _ = n.Close() })
	c := &faultCluster{t: t, net: n, dir: t.TempDir()}
	var ports []int
	var storeArgs [][]string
	for i := range zones {
		ports = append(ports, block.GRPC[i], block.Status[i])
		var za []string
		for z, a := range n.ZoneAddrs(uint64(i + 1)) {
			za = append(za, z+"="+a)
		}
		slices.Sort(za)
		storeArgs = append(storeArgs, []string{"--advertise-zone-addrs", strings.Join(za, ",")})
	}
	t.Cleanup(func() {
		if t.Failed() {
			for s := 1; s <= len(zones); s++ {
				if b, err := os.ReadFile(c.procs.LogPath(uint64(s))); err == nil {
					t.Logf("store%d.log (tail):\n%s", s, tail(string(b), 30))
				}
			}
		}
	})
	c.procs = testbin.StartProcesses(t, "hedgekv-etcdfaults-bin-", cluster.ProcessesConfig{
		Dir: c.dir, Zones: zones, Ports: ports, StoreArgs: storeArgs, ReadyTimeout: readyTimeout,
	})
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := c.waitZoneRoutes(ctx); err != nil {
		t.Fatal(err)
	}
	cli := c.directClient(t)
	for {
		// The first write makes the keyspace a region of its own.
		_, err := cli.Put(ctx, "etcdfaults/ready", "1")
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the etcd keyspace takes no write: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// waitZoneRoutes waits until every store lists every store with its zone
// addresses: until then a store may dial a peer directly, past the
// network (scripts/cluster.sh waits for the same).
func (c *faultCluster) waitZoneRoutes(ctx context.Context) error {
	last := "no answer yet"
	for {
		pending := false
		for _, ep := range c.procs.Endpoints {
			n, err := zoneRoutes(ctx, ep)
			if err != nil || n < len(zones) {
				pending, last = true, fmt.Sprintf("%s: %d stores with zone addresses (%v)", ep, n, err)
				break
			}
		}
		if !pending {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stores do not reach each other through the network (%s): %w", last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// zoneRoutes is how many stores the store at ep lists with zone addresses.
func zoneRoutes(ctx context.Context, ep string) (int, error) {
	cc, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := kvpb.NewAdminClient(cc).Stores(ctx, &kvpb.StoresRequest{Fresh: true})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range resp.GetStores() {
		if len(s.GetZoneAddresses()) == len(zones) {
			n++
		}
	}
	return n, nil
}

// newClient is a clientv3 client of endpoints, closed when the test ends.
// Keep-alive pings (every 5s: the stores refuse more often) find a
// connection a partition holds, so that requests and watches move to
// another endpoint, or reconnect, as they would in production.
func newClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// zoneClient is a client in zone, dialling every store through the zone's
// links (no AutoSyncInterval: the member list names the stores' own
// addresses, which would bypass the network).
func (c *faultCluster) zoneClient(t *testing.T, zone string) *clientv3.Client {
	var eps []string
	for s := 1; s <= len(zones); s++ {
		eps = append(eps, c.net.Addr(zone, uint64(s)))
	}
	return newClient(t, eps)
}

// storeClient is a client in zone of one store only: its requests and
// watches go to that store, and wait for it while it is down.
func (c *faultCluster) storeClient(t *testing.T, zone string, store uint64) *clientv3.Client {
	return newClient(t, []string{c.net.Addr(zone, store)})
}

// directClient reaches every store at its own address, past the network:
// for setting up and for the checks after the faults.
func (c *faultCluster) directClient(t *testing.T) *clientv3.Client {
	return newClient(t, c.procs.Endpoints)
}

// etcdLeader is the store leading the etcd keyspace's region, as a running
// store reports it (0 if none answers).
func (c *faultCluster) etcdLeader(ctx context.Context, cli *clientv3.Client) uint64 {
	for i, ep := range c.procs.Endpoints {
		if !c.procs.Running(uint64(i + 1)) {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err == nil && st.Leader != 0 {
			return st.Leader
		}
	}
	return 0
}

// nemesis injects one fault at a time: kill -9 of a store (then a restart
// on the same data), a partition of a store (blackhole: bytes held, or
// disconnect: connections closed), or both (restart-cut: killed, then
// restarted cut off), each for a while.
type nemesis struct {
	c   *faultCluster
	cli *clientv3.Client // direct, to ask who leads
	rng *rand.Rand

	mu     sync.Mutex
	log    []string
	counts map[string]int
	// longCuts counts partitions that outlasted the session TTL by a
	// second or more: sessions in the cut zone expire.
	longCuts int
}

func newNemesis(c *faultCluster, seed uint64) *nemesis {
	return &nemesis{c: c, cli: c.directClient(c.t), rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b9)), counts: map[string]int{}}
}

func (n *nemesis) record(kind, format string, a ...any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.counts[kind]++
	n.log = append(n.log, fmt.Sprintf("%s %s: ", time.Now().Format("15:04:05.000"), kind)+fmt.Sprintf(format, a...))
}

func (n *nemesis) summary() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(n.counts)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, n.counts[k]))
	}
	return strings.Join(parts, " ")
}

// fault is one fault of the schedule.
type fault struct {
	kind   string // "kill", "blackhole", "disconnect", "restart-cut"
	leader bool   // on the etcd region's leader's store, else another
	hold   time.Duration
}

// run injects faults until d has passed (the fault under way then ends
// first): the first five in a fixed order, so that every run kills a
// leader and a follower, makes a partition that outlasts the sessions
// and restarts a store cut off, then at random. A pause between faults lets clients move.
func (n *nemesis) run(ctx context.Context, d time.Duration) {
	end := time.Now().Add(d)
	script := []fault{
		{kind: "kill", leader: true, hold: 1500 * time.Millisecond},
		{kind: "blackhole", leader: n.rng.IntN(2) == 0, hold: (sessionTTL + 2) * time.Second},
		{kind: "kill", hold: time.Second},
		{kind: "disconnect", leader: true, hold: 1500 * time.Millisecond},
		{kind: "restart-cut", hold: 2 * time.Second},
	}
	kinds := []string{"kill", "blackhole", "disconnect", "restart-cut"}
	for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
		f := fault{kind: kinds[n.rng.IntN(len(kinds))], leader: n.rng.IntN(2) == 0, hold: time.Duration(500+n.rng.IntN(3000)) * time.Millisecond}
		if i < len(script) {
			f = script[i]
		}
		n.inject(ctx, f)
		sleepCtx(ctx, time.Duration(500+n.rng.IntN(1000))*time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// inject makes one fault and ends it.
func (n *nemesis) inject(ctx context.Context, f fault) {
	c := n.c
	leader := c.etcdLeader(ctx, n.cli)
	store := leader
	if !f.leader || leader == 0 {
		var others []uint64
		for s := uint64(1); s <= uint64(len(zones)); s++ {
			if s != leader {
				others = append(others, s)
			}
		}
		store = others[n.rng.IntN(len(others))]
	}
	role := "follower"
	if store == leader {
		role = "leader"
	}
	switch f.kind {
	case "kill":
		n.record("kill", "store %d (%s) kill -9, down %v", store, role, f.hold)
		if err := c.procs.Kill(store); err != nil {
			c.t.Errorf("kill store %d: %v", store, err)
			return
		}
		sleepCtx(ctx, f.hold)
		if err := c.restart(store); err != nil {
			c.t.Errorf("restart store %d: %v", store, err)
		}
	case "restart-cut":
		// Killed, then restarted cut off from every other store: no
		// leader, no safe point, until the partition heals (a watch made
		// again on it was cancelled for good before ReadOptions.Local).
		n.record("restart-cut", "store %d (%s) kill -9, restarted cut off for %v", store, role, f.hold)
		if err := c.procs.Kill(store); err != nil {
			c.t.Errorf("kill store %d: %v", store, err)
			return
		}
		if err := c.net.PartitionWith(store, netsim.PartitionMode("blackhole")); err != nil {
			c.t.Errorf("partition store %d: %v", store, err)
			return
		}
		if err := c.procs.Start(store); err != nil {
			c.t.Errorf("start store %d: %v", store, err)
		}
		sleepCtx(ctx, f.hold)
		if err := c.net.Heal(); err != nil {
			c.t.Errorf("heal: %v", err)
		}
		rctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		defer cancel()
		if err := c.procs.WaitReady(rctx, store); err != nil {
			c.t.Errorf("store %d after its partition healed: %v", store, err)
		}
	case "blackhole", "disconnect":
		n.record(f.kind, "store %d (%s, zone %s) cut off for %v", store, role, zones[store-1], f.hold)
		if err := c.net.PartitionWith(store, netsim.PartitionMode(f.kind)); err != nil {
			c.t.Errorf("partition store %d: %v", store, err)
			return
		}
		sleepCtx(ctx, f.hold)
		if err := c.net.Heal(); err != nil {
			c.t.Errorf("heal: %v", err)
		}
		if f.hold >= (sessionTTL+1)*time.Second {
			n.mu.Lock()
			n.longCuts++
			n.mu.Unlock()
		}
	}
}

// restart starts a killed store again on its data and waits until it is
// ready (caught up).
func (c *faultCluster) restart(store uint64) error {
	if err := c.procs.Start(store); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	return c.procs.WaitReady(ctx, store)
}

// recover ends every fault: heals the network, starts any store that is
// down, and waits until the cluster is settled.
func (c *faultCluster) recover() {
	c.t.Helper()
	if err := c.net.Heal(); err != nil {
		c.t.Errorf("heal: %v", err)
	}
	for s := uint64(1); s <= uint64(len(zones)); s++ {
		if !c.procs.Running(s) {
			if err := c.restart(s); err != nil {
				c.t.Errorf("restart store %d after the faults: %v", s, err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if _, err := c.procs.WaitSettled(ctx, 0); err != nil {
		c.t.Errorf("after the faults: %v", err)
	}
}

// diagnoseWatch logs, for a watcher that stopped, what each running store
// says of the etcd region (how far it applied) and where its watch
// goroutines wait: enough to tell a replica that stopped applying from a
// watch that stopped reading.
func (c *faultCluster) diagnoseWatch(ctx context.Context) {
	cli := c.directClient(c.t)
	for i, ep := range c.procs.Endpoints {
		s := uint64(i + 1)
		if !c.procs.Running(s) {
			c.t.Logf("store %d: not running", s)
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			c.t.Logf("store %d: status: %v", s, err)
		} else {
			c.t.Logf("store %d: leader %d, term %d, commit %d, applied %d, revision %d", s, st.Leader, st.RaftTerm, st.RaftIndex, st.RaftAppliedIndex, st.Header.Revision)
		}
		for _, g := range watchGoroutines(ctx, c.procs.StatusAddrs[i]) {
			c.t.Logf("store %d: %s", s, g)
		}
	}
}

// watchGoroutines reads a store's goroutines (its status port's pprof)
// and returns, one line each, those of the etcd watch: state and frames.
func watchGoroutines(ctx context.Context, statusAddr string) []string {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+statusAddr+"/debug/pprof/goroutine?debug=2", nil)
	if err != nil {
		return []string{err.Error()}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return []string{fmt.Sprintf("goroutines: %v", err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return []string{fmt.Sprintf("goroutines: %v", err)}
	}
	var out []string
	for _, g := range strings.Split(string(b), "\n\n") {
		if !strings.Contains(g, "etcdapi.(*feed)") && !strings.Contains(g, "etcdapi.(*watcher)") && !strings.Contains(g, "watchElsewhere") {
			continue
		}
		lines := strings.Split(g, "\n")
		var frames []string
		for _, l := range lines[1:] {
			if l != "" && !strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "created by") {
				fn := l[strings.LastIndex(l, "/")+1:] // package.(*Type).Method(args)
				if j := strings.LastIndex(fn, "("); j > 0 {
					fn = fn[:j]
				}
				frames = append(frames, fn)
			}
		}
		out = append(out, lines[0]+" "+strings.Join(frames[:min(len(frames), 12)], " < "))
	}
	return out
}
