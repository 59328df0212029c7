package cluster_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/raftstore"
)

// The load spec is issue 18's report in small: many writers inserting new
// keys as fast as they can (go-ycsb's load phase) while the regions split
// on their own (small split thresholds, a fast split check), the balancer
// moves leaders and, once a fourth store joins, replicas, and the test
// moves leaders and replicas of its own on top. Every operation has a
// generous deadline; not one may fail: region errors (NotLeader from a
// split-born region with no leader yet, RegionNotFound from a store that
// has not applied a split, EpochNotMatch from one that applied it before
// the client heard) are the client's to retry.

const (
	loadWriters = 24
	loadReaders = 4
	// loadOpTimeout is every operation's deadline, as a YCSB binding's.
	loadOpTimeout = 10 * time.Second
	// loadValueSize is about a YCSB record (10 fields of 100 bytes).
	loadValueSize = 1024
	// The load runs at least loadMin, then until there are loadRegions
	// regions and store 4 hosts replicas, at most loadMax.
	loadMin, loadMax = 12 * time.Second, 45 * time.Second
	loadRegions      = 6
)

// reshaped reports whether the stores lead at least n regions between them
// and store 4 hosts a replica.
func (c *serverCluster) reshaped(n int) bool {
	s4, ok := c.servers[4]
	return ok && len(c.leaders()) >= n && len(s4.Store().Regions()) > 0
}

// loadKey is writer w's i-th key, hashed so that inserts spread over
// every region as YCSB's hashed insert order does.
func loadKey(w, i int) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d", w, i)
	return fmt.Sprintf("ld/user%016x", h.Sum64())
}

func loadValue(k string) []byte {
	v := make([]byte, loadValueSize)
	for i := range v {
		v[i] = 'a' + byte((len(k)+i*7)%26)
	}
	copy(v, k)
	return v
}

// loadRun is what the writers and readers did.
type loadRun struct {
	ops, reads atomic.Int64
	slowest    atomic.Int64 // nanoseconds

	mu    sync.Mutex
	errs  []error
	acked []string
	slow  []string // operations of loadSlow or more
}

// loadSlow is how long an operation takes before the spec reports it.
const loadSlow = 2 * time.Second

func (l *loadRun) done(what string, begin time.Time) {
	took := time.Since(begin)
	if took >= loadSlow {
		l.mu.Lock()
		l.slow = append(l.slow, fmt.Sprintf("%s at %s took %v", what, begin.Format("15:04:05.000"), took.Round(time.Millisecond)))
		l.mu.Unlock()
	}
	d := int64(took)
	for {
		cur := l.slowest.Load()
		if d <= cur || l.slowest.CompareAndSwap(cur, d) {
			return
		}
	}
}

func (l *loadRun) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

// ackedKey returns an acknowledged key picked by r, "" if none yet.
func (l *loadRun) ackedKey(r *rand.Rand) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.acked) == 0 {
		return ""
	}
	return l.acked[r.IntN(len(l.acked))]
}

// runLoad inserts new keys from loadWriters goroutines and reads back
// acknowledged ones from loadReaders (leader and follower reads) on ls.
func runLoad(cli *client.Client, l *loadRun, ls *loops) {
	for w := range loadWriters {
		i := 0
		ls.run(func() {
			l.insert(cli, loadKey(w, i))
			i++
		})
	}
	// Half the readers read from followers (ReadIndex): a follower that
	// has not applied a split yet does not host the new region.
	follower := cli.Session(client.ReadPolicy{Replica: client.ReplicaFollower})
	for r := range loadReaders {
		get := cli.Get
		if r%2 == 1 {
			get = follower.Get
		}
		rnd := rand.New(rand.NewPCG(uint64(r), 18))
		ls.run(func() {
			k := l.ackedKey(rnd)
			if k == "" {
				time.Sleep(10 * time.Millisecond) // nothing acknowledged yet
				return
			}
			l.readBack(get, k, r)
		})
	}
}

func (l *loadRun) insert(cli *client.Client, k string) {
	ctx, cancel := context.WithTimeout(context.Background(), loadOpTimeout)
	begin := time.Now()
	err := cli.Put(ctx, []byte(k), loadValue(k))
	cancel()
	l.done("insert "+k, begin)
	l.ops.Add(1)
	if err != nil {
		l.fail(fmt.Errorf("insert %s after %v: %w", k, time.Since(begin).Round(time.Millisecond), err))
		return
	}
	l.mu.Lock()
	l.acked = append(l.acked, k)
	l.mu.Unlock()
}

func (l *loadRun) readBack(get func(context.Context, []byte) ([]byte, error), k string, reader int) {
	ctx, cancel := context.WithTimeout(context.Background(), loadOpTimeout)
	begin := time.Now()
	v, err := get(ctx, []byte(k))
	cancel()
	l.done(fmt.Sprintf("read %s (reader %d)", k, reader), begin)
	l.ops.Add(1)
	l.reads.Add(1)
	switch {
	case err != nil:
		l.fail(fmt.Errorf("read %s after %v: %w", k, time.Since(begin).Round(time.Millisecond), err))
	case string(v) != string(loadValue(k)):
		l.fail(fmt.Errorf("read %s: wrong value (%d bytes)", k, len(v)))
	}
}

