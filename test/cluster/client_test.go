package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The client specs run real servers (gRPC over loopback TCP, the server
// package's transport between the stores) in this process and drive them
// through the Go client, while the test changes the cluster's shape under
// the client's feet: splits, leader transfers, and a replica moved to a
// store that joined meanwhile. The client must hide all of it: region
// errors are retried within the deadline and never reach the caller.

// serverCluster is a few in-process servers.
type serverCluster struct {
	dir     string
	log     *slog.Logger
	peers   map[uint64]string
	servers map[uint64]*server.Server
}

// serverLogger writes the servers' logs to GinkgoWriter, which shows them
// for failed specs only (and for all with -ginkgo.v).
func serverLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// serverTick is the servers' raft tick: the binary's default. With it an
// election times out after 500 ms-1 s; a 10 ms tick made that 100-200 ms,
// under the round trip of a heartbeat between servers under -race on a
// loaded 2-core machine, and leaders stepped down (check quorum) and
// elections timed out before their votes arrived, over and over, leaving
// regions without a leader for longer than an operation's deadline.
const serverTick = 50 * time.Millisecond

func storeConfig(id uint64, dir string, initial []uint64, log *slog.Logger) raftstore.Config {
	return raftstore.Config{
		StoreID:            id,
		Zone:               fmt.Sprintf("dc-%c", 'a'+rune(id-1)),
		DataDir:            filepath.Join(dir, fmt.Sprintf("store%d", id)),
		InitialStores:      initial,
		TickInterval:       serverTick,
		NoSync:             true,
		BalanceInterval:    -1,
		SplitCheckInterval: -1,
		Logger:             log,
	}
}

// startServers starts stores 1..n, which bootstrap region 1 together, and
// stops them after the spec; tune, if given, adjusts each store's config.
func startServers(n int, tune ...func(*raftstore.Config)) *serverCluster {
	GinkgoHelper()
	c := &serverCluster{
		dir:     GinkgoT().TempDir(),
		log:     serverLogger(),
		peers:   map[uint64]string{},
		servers: map[uint64]*server.Server{},
	}
	DeferCleanup(c.stop)
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			c.dumpRegions()
		}
	})
	ids := make([]uint64, n)
	lis := make([]net.Listener, n)
	for i := range n {
		ids[i] = uint64(i + 1)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		lis[i] = l
		c.peers[ids[i]] = l.Addr().String()
	}
	for i, id := range ids {
		cfg := storeConfig(id, c.dir, ids, c.log)
		for _, t := range tune {
			t(&cfg)
		}
		srv, err := server.New(server.Config{
			Store:    cfg,
			Listener: lis[i],
			Peers:    c.peers,
			// Specs may stall a store (Client.Fault); none does unless
			// it says so.
			AllowFaults: true,
		})
		Expect(err).NotTo(HaveOccurred())
		c.servers[id] = srv
	}
	for _, id := range ids {
		Expect(c.servers[id].Start()).To(Succeed())
	}
	return c
}

// join starts store id with only a join address, as `server --join` does.
func (c *serverCluster) join(ctx context.Context, id uint64, via uint64) {
	GinkgoHelper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	srv, err := server.New(server.Config{
		Store:       storeConfig(id, c.dir, nil, c.log),
		Listener:    l,
		Join:        []string{c.peers[via]},
		AllowFaults: true,
	})
	Expect(err).NotTo(HaveOccurred())
	c.servers[id] = srv // stopped with the others
	Expect(srv.StartContext(ctx)).To(Succeed())
	c.peers[id] = srv.Addr()
}

func (c *serverCluster) stop() {
	var wg sync.WaitGroup
	for _, s := range c.servers {
		wg.Go(s.Stop)
	}
	wg.Wait()
}

// dumpRegions writes every store's view of its regions to GinkgoWriter.
func (c *serverCluster) dumpRegions() {
	for _, id := range slices.Sorted(maps.Keys(c.servers)) {
		for _, st := range c.servers[id].Store().Regions() {
			GinkgoWriter.Printf("store %d: %+v\n", id, st)
		}
	}
}

