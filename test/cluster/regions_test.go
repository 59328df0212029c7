package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/region"
)

func key(i int) []byte { return fmt.Appendf(nil, "key%05d", i) }

// everyRegionHasLeader waits until each region has a leader.
func everyRegionHasLeader(c *raftstoretest.Cluster) {
	GinkgoHelper()
	Eventually(func() error {
		for _, r := range c.Regions() {
			if _, ok := c.Leader(r.ID); !ok {
				return fmt.Errorf("region %d has no leader", r.ID)
			}
		}
		return nil
	}).WithTimeout(10 * time.Second).Should(Succeed())
}

var _ = Describe("regions", func() {
	It("loses and rejects nothing when a region splits under concurrent writes", splitUnderWrites)

	It("keeps routing every key on a store that hears from a new region before it applies the split", routingBeforeSplitApplied)

	It("answers a stale epoch with EpochNotMatch carrying the current regions", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(20 * time.Second)
		before, _ := c.RegionOf(key(1))
		Expect(c.Split(ctx, key(500))).To(Succeed())
		leader, _ := c.LeaderOf(key(1))
		err := mustStore(c, leader).Put(ctx, raftstore.WriteOptions{RegionID: before.ID, Epoch: before.Epoch}, key(1), []byte("x"))
		Expect(err).To(MatchError(ContainSubstring("epoch not match")))
	})

	It("scans across ten regions in key order with the limit respected", scanAcrossTenRegions)

	It("splits a region automatically past its key threshold", func() {
		c := startCluster(raftstoretest.Options{SplitMaxKeys: 50})
		ctx := ctxFor(30 * time.Second)
		for i := range 300 {
			Expect(c.Put(ctx, key(i), []byte("v"))).To(Succeed())
		}
		Eventually(func() int { return len(c.Regions()) }).WithTimeout(10 * time.Second).Should(BeNumerically(">=", 4))
		everyRegionHasLeader(c)
		kvs, err := c.Scan(ctx, nil, nil, 1000)
		Expect(err).NotTo(HaveOccurred())
		Expect(kvs).To(HaveLen(300))
	})

	It("keeps all data through add-peer then remove-peer", addThenRemovePeer)

	It("destroys a replica removed while its store was down once the store is back", removedWhileDown)

	It("keeps taking writes while a leadership transfer waits for a target that lags", writesDuringLaggingTransfer)

	It("destroys a replica that has the entry removing it but never hears that it committed", removedNeverHearingCommit)

	It("never answers a follower read from a replica whose data is being removed", noReadFromReplicaBeingRemoved)

	It("moves a replica (learner, promote, remove) and keeps serving", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(60 * time.Second)
		Expect(c.Put(ctx, key(1), []byte("v"))).To(Succeed())
		newStore, err := c.AddStore()
		Expect(err).NotTo(HaveOccurred())
		leader, _ := c.Leader(1)
		from := otherThan(c, leader, newStore)[0]
		Expect(mustStore(c, leader).MovePeer(ctx, 1, from, newStore)).To(Succeed())
		r, _ := c.RegionOf(key(1))
		_, onFrom := r.PeerOnStore(from)
		_, onNew := r.PeerOnStore(newStore)
		Expect(onFrom).To(BeFalse())
		Expect(onNew).To(BeTrue())
		Expect(c.Put(ctx, key(2), []byte("w"))).To(Succeed())
	})

	It("applies membership changes proposed back to back", func() {
		// Raft drops a conf change proposed before it has taken in the
		// previous one's apply (it learns at Advance, after the proposer
		// was told): the next change must wait for it, not hang.
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(60 * time.Second)
		Expect(c.Put(ctx, key(1), []byte("v"))).To(Succeed())
		spare, err := c.AddStore()
		Expect(err).NotTo(HaveOccurred())
		leader, _ := c.Leader(1)
		for i := range 8 {
			from := otherThan(c, leader, spare)[0]
			step, cancel := context.WithTimeout(ctx, 10*time.Second)
			Expect(mustStore(c, leader).MovePeer(step, 1, from, spare)).To(Succeed(), "move %d: %d -> %d", i, from, spare)
			cancel()
			spare = from
		}
		r, _ := c.RegionOf(key(1))
		Expect(r.Peers).To(HaveLen(3))
		Expect(c.Put(ctx, key(2), []byte("w"))).To(Succeed())
	})

	It("rebalances leaders after a store restarts", rebalanceAfterRestart)

	It("replaces the replicas of a store that stays down", replaceDownStore)
})

