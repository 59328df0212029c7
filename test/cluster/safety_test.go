package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/clock"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/region"
)

// The read-path scenarios found in review: each once answered a stale
// value. Each spec builds its scenario step by step with filters and
// asserts that no read returns the overwritten value.

// linkFilter drops every message between stores a and b, both ways.
func linkFilter(a, b uint64) raftstore.Filter {
	return raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		return (m.FromStore == a && m.ToStore == b) || (m.FromStore == b && m.ToStore == a), 0
	})
}

// toStoreFilter drops messages of the given types sent to store id.
func toStoreFilter(id uint64, types ...raftpb.MessageType) raftstore.Filter {
	return raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		if m.ToStore != id {
			return false, 0
		}
		for _, t := range types {
			if m.Msg.Type == t {
				return true, 0
			}
		}
		return false, 0
	})
}

// waitCaughtUp waits until every running store has applied region 1 up to
// the leader's commit index.
func waitCaughtUp(c *raftstoretest.Cluster, regionID uint64) {
	GinkgoHelper()
	Eventually(func() bool {
		leader, ok := c.Leader(regionID)
		if !ok {
			return false
		}
		lst, _ := c.Status(leader, regionID)
		for _, id := range c.IDs() {
			st, ok := c.Status(id, regionID)
			if ok && (st.AppliedIndex < lst.CommitIndex || st.LeaderStoreID != leader) {
				return false
			}
		}
		return true
	}).WithTimeout(5 * time.Second).Should(BeTrue())
}

// putOn writes key=value through store id, retrying until it is accepted.
func putOn(c *raftstoretest.Cluster, id uint64, key, value string) {
	GinkgoHelper()
	opts := raftstore.WriteOptions{RequestID: rand.Uint64() | 1}
	Eventually(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		return mustStore(c, id).Put(ctx, opts, []byte(key), []byte(value))
	}).WithTimeout(5 * time.Second).WithPolling(5 * time.Millisecond).Should(Succeed())
}

// transferTo makes store id the leader of region 1.
func transferTo(c *raftstoretest.Cluster, id uint64) {
	GinkgoHelper()
	Eventually(func() uint64 {
		if leader, ok := c.Leader(1); ok && leader != id {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = mustStore(c, leader).TransferLeader(ctx, 1, id)
			cancel()
		}
		leader, _ := c.Leader(1)
		return leader
	}).WithTimeout(10 * time.Second).Should(Equal(id))
}