// churn moves leaders and replicas at random on ls: admin calls that lose
// a race with a split or the balancer just fail, which is fine; only the
// load's operations count.
func churn(cli *client.Client, ls *loops, moves *atomic.Int64) {
	rnd := rand.New(rand.NewPCG(18, 1))
	ls.every(150*time.Millisecond, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		regions, err := cli.Regions(ctx)
		if err != nil || len(regions) == 0 {
			return
		}
		r := regions[rnd.IntN(len(regions))]
		var voters, others []uint64
		for _, p := range r.Region.Voters() {
			if p.StoreID != r.LeaderStoreID {
				voters = append(voters, p.StoreID)
			}
		}
		for _, s := range []uint64{1, 2, 3, 4} {
			if _, ok := r.Region.PeerOnStore(s); !ok {
				others = append(others, s)
			}
		}
		switch {
		case rnd.IntN(3) > 0 && len(voters) > 0:
			if cli.TransferLeader(ctx, r.Region.ID, voters[rnd.IntN(len(voters))]) == nil {
				moves.Add(1)
			}
		case len(others) > 0 && len(voters) > 0:
			// A follower's replica to a store without one.
			to, from := others[rnd.IntN(len(others))], voters[rnd.IntN(len(voters))]
			if cli.AddPeer(ctx, r.Region.ID, to) == nil && cli.RemovePeer(ctx, r.Region.ID, from) == nil {
				moves.Add(1)
			}
		}
	})
}

// stallStores stalls a store at a time (Client.Fault: it answers
// nothing, raft included, as in a long GC pause or a slow split apply in
// its Ready loop) for stall, every period, on ls.
func stallStores(cli *client.Client, stores func() []uint64, stall, period time.Duration, ls *loops, n *atomic.Int64) {
	rnd := rand.New(rand.NewPCG(18, 2))
	ls.every(period, func() {
		ids := stores()
		id := ids[rnd.IntN(len(ids))]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if cli.Fault(ctx, id, client.Fault{Stall: stall}) == nil {
			n.Add(1)
			GinkgoWriter.Printf("%s: store %d stalls for %v\n", time.Now().Format("15:04:05.000"), id, stall)
		}
	})
}

var _ = Describe("client under a load while regions split", func() {
	It("fails no insert or read while regions split on their own, leaders and replicas move and stores stall", func() {
		ctx := ctxFor(120 * time.Second)
		c := startServers(3, func(cfg *raftstore.Config) {
			cfg.SplitCheckInterval = 100 * time.Millisecond
			cfg.SplitMaxKeys = 200
			cfg.SplitMaxBytes = 128 << 10
			cfg.BalanceInterval = 200 * time.Millisecond
			cfg.MaxStoreDownTime = time.Minute
		})
		cli := readyClient(ctx, c)

		l := &loadRun{}
		ls := startLoops()
		runLoad(cli, l, ls)
		var moves, stalls atomic.Int64
		churn(cli, ls, &moves)
		// A separate client stalls the stores, so that its calls to a
		// stalled store do not count against the load's client.
		admin, err := client.New(ctx, client.Config{Endpoints: c.endpoints()})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(admin.Close)
		var joined atomic.Bool
		stores := func() []uint64 {
			if joined.Load() {
				return []uint64{1, 2, 3, 4}
			}
			return []uint64{1, 2, 3}
		}
		stallStores(admin, stores, time.Second, 2500*time.Millisecond, ls, &stalls)

		start := time.Now()
		// A store joins under the load, once the regions have begun to
		// split: the balancer moves replicas to it.
		Eventually(func() int { return len(c.leaders()) }).WithTimeout(loadMax).Should(BeNumerically(">=", 2))
		jctx, jcancel := context.WithTimeout(ctx, stepTimeout)
		c.join(jctx, 4, 2)
		jcancel()
		joined.Store(true)
		GinkgoWriter.Printf("%v: store 4 joined\n", time.Since(start).Round(time.Millisecond))
		// At least loadMin, until the regions have split a few times and
		// store 4 has replicas (slower under -race on a busy machine),
		// at most loadMax.
		for time.Since(start) < loadMin || !c.reshaped(loadRegions) {
			if time.Since(start) > loadMax {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		ls.haltAndWait()

		regions, err := cli.Regions(ctx)
		Expect(err).NotTo(HaveOccurred())
		on4 := 0
		for _, r := range regions {
			if _, ok := r.Region.PeerOnStore(4); ok {
				on4++
			}
		}
		GinkgoWriter.Printf("%d operations (%d reads) in %v, slowest %v; %d regions, %d with a replica on store 4; %d moves by the test, %d stalls\n",
			l.ops.Load(), l.reads.Load(), time.Since(start).Round(time.Millisecond),
			time.Duration(l.slowest.Load()).Round(time.Millisecond), len(regions), on4, moves.Load(), stalls.Load())

		l.mu.Lock()
		for _, s := range l.slow {
			GinkgoWriter.Printf("  slow: %s\n", s)
		}
		errs := firstErrs(slices.Clone(l.errs), 20)
		acked := slices.Clone(l.acked)
		l.mu.Unlock()
		Expect(errs).To(BeEmpty(), "operations failed under the load")
		Expect(len(regions)).To(BeNumerically(">=", loadRegions), "the regions did not split on their own")
		Expect(on4).To(BeNumerically(">", 0), "no replica moved to store 4")

		// Every acknowledged insert reads back.
		for _, k := range acked {
			v, err := cli.Get(ctx, []byte(k))
			Expect(err).NotTo(HaveOccurred(), "read back %s", k)
			Expect(string(v)).To(Equal(string(loadValue(k))), "read back %s", k)
		}
	})
})
