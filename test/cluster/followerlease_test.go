package cluster_test

import (
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
)

// leaseOpts is a cluster with follower leases on.
func leaseOpts() raftstoretest.Options {
	return raftstoretest.Options{FollowerLeases: true}
}

// waitFollowerLease waits until a follower read on id is served from its
// lease.
func waitFollowerLease(c *raftstoretest.Cluster, id uint64, key string) {
	GinkgoHelper()
	Eventually(func() raftstore.ReadMode {
		_, _, info, err := readOn(c, id, raftstore.ReadOptions{ReplicaRead: true}, key, time.Second)
		if err != nil {
			return 0
		}
		return info.Mode
	}).WithTimeout(5*time.Second).WithPolling(10*time.Millisecond).Should(Equal(raftstore.ReadModeFollowerLease), "store %d never read from a follower lease", id)
}

var _ = Describe("follower lease read", func() {
	It("returns the latest committed write with no round trip to the leader", func() {
		c := startCluster(leaseOpts())
		ctx := ctxFor(20 * time.Second)
		Expect(c.Put(ctx, []byte("x"), []byte("init"))).To(Succeed())
		leader, _ := c.Leader(1)
		followers := otherThan(c, leader)
		for _, id := range followers {
			waitFollowerLease(c, id, "x")
		}
		// No ReadIndex may reach the leader from here on: the reads below
		// must be answered from the leases alone.
		c.Net.AddFilter(raftstore.MsgTypeFilter(raftstore.DropFilter(1), raftpb.MsgReadIndex))
		for i := range 30 {
			Expect(c.Put(ctx, []byte("x"), []byte(strconv.Itoa(i)))).To(Succeed())
			// Right after the ack, every follower must see the write.
			for _, id := range followers {
				v, _, info, err := readOn(c, id, raftstore.ReadOptions{ReplicaRead: true}, "x", 2*time.Second)
				Expect(err).NotTo(HaveOccurred())
				Expect(v).To(Equal(strconv.Itoa(i)), "store %d", id)
				Expect(info.Mode).To(Equal(raftstore.ReadModeFollowerLease), "store %d", id)
			}
		}
	})
})
