package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/test/kvmodel"
)

var _ = Describe("disk failure", func() {
	It("freezes a store whose disk write fails (no writes, bounded-stale reads only) and rebuilds it from disk once writes succeed again", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(60 * time.Second)
		for i := range 10 {
			Expect(c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("before"))).To(Succeed())
		}
		victim, _ := c.Leader(1)
		s := mustStore(c, victim)
		// A heartbeat round has stamped a safe point for the stale read
		// below once a follower serves one (the leader keeps its own).
		Eventually(func() error {
			_, _, _, err := readOn(c, otherThan(c, victim)[0], raftstore.ReadOptions{MaxStaleness: 10 * time.Second}, "k1", time.Second)
			return err
		}).WithTimeout(5 * time.Second).Should(Succeed())
		s.InjectDiskFailure(errors.New("write store.db: no space left on device"))

		// The next write's round fails on the victim; the others elect a
		// leader among themselves and take it.
		Expect(c.Put(ctx, []byte("k0"), []byte("during"))).To(Succeed())
		Eventually(func() uint64 { return s.Stats().DiskFailures }).WithTimeout(5 * time.Second).Should(BeNumerically(">=", 1))

		// Asked directly, the frozen store refuses writes and linearizable
		// reads at once, saying why...
		wctx := ctxFor(time.Second)
		err := s.Put(wctx, raftstore.WriteOptions{}, []byte("k1"), []byte("refused"))
		Expect(errors.Is(err, raftstore.ErrDiskFailed)).To(BeTrue(), "put on the frozen store: %v", err)
		Expect(err.Error()).To(ContainSubstring("no space left on device"))
		_, _, _, err = readOn(c, victim, raftstore.ReadOptions{ReplicaRead: true}, "k1", time.Second)
		Expect(errors.Is(err, raftstore.ErrDiskFailed)).To(BeTrue(), "linearizable read on the frozen store: %v", err)
		// ...and serves what it applied before, under a staleness bound.
		v, _, info, err := readOn(c, victim, raftstore.ReadOptions{MaxStaleness: 10 * time.Second}, "k1", time.Second)
		var dr *region.DataIsNotReadyError
		if !errors.As(err, &dr) {
			Expect(err).NotTo(HaveOccurred())
			Expect(v).To(Equal("before"))
			Expect(info.Mode).To(Equal(readmode.Stale))
		}

		// Writes go on without it.
		for i := range 10 {
			Expect(c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("after"))).To(Succeed())
		}

		// Space returns: the store rebuilds its peers from disk and catches up.
		s.InjectDiskFailure(nil)
		Eventually(func() string {
			v, _, _, _ := readOn(c, victim, raftstore.ReadOptions{ReplicaRead: true}, "k9", time.Second)
			return v
		}).WithTimeout(15 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal("after"))
		// The failure struck a round that had written into the open batch
		// (its uncommitted rounds were lost with it): they were rebuilt
		// from the WAL before the peers were.
		Expect(s.Stats().BatchesRebuilt).To(BeNumerically(">=", 1))
		Expect(s.Put(ctxFor(5*time.Second), raftstore.WriteOptions{}, []byte("k1"), []byte("x"))).To(Or(Succeed(), MatchError(ContainSubstring("not leader"))))
		// No acknowledged write is lost; startCluster's cleanup then checks
		// that the three replicas agree.
		for i := range 10 {
			v, found, err := c.Get(ctx, fmt.Appendf(nil, "k%d", i))
			Expect(err).NotTo(HaveOccurred())
			Expect(found).To(BeTrue())
			if i != 1 {
				Expect(string(v)).To(Equal("after"))
			}
		}
	})
})

