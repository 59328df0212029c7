package cluster_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/readmode"
)

var _ = Describe("replicated core", Label("check"), func() {
	It("elects a leader", func() {
		c := startCluster(raftstoretest.Options{})
		leader, ok := c.Leader(1)
		Expect(ok).To(BeTrue())
		for _, id := range otherThan(c, leader) {
			Eventually(func() uint64 { st, _ := c.Status(id, 1); return st.LeaderStoreID }).
				WithTimeout(5 * time.Second).Should(Equal(leader))
		}
	})

	It("replicates writes to every store", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(10 * time.Second)
		for i := range 100 {
			Expect(c.Put(ctx, fmt.Appendf(nil, "key%03d", i), fmt.Appendf(nil, "v%d", i))).To(Succeed())
		}
		Expect(c.Delete(ctx, []byte("key050"))).To(Succeed())
		leader, _ := c.Leader(1)
		want, _ := c.Status(leader, 1)
		for _, id := range c.IDs() {
			Eventually(func() uint64 { st, _ := c.Status(id, 1); return st.AppliedIndex }).
				WithTimeout(5*time.Second).Should(BeNumerically(">=", want.AppliedIndex), "store %d", id)
			// Each store answers from its own copy (follower read).
			s := mustStore(c, id)
			v, found, info, err := s.Get(ctx, raftstore.ReadOptions{ReplicaRead: true}, []byte("key042"))
			Expect(err).NotTo(HaveOccurred())
			Expect(found).To(BeTrue())
			Expect(string(v)).To(Equal("v42"))
			Expect(info.StoreID).To(Equal(id))
			_, found, _, err = s.Get(ctx, raftstore.ReadOptions{ReplicaRead: true}, []byte("key050"))
			Expect(err).NotTo(HaveOccurred())
			Expect(found).To(BeFalse())
		}
	})

	It("answers NotLeader with the leader's hint on a follower", func() {
		c := startCluster(raftstoretest.Options{})
		leader, _ := c.Leader(1)
		follower := otherThan(c, leader)[0]
		Eventually(func() uint64 { st, _ := c.Status(follower, 1); return st.LeaderStoreID }).WithTimeout(5 * time.Second).Should(Equal(leader))
		err := mustStore(c, follower).Put(ctxFor(time.Second), raftstore.WriteOptions{}, []byte("k"), []byte("v"))
		Expect(err).To(MatchError(ContainSubstring(fmt.Sprintf("store %d", leader))))
		_, _, _, err = mustStore(c, follower).Get(ctxFor(time.Second), raftstore.ReadOptions{}, []byte("k"))
		Expect(raftstoretest.Retryable(err)).To(BeTrue(), "got %v", err)
	})

	It("stops serving reads on an isolated leader before a new leader can commit", isolatedLeaderStopsReading)

	It("drops the lease before a leadership transfer", leaseDroppedBeforeTransfer)

	It("catches a far-behind follower up by snapshot", snapshotCatchesUp)

	It("keeps every acknowledged write across a restart of all stores", func() {
		c := startCluster(raftstoretest.Options{LogGCThreshold: 50})
		ctx := ctxFor(30 * time.Second)
		for i := range 120 {
			Expect(c.Put(ctx, fmt.Appendf(nil, "k%03d", i), fmt.Appendf(nil, "v%d", i))).To(Succeed())
		}
		for _, id := range c.IDs() {
			Expect(c.StopStore(id)).To(Succeed())
		}
		for _, id := range c.IDs() {
			Expect(c.StartStore(id)).To(Succeed())
		}
		_, err := c.WaitLeader(1, 10*time.Second)
		Expect(err).NotTo(HaveOccurred())
		for i := range 120 {
			v, found, err := c.Get(ctx, fmt.Appendf(nil, "k%03d", i))
			Expect(err).NotTo(HaveOccurred())
			Expect(found).To(BeTrue(), "k%03d lost", i)
			Expect(string(v)).To(Equal(fmt.Sprintf("v%d", i)))
		}
	})

	It("keeps working with one store down", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(20 * time.Second)
		leader, _ := c.Leader(1)
		Expect(c.StopStore(leader)).To(Succeed())
		Expect(c.Put(ctx, []byte("after"), []byte("crash"))).To(Succeed())
		v, _, err := c.Get(ctx, []byte("after"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(v)).To(Equal("crash"))
		Expect(c.StartStore(leader)).To(Succeed())
		Eventually(func() uint64 { st, _ := c.Status(leader, 1); return st.LeaderStoreID }).WithTimeout(5 * time.Second).ShouldNot(BeZero())
	})
})

