package wan

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/netsim"
	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/test/testbin"
)

const (
	// scriptTimeout bounds every scripts/cluster.sh call.
	scriptTimeout = 90 * time.Second
	// cliTimeout bounds every CLI call.
	cliTimeout = 15 * time.Second
	// rpcTimeout bounds one RPC the specs make themselves.
	rpcTimeout = 5 * time.Second

	// The default topology: 14 ms one way between zones, nothing inside.
	remoteRTT = 28 * time.Millisecond
	// localBudget is what a read that never leaves the client's zone may
	// take (median): loopback, one proxy hop that adds nothing, a local
	// bbolt read. Far below one WAN round trip.
	localBudget = 5 * time.Millisecond
	// samples reads are timed per kind; their median is compared.
	samples = 10

	// cutProbe is the deadline of a read sent over a cut link: it must
	// fail within it (blackhole: nothing comes back, nobody is told).
	cutProbe = 1500 * time.Millisecond
	// catchUpBudget bounds the wait for a healed store to catch up.
	catchUpBudget = 30 * time.Second

	// opBudget is what one get or put may take, CLI process included,
	// with one store cut off and the client's zone reaching the two
	// others (28 ms round trips); cutRounds is how many of each a zone
	// sends per cut store.
	opBudget  = time.Second
	cutRounds = 4
)

var zones = []string{"dc-a", "dc-b", "dc-c"}

// region 1 is the only region: nothing splits it (64 MiB) and BALANCE=off
// keeps its leader where transfer-leader puts it.
const regionID = 1

// ---------------------------------------------------------------- processes

type result = testbin.Result

// run executes name args... with env in the repository, bounded by timeout.
func run(timeout time.Duration, env []string, name string, args ...string) result {
	return testbin.Run(repoRoot, timeout, env, name, args...)
}

// freeBlock returns a free block of ports for one cluster (testbin.FreeBlock).
func freeBlock() testbin.Block {
	GinkgoHelper()
	b, err := testbin.FreeBlock()
	Expect(err).NotTo(HaveOccurred())
	return b
}

// ---------------------------------------------------------------- cluster

// wanCluster is one cluster.sh-managed cluster behind the default topology.
type wanCluster struct {
	dir     string
	env     []string
	direct  []string // store i+1's own listen address (bypasses netsim)
	control netsim.Control

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// startWAN starts stores 1-3 behind `--topology default` with the
// balancer off, on free ports in a temporary directory, and stops
// everything after the spec, whatever happened.
func startWAN() *wanCluster {
	GinkgoHelper()
	dir := GinkgoT().TempDir()
	block := freeBlock()
	c := &wanCluster{
		dir:     dir,
		control: netsim.Control{Addr: fmt.Sprintf("127.0.0.1:%d", block.Control)},
		conns:   map[string]*grpc.ClientConn{},
		direct:  block.GRPCAddrs,
	}
	c.env = append(append(os.Environ(),
		"BIN="+binPath,
		"CLUSTER_DIR="+dir),
		block.Env()...)
	c.env = append(c.env,
		"BALANCE=off",
		"FAULTS=0",
		"TICK=",
		"START_TIMEOUT=60",
	)
	// Cleanups run last-registered first: this one runs before the
	// temporary directory goes.
	DeferCleanup(func() {
		c.closeConns()
		if CurrentSpecReport().Failed() {
			c.dumpLogs()
		}
		r := c.script("stop")
		Expect(r.Err).NotTo(HaveOccurred(), "cluster.sh stop: %v", r)
	})
	r := c.script("start", "--topology", "default")
	GinkgoWriter.Printf("cluster.sh start --topology default (%v):\n%s%s", r.Elapsed.Round(time.Millisecond), r.Stdout, r.Stderr)
	Expect(r.Err).NotTo(HaveOccurred(), "cluster.sh start --topology default: %v", r)
	return c
}

func (c *wanCluster) script(args ...string) result {
	return testbin.ClusterScript(repoRoot, scriptTimeout, c.env, args...)
}

// cli runs the hedgekv CLI against this cluster's stores' own addresses.
func (c *wanCluster) cli(args ...string) result {
	return run(cliTimeout, c.env, binPath, append(args, "--endpoints", strings.Join(c.direct, ","))...)
}

func (c *wanCluster) mustScript(args ...string) {
	GinkgoHelper()
	r := c.script(args...)
	GinkgoWriter.Printf("cluster.sh %s (%v): %s%s", strings.Join(args, " "), r.Elapsed.Round(time.Millisecond), r.Stdout, r.Stderr)
	Expect(r.Err).NotTo(HaveOccurred(), "cluster.sh %s: %v", strings.Join(args, " "), r)
}

func (c *wanCluster) dumpLogs() {
	names := []string{"netsim.log", "store1.log", "store2.log", "store3.log"}
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(c.dir, name))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		GinkgoWriter.Printf("--- %s (last %d lines) ---\n%s\n", name, len(lines), strings.Join(lines, "\n"))
	}
	r := c.script("status")
	GinkgoWriter.Printf("--- cluster.sh status ---\n%s%s\n", r.Stdout, r.Stderr)
}

