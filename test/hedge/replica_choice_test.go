package hedge_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/readmode"
)

// readsPerStore runs `clients` independent clients (each its own
// client.Client: no shared state), each with two workers reading under
// policy for d, and returns how many reads each store served.
func readsPerStore(c *cluster.Local, clients int, policy client.ReadPolicy, keys int, d time.Duration) (map[uint64]int64, int64) {
	GinkgoHelper()
	served := map[uint64]*atomic.Int64{}
	for _, id := range c.StoreIDs() {
		served[id] = &atomic.Int64{}
	}
	var failed atomic.Int64
	ctx := ctxFor(d + 30*time.Second)
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := range clients {
		cl := newClient(c)
		s := cl.Session(policy)
		for w := range 2 {
			wg.Go(func() {
				// Bounded in count as well as time.
				for n := 0; n < 5000 && time.Now().Before(deadline); n++ {
					key := fmt.Appendf(nil, "p2c-%03d", (i*7+w*3+n)%keys)
					_, info, err := s.GetWithInfo(ctx, key)
					if err != nil {
						failed.Add(1)
						continue
					}
					if n := served[info.StoreID]; n != nil {
						n.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	out := map[uint64]int64{}
	for id, n := range served {
		out[id] = n.Load()
	}
	return out, failed.Load()
}

var _ = Describe("replica choice", func() {
	It("sends well under a third of sixteen independent clients' reads to a slow store", func() {
		c := startCluster()
		cl := newClient(c)
		const keys = 32
		for i := range keys {
			Expect(cl.Put(ctxFor(10*time.Second), fmt.Appendf(nil, "p2c-%03d", i), []byte("v"))).To(Succeed())
		}
		leader := leaderOf(c)
		// A follower's read path made slow: 200ms on every read. Healthy
		// reads take a few ms, but tens of ms with 32 readers under -race
		// on two cores, so the fault must stand well clear of that.
		var slow uint64
		for _, id := range c.StoreIDs() {
			if id != leader {
				slow = id
				break
			}
		}
		Expect(cl.Fault(ctxFor(10*time.Second), slow, client.Fault{Delay: 200 * time.Millisecond, Prob: 1})).To(Succeed())

		p2c, failed := readsPerStore(c, 16, client.ReadPolicy{Replica: client.ReplicaMixed}, keys, 3*time.Second)
		Expect(failed).To(BeZero())
		rr, failed := readsPerStore(c, 16, client.ReadPolicy{Replica: client.ReplicaRoundRobin}, keys, 3*time.Second)
		Expect(failed).To(BeZero())
		share := func(m map[uint64]int64) float64 {
			var total int64
			for _, n := range m {
				total += n
			}
			if total == 0 {
				return 0
			}
			return float64(m[slow]) / float64(total)
		}
		GinkgoWriter.Printf("slow store %d: p2c %v (%.1f%%), round-robin %v (%.1f%%)\n", slow, p2c, 100*share(p2c), rr, 100*share(rr))
		// Round-robin is blind to load; the spec's point is the contrast.
		// (Under -race on a loaded machine the healthy stores are slow too,
		// which narrows it: 11.3% against round-robin's 34% in a CI run.)
		Expect(share(p2c)).To(BeNumerically("<", 0.15), "p2c reads per store %v", p2c)
		Expect(share(p2c)).To(BeNumerically("<", share(rr)/2), "p2c %v, round-robin %v", p2c, rr)
	})

	It("sends a read to a follower at once when the leader is busier than the read's threshold", func() {
		c := startCluster()
		cl := newClient(c)
		key, value := []byte("busy-key"), []byte("busy-value")
		Expect(cl.Put(ctxFor(10*time.Second), key, value)).To(Succeed())
		leader := leaderOf(c)
		s := cl.Session(client.ReadPolicy{Replica: client.ReplicaLeader, BusyThreshold: 20 * time.Millisecond})
		got, err := s.Get(ctxFor(10*time.Second), key)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(value))

		// The leader's read path takes 150ms: once one read has shown it,
		// the leader's estimated wait is far above the 20ms threshold.
		Expect(cl.Fault(ctxFor(10*time.Second), leader, client.Fault{Delay: 150 * time.Millisecond, Prob: 1})).To(Succeed())
		var fromFollowers, fast int
		const reads = 100
		began := time.Now()
		for i := range reads {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			got, info, err := s.GetWithInfo(ctx, key)
			took := time.Since(start)
			cancel()
			Expect(err).NotTo(HaveOccurred(), "read %d", i)
			Expect(got).To(Equal(value), "read %d", i)
			if info.StoreID != leader {
				fromFollowers++
				// Linearizable still: a follower's ReadIndex read.
				Expect(info.Mode).To(Equal(readmode.ReadIndex), "read %d", i)
			}
			if took < 100*time.Millisecond {
				fast++
			}
		}
		busy := c.Server(leader).ReadCounters().RefusedBusy
		GinkgoWriter.Printf("%d of %d reads from followers, %d fast, leader refused %d as busy\n", fromFollowers, reads, fast, busy)
		Expect(busy).To(BeNumerically(">", 0))
		// The leader's window forgets its slowness once no read ends there
		// for a second, so about one read a second probes it again: a tenth
		// of the reads, or more on a machine slow enough that the reads
		// take over ten seconds (88 of 100 from followers under -race at
		// load 17).
		probes := max(reads/10, int(time.Since(began)/time.Second)+2)
		Expect(fromFollowers).To(BeNumerically(">=", reads-probes))
		Expect(fast).To(BeNumerically(">=", reads-probes))
		n, err := metric(c, leader, "hedgekv_reads_refused_busy_total")
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(BeNumerically(">", 0))
	})
})