// scanAcrossTenRegions: a scan across ten regions returns keys in order and
// respects its limit.
func scanAcrossTenRegions() {
	c := startCluster(raftstoretest.Options{})
	ctx := ctxFor(60 * time.Second)
	for i := range 200 {
		Expect(c.Put(ctx, key(i), fmt.Appendf(nil, "%d", i))).To(Succeed())
	}
	for at := 20; at < 200; at += 20 {
		Expect(c.Split(ctx, key(at))).To(Succeed())
	}
	Expect(c.Regions()).To(HaveLen(10))
	everyRegionHasLeader(c)
	kvs, err := c.Scan(ctx, key(0), nil, 1000)
	Expect(err).NotTo(HaveOccurred())
	Expect(kvs).To(HaveLen(200))
	for i, kv := range kvs {
		Expect(string(kv.Key)).To(Equal(string(key(i))))
	}
	kvs, err = c.Scan(ctx, key(15), key(95), 50)
	Expect(err).NotTo(HaveOccurred())
	Expect(kvs).To(HaveLen(50))
	Expect(string(kvs[0].Key)).To(Equal(string(key(15))))
	Expect(string(kvs[49].Key)).To(Equal(string(key(64))))
}

// splitUnderWrites: splits under concurrent writes reject no write and lose
// none.
func splitUnderWrites() {
	c := startCluster(raftstoretest.Options{})
	ctx := ctxFor(60 * time.Second)
	var (
		wg      sync.WaitGroup
		acked   sync.Map
		written atomic.Int64 // acknowledged puts
		failed  atomic.Int64
		stop    = make(chan struct{})
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i += 4 {
				select {
				case <-stop:
					return
				default:
				}
				k := key(i % 1000)
				v := fmt.Sprintf("v%d", i)
				if err := c.Put(ctx, k, []byte(v)); err != nil {
					failed.Add(1)
					continue
				}
				acked.Store(string(k), v)
				written.Add(1)
			}
		}()
	}
	// Writes land before, between and after the splits.
	moreWrites := func() {
		want := written.Load() + 20
		Eventually(written.Load).WithTimeout(10 * time.Second).Should(BeNumerically(">=", want))
	}
	for _, at := range []int{500, 250, 750, 125, 875} {
		moreWrites()
		Expect(c.Split(ctx, key(at))).To(Succeed())
	}
	moreWrites()
	close(stop)
	wg.Wait()
	Expect(failed.Load()).To(BeZero(), "a caller saw a write rejected")
	Expect(c.Regions()).To(HaveLen(6))
	everyRegionHasLeader(c)
	n := 0
	acked.Range(func(k, v any) bool {
		got, found, err := c.Get(ctx, []byte(k.(string)))
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue(), "%s lost", k)
		Expect(string(got)).To(Equal(v.(string)), "%s", k)
		n++
		return true
	})
	Expect(n).To(BeNumerically(">", 100))
}

// routingBeforeSplitApplied: a store that hears from a new region's leader
// before it applies the split keeps routing every key.
func routingBeforeSplitApplied() {
	// A store that learns of a region from its leader before applying
	// the split that creates it holds an uninitialized placeholder. The
	// placeholder has no range yet; it once entered the store's range
	// tree as the whole key space and evicted every region from it, so
	// the store answered RegionNotFound for keys of regions untouched
	// by the split, for good.
	c := startCluster(raftstoretest.Options{})
	ctx := ctxFor(30 * time.Second)
	for i := 0; i < 1000; i += 100 {
		Expect(c.Put(ctx, key(i), []byte("v"))).To(Succeed())
	}
	Expect(c.Split(ctx, key(500))).To(Succeed())
	left, _ := c.RegionOf(key(0))
	right, _ := c.RegionOf(key(700))
	everyRegionHasLeader(c)
	lagger := uint64(1)
	if l, _ := c.Leader(left.ID); l == lagger {
		lagger = 2
	}
	Eventually(func() int { return len(mustStore(c, lagger).Regions()) }).
		WithTimeout(5 * time.Second).Should(Equal(2))

	// The lagging store gets none of the left region's entries, so it
	// does not apply the next split, but it hears from the new region.
	heal := c.Net.AddFilter(raftstore.MsgTypeFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		return m.RegionID == left.ID && m.ToStore == lagger, 0
	}), raftpb.MsgApp, raftpb.MsgSnap))
	var heard atomic.Bool
	c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		if m.FromStore == lagger && m.RegionID != left.ID && m.RegionID != right.ID {
			heard.Store(true) // the placeholder answered its leader
		}
		return false, 0
	}))
	Expect(c.Split(ctx, key(250))).To(Succeed())
	Eventually(heard.Load).WithTimeout(5 * time.Second).Should(BeTrue())

	heal()
	Eventually(func() int { return len(mustStore(c, lagger).Regions()) }).
		WithTimeout(10 * time.Second).Should(Equal(3))
	// A new peer may not know its leader yet (NotLeader, retryable);
	// a key the store cannot place stays RegionNotFound.
	for _, k := range []int{0, 300, 700} {
		Eventually(func() error {
			_, found, _, err := mustStore(c, lagger).Get(ctx, raftstore.ReadOptions{ReplicaRead: true}, key(k))
			if err == nil && !found {
				err = fmt.Errorf("%s not found", key(k))
			}
			return err
		}).WithTimeout(5*time.Second).Should(Succeed(), "%s on the lagging store", key(k))
	}
}