// newClient is a Go client in zone, bootstrapped from the stores' own
// addresses: it learns every store's address for its zone (the netsim
// proxies) from the cluster and dials those.
func (c *wanCluster) newClient(zone string) *client.Client {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	cli, err := client.New(ctx, client.Config{Endpoints: c.direct, Zone: zone, RequestTimeout: rpcTimeout})
	Expect(err).NotTo(HaveOccurred(), "client in zone %s", zone)
	DeferCleanup(cli.Close)
	return cli
}

// conn is one gRPC connection to addr, kept for the spec: a raw
// connection pinned to one address, as no client policy pins a store.
func (c *wanCluster) conn(addr string) *grpc.ClientConn {
	GinkgoHelper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[addr]; ok {
		return cc
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	Expect(err).NotTo(HaveOccurred())
	c.conns[addr] = cc
	return cc
}

func (c *wanCluster) closeConns() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.conns {
		cc.Close()
	}
	c.conns = map[string]*grpc.ClientConn{}
}

// netsimStatus asks the cluster's netsim for its links and partitions.
func (c *wanCluster) netsimStatus() *netsim.Status {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	st, err := c.control.Status(ctx)
	Expect(err).NotTo(HaveOccurred(), "netsim status")
	return st
}

// link returns the netsim link from zone to store.
func link(st *netsim.Status, zone string, store uint64) netsim.LinkStatus {
	GinkgoHelper()
	for _, l := range st.Links {
		if l.Zone == zone && l.Store == store {
			return l
		}
	}
	Fail(fmt.Sprintf("netsim has no link %s → store %d", zone, store))
	return netsim.LinkStatus{}
}

// storeStatus asks the store at addr for its Status.
func (c *wanCluster) storeStatus(ctx context.Context, addr string) (*kvpb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	return kvpb.NewAdminClient(c.conn(addr)).Status(ctx, &kvpb.StatusRequest{})
}

// region1 is region 1 as the store at addr (its own address) sees it.
func (c *wanCluster) region1(addr string) (*kvpb.RegionInfo, error) {
	st, err := c.storeStatus(context.Background(), addr)
	if err != nil {
		return nil, err
	}
	for _, r := range st.GetRegions() {
		if r.GetRegion().GetId() == regionID {
			return r, nil
		}
	}
	return nil, fmt.Errorf("store at %s hosts no region %d", addr, regionID)
}

// applied is store id's applied index of region 1, asked at its own address.
func (c *wanCluster) applied(id int) uint64 {
	GinkgoHelper()
	r, err := c.region1(c.direct[id-1])
	Expect(err).NotTo(HaveOccurred(), "status of store %d", id)
	return r.GetAppliedIndex()
}

// pinnedGet reads key from region 1's replica at addr and nowhere else: a
// follower read (replica_read), bounded-stale when staleness > 0.
// Its error keeps the gRPC code and message only (the details of a region
// error would fill a failure report).
func (c *wanCluster) pinnedGet(ctx context.Context, addr string, epoch *kvpb.Epoch, key string, staleness time.Duration) (*kvpb.GetResponse, error) {
	resp, err := kvpb.NewKVClient(c.conn(addr)).Get(ctx, &kvpb.GetRequest{
		Context: &kvpb.ReadContext{
			RegionId:       regionID,
			RegionEpoch:    epoch,
			ReplicaRead:    true,
			MaxStalenessMs: uint64(staleness / time.Millisecond),
		},
		Key: []byte(key),
	})
	if err != nil {
		st := status.Convert(err)
		return nil, status.Error(st.Code(), st.Message())
	}
	return resp, nil
}