var _ = Describe("disk failure, again and again", func() {
	// A failure may strike a round's write or a commit of the batch outside
	// the loop; either loses the rounds since the last commit, which the
	// store must rebuild from its WAL and re-apply before it goes on.
	It("leaves every replica caught up after short failures of random stores under a write load", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(90 * time.Second)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				wctx, cancel := context.WithTimeout(ctx, time.Second)
				_ = c.Put(wctx, fmt.Appendf(nil, "k%d", i%50), fmt.Appendf(nil, "v%d", i))
				cancel()
			}
		}()
		rng := rand.New(rand.NewPCG(7, 7))
		ids := c.IDs()
		for round := range 12 {
			victim := ids[rng.IntN(len(ids))]
			s := mustStore(c, victim)
			s.InjectDiskFailure(errors.New("injected: no space left on device"))
			if round%2 == 0 {
				// A digest (ctl check) commits the open batch outside the
				// Ready loop: that commit may be the one that fails.
				_, _ = s.RegionDigest(1)
			}
			time.Sleep(time.Duration(50+rng.IntN(300)) * time.Millisecond)
			s.InjectDiskFailure(nil)
			time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
			By(fmt.Sprintf("round %d: store %d failed and healed", round, victim))
		}
		close(stop)
		<-done
		// Idle now: every replica must reach the leader's applied index
		// within a few election timeouts, not wait for the next write.
		Expect(checkWithin(c, 5*time.Second)).To(Succeed())
	})

	// The rounds of an idle store stay in the open batch until its next
	// checkpoint; a commit outside the loop (a digest's) that fails then
	// loses them with no round to notice. The store must still freeze and
	// rebuild, not checkpoint past the loss.
	It("rebuilds a store whose batch was lost by a failed commit outside the loop while idle", func() {
		// Rounds commit only at checkpoints (every 100 ms): a batch is
		// open after a put whatever the rounds cost (-race).
		c := startCluster(raftstoretest.Options{BatchInterval: time.Hour})
		ctx := ctxFor(30 * time.Second)
		for i := range 5 {
			Expect(c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("v1"))).To(Succeed())
		}
		Expect(checkWithin(c, 5*time.Second)).To(Succeed())
		for round := range 6 {
			victim := c.IDs()[round%3]
			s := mustStore(c, victim)
			rebuilt := s.Stats().BatchesRebuilt
			// The digest's commit fails only if the victim's batch is
			// open (no checkpoint since the put), and only if none of the
			// victim's rounds ran into the failure first (that path is
			// the other spec's): try again until it is the digest's.
			const digestFailed = "commit batch: injected: fsync failed"
			var err error
			for try := 0; try < 50 && (err == nil || !strings.Contains(err.Error(), digestFailed)); try++ {
				Eventually(s.DiskError).WithTimeout(5 * time.Second).Should(Succeed())
				key := fmt.Appendf(nil, "k%d", round)
				Expect(c.Put(ctx, key, fmt.Appendf(nil, "v%d-%d", round, try))).To(Succeed())
				s.InjectDiskFailure(errors.New("injected: fsync failed"))
				_, err = s.RegionDigest(1)
				s.InjectDiskFailure(nil)
			}
			Expect(err).To(MatchError(ContainSubstring(digestFailed)), "round %d: the digest's commit never failed", round)
			// Idle: the store must freeze and rebuild with no round to run.
			Eventually(func() uint64 { return s.Stats().BatchesRebuilt }).WithTimeout(5*time.Second).Should(BeNumerically(">", rebuilt), "round %d, store %d", round, victim)
			Expect(c.Put(ctx, []byte("after"), fmt.Appendf(nil, "%d", round))).To(Succeed())
			Expect(checkWithin(c, 5*time.Second)).To(Succeed(), "round %d, store %d", round, victim)
		}
	})
})

var _ = Describe("disk failure, stale reads across the rebuild", func() {
	// The nemesis' disk-fail fault, on a follower of the quiet region each
	// time: a write of the quiet key goes into the victim's open batch,
	// which the failure loses; once the disk heals, the victim rebuilds the
	// batch (its engine goes back to its last commit) and then its peers,
	// while stale reads run against it. None may answer older than its
	// bound allows (staleReadsAcrossRebuild).
	It("serves no bounded-staleness read older than its bound while a store rebuilds a lost batch", func() {
		// True clocks: with the nemesis's drifting ones, a victim whose
		// leader's clock ran fast refused every safe point once the drift
		// passed MaxClockOffset (after the preload), and the spec could
		// not even begin (about half its runs).
		run := nemesisRun{seed: 11, tick: 10 * time.Millisecond, trueClocks: true}
		rng := rand.New(rand.NewPCG(run.seed, run.seed))
		c, clocks := startNemesisCluster(run, rng)
		stop := make(chan struct{})
		defer close(stop)
		faults := &faultLog{}
		n := &nemesis{c: c, run: run, rng: rng, stop: stop, log: faults, h: kvmodel.NewHistory(), clocks: clocks}
		r, ok := c.RegionOf([]byte(quietKey))
		Expect(ok).To(BeTrue())
		for round := range 6 {
			leader, err := c.WaitLeader(r.ID, 10*time.Second)
			Expect(err).NotTo(HaveOccurred())
			var victim uint64
			for _, pr := range r.Peers {
				if pr.StoreID != leader && !pr.IsLearner {
					victim = pr.StoreID
				}
			}
			Expect(victim).NotTo(BeZero())
			s := mustStore(c, victim)
			// A safe point first: the victim serves the quiet key stale.
			// After the previous round's rebuild it must catch up with the
			// leader's commit (from its log or, the region being preloaded,
			// a paced snapshot): on a loaded machine that took over 5 s.
			Eventually(func() error {
				_, _, _, err := readOn(c, victim, raftstore.ReadOptions{RegionID: r.ID, MaxStaleness: 5 * time.Second}, quietKey, time.Second)
				return err
			}).WithTimeout(30*time.Second).Should(Succeed(), "round %d: store %d never served a stale read", round, victim)
			n.diskFail(victim, 300*time.Millisecond)
			Eventually(s.DiskError).WithTimeout(10*time.Second).Should(Succeed(), "round %d: store %d never rebuilt", round, victim)
		}
		GinkgoWriter.Printf("%s; %d stale reads checked\n", faults.summary(), n.staleChecked)
		Expect(n.staleViolations).To(BeZero(), "%v", faults.list)
		Expect(n.staleChecked).To(BeNumerically(">", 0), "no stale read was checked: %v", faults.list)
	})
})