var _ = Describe("read safety", Label("check"), func() {
	DescribeTable("a follower read that waits across a split never answers from the split-off range",
		func(read func(s *raftstore.Store, oldEpoch region.Epoch) (string, error)) {
			c := startCluster(raftstoretest.Options{})
			ctx := ctxFor(20 * time.Second)
			Expect(c.Put(ctx, []byte("p"), []byte("v1"))).To(Succeed())
			waitCaughtUp(c, 1)
			leader, _ := c.Leader(1)
			f := otherThan(c, leader)[0]
			old, _ := c.RegionOf([]byte("p"))

			// F lags: it hears heartbeats (so it knows the leader and can
			// ask it for a read index) but no entries.
			lag := c.Net.AddFilter(toStoreFilter(f, raftpb.MsgApp, raftpb.MsgSnap))
			Expect(c.Split(ctx, []byte("m"))).To(Succeed())
			Expect(c.Put(ctx, []byte("p"), []byte("v2"))).To(Succeed())
			right, _ := c.RegionOf([]byte("p"))
			Expect(right.ID).NotTo(Equal(uint64(1)))

			// A client whose cache predates the split reads p on F. The read
			// index covers the split; F applies it while the read waits.
			fs := mustStore(c, f)
			before := fs.Stats().ReadIndexBatches
			type answer struct {
				v   string
				err error
			}
			done := make(chan answer, 1)
			go func() {
				v, err := read(fs, old.Epoch)
				done <- answer{v, err}
			}()
			Eventually(func() uint64 { return fs.Stats().ReadIndexBatches }).WithTimeout(5 * time.Second).Should(BeNumerically(">", before))
			lag()
			var a answer
			Eventually(done).WithTimeout(5 * time.Second).Should(Receive(&a))
			Expect(a.v).NotTo(Equal("v1"), "store %d answered the value overwritten in the split-off region", f)
			Expect(a.err).To(HaveOccurred())
			Expect(region.IsRegionError(a.err)).To(BeTrue(), "want a region error the client retries, got %v", a.err)
		},
		Entry("get with the old epoch", func(s *raftstore.Store, old region.Epoch) (string, error) {
			v, _, _, err := s.Get(context.Background(), raftstore.ReadOptions{RegionID: 1, Epoch: old, ReplicaRead: true}, []byte("p"))
			return string(v), err
		}),
		Entry("get routed by key alone", func(s *raftstore.Store, _ region.Epoch) (string, error) {
			v, _, _, err := s.Get(context.Background(), raftstore.ReadOptions{ReplicaRead: true}, []byte("p"))
			return string(v), err
		}),
		Entry("batch get with the old epoch", func(s *raftstore.Store, old region.Epoch) (string, error) {
			kvs, _, err := s.BatchGet(context.Background(), raftstore.ReadOptions{RegionID: 1, Epoch: old, ReplicaRead: true}, [][]byte{[]byte("a"), []byte("p")})
			for _, kv := range kvs {
				if string(kv.Key) == "p" {
					return string(kv.Value), err
				}
			}
			return "", err
		}),
		Entry("scan with the old epoch", func(s *raftstore.Store, old region.Epoch) (string, error) {
			kvs, _, _, err := s.Scan(context.Background(), raftstore.ReadOptions{RegionID: 1, Epoch: old, ReplicaRead: true}, []byte("n"), nil, 10)
			for _, kv := range kvs {
				if string(kv.Key) == "p" {
					return string(kv.Value), err
				}
			}
			return "", err
		}),
	)

	It("never serves from a lease while an abandoned leadership transfer is still live in raft", noLeaseWhileTransferLive)

	It("never serves from a lease a restarted follower no longer remembers", noLeaseForgottenByRestart)

	It("refuses safe points from a leader whose clock is further ahead than the max clock offset", refuseSafePointsFromTheFuture)
})

// noLeaseWhileTransferLive: nothing is served from a lease while an abandoned
// leadership transfer is still live in raft.
func noLeaseWhileTransferLive() {
	// Long ticks: the lease (about 400ms) must outlast the steps below.
	c := startCluster(raftstoretest.Options{TickInterval: 50 * time.Millisecond})
	ctx := ctxFor(20 * time.Second)
	Expect(c.Put(ctx, []byte("x"), []byte("v0"))).To(Succeed())
	waitCaughtUp(c, 1)
	l, _ := c.Leader(1)
	rest := otherThan(c, l)
	target := rest[0]
	ls := mustStore(c, l)

	// The target lags, so raft holds the transfer until it catches up.
	lag := c.Net.AddFilter(toStoreFilter(target, raftpb.MsgApp))
	putOn(c, l, "x", "v1")
	tctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err := ls.TransferLeader(tctx, 1, target)
	cancel()
	Expect(err).To(MatchError(context.DeadlineExceeded))

	// A ReadIndex round (acked by both followers) while raft still
	// holds the transferee.
	v, _, _, err := readOn(c, l, raftstore.ReadOptions{}, "x", time.Second)
	Expect(err).NotTo(HaveOccurred())
	Expect(v).To(Equal("v1"))

	// Let the target catch up; the old leader is cut off the moment it
	// sends MsgTimeoutNow.
	var cut atomic.Bool
	c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		if cut.Load() {
			return m.FromStore == l || m.ToStore == l, 0
		}
		if m.FromStore == l && m.Msg.Type == raftpb.MsgTimeoutNow {
			cut.Store(true)
		}
		return false, 0
	}))
	lag()
	Eventually(cut.Load).WithTimeout(3 * time.Second).Should(BeTrue())
	Eventually(func() bool { st, _ := c.Status(target, 1); return st.IsLeader }).WithTimeout(3 * time.Second).Should(BeTrue())
	putOn(c, target, "x", "v2")

	st, _ := c.Status(l, 1)
	if st.IsLeader {
		v, _, _, err = readOn(c, l, raftstore.ReadOptions{}, "x", 100*time.Millisecond)
		Expect(v).NotTo(Equal("v1"), "the old leader served the overwritten value (err %v)", err)
	}
}

