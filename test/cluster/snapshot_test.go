package cluster_test

import (
	"context"
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

// loadRegion writes n values of size bytes each under prefix, through
// region 1's leader, from many writers at once so that each Ready round
// carries a large batch.
func loadRegion(ctx context.Context, c *raftstoretest.Cluster, prefix string, n, size int) {
	GinkgoHelper()
	const writers = 64
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			val := make([]byte, size)
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				for j := range val {
					val[j] = byte('a' + (i+j)%26)
				}
				if err := c.Put(ctx, fmt.Appendf(nil, "%s%06d", prefix, i), val); err != nil {
					errs <- fmt.Errorf("put %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		Expect(err).NotTo(HaveOccurred())
	}
}

// regionOn returns region 1 as store id sees it.
func regionOn(c *raftstoretest.Cluster, id uint64) (region.Region, bool) {
	st, ok := c.Status(id, 1)
	return st.Region, ok
}

var _ = Describe("snapshots of large regions", func() {
	// Issue 18, item 3: `cluster.sh add 4` then `remove 1` with ~200 MB per
	// store left a new replica an uninitialized learner for minutes: its
	// region's leadership moved while the snapshot was on its way, and the
	// new leader never sent one.
	It("completes a replica add whose snapshot is in flight when leadership moves, then a removal", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(3 * time.Minute)

		start := time.Now()
		const n, size = 12800, 4 << 10 // 50 MiB
		loadRegion(ctx, c, "big/", n, size)
		GinkgoWriter.Printf("loaded %d MiB in %v\n", n*size>>20, time.Since(start).Round(time.Millisecond))
		waitCaughtUp(c, 1)

		s4, err := c.AddStore()
		Expect(err).NotTo(HaveOccurred())
		oldLeader, ok := c.Leader(1)
		Expect(ok).To(BeTrue())

		// Every snapshot to the new store is slowed down; the first one
		// tells the spec it left, so leadership moves while it travels.
		sent := make(chan struct{})
		var snaps atomic.Int32
		c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
			if m.ToStore != s4 || m.Msg.Type != raftpb.MsgSnap {
				return false, 0
			}
			if snaps.Add(1) == 1 {
				close(sent)
			}
			return false, 1500 * time.Millisecond
		}))

		addStart := time.Now()
		addErr := make(chan error, 1)
		go func() {
			defer GinkgoRecover()
			actx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			addErr <- mustStore(c, oldLeader).AddPeer(actx, 1, s4)
		}()
		Eventually(sent).WithTimeout(20 * time.Second).Should(BeClosed())
		newLeader := otherThan(c, oldLeader, s4)[0]
		transferTo(c, newLeader)
		GinkgoWriter.Printf("leadership moved from store %d to %d with the snapshot in flight\n", oldLeader, newLeader)
		// The old leader's add ends (NotLeader, once it has stepped down);
		// it is finished where leadership went, as the balancer does.
		Eventually(addErr).WithTimeout(30 * time.Second).Should(Receive())

		Eventually(func() error {
			l, ok := c.Leader(1)
			if !ok {
				return fmt.Errorf("region 1 has no leader")
			}
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return mustStore(c, l).AddPeer(actx, 1, s4)
		}).WithTimeout(30*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(),
			"the learner on store %d never caught up (snapshots sent to it: %d)", s4, snaps.Load())
		GinkgoWriter.Printf("add done in %v after %d snapshot(s)\n", time.Since(addStart).Round(time.Millisecond), snaps.Load())

		r, _ := c.RegionOf([]byte("big/"))
		p4, on4 := r.PeerOnStore(s4)
		Expect(on4).To(BeTrue())
		Expect(p4.IsLearner).To(BeFalse(), "the replica on store %d was promoted", s4)
		r4, ok := regionOn(c, s4)
		Expect(ok).To(BeTrue(), "store %d's replica is initialized", s4)
		Expect(r4.ID).To(BeEquivalentTo(1))
		d, err := mustStore(c, s4).RegionDigest(1)
		Expect(err).NotTo(HaveOccurred())
		Expect(d.Keys).To(BeNumerically(">=", n))

		// Then the store that led at first gives up its replica: a removal
		// finishes too, and every remaining replica agrees (checkReplicas).
		Eventually(func() error {
			l, ok := c.Leader(1)
			if !ok {
				return fmt.Errorf("region 1 has no leader")
			}
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return mustStore(c, l).RemovePeer(actx, 1, oldLeader)
		}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		Eventually(func() bool {
			r, _ := c.RegionOf([]byte("big/"))
			_, still := r.PeerOnStore(oldLeader)
			return still
		}).WithTimeout(10 * time.Second).Should(BeFalse())
		Expect(c.Put(ctx, []byte("big/after"), []byte("v"))).To(Succeed())
		Expect(c.StopStore(oldLeader)).To(Succeed())
	})
})
