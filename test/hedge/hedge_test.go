package hedge_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/readmode"
)

var _ = Describe("hedged reads", func() {
	It("beats a leader whose read path is slow, and the loser stops on the server", func() {
		c := startCluster()
		cl := newClient(c)
		key, value := []byte("hedge-key"), []byte("hedge-value")
		Expect(cl.Put(ctxFor(10*time.Second), key, value)).To(Succeed())
		leader := leaderOf(c)

		// Warm the region cache and connections before the fault, so the
		// timed reads measure the read path only. A budget of 1 (a token
		// per primary) lets every read be hedged: the default 5% would run
		// dry after the bucket's 10 saved tokens (the next spec's subject).
		hedged := cl.Session(client.ReadPolicy{Replica: client.ReplicaLeader, Hedge: client.HedgeAfter(20 * time.Millisecond), HedgeBudget: 1})
		plain := cl.Session(client.ReadPolicy{Replica: client.ReplicaLeader})
		for _, s := range []*client.Session{hedged, plain} {
			got, err := s.Get(ctxFor(10*time.Second), key)
			Expect(err).NotTo(HaveOccurred())
			Expect(got).To(Equal(value))
		}
		before := hedged.HedgeStats()
		cancelledBefore := c.Server(leader).ReadsCancelled()

		// Every KV read on the leader's store is held 300ms; raft stays live.
		Expect(cl.Fault(ctxFor(10*time.Second), leader, client.Fault{Delay: 300 * time.Millisecond, Prob: 1})).To(Succeed())

		for i := range 20 {
			start := time.Now()
			got, info, err := hedged.GetWithInfo(ctxFor(10*time.Second), key)
			took := time.Since(start)
			Expect(err).NotTo(HaveOccurred(), "read %d", i)
			Expect(got).To(Equal(value), "read %d", i)
			// A functional bound far from the fault's 300ms: the hedge goes
			// out after 20ms and a follower's ReadIndex read takes a few ms.
			Expect(took).To(BeNumerically("<", 250*time.Millisecond), "read %d took %v", i, took)
			Expect(info.HedgeWon).To(BeTrue(), "read %d was answered by store %d", i, info.StoreID)
			Expect(info.StoreID).NotTo(Equal(leader), "read %d", i)
		}
		st := hedged.HedgeStats()
		sent, won := st.HedgesSent-before.HedgesSent, st.HedgesWon-before.HedgesWon
		Expect(sent).To(BeNumerically(">", 0))
		Expect(won).To(Equal(sent), "every hedge beat the held primary: %+v", st)

		// The losing primaries were cancelled by the client and stopped on
		// the leader's server instead of running out the 300ms.
		Eventually(func() uint64 {
			return c.Server(leader).ReadsCancelled() - cancelledBefore
		}).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(BeNumerically(">", 0))
		Eventually(func() (float64, error) {
			return metric(c, leader, "hedgekv_reads_cancelled_total")
		}).WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).Should(BeNumerically(">", 0))

		// Without hedging the read waits out the fault.
		start := time.Now()
		got, err := plain.Get(ctxFor(10*time.Second), key)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(value))
		Expect(time.Since(start)).To(BeNumerically(">=", 300*time.Millisecond))
	})

	It("keeps extra requests within the budget", extraRequestsWithinBudget)

	It("answers through a stale hedge while the leader's store is stalled", staleHedgeDuringStall)

	It("fails no read when the leader's store is killed, with a staleness bound", noFailedReadOnLeaderKill)
})