// leadRegion1On moves region 1's leader to store id and waits until every
// store agrees.
func (c *wanCluster) leadRegion1On(id int) {
	GinkgoHelper()
	r := c.cli("ctl", "transfer-leader", strconv.Itoa(regionID), strconv.Itoa(id))
	Expect(r.Err).NotTo(HaveOccurred(), "ctl transfer-leader %d %d: %v", regionID, id, r)
	Eventually(func(g Gomega) {
		for n, addr := range c.direct {
			ri, err := c.region1(addr)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ri.GetLeaderStoreId()).To(BeEquivalentTo(id), "leader of region %d as store %d sees it", regionID, n+1)
		}
	}).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ctxFor(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	DeferCleanup(cancel)
	return ctx
}

// ---------------------------------------------------------------- specs

var _ = Describe("simulated WAN", func() {
	It("makes a leader read from a remote zone pay the round trip, and a stale read in the client's zone not", func() {
		c := startWAN()
		cli := c.newClient("dc-b")
		key, val := "wan/latency", "28ms away"
		Expect(cli.Put(ctxFor(rpcTimeout), []byte(key), []byte(val))).To(Succeed())
		c.leadRegion1On(1) // dc-a; the client sits in dc-b

		// Leader reads: dc-b → store 1 crosses the WAN both ways.
		leader := cli.Session(client.ReadPolicy{Replica: client.ReplicaLeader})
		before := link(c.netsimStatus(), "dc-b", 1).Bytes
		read := func(s *client.Session) (time.Duration, client.ReadInfo) {
			GinkgoHelper()
			start := time.Now()
			v, info, err := s.GetWithInfo(ctxFor(rpcTimeout), []byte(key))
			d := time.Since(start)
			Expect(err).NotTo(HaveOccurred())
			Expect(string(v)).To(Equal(val))
			return d, info
		}
		for range 3 { // warm up: connection, region cache, leader hint
			read(leader)
		}
		var leaderLat []time.Duration
		for range samples {
			d, info := read(leader)
			Expect(info.StoreID).To(BeEquivalentTo(1), "leader read served by %+v", info)
			leaderLat = append(leaderLat, d)
		}
		after := link(c.netsimStatus(), "dc-b", 1).Bytes
		Expect(after).To(BeNumerically(">", before), "the leader reads crossed the dc-b → store 1 link")

		// Bounded-stale reads in the client's zone: ReplicaClosest picks the
		// replica in dc-b (store 2; so does ReplicaFollower, which prefers
		// the client's zone), which answers from local state without asking
		// the leader.
		// The first may find store 2 without a fresh safe point (the region
		// hibernates when idle) and be served elsewhere; wait until it is
		// served locally.
		stale := cli.Session(client.ReadPolicy{Replica: client.ReplicaClosest, MaxStaleness: 5 * time.Second})
		Eventually(func(g Gomega) {
			_, info, err := stale.GetWithInfo(ctxFor(rpcTimeout), []byte(key))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(info.StoreID).To(BeEquivalentTo(2))
			g.Expect(info.Mode).To(Equal(readmode.Stale))
		}).WithTimeout(15 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		var staleLat []time.Duration
		var staleInfo []client.ReadInfo
		for range samples {
			d, info := read(stale)
			staleLat = append(staleLat, d)
			staleInfo = append(staleInfo, info)
		}

		GinkgoWriter.Printf("leader reads from dc-b (leader in dc-a): median %v, all %v\n", median(leaderLat), leaderLat)
		GinkgoWriter.Printf("stale reads from dc-b on store 2: median %v, all %v\n", median(staleLat), staleLat)
		Expect(median(leaderLat)).To(BeNumerically(">=", remoteRTT), "a leader read from dc-b crosses the 28 ms RTT: %v", leaderLat)
		Expect(median(staleLat)).To(BeNumerically("<", localBudget), "a stale read on dc-b's own store stays in dc-b: %v %+v", staleLat, staleInfo)
		local := 0
		for _, info := range staleInfo {
			if info.StoreID == 2 && info.Mode == "stale" {
				local++
			}
		}
		Expect(local).To(BeNumerically(">", samples/2), "stale reads served by store 2 from local state: %+v", staleInfo)
	})

	It("partition and heal cut and restore raft and client traffic", partitionAndHeal)

	It("keeps every get and put from a zone that reaches a majority under 1 s while any one store is cut off", majorityZoneFastUnderCut)

	It("says plainly that partition and heal need the simulated network", func() {
		dir := GinkgoT().TempDir()
		env := append(os.Environ(), "BIN="+binPath, "CLUSTER_DIR="+dir)
		for _, args := range [][]string{{"partition", "2"}, {"heal"}} {
			r := testbin.ClusterScript(repoRoot, scriptTimeout, env, args...)
			var exit *exec.ExitError
			Expect(errors.As(r.Err, &exit)).To(BeTrue(), "cluster.sh %v: %v", args, r)
			Expect(r.Stderr).To(ContainSubstring("start --topology"), "cluster.sh %v", args)
		}
	})
})

// partitionAndHeal: a partition cuts a store's raft and client traffic, and
// heal restores it.
func partitionAndHeal() {
	c := startWAN()
	cliA := c.newClient("dc-a")
	c.leadRegion1On(1)
	// A write after the transfer also gives the new leader its lease,
	// without which it stamps no safe points on its heartbeats and a
	// follower serves no stale read.
	Expect(cliA.Put(ctxFor(rpcTimeout), []byte("wan/p"), []byte("before"))).To(Succeed())
	// Store 2 has caught up before the cut.
	Eventually(func() bool { return c.applied(2) >= c.applied(1) }).
		WithTimeout(10 * time.Second).WithPolling(100 * time.Millisecond).Should(BeTrue())

	// The addresses a dc-a and a dc-b client dial to reach store 2
	// (netsim proxies), and store 2's own address.
	st := c.netsimStatus()
	viaA, viaB, direct2 := link(st, "dc-a", 2).Address, link(st, "dc-b", 2).Address, c.direct[1]
	r2, err := c.region1(direct2)
	Expect(err).NotTo(HaveOccurred())
	epoch := r2.GetRegion().GetEpoch()
	// Pinned stale reads work through both proxies before the cut (and
	// warm their connections, so the cut is seen on live connections).
	// Store 2 may lack a safe point of the new term (DataIsNotReady)
	// until the next heartbeat.
	for _, addr := range []string{viaA, viaB} {
		Eventually(func(g Gomega) {
			resp, err := c.pinnedGet(ctxFor(rpcTimeout), addr, epoch, "wan/p", time.Hour)
			g.Expect(err).NotTo(HaveOccurred(), "pinned read of store 2 via %s before the partition", addr)
			g.Expect(string(resp.GetValue())).To(Equal("before"))
			g.Expect(resp.GetReadInfo().GetMode()).To(Equal(kvpb.ReadMode_READ_MODE_STALE))
		}).WithTimeout(10 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	}

	c.mustScript("partition", "2")
	Expect(c.netsimStatus().Partitioned).To(Equal([]uint64{2}))
	cut := c.applied(2)

	By("a write through store 1's leader still succeeds (stores 1 and 3 are a quorum)")
	for i := range 5 {
		Expect(cliA.Put(ctxFor(rpcTimeout), []byte("wan/p"), []byte(fmt.Sprintf("during-%d", i)))).To(Succeed())
	}
	leaderApplied := c.applied(1)
	Expect(leaderApplied).To(BeNumerically(">=", cut+5))

	By("store 2 applies nothing while it is cut off (raft traffic is cut)")
	Consistently(func() uint64 { return c.applied(2) }).
		WithTimeout(1500 * time.Millisecond).WithPolling(250 * time.Millisecond).Should(Equal(cut))

	By("a dc-a client cannot reach store 2; its own address and dc-b's link still answer")
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), cutProbe)
	_, err = c.pinnedGet(ctx, viaA, epoch, "wan/p", time.Hour)
	cancel()
	Expect(err).To(HaveOccurred(), "a read of store 2 from dc-a during the partition")
	Expect(status.Code(err)).To(Equal(codes.DeadlineExceeded), "%v", err)
	Expect(time.Since(start)).To(BeNumerically("<", cutProbe+time.Second))

	s2, err := c.storeStatus(context.Background(), direct2)
	Expect(err).NotTo(HaveOccurred(), "Status at store 2's own address during the partition")
	Expect(s2.GetStoreId()).To(BeEquivalentTo(2))
	r := run(cliTimeout, c.env, binPath, "ctl", "stores", "--endpoints", direct2)
	Expect(r.Err).NotTo(HaveOccurred(), "ctl stores at store 2's own address: %v", r)

	resp, err := c.pinnedGet(ctxFor(rpcTimeout), viaB, epoch, "wan/p", time.Hour)
	Expect(err).NotTo(HaveOccurred(), "a stale read of store 2 from its own zone during the partition")
	Expect(string(resp.GetValue())).To(Equal("before"), "store 2 has not seen the writes made during the partition")

	By("after heal, store 2 catches up and the dc-a client reaches it again")
	c.mustScript("heal")
	healed := time.Now()
	Expect(c.netsimStatus().Partitioned).To(BeEmpty())
	Eventually(func() uint64 { return c.applied(2) }).
		WithTimeout(catchUpBudget).WithPolling(100 * time.Millisecond).Should(BeNumerically(">=", leaderApplied))
	GinkgoWriter.Printf("store 2 stayed at applied index %d while cut off (leader at %d); caught up %v after heal\n",
		cut, leaderApplied, time.Since(healed).Round(time.Millisecond))
	// A linearizable follower read pinned to store 2 from dc-a: the
	// client's link and store 2's ReadIndex round trip to the leader
	// both work again.
	Eventually(func(g Gomega) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := c.pinnedGet(ctx, viaA, epoch, "wan/p", 0)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(resp.GetValue())).To(Equal("during-4"))
		g.Expect(resp.GetReadInfo().GetStoreId()).To(BeEquivalentTo(2))
		g.Expect(resp.GetReadInfo().GetMode()).To(Equal(kvpb.ReadMode_READ_MODE_READ_INDEX))
	}).WithTimeout(catchUpBudget).WithPolling(200 * time.Millisecond).Should(Succeed())
}