func (c *serverCluster) endpoints() []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(c.peers)) {
		out = append(out, c.peers[id])
	}
	return out
}

// leaders maps each region, as the stores themselves report it, to its
// leader's store (regions without a leader are left out).
func (c *serverCluster) leaders() map[uint64]uint64 {
	out := map[uint64]uint64{}
	for _, s := range c.servers {
		for _, st := range s.Store().Regions() {
			if st.IsLeader {
				out[st.Region.ID] = s.Store().ID()
			}
		}
	}
	return out
}

// ---------------------------------------------------------------- workload

// workload is what the client goroutines did.
type workload struct {
	mu    sync.Mutex
	errs  []error
	acked map[string]int // key -> highest sequence number acknowledged

	ops    atomic.Int64
	modes  sync.Map // read mode -> *atomic.Int64
	served sync.Map // "store N mode" of each read -> *atomic.Int64
}

func (w *workload) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, err)
}

func (w *workload) errors() []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.errs)
}

func (w *workload) ackedSeq(k string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked[k]
}

func (w *workload) snapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.acked)
}

func count(m *sync.Map, k string) {
	v, _ := m.LoadOrStore(k, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func counts(m *sync.Map) map[string]int64 {
	out := map[string]int64{}
	m.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

const (
	clientWriters = 4
	keysPerWriter = 50
	// clientOpTimeout is each operation's deadline: far more than any
	// region error needs to be retried through.
	clientOpTimeout = 5 * time.Second
	// stepTimeout bounds each change the test makes to the cluster.
	stepTimeout = 20 * time.Second
)

func clientKey(writer, i int) string { return fmt.Sprintf("ck/%d/%03d", writer, i) }

func clientValue(k string, seq int) string { return fmt.Sprintf("%s#%d", k, seq) }

// opTime says when an operation that began at begin began and how long
// it took, for its error: the stores' log lines place it.
func opTime(begin time.Time) string {
	return fmt.Sprintf("at %s after %v", begin.Format("15:04:05.000"), time.Since(begin).Round(time.Millisecond))
}

// parseSeq checks a value read for key k and returns its sequence number.
func parseSeq(k string, v []byte) (int, error) {
	pre, seq, ok := strings.Cut(string(v), "#")
	n, err := strconv.Atoi(seq)
	if !ok || pre != k || err != nil {
		return 0, fmt.Errorf("value %q is not one written to %s", v, k)
	}
	return n, nil
}

// prime writes every key of the workload once (sequence number 0).
func prime(ctx context.Context, cli *client.Client, w *workload) {
	GinkgoHelper()
	for wr := range clientWriters {
		for i := range keysPerWriter {
			k := clientKey(wr, i)
			Expect(cli.Put(ctx, []byte(k), []byte(clientValue(k, 0)))).To(Succeed())
			w.acked[k] = 0
		}
	}
}

// loops runs goroutines until halted, or until the spec ends.
type loops struct {
	stop chan struct{}
	halt func() // more than once is fine
	wg   sync.WaitGroup
}

// startLoops returns loops that are halted and waited for when the spec
// ends, if not before.
func startLoops() *loops {
	ls := &loops{stop: make(chan struct{})}
	ls.halt = sync.OnceFunc(func() { close(ls.stop) })
	DeferCleanup(ls.haltAndWait)
	return ls
}

func (ls *loops) stopped() bool {
	select {
	case <-ls.stop:
		return true
	default:
		return false
	}
}

// run calls body again and again, in a goroutine of its own, until halted.
func (ls *loops) run(body func()) {
	ls.wg.Go(func() {
		for !ls.stopped() {
			body()
		}
	})
}

// every calls body every period, in a goroutine of its own, until halted.
func (ls *loops) every(period time.Duration, body func()) {
	ls.wg.Go(func() {
		for {
			select {
			case <-ls.stop:
				return
			case <-time.After(period):
			}
			body()
		}
	})
}

func (ls *loops) haltAndWait() {
	ls.halt()
	ls.wg.Wait()
}

// firstErrs is errs cut to its first n, and a line for the rest.
func firstErrs(errs []error, n int) []error {
	if len(errs) > n {
		return append(errs[:n:n], fmt.Errorf("... and %d more", len(errs)-n))
	}
	return errs
}

// runWorkload runs writers, readers and scanners against cli on ls. Every
// error reaches w; so does every read that returns older data than was
// acknowledged before the read began. Every key must have been primed.
func runWorkload(cli *client.Client, sess *client.Session, w *workload, ls *loops) {
	// Writers: each owns keysPerWriter keys and overwrites them in turn with
	// increasing sequence numbers.
	for wr := range clientWriters {
		seq := 0
		ls.run(func() {
			seq++
			k := clientKey(wr, seq%keysPerWriter)
			ctx, cancel := context.WithTimeout(context.Background(), clientOpTimeout)
			begin := time.Now()
			err := cli.Put(ctx, []byte(k), []byte(clientValue(k, seq)))
			cancel()
			w.ops.Add(1)
			w.mu.Lock()
			if err != nil {
				w.errs = append(w.errs, fmt.Errorf("put %s #%d %s: %w", k, seq, opTime(begin), err))
			} else {
				w.acked[k] = seq
			}
			w.mu.Unlock()
		})
	}
	// Readers: Get (under the session's policy) of a key, which must be
	// at least as new as what was acknowledged before the read began.
	for r := range 3 {
		i := r
		ls.run(func() {
			k := clientKey(i%clientWriters, i%keysPerWriter)
			i += 7
			w.checkGet(sess, k)
		})
	}
	// Scanners: the whole key space, across every region; every key
	// acknowledged before the scan began is there, at least that new.
	for range 2 {
		ls.run(func() { w.checkScan(sess) })
	}
}

// checkGet reads k under sess's policy: it must be there, at least as new
// as what was acknowledged before the read began.
func (w *workload) checkGet(sess *client.Session, k string) {
	floor := w.ackedSeq(k)
	ctx, cancel := context.WithTimeout(context.Background(), clientOpTimeout)
	begin := time.Now()
	v, info, err := sess.GetWithInfo(ctx, []byte(k))
	cancel()
	w.ops.Add(1)
	switch {
	case errors.Is(err, client.ErrNotFound):
		w.fail(fmt.Errorf("get %s %s: not found, but #%d was acknowledged before", k, opTime(begin), floor))
		return
	case err != nil:
		w.fail(fmt.Errorf("get %s %s: %w", k, opTime(begin), err))
		return
	}
	count(&w.modes, string(info.Mode))
	count(&w.served, fmt.Sprintf("store %d %s", info.StoreID, info.Mode))
	if seq, err := parseSeq(k, v); err != nil {
		w.fail(fmt.Errorf("get %s: %w", k, err))
	} else if seq < floor {
		w.fail(fmt.Errorf("get %s: stale read #%d, #%d was acknowledged before it began (served by store %d, %s)", k, seq, floor, info.StoreID, info.Mode))
	}
}

// checkScan scans the whole key space under sess's policy: in order, every
// key acknowledged before the scan began there, at least that new.
func (w *workload) checkScan(sess *client.Session) {
	floor := w.snapshot()
	ctx, cancel := context.WithTimeout(context.Background(), clientOpTimeout)
	begin := time.Now()
	kvs, err := sess.Scan(ctx, []byte("ck/"), []byte("ck0"), 0)
	cancel()
	w.ops.Add(1)
	if err != nil {
		w.fail(fmt.Errorf("scan %s: %w", opTime(begin), err))
		return
	}
	seen := map[string]bool{}
	for i, kv := range kvs {
		k := string(kv.Key)
		if i > 0 && k <= string(kvs[i-1].Key) {
			w.fail(fmt.Errorf("scan: %q after %q", k, kvs[i-1].Key))
		}
		seen[k] = true
		if seq, err := parseSeq(k, kv.Value); err != nil {
			w.fail(fmt.Errorf("scan: %w", err))
		} else if seq < floor[k] {
			w.fail(fmt.Errorf("scan: stale %s #%d, #%d was acknowledged before the scan began", k, seq, floor[k]))
		}
	}
	for k := range floor {
		if !seen[k] {
			w.fail(fmt.Errorf("scan: acknowledged key %s missing", k))
		}
	}
}

// readyClient opens a client on c and waits until a write succeeds, so
// that every error a workload sees afterwards is one the client let
// through; it is closed after the spec.
func readyClient(ctx context.Context, c *serverCluster) *client.Client {
	GinkgoHelper()
	cli, err := client.New(ctx, client.Config{Endpoints: c.endpoints(), RequestTimeout: clientOpTimeout})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(cli.Close)
	Eventually(func() error {
		return cli.Put(ctx, []byte("ck"), []byte("ready"))
	}).WithContext(ctx).WithTimeout(10 * time.Second).Should(Succeed())
	return cli
}

// startWorkload runs the workload (reads under policy) until halted, or
// until the spec ends.
func startWorkload(cli *client.Client, policy client.ReadPolicy, w *workload) *loops {
	ls := startLoops()
	runWorkload(cli, cli.Session(policy), w, ls)
	return ls
}

// waitOps waits until the workload has done n more operations than now.
func (w *workload) waitOps(n int64) {
	GinkgoHelper()
	want := w.ops.Load() + n
	Eventually(w.ops.Load).WithTimeout(10 * time.Second).Should(BeNumerically(">=", want))
}

// ---------------------------------------------------------------- events

// reshape changes the cluster under the workload: it splits region 1 into
// four, transfers every region's leadership, starts store 4, moves one
// region's replica from a follower's store to store 4 and another
// region's from its leader's store, and transfers leaders again. Every
// step is bounded by ctx, and followed by pause of the workload w alone.
func reshape(ctx context.Context, c *serverCluster, cli *client.Client, w *workload, pause time.Duration) {
	GinkgoHelper()
	// Each change gets stepTimeout of its own, so a stuck one fails fast.
	stepCtx := func() context.Context {
		sctx, cancel := context.WithTimeout(ctx, stepTimeout)
		DeferCleanup(cancel)
		return sctx
	}
	step := func(what string) {
		GinkgoWriter.Printf("%s: %s\n", time.Now().Format("15:04:05.000"), what)
		time.Sleep(pause)
	}
	w.waitOps(50)
	step("workload running")
	for _, at := range []string{"ck/2", "ck/1", "ck/3"} {
		_, _, err := cli.Split(stepCtx(), []byte(at))
		Expect(err).NotTo(HaveOccurred(), "split at %s", at)
		step("split at " + at)
	}
	transferAll(stepCtx(), c, cli)
	step("leaders transferred")

	c.join(stepCtx(), 4, 2)
	step("store 4 joined")

	regions, err := cli.Regions(stepCtx())
	Expect(err).NotTo(HaveOccurred())
	Expect(regions).To(HaveLen(4))
	// A follower's replica of the second region moves to store 4 ...
	r := regions[1]
	var from uint64
	for _, p := range r.Region.Peers {
		if p.StoreID != r.LeaderStoreID {
			from = p.StoreID
		}
	}
	moveReplica(stepCtx(), cli, r.Region.ID, from, 4)
	step(fmt.Sprintf("region %d moved from follower store %d to store 4", r.Region.ID, from))
	// ... and the leader's replica of the third (RemovePeer hands
	// leadership away first).
	r = regions[2]
	moveReplica(stepCtx(), cli, r.Region.ID, r.LeaderStoreID, 4)
	step(fmt.Sprintf("region %d moved from leader store %d to store 4", r.Region.ID, r.LeaderStoreID))

	transferAll(stepCtx(), c, cli)
	step("leaders transferred again")
}

// moveReplica adds a replica of region on store to, then removes the one
// on store from, and checks the outcome.
func moveReplica(ctx context.Context, cli *client.Client, region, from, to uint64) {
	GinkgoHelper()
	Expect(cli.AddPeer(ctx, region, to)).To(Succeed(), "add peer of region %d on store %d", region, to)
	Expect(cli.RemovePeer(ctx, region, from)).To(Succeed(), "remove peer of region %d on store %d", region, from)
	Eventually(func() error {
		regions, err := cli.Regions(ctx)
		if err != nil {
			return err
		}
		for _, r := range regions {
			if r.Region.ID != region {
				continue
			}
			var stores []uint64
			for _, p := range r.Region.Peers {
				if p.IsLearner {
					return fmt.Errorf("region %d still has a learner: %v", region, r)
				}
				stores = append(stores, p.StoreID)
			}
			if len(stores) != 3 || !slices.Contains(stores, to) || slices.Contains(stores, from) || r.LeaderStoreID == 0 {
				return fmt.Errorf("region %d: peers on %v, leader %d", region, stores, r.LeaderStoreID)
			}
			return nil
		}
		return fmt.Errorf("region %d not listed", region)
	}).WithContext(ctx).WithTimeout(10 * time.Second).Should(Succeed())
}

// transferAll hands every region's leadership to another of its voters,
// through the client, and waits until the stores agree.
func transferAll(ctx context.Context, c *serverCluster, cli *client.Client) {
	GinkgoHelper()
	regions, err := cli.Regions(ctx)
	Expect(err).NotTo(HaveOccurred())
	want := map[uint64]uint64{}
	for _, r := range regions {
		id := r.Region.ID
		var to uint64
		for _, p := range r.Region.Peers {
			if !p.IsLearner && p.StoreID != r.LeaderStoreID {
				to = p.StoreID
			}
		}
		Expect(to).NotTo(BeZero(), "region %d has no other voter: %v", id, r)
		Expect(cli.TransferLeader(ctx, id, to)).To(Succeed(), "transfer region %d to store %d", id, to)
		want[id] = to
	}
	// An election may take a leadership back before every store has seen
	// the transfer (seen under -race on a loaded machine): ask again.
	Eventually(func() error {
		got := c.leaders()
		for id, to := range want {
			if got[id] != to {
				tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_ = cli.TransferLeader(tctx, id, to)
				cancel()
				return fmt.Errorf("region %d led by store %d, want %d", id, got[id], to)
			}
		}
		return nil
	}).WithContext(ctx).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
}

// ---------------------------------------------------------------- specs

var _ = Describe("client", func() {
	// clientRun starts three servers and a client, runs the workload with
	// reads under policy while reshape runs, and checks the outcome.
	clientRun := func(policy client.ReadPolicy) *workload {
		GinkgoHelper()
		ctx := ctxFor(90 * time.Second)
		c := startServers(3)
		cli := readyClient(ctx, c)
		w := &workload{acked: map[string]int{}}
		prime(ctx, cli, w)
		ls := startWorkload(cli, policy, w)

		start := time.Now()
		reshape(ctx, c, cli, w, 300*time.Millisecond)
		ls.haltAndWait()
		GinkgoWriter.Printf("%d client operations in %v; read modes %v; reads served %v\n",
			w.ops.Load(), time.Since(start).Round(time.Millisecond), counts(&w.modes), counts(&w.served))

		Expect(firstErrs(w.errors(), 20)).To(BeEmpty(), "errors surfaced to the client goroutines")

		// Every acknowledged write reads back, from the leaders and under
		// the session's policy.
		final := w.snapshot()
		Expect(final).To(HaveLen(clientWriters * keysPerWriter))
		sess := cli.Session(policy)
		for k, seq := range final {
			for _, get := range []func(context.Context, []byte) ([]byte, error){cli.Get, sess.Get} {
				v, err := get(ctx, []byte(k))
				Expect(err).NotTo(HaveOccurred(), "read back %s", k)
				Expect(string(v)).To(Equal(clientValue(k, seq)), "read back %s", k)
			}
		}
		kvs, err := cli.Scan(ctx, []byte("ck/"), []byte("ck0"), 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(kvs).To(HaveLen(len(final)))
		for _, kv := range kvs {
			Expect(string(kv.Value)).To(Equal(clientValue(string(kv.Key), final[string(kv.Key)])))
		}
		stores, err := cli.Stores(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(stores).To(HaveLen(4))
		Expect(stores).To(HaveEach(HaveField("Up", BeTrue())))
		return w
	}

	It("keeps working with no error surfaced across splits, leader transfers and a replica move", func() {
		clientRun(client.ReadPolicy{Replica: client.ReplicaLeader})
	})

	It("keeps follower reads working with no error surfaced across the same changes", func() {
		w := clientRun(client.ReadPolicy{Replica: client.ReplicaFollower})
		// Followers answered through ReadIndex; the leader only stands in
		// when no follower can.
		Expect(counts(&w.modes)).To(HaveKeyWithValue("read-index", BeNumerically(">", 0)))
	})
})

var _ = Describe("store removal", func() {
	It("drains a store under the client workload, follower reads included, with no error surfaced and no write lost", func() {
		ctx := ctxFor(90 * time.Second)
		c := startServers(4, func(cfg *raftstore.Config) {
			cfg.BalanceInterval = 100 * time.Millisecond
			cfg.MaxStoreDownTime = time.Minute // only the removal moves replicas off store 4
		})
		cli := readyClient(ctx, c)
		for _, at := range []string{"ck/1", "ck/2", "ck/3"} {
			_, _, err := cli.Split(ctx, []byte(at))
			Expect(err).NotTo(HaveOccurred(), "split at %s", at)
		}
		// onStore4 counts the replicas the stores' regions put on store 4.
		onStore4 := func() (int, error) {
			regions, err := cli.Regions(ctx)
			if err != nil {
				return 0, err
			}
			n := 0
			for _, r := range regions {
				if _, ok := r.Region.PeerOnStore(4); ok {
					n++
				}
			}
			return n, nil
		}
		Eventually(onStore4).WithContext(ctx).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 2))

		w := &workload{acked: map[string]int{}}
		prime(ctx, cli, w)
		ls := startWorkload(cli, client.ReadPolicy{Replica: client.ReplicaFollower}, w)

		start := time.Now()
		already, err := cli.RemoveStore(ctx, 4)
		Expect(err).NotTo(HaveOccurred())
		Expect(already).To(BeFalse())
		Eventually(func() error {
			n, err := onStore4()
			if err != nil {
				return err
			}
			stores, err := cli.Stores(ctx)
			if err != nil {
				return err
			}
			if n != 0 || len(stores) != 4 || !stores[3].Removed {
				return fmt.Errorf("%d replicas on store 4; stores %+v", n, stores)
			}
			return nil
		}).WithContext(ctx).WithTimeout(40 * time.Second).Should(Succeed())
		drained := time.Since(start)
		w.waitOps(50) // the workload runs on after the drain
		ls.haltAndWait()
		GinkgoWriter.Printf("store 4 drained in %v; %d client operations; read modes %v; reads served %v\n",
			drained.Round(time.Millisecond), w.ops.Load(), counts(&w.modes), counts(&w.served))
		Expect(w.errors()).To(BeEmpty(), "errors surfaced to the client goroutines")
		Expect(c.servers[4].Store().Regions()).To(BeEmpty(), "store 4 still hosts replicas")

		final := w.snapshot()
		Expect(final).To(HaveLen(clientWriters * keysPerWriter))
		for k, seq := range final {
			v, err := cli.Get(ctx, []byte(k))
			Expect(err).NotTo(HaveOccurred(), "read back %s", k)
			Expect(string(v)).To(Equal(clientValue(k, seq)), "read back %s", k)
		}
		// Removing another store now would leave two: refused.
		_, err = cli.RemoveStore(ctx, 3)
		Expect(status.Code(err)).To(Equal(codes.FailedPrecondition), "remove store 3: %v", err)
	})
})