// noLeaseForgottenByRestart: nothing is served from a lease that a
// restarted follower no longer remembers.
func noLeaseForgottenByRestart() {
	// Store 3 campaigns every 150-300ms; stores 1 and 2 have a 500ms
	// election timeout, so the lease store 1 holds is about 400ms.
	c := startCluster(raftstoretest.Options{
		TickInterval:       50 * time.Millisecond,
		StoreElectionTicks: map[uint64]int{3: 3},
	})
	ctx := ctxFor(30 * time.Second)
	Expect(c.Put(ctx, []byte("x"), []byte("v1"))).To(Succeed())
	transferTo(c, 1)
	waitCaughtUp(c, 1)

	// Store 3 cannot hear store 1 and keeps asking store 2 for votes;
	// store 2 refuses while it hears from its leader.
	c.Net.AddFilter(linkFilter(1, 3))
	time.Sleep(400 * time.Millisecond)
	l, _ := c.Leader(1)
	Expect(l).To(Equal(uint64(1)), "store 2 gave store 3 its vote while it heard from store 1")

	// Reads on store 1 until its lease was just renewed (a ReadIndex
	// round acked by store 2, no new entry: store 3's log stays as
	// long as the others'); then store 2 restarts and never hears from
	// store 1 again.
	Eventually(func() time.Duration {
		_, _, _, _ = readOn(c, 1, raftstore.ReadOptions{}, "x", 100*time.Millisecond)
		st, _ := c.Status(1, 1)
		return time.Until(st.LeaseExpiry)
	}).WithTimeout(5 * time.Second).WithPolling(2 * time.Millisecond).Should(BeNumerically(">", 300*time.Millisecond))
	c.Net.AddFilter(linkFilter(1, 2))
	Expect(c.StopStore(2)).To(Succeed())
	Expect(c.StartStore(2)).To(Succeed())

	var newLeader uint64
	Eventually(func() bool {
		for _, id := range []uint64{2, 3} {
			if st, _ := c.Status(id, 1); st.IsLeader {
				newLeader = id
				return true
			}
		}
		return false
	}).WithTimeout(5 * time.Second).Should(BeTrue())
	putOn(c, newLeader, "x", "v2")
	v, _, _, err := readOn(c, 1, raftstore.ReadOptions{}, "x", 100*time.Millisecond)
	Expect(v).NotTo(Equal("v1"), "store 1 served the overwritten value from its lease (err %v)", err)
}

// refuseSafePointsFromTheFuture: safe points from a leader whose clock is
// ahead by more than the max clock offset are refused.
func refuseSafePointsFromTheFuture() {
	// Store 2's clock runs 200ms behind the others: a safe point from
	// store 1 looks 200ms in its future, which the 50ms max clock
	// offset says cannot happen. Store 3's is 20ms behind: within it.
	c := startCluster(raftstoretest.Options{Clock: func(id uint64) clock.Clock {
		switch id {
		case 2:
			return raftstoretest.SkewedClock(-200*time.Millisecond, 1)
		case 3:
			return raftstoretest.SkewedClock(-20*time.Millisecond, 1)
		}
		return clock.Real{}
	}})
	ctx := ctxFor(20 * time.Second)
	Expect(c.Put(ctx, []byte("x"), []byte("v"))).To(Succeed())
	transferTo(c, 1)
	waitCaughtUp(c, 1)
	stale := raftstore.ReadOptions{ReplicaRead: true, MaxStaleness: 2 * time.Second}
	Eventually(func() error {
		_, _, info, err := readOn(c, 3, stale, "x", 100*time.Millisecond)
		if err == nil && info.Mode != readmode.Stale {
			return fmt.Errorf("served as %v", info.Mode)
		}
		return err
	}).WithTimeout(5 * time.Second).Should(Succeed())
	Consistently(func() error {
		_, _, info, err := readOn(c, 2, stale, "x", 100*time.Millisecond)
		if err == nil && info.Mode == readmode.Stale {
			return fmt.Errorf("store 2 served a stale read from a safe point it should have refused")
		}
		return nil
	}).WithTimeout(500 * time.Millisecond).Should(Succeed())
	Expect(mustStore(c, 2).Stats().SafePointsRefused).To(BeNumerically(">", 0))
	Expect(mustStore(c, 3).Stats().SafePointsRefused).To(BeZero())
}