// extraRequestsWithinBudget: hedged reads send extra requests only within
// the client's budget.
func extraRequestsWithinBudget() {
	c := startCluster()
	cl := newClient(c)
	const keys = 16
	for i := range keys {
		Expect(cl.Put(ctxFor(10*time.Second), fmt.Appendf(nil, "budget-%02d", i), []byte("v"))).To(Succeed())
	}
	leader := leaderOf(c)

	const budget = 0.05
	s := cl.Session(client.ReadPolicy{Replica: client.ReplicaLeader, Hedge: client.HedgeAfter(5 * time.Millisecond), HedgeBudget: budget})
	// Half the leader's reads are held 20ms, four times the hedge delay,
	// so about half the primaries are due a hedge: far more than the
	// budget allows.
	Expect(cl.Fault(ctxFor(10*time.Second), leader, client.Fault{Delay: 20 * time.Millisecond, Prob: 0.5})).To(Succeed())

	// 10,000 reads by 40 workers sharing the session (and its bucket):
	// about 5,000 are held 20ms, so this takes a few seconds, not 100.
	const workers, perWorker = 40, 250
	ctx := ctxFor(120 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				key := fmt.Appendf(nil, "budget-%02d", (w*perWorker+i)%keys)
				if _, err := s.Get(ctx, key); err != nil {
					errs <- fmt.Errorf("worker %d read %d: %w", w, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		Expect(err).NotTo(HaveOccurred())
	}

	st := s.HedgeStats()
	GinkgoWriter.Printf("hedge stats: %+v (extra request ratio %.3f)\n", st, st.ExtraRequestRatio())
	Expect(st.Primaries).To(BeNumerically(">=", workers*perWorker))
	// Tolerance: the bucket starts full with its cap of 10 tokens and
	// each primary earns budget tokens, so at most budget*primaries + 10
	// hedges can ever be sent; nothing else is allowed on top.
	Expect(float64(st.HedgesSent)).To(BeNumerically("<=", budget*float64(st.Primaries)+10), "%+v", st)
	// Over 10,000 primaries that tolerance is 0.1 percentage points.
	Expect(st.ExtraRequestRatio()).To(BeNumerically("<=", budget+0.001), "%+v", st)
	// The hedges reached the followers marked as hedges.
	var flagged float64
	for _, id := range c.StoreIDs() {
		if id == leader {
			continue
		}
		n, err := metric(c, id, "hedgekv_hedge_reads_total")
		Expect(err).NotTo(HaveOccurred())
		flagged += n
	}
	Expect(flagged).To(BeNumerically(">", 0))
	Expect(flagged).To(BeNumerically("<=", float64(st.HedgesSent)))
	// The budget was the limit, not a lack of slow reads.
	Expect(st.DeniedByBudget).To(BeNumerically(">", 0), "%+v", st)
	Expect(st.HedgesSent).To(BeNumerically(">", 0), "%+v", st)
}

// staleHedgeDuringStall: while the leader's store is stalled, reads are
// answered through a stale hedge.
func staleHedgeDuringStall() {
	c := startCluster()
	cl := newClient(c)
	key, value := []byte("stall-key"), []byte("stall-value")
	leader := leaderOf(c)

	hedged := cl.Session(client.ReadPolicy{Replica: client.ReplicaLeader, Hedge: client.HedgeAfter(20 * time.Millisecond), HedgeBudget: 1, MaxStaleness: 5 * time.Second})
	plain := cl.Session(client.ReadPolicy{Replica: client.ReplicaLeader})
	follower := cl.Session(client.ReadPolicy{Replica: client.ReplicaFollower, MaxStaleness: 5 * time.Second})
	// Writes and reads before the stall warm the region cache and
	// connections.
	for i := range 5 {
		Expect(cl.Put(ctxFor(10*time.Second), key, value)).To(Succeed(), "put %d", i)
		for _, s := range []*client.Session{hedged, plain, follower} {
			got, err := s.Get(ctxFor(10*time.Second), key)
			Expect(err).NotTo(HaveOccurred())
			Expect(got).To(Equal(value))
		}
	}

	// A follower has safe points only once its stale reads nudged the
	// leader into stamping them (raftstore/stale.go): wait until a
	// follower serves a stale read itself.
	Eventually(func() (client.ReadInfo, error) {
		_, info, err := follower.GetWithInfo(ctxFor(10*time.Second), key)
		return info, err
	}).WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).Should(And(
		HaveField("Mode", readmode.Stale), Not(HaveField("StoreID", leader))))
	// The leader's whole store answers nothing for 1.5s (raft included).
	const stall = 1500 * time.Millisecond
	DeferCleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		Expect(cl.Fault(ctx, leader, client.Fault{Clear: true})).To(Succeed())
	})
	issued := time.Now()
	Expect(cl.Fault(ctxFor(10*time.Second), leader, client.Fault{Stall: stall})).To(Succeed())
	// The stall started no earlier than issued, so it ends no earlier
	// than stallEnd.
	stallEnd := issued.Add(stall)

	for i := range 5 {
		start := time.Now()
		got, info, err := hedged.GetWithInfo(ctxFor(10*time.Second), key)
		took := time.Since(start)
		Expect(err).NotTo(HaveOccurred(), "read %d", i)
		Expect(got).To(Equal(value), "read %d", i)
		Expect(took).To(BeNumerically("<", 500*time.Millisecond), "read %d took %v: %+v, %+v", i, took, info, hedged.HedgeStats())
		Expect(info.StoreID).NotTo(Equal(leader), "read %d", i)
		Expect(info.HedgeWon).To(BeTrue(), "read %d", i)
		Expect(info.Mode).To(Equal(readmode.Stale), "read %d: %+v", i, info)
	}
	Expect(time.Now()).To(BeTemporally("<", stallEnd), "the hedged reads outlasted the stall, so they proved nothing")

	// A linearizable read without hedging gets nothing from the stalled
	// leader: it waits the stall out, or, once the other stores have
	// elected a new leader (the stall outlasts an election timeout),
	// the client's leader check finds it and the new leader answers.
	start := time.Now()
	remaining := stallEnd.Sub(start)
	_, info, err := plain.GetWithInfo(ctxFor(10*time.Second), key)
	took := time.Since(start)
	if err == nil {
		if took < remaining {
			Expect(info.StoreID).NotTo(Equal(leader), "the stalled leader answered after %v with %v of stall left", took, remaining)
			Expect(info.Mode).NotTo(Equal(readmode.Stale), "a plain session read stale: %+v", info)
		}
	} else {
		Expect(err).To(MatchError(context.DeadlineExceeded))
	}
}