// isolatedLeaderStopsReading: a leader cut off from the others serves no read
// that ends after a new leader has committed a new write.
func isolatedLeaderStopsReading() {
	c := startCluster(raftstoretest.Options{})
	ctx := ctxFor(20 * time.Second)
	Expect(c.Put(ctx, []byte("x"), []byte("old"))).To(Succeed())
	old, _ := c.Leader(1)
	oldStore := mustStore(c, old)
	// Warm the lease so the old leader is serving lease reads when cut off.
	Eventually(func() readmode.Mode {
		_, _, info, _ := oldStore.Get(ctx, raftstore.ReadOptions{}, []byte("x"))
		return info.Mode
	}).WithTimeout(5 * time.Second).Should(Equal(readmode.Lease))

	rs := startReads(1, func() (string, error) {
		rctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		v, _, _, err := oldStore.Get(rctx, raftstore.ReadOptions{}, []byte("x"))
		return string(v), err
	})

	c.Net.AddFilter(raftstore.IsolateFilter(old))
	var newLeader uint64
	Eventually(func() bool {
		for _, id := range otherThan(c, old) {
			if st, ok := c.Status(id, 1); ok && st.IsLeader {
				newLeader = id
				return true
			}
		}
		return false
	}).WithTimeout(10 * time.Second).WithPolling(5 * time.Millisecond).Should(BeTrue())
	Eventually(func() error {
		return mustStore(c, newLeader).Put(ctxFor(time.Second), raftstore.WriteOptions{}, []byte("x"), []byte("new"))
	}).WithTimeout(10 * time.Second).Should(Succeed())
	acked := time.Now()
	// The reader tries the old leader some more after the write.
	tried := rs.attempts.Load()
	Eventually(rs.attempts.Load).WithTimeout(5 * time.Second).Should(BeNumerically(">=", tried+3))
	reads := rs.halt()
	Expect(reads).NotTo(BeEmpty(), "the old leader served nothing even before the partition")
	last := reads[len(reads)-1]
	Expect(last.end.Before(acked)).To(BeTrue(), "old leader served a read ending %v after the new write was acknowledged", last.end.Sub(acked))
	for _, r := range reads {
		Expect(r.val).To(Equal("old"))
	}
}

// leaseDroppedBeforeTransfer: a leader serves nothing from its lease while a
// transfer of its leadership is under way.
func leaseDroppedBeforeTransfer() {
	c := startCluster(raftstoretest.Options{})
	ctx := ctxFor(20 * time.Second)
	Expect(c.Put(ctx, []byte("x"), []byte("1"))).To(Succeed())
	old, _ := c.Leader(1)
	oldStore := mustStore(c, old)
	target := otherThan(c, old)[0]
	Eventually(func() readmode.Mode {
		_, _, info, _ := oldStore.Get(ctx, raftstore.ReadOptions{}, []byte("x"))
		return info.Mode
	}).WithTimeout(5 * time.Second).Should(Equal(readmode.Lease))

	// Hold the transfer half-way: the transferee never gets MsgTimeoutNow.
	heal := c.Net.AddFilter(raftstore.MsgTypeFilter(raftstore.DropFilter(1), raftpb.MsgTimeoutNow))
	transferDone := make(chan error, 1)
	go func() { transferDone <- oldStore.TransferLeader(ctxFor(10*time.Second), 1, target) }()
	Eventually(func() bool { st, _ := c.Status(old, 1); return st.Transferring }).WithTimeout(2 * time.Second).WithPolling(time.Millisecond).Should(BeTrue())

	// While the transfer is under way nothing may be served from the lease.
	for range 20 {
		_, _, info, err := oldStore.Get(ctxFor(time.Second), raftstore.ReadOptions{}, []byte("x"))
		if err == nil {
			Expect(info.Mode).NotTo(Equal(readmode.Lease))
		}
		time.Sleep(2 * time.Millisecond)
	}
	heal()
	Eventually(transferDone).WithTimeout(10 * time.Second).Should(Receive(BeNil()))
	Eventually(func() uint64 { id, _ := c.Leader(1); return id }).WithTimeout(5 * time.Second).Should(Equal(target))
	v, found, err := c.Get(ctx, []byte("x"))
	Expect(err).NotTo(HaveOccurred())
	Expect(found).To(BeTrue())
	Expect(string(v)).To(Equal("1"))
}

// snapshotCatchesUp: a follower that missed more than the log keeps catches
// up by snapshot.
func snapshotCatchesUp() {
	c := startCluster(raftstoretest.Options{LogGCThreshold: 20})
	ctx := ctxFor(30 * time.Second)
	leader, _ := c.Leader(1)
	lagging := otherThan(c, leader)[0]
	Expect(c.StopStore(lagging)).To(Succeed())
	for i := range 200 {
		Expect(c.Put(ctx, fmt.Appendf(nil, "k%03d", i), fmt.Appendf(nil, "v%d", i))).To(Succeed())
	}
	Expect(c.StartStore(lagging)).To(Succeed())
	want, _ := c.Status(leader, 1)
	Eventually(func() uint64 { st, _ := c.Status(lagging, 1); return st.AppliedIndex }).
		WithTimeout(10 * time.Second).Should(BeNumerically(">=", want.AppliedIndex))
	s := mustStore(c, lagging)
	Expect(s.Stats().SnapshotsApplied).To(BeNumerically(">=", 1))
	for _, i := range []int{0, 99, 199} {
		v, found, _, err := s.Get(ctx, raftstore.ReadOptions{ReplicaRead: true}, fmt.Appendf(nil, "k%03d", i))
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue())
		Expect(string(v)).To(Equal(fmt.Sprintf("v%d", i)))
	}
}