// addThenRemovePeer: adding a replica and removing another keeps every key.
func addThenRemovePeer() {
	c := startCluster(raftstoretest.Options{LogGCThreshold: 20})
	ctx := ctxFor(60 * time.Second)
	for i := range 100 {
		Expect(c.Put(ctx, key(i), fmt.Appendf(nil, "%d", i))).To(Succeed())
	}
	newStore, err := c.AddStore()
	Expect(err).NotTo(HaveOccurred())
	leader, _ := c.Leader(1)
	Expect(mustStore(c, leader).AddPeer(ctx, 1, newStore)).To(Succeed())
	r, _ := c.RegionOf(key(0))
	Expect(r.Peers).To(HaveLen(4))
	Expect(r.Epoch.ConfVer).To(BeNumerically(">", 1))
	// The new replica has the data, by snapshot and log.
	Eventually(func() error {
		v, found, _, err := mustStore(c, newStore).Get(ctx, raftstore.ReadOptions{ReplicaRead: true}, key(42))
		if err != nil || !found || string(v) != "42" {
			return fmt.Errorf("get on new store: %q %v %v", v, found, err)
		}
		return nil
	}).WithTimeout(10 * time.Second).Should(Succeed())

	victim := otherThan(c, leader, newStore)[0]
	Expect(mustStore(c, leader).RemovePeer(ctx, 1, victim)).To(Succeed())
	r, _ = c.RegionOf(key(0))
	Expect(r.Peers).To(HaveLen(3))
	_, onVictim := r.PeerOnStore(victim)
	Expect(onVictim).To(BeFalse())
	Eventually(func() int { return len(mustStore(c, victim).Regions()) }).WithTimeout(5 * time.Second).Should(BeZero())
	for i := range 100 {
		v, found, err := c.Get(ctx, key(i))
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue())
		Expect(string(v)).To(Equal(fmt.Sprint(i)))
	}
	Expect(c.Put(ctx, key(1000), []byte("after"))).To(Succeed())
}

// twentyKeys starts a cluster whose region 1 holds keys 0-19, and returns
// it with the region's leader and one of its followers.
func twentyKeys(ctx context.Context) (c *raftstoretest.Cluster, leader, follower uint64) {
	GinkgoHelper()
	c = startCluster(raftstoretest.Options{})
	for i := range 20 {
		Expect(c.Put(ctx, key(i), fmt.Appendf(nil, "%d", i))).To(Succeed())
	}
	leader, _ = c.Leader(1)
	return c, leader, otherThan(c, leader)[0]
}

// removedWhileDown: a replica removed while its store was down is destroyed
// once the store is back.
func removedWhileDown() {
	// The leader's tombstone for a removed peer goes out once, when the
	// removal applies; a store down then never hears it. The peer comes
	// back with its store and must learn of its removal from the
	// members it contacts, else it holds its data, and is counted as a
	// replica of its store, for good.
	ctx := ctxFor(60 * time.Second)
	c, leader, victim := twentyKeys(ctx)
	Expect(c.StopStore(victim)).To(Succeed())
	Expect(mustStore(c, leader).RemovePeer(ctx, 1, victim)).To(Succeed())
	Expect(c.Put(ctx, key(100), []byte("after"))).To(Succeed())
	Expect(c.StartStore(victim)).To(Succeed())
	Eventually(func() int { return len(mustStore(c, victim).Regions()) }).WithTimeout(10 * time.Second).Should(BeZero())
	// Its data is gone with it: a follower read there finds no region.
	_, _, _, err := mustStore(c, victim).Get(ctx, raftstore.ReadOptions{ReplicaRead: true}, key(1))
	var notFound *region.RegionNotFoundError
	Expect(errors.As(err, &notFound)).To(BeTrue(), "read on the removed replica's store: %v", err)
	r, _ := c.RegionOf(key(0))
	Expect(r.Peers).To(HaveLen(2))
}

