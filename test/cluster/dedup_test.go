package cluster_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
)

// dedupPut writes k=v under request ID id at the leader of the region
// holding k, retrying (with the same ID, as a client does) until it is
// acknowledged.
func dedupPut(ctx context.Context, c *raftstoretest.Cluster, id uint64, k, v string) {
	GinkgoHelper()
	Eventually(func() error {
		r, ok := c.RegionOf([]byte(k))
		if !ok {
			return fmt.Errorf("no region holds %q", k)
		}
		l, ok := c.Leader(r.ID)
		if !ok {
			return fmt.Errorf("region %d has no leader", r.ID)
		}
		s, ok := c.Store(l)
		if !ok {
			return fmt.Errorf("store %d is not running", l)
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return s.Put(wctx, raftstore.WriteOptions{RequestID: id, RegionID: r.ID, Epoch: r.Epoch}, []byte(k), []byte(v))
	}).WithTimeout(20*time.Second).Should(Succeed(), "put %s=%s (request %#x)", k, v, id)
}

// dedupReplicaValues reads k on every store's replica of regionID with a
// follower read (a ReadIndex round: each replica answers with everything
// committed so far applied), so a divergent replica shows its own state.
func dedupReplicaValues(ctx context.Context, c *raftstoretest.Cluster, regionID uint64, k string) map[uint64]string {
	GinkgoHelper()
	out := map[uint64]string{}
	for _, id := range c.IDs() {
		Eventually(func() error {
			s, ok := c.Store(id)
			if !ok {
				return fmt.Errorf("store %d is not running", id)
			}
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			v, found, _, err := s.Get(rctx, raftstore.ReadOptions{ReplicaRead: true, RegionID: regionID}, []byte(k))
			if err != nil {
				return err
			}
			out[id] = "<absent>"
			if found {
				out[id] = string(v)
			}
			return nil
		}).WithTimeout(20*time.Second).Should(Succeed(), "follower read of %s on store %d", k, id)
	}
	return out
}

var _ = Describe("exactly-once writes", Label("check"), func() {
	It("skips a retried write on every replica of a split-off region, including one created later by snapshot", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(90 * time.Second)
		const x = uint64(0x5eed0000000001)

		// put(p,v1) with ID X applies in region 1; the client never learns.
		dedupPut(ctx, c, x, "p", "v1")
		// Region 1 splits at "m": p moves to the new region.
		Expect(c.Split(ctx, []byte("m"))).To(Succeed())
		right, ok := c.RegionOf([]byte("p"))
		Expect(ok).To(BeTrue())
		Expect(right.ID).NotTo(Equal(uint64(1)))
		everyRegionHasLeader(c)
		// Another client's put(p,v2) is acknowledged.
		Expect(c.Put(ctx, []byte("p"), []byte("v2"))).To(Succeed())

		// The new region gets a replica on a new store, by snapshot.
		s4, err := c.AddStore()
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() error {
			l, ok := c.Leader(right.ID)
			if !ok {
				return fmt.Errorf("region %d has no leader", right.ID)
			}
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return mustStore(c, l).AddPeer(actx, right.ID, s4)
		}).WithTimeout(30 * time.Second).Should(Succeed())
		r, _ := c.RegionOf([]byte("p"))
		_, on4 := r.PeerOnStore(s4)
		Expect(on4).To(BeTrue())

		// The client retries X at the new region's leader: a duplicate on
		// every replica, the snapshot-created one included.
		dedupPut(ctx, c, x, "p", "v1")
		Expect(dedupReplicaValues(ctx, c, right.ID, "p")).To(Equal(map[uint64]string{1: "v2", 2: "v2", 3: "v2", s4: "v2"}))

		// And whichever replica leads next serves the acknowledged write.
		Eventually(func() error {
			l, ok := c.Leader(right.ID)
			if !ok {
				return fmt.Errorf("region %d has no leader", right.ID)
			}
			if l == s4 {
				return nil
			}
			tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return mustStore(c, l).TransferLeader(tctx, right.ID, s4)
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Eventually(func() (string, error) {
			v, _, err := c.Get(ctx, []byte("p"))
			return string(v), err
		}).WithTimeout(10 * time.Second).Should(Equal("v2"))
	})

	It("decides a retry the same way on a replica that catches up in one apply round", func() {
		const window = 4
		c := startCluster(raftstoretest.Options{DedupWindow: window})
		ctx := ctxFor(60 * time.Second)
		const x = uint64(0x5eed0000000002)
		leader, ok := c.Leader(1)
		Expect(ok).To(BeTrue())
		lagger := otherThan(c, leader)[0]

		// The lagging follower hears nothing while the rest go on.
		heal := c.Net.AddFilter(raftstore.IsolateFilter(lagger))
		dedupPut(ctx, c, x, "p", "v1")
		Expect(c.Put(ctx, []byte("p"), []byte("v2"))).To(Succeed())
		for i := range window + 1 {
			Expect(c.Put(ctx, key(i), []byte("filler"))).To(Succeed())
		}
		// A retry of X more than a window after it: every replica must take
		// the same decision, whatever rounds it applied the log in.
		dedupPut(ctx, c, x, "p", "v1")
		heal()

		vals := dedupReplicaValues(ctx, c, 1, "p")
		Expect(vals).To(HaveLen(3))
		for id, v := range vals {
			Expect(v).To(Equal(vals[leader]), "store %d disagrees with the leader's store %d: %v", id, leader, vals)
		}
	})
})