// majorityZoneFastUnderCut: while any one store is cut off, every get and
// put from a zone that reaches a majority takes under a second.
func majorityZoneFastUnderCut() {
	c := startWAN()
	// One long-lived Go client per zone, made before any cut: its
	// caches and connections are warm, unlike a CLI process's.
	clients := map[string]*client.Client{}
	for _, z := range zones {
		clients[z] = c.newClient(z)
	}
	Expect(clients["dc-a"].Put(ctxFor(rpcTimeout), []byte("wan/cut"), []byte("v0"))).To(Succeed())

	type slow struct {
		what string
		took time.Duration
		err  string
	}
	var (
		slowOps []slow
		worst   time.Duration
		ops     int
	)
	worstBy := map[string]time.Duration{}
	check := func(what string, took time.Duration, err error, stderr string) {
		ops++
		worst = max(worst, took)
		kind := what[strings.Index(what, ": ")+2 : strings.Index(what, " from ")]
		worstBy[kind] = max(worstBy[kind], took)
		switch {
		case err != nil:
			slowOps = append(slowOps, slow{what, took, err.Error() + " " + strings.TrimSpace(stderr)})
		case took >= opBudget:
			slowOps = append(slowOps, slow{what, took, ""})
		case stderr != "":
			// A command that succeeded says nothing on stderr: the
			// client library's own log is no business of its user's.
			slowOps = append(slowOps, slow{what, took, "stderr: " + strings.TrimSpace(stderr)})
		}
	}
	for cut := 1; cut <= 3; cut++ {
		// The leader sits elsewhere: a cut leader costs an election,
		// which is no client's fault; this spec is about the client
		// waiting on a store it need not ask.
		c.leadRegion1On(cut%3 + 1)
		c.mustScript("partition", strconv.Itoa(cut))
		for zi, z := range zones {
			if zi == cut-1 {
				continue // the cut store's zone reaches no majority
			}
			for i := range cutRounds {
				key := fmt.Sprintf("wan/cut/%d/%s/%d", cut, z, i)
				r := c.cli("--zone", z, "put", key, "v")
				check(fmt.Sprintf("store %d cut: cli put from %s", cut, z), r.Elapsed, r.Err, r.Stderr)
				r = c.cli("--zone", z, "get", key)
				check(fmt.Sprintf("store %d cut: cli get from %s", cut, z), r.Elapsed, r.Err, r.Stderr)
				if r.Err == nil {
					Expect(strings.TrimSpace(r.Stdout)).To(Equal("v"))
				}
				start := time.Now()
				err := clients[z].Put(ctxFor(rpcTimeout), []byte(key), []byte("w"))
				check(fmt.Sprintf("store %d cut: client put from %s", cut, z), time.Since(start), err, "")
				start = time.Now()
				_, err = clients[z].Get(ctxFor(rpcTimeout), []byte(key))
				check(fmt.Sprintf("store %d cut: client get from %s", cut, z), time.Since(start), err, "")
			}
		}
		c.mustScript("heal")
	}
	GinkgoWriter.Printf("%d gets and puts with one store cut off: slowest %v (%v); %d over %v or failed\n", ops, worst.Round(time.Millisecond), worstBy, len(slowOps), opBudget)
	for _, s := range slowOps {
		GinkgoWriter.Printf("  %s: %v %s\n", s.what, s.took.Round(time.Millisecond), s.err)
	}
	Expect(slowOps).To(BeEmpty(), "every get and put from a zone that reaches two stores finishes under %v, quietly", opBudget)
}