// writesDuringLaggingTransfer: writes go on while a leadership transfer waits
// for a target that lags.
func writesDuringLaggingTransfer() {
	// Raft drops proposals while a transfer is pending; a transfer to
	// a follower far behind, retried every election timeout, would
	// stall the region's writes for as long as the follower lags.
	c := startCluster(raftstoretest.Options{})
	ctx := ctxFor(30 * time.Second)
	leader, _ := c.Leader(1)
	target := otherThan(c, leader)[0]
	c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		return m.ToStore == target && (m.Msg.Type == raftpb.MsgApp || m.Msg.Type == raftpb.MsgSnap), 0
	}))
	for i := range 200 {
		Expect(c.Put(ctx, key(i), []byte("v"))).To(Succeed())
	}
	// Under load an election may have moved the leadership meanwhile (never
	// to the target, whose log lags): transfer from whoever leads now.
	leader, _ = c.Leader(1)
	Expect(leader).NotTo(Equal(target))
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- mustStore(c, leader).TransferLeader(tctx, 1, target) }()
	for i := range 20 {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		err := mustStore(c, leader).Put(pctx, raftstore.WriteOptions{}, key(1000+i), []byte("during"))
		pcancel()
		Expect(err).NotTo(HaveOccurred(), "write %d during the transfer", i)
	}
	Expect(<-done).To(MatchError(ContainSubstring("has not caught up")))
}

// removedNeverHearingCommit: a replica that has the entry removing it but
// never hears that it committed is destroyed.
func removedNeverHearingCommit() {
	// The removed peer acks the entry that removes it, the leader
	// commits it and stops replicating to it, and the leader's one
	// tombstone is lost: the peer holds an unapplied conf change, so
	// raft will not let it campaign, and it sends nothing a member
	// could answer with a tombstone. It must ask.
	ctx := ctxFor(60 * time.Second)
	c, leader, victim := twentyKeys(ctx)
	Eventually(func() bool {
		l, _ := c.Status(leader, 1)
		v, _ := c.Status(victim, 1)
		return l.CommitIndex > 0 && l.AppliedIndex == l.CommitIndex && v.AppliedIndex == l.AppliedIndex
	}).WithTimeout(5 * time.Second).Should(BeTrue())
	st, _ := c.Status(leader, 1)
	committed := st.CommitIndex
	heal := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		if m.FromStore == victim {
			// Its acks are lost too, or a late one would reveal it.
			return true, 0
		}
		if m.ToStore != victim {
			return false, 0
		}
		// Entries pass, but no commit index beyond what it had.
		m.Msg.Commit = min(m.Msg.Commit, committed)
		if m.Notice != nil {
			m.Notice.Commit = min(m.Notice.Commit, committed)
		}
		return m.Notice != nil && m.Notice.Kind == raftstore.NoticeTombstone, 0
	}))
	Expect(mustStore(c, leader).RemovePeer(ctx, 1, victim)).To(Succeed())
	r, _ := c.RegionOf(key(0))
	Expect(r.Peers).To(HaveLen(2))
	// The tombstone is gone. Its campaigns stay silent, as when raft
	// refuses to campaign with a committed conf change unapplied (seen
	// at scale): a campaign is not what may reveal it.
	heal()
	c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		return m.FromStore == victim && (m.Msg.Type == raftpb.MsgPreVote || m.Msg.Type == raftpb.MsgVote), 0
	}))
	Eventually(func() int { return len(mustStore(c, victim).Regions()) }).WithTimeout(10*time.Second).Should(BeZero(),
		"the removed replica still lingers on store %d", victim)
}