// noFailedReadOnLeaderKill: with a staleness bound, no read fails when the
// leader's store is killed.
func noFailedReadOnLeaderKill() {
	c := startCluster()
	cl := newClient(c)
	key, value := []byte("kill-key"), []byte("kill-value")
	Expect(cl.Put(ctxFor(10*time.Second), key, value)).To(Succeed())
	leader := leaderOf(c)

	s := cl.Session(client.ReadPolicy{Replica: client.ReplicaLeader, Hedge: client.HedgeAfter(20 * time.Millisecond), HedgeBudget: 1, MaxStaleness: 5 * time.Second})
	// Warm the region cache and connections before the kill.
	for i := range 5 {
		Expect(cl.Put(ctxFor(10*time.Second), key, value)).To(Succeed(), "put %d", i)
		got, err := s.Get(ctxFor(10*time.Second), key)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(value))
	}

	var reads, failed int
	var errs []error
	read := func() {
		reads++
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := s.Get(ctx, key)
		cancel()
		if err == nil && string(got) != string(value) {
			err = fmt.Errorf("read %q, want %q", got, value)
		}
		if err != nil {
			failed++
			errs = append(errs, err)
		}
	}
	for range 20 {
		read()
	}
	c.Server(leader).Stop() // safe to call again from c.Stop
	killed := time.Now()
	for time.Since(killed) < 2*time.Second {
		read()
	}
	GinkgoWriter.Printf("%d reads, %d failed, hedge stats %+v\n", reads, failed, s.HedgeStats())
	Expect(errors.Join(errs...)).NotTo(HaveOccurred(), "%d of %d reads failed", failed, reads)
}