// noReadFromReplicaBeingRemoved: no follower read is answered from a replica
// whose data is being removed.
func noReadFromReplicaBeingRemoved() {
	// A removed replica deletes its range right after applying its own
	// removal; a read that woke on that same apply must not read the
	// emptied range and answer "no keys".
	c := startCluster(raftstoretest.Options{})
	ctx := ctxFor(30 * time.Second)
	const n = 50
	for i := range n {
		Expect(c.Put(ctx, key(i), []byte("v"))).To(Succeed())
	}
	leader, _ := c.Leader(1)
	victim := otherThan(c, leader)[0]
	vs := mustStore(c, victim)
	var (
		wg    sync.WaitGroup
		stop  atomic.Bool
		short atomic.Int64
		full  atomic.Int64
	)
	for range 8 {
		wg.Go(func() {
			for !stop.Load() {
				rctx, cancel := context.WithTimeout(ctx, time.Second)
				kvs, _, _, err := vs.Scan(rctx, raftstore.ReadOptions{ReplicaRead: true}, key(0), nil, 1000)
				cancel()
				switch {
				case err != nil:
					time.Sleep(time.Millisecond) // refused: fine, the client goes elsewhere
				case len(kvs) != n:
					short.Add(1)
				default:
					full.Add(1)
				}
			}
		})
	}
	Eventually(full.Load).Should(BeNumerically(">", 20))
	Expect(mustStore(c, leader).RemovePeer(ctx, 1, victim)).To(Succeed())
	Eventually(func() int { return len(vs.Regions()) }).WithTimeout(5 * time.Second).Should(BeZero())
	stop.Store(true)
	wg.Wait()
	Expect(short.Load()).To(BeZero(), "reads answered with part of the region missing")
}

// rebalanceAfterRestart: the balancer spreads the leaders again after a
// store restarts.
func rebalanceAfterRestart() {
	// On the manual clock, stepped by a clockRunner as fast as the stores
	// take the ticks: the balancer waits 2 s of its clock after each move
	// before it judges the spread again (settleTime), and spreading ten
	// leaders off one store took six such waits, on the real clock 10 of
	// the spec's 15 s. Every wait below is bounded in the stores' time,
	// as the balancer's pace is, so a starved machine, whose clock then
	// runs slower, gets as long in the stores' time as a fast one.
	stop := make(chan struct{})
	DeferCleanup(func() { close(stop) }) // after the replica check, which needs ticks
	c := startCluster(raftstoretest.Options{Balance: true, ManualClock: true})
	clk := runClock(c, stop)
	ctx := ctxFor(2 * time.Minute)
	for at := 100; at < 1000; at += 100 {
		Expect(c.Split(ctx, key(at))).To(Succeed())
	}
	everyRegionHasLeader(c)
	spread := func() error {
		counts := map[uint64]int{}
		for _, r := range c.Regions() {
			id, ok := c.Leader(r.ID)
			if !ok {
				return fmt.Errorf("region %d has no leader", r.ID)
			}
			counts[id]++
		}
		lo, hi := 1<<30, 0
		for _, id := range c.IDs() {
			lo, hi = min(lo, counts[id]), max(hi, counts[id])
		}
		if hi-lo > 1 {
			return fmt.Errorf("leaders per store %v", counts)
		}
		return nil
	}
	Expect(untilOnClock(c, 20*time.Second, spread)).To(Succeed())
	victim := c.IDs()[0]
	clk.hold(func() { Expect(c.StopStore(victim)).To(Succeed()) })
	everyRegionHasLeader(c)
	clk.hold(func() { Expect(c.StartStore(victim)).To(Succeed()) })
	Expect(untilOnClock(c, 20*time.Second, spread)).To(Succeed())
	Expect(clk.err()).To(Succeed())
}

// clockRunner steps a cluster's manual clock (runClock).
type clockRunner struct {
	mu    sync.Mutex // held for each step, and by hold
	first error      // the first error a step met
}

// runClock steps c's manual clock a tick at a time, as fast as every
// store takes the ticks (Advance waits for them), until stop is closed.
func runClock(c *raftstoretest.Cluster, stop <-chan struct{}) *clockRunner {
	r := &clockRunner{}
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			r.mu.Lock()
			if err := c.Tick(1); err != nil && r.first == nil {
				r.first = err
			}
			r.mu.Unlock()
			// A pace: the stores' goroutines outside the tick (the
			// balancer, a transfer's messages) get a moment of real time
			// in each tick of theirs.
			time.Sleep(time.Millisecond)
		}
	}()
	return r
}

// hold runs f with the clock stopped: a store started while the clock
// moves may arm its ticker a tick later than the cluster counts its ticks
// from, and Advance would then wait for a tick it never takes.
func (r *clockRunner) hold(f func()) {
	GinkgoHelper()
	r.mu.Lock()
	defer r.mu.Unlock()
	f()
}

func (r *clockRunner) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.first
}

// untilOnClock polls cond until it holds, for at most d of c's manual
// clock (and, so that a stuck clock cannot hang the spec, two minutes of
// real time).
func untilOnClock(c *raftstoretest.Cluster, d time.Duration, cond func() error) error {
	GinkgoHelper()
	clk := c.Clock()
	end, realEnd := clk.Now().Add(d), time.Now().Add(2*time.Minute)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if !clk.Now().Before(end) || time.Now().After(realEnd) {
			return fmt.Errorf("after %v of the stores' clock (%v of the real one): %w",
				d-end.Sub(clk.Now()), time.Until(realEnd.Add(-2*time.Minute)).Abs().Round(time.Millisecond), err)
		}
		time.Sleep(5 * time.Millisecond) // a pace of polling
	}
}

// replaceDownStore: the replicas of a store that stays down are replaced on
// the others.
func replaceDownStore() {
	c := startCluster(raftstoretest.Options{Stores: 4, Balance: true, MaxStoreDownTime: 500 * time.Millisecond})
	ctx := ctxFor(60 * time.Second)
	Expect(c.Put(ctx, key(1), []byte("v"))).To(Succeed())
	// Region 1 starts on all four stores; the balancer trims it to three.
	Eventually(func() int { r, _ := c.RegionOf(key(1)); return len(r.Peers) }).WithTimeout(20 * time.Second).Should(Equal(3))
	r, _ := c.RegionOf(key(1))
	leader, _ := c.Leader(r.ID)
	var victim uint64
	for _, p := range r.Peers {
		if p.StoreID != leader {
			victim = p.StoreID
		}
	}
	Expect(c.StopStore(victim)).To(Succeed())
	Eventually(func() error {
		r, _ := c.RegionOf(key(1))
		if _, on := r.PeerOnStore(victim); on || len(r.Peers) != 3 {
			return fmt.Errorf("region peers %v", r.Peers)
		}
		return nil
	}).WithTimeout(20 * time.Second).Should(Succeed())
	v, _, err := c.Get(ctx, key(1))
	Expect(err).NotTo(HaveOccurred())
	Expect(string(v)).To(Equal("v"))
}

var _ = Describe("hibernation", func() {
	It("lets idle regions stop ticking, wakes them on traffic, and recovers from a dead leader", func() {
		c := startCluster(raftstoretest.Options{HibernateAfter: 200 * time.Millisecond})
		ctx := ctxFor(30 * time.Second)
		for at := 100; at < 500; at += 100 {
			Expect(c.Split(ctx, key(at))).To(Succeed())
		}
		allAsleep := func() error {
			for _, id := range c.IDs() {
				s, ok := c.Store(id)
				if !ok {
					continue
				}
				for _, st := range s.Regions() {
					if !st.Hibernating {
						return fmt.Errorf("store %d region %d awake", id, st.Region.ID)
					}
				}
			}
			return nil
		}
		Eventually(allAsleep).WithTimeout(10 * time.Second).Should(Succeed())
		// Asleep means no raft traffic at all.
		var msgs atomic.Int64
		c.Net.AddFilter(raftstore.FilterFunc(func(*raftstore.Message) (bool, time.Duration) { msgs.Add(1); return false, 0 }))
		time.Sleep(300 * time.Millisecond)
		Expect(msgs.Load()).To(BeZero())

		// Traffic wakes the region it touches, and only that one.
		Expect(c.Put(ctx, key(150), []byte("v"))).To(Succeed())
		v, _, err := c.Get(ctx, key(150))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(v)).To(Equal("v"))
		Eventually(allAsleep).WithTimeout(10 * time.Second).Should(Succeed())

		// A leader's store dies while everything sleeps: its regions wake
		// through the liveness check and elect new leaders.
		r, _ := c.RegionOf(key(150))
		dead, _ := c.Leader(r.ID)
		Expect(c.StopStore(dead)).To(Succeed())
		Expect(c.Put(ctx, key(151), []byte("w"))).To(Succeed())
		everyRegionHasLeader(c)
	})
})
