package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/region"
)

// readOn reads key from store id with opts under a short deadline.
func readOn(c *raftstoretest.Cluster, id uint64, opts raftstore.ReadOptions, key string, d time.Duration) (string, bool, raftstore.ReadInfo, error) {
	s, ok := c.Store(id)
	if !ok {
		return "", false, raftstore.ReadInfo{}, fmt.Errorf("store %d down", id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	v, found, info, err := s.Get(ctx, opts, []byte(key))
	return string(v), found, info, err
}

var electionMsgs = []raftpb.MessageType{raftpb.MsgVote, raftpb.MsgPreVote, raftpb.MsgVoteResp, raftpb.MsgPreVoteResp, raftpb.MsgTimeoutNow}

var _ = Describe("follower read", Label("check"), func() {
	It("returns the latest committed write", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(10 * time.Second)
		leader, _ := c.Leader(1)
		for _, id := range otherThan(c, leader) {
			Eventually(func() uint64 { st, _ := c.Status(id, 1); return st.LeaderStoreID }).WithTimeout(5 * time.Second).Should(Equal(leader))
		}
		for i := range 20 {
			Expect(c.Put(ctx, []byte("x"), []byte(strconv.Itoa(i)))).To(Succeed())
			leader, _ := c.Leader(1)
			// Right after the ack, every follower must see the write.
			for _, id := range otherThan(c, leader) {
				v, _, info, err := readOn(c, id, raftstore.ReadOptions{ReplicaRead: true}, "x", 2*time.Second)
				Expect(err).NotTo(HaveOccurred())
				Expect(v).To(Equal(strconv.Itoa(i)))
				Expect(info.Mode).To(Equal(readmode.ReadIndex))
				Expect(info.StoreID).To(Equal(id))
			}
		}
	})

	It("shares one ReadIndex among concurrent follower reads", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(10 * time.Second)
		Expect(c.Put(ctx, []byte("x"), []byte("v"))).To(Succeed())
		leader, _ := c.Leader(1)
		follower := otherThan(c, leader)[0]
		s := mustStore(c, follower)
		// A slow round trip, so that reads arrive while one is in flight
		// (the in-memory network otherwise answers before the next read).
		c.Net.AddFilter(raftstore.MsgTypeFilter(raftstore.DelayFilter(5*time.Millisecond, 0), raftpb.MsgReadIndex, raftpb.MsgReadIndexResp))
		before := s.Stats()
		var wg sync.WaitGroup
		const readers, each = 16, 20
		for range readers {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for range each {
					_, _, _, err := readOn(c, follower, raftstore.ReadOptions{ReplicaRead: true}, "x", 2*time.Second)
					Expect(err).NotTo(HaveOccurred())
				}
			}()
		}
		wg.Wait()
		after := s.Stats()
		reads := after.ReadsReadIndex - before.ReadsReadIndex
		batches := after.ReadIndexBatches - before.ReadIndexBatches
		Expect(reads).To(BeNumerically("==", readers*each))
		Expect(batches).To(BeNumerically("<", reads/2), "reads did not share ReadIndex rounds")
	})

	It("never returns the old value on either side once a new leader has committed a new write", noOldValueAfterNewLeaderWrite)

	It("fails fast with a retryable error when the follower knows no leader (etcd#9566)", func() {
		c := startCluster(raftstoretest.Options{})
		leader, _ := c.Leader(1)
		follower := otherThan(c, leader)[0]
		c.Net.AddFilter(raftstore.IsolateFilter(follower))
		Eventually(func() uint64 { st, _ := c.Status(follower, 1); return st.LeaderPeerID }).WithTimeout(5 * time.Second).Should(BeZero())
		_, _, _, err := readOn(c, follower, raftstore.ReadOptions{ReplicaRead: true}, "x", 5*time.Second)
		var nl *region.NotLeaderError
		Expect(errors.As(err, &nl)).To(BeTrue(), "want NotLeader at once, got %v", err)
	})

	It("does not answer a ReadIndex on a new leader before it commits an entry of its term (etcd#7331)", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(20 * time.Second)
		Expect(c.Put(ctx, []byte("x"), []byte("1"))).To(Succeed())
		old, _ := c.Leader(1)
		target := otherThan(c, old)[0]
		// The transferee must be caught up, or raft never hands over.
		want, _ := c.Status(old, 1)
		Eventually(func() uint64 { st, _ := c.Status(target, 1); return st.AppliedIndex }).
			WithTimeout(5 * time.Second).Should(BeNumerically(">=", want.AppliedIndex))
		// The new leader will be elected but unable to replicate its first entry.
		heal := c.Net.AddFilter(raftstore.MsgTypeFilter(raftstore.DropFilter(1), raftpb.MsgApp, raftpb.MsgAppResp))
		Expect(mustStore(c, old).TransferLeader(ctxFor(5*time.Second), 1, target)).To(Succeed())
		Eventually(func() bool { st, _ := c.Status(target, 1); return st.IsLeader }).WithTimeout(5 * time.Second).Should(BeTrue())
		_, _, _, err := readOn(c, target, raftstore.ReadOptions{}, "x", 300*time.Millisecond)
		Expect(err).To(HaveOccurred(), "new leader served a read before committing in its term")
		_, _, _, err = readOn(c, otherThan(c, old, target)[0], raftstore.ReadOptions{ReplicaRead: true}, "x", 300*time.Millisecond)
		Expect(err).To(HaveOccurred(), "a follower got a read index from a leader that had not committed in its term")
		heal()
		Eventually(func() error { _, _, _, err := readOn(c, target, raftstore.ReadOptions{}, "x", time.Second); return err }).
			WithTimeout(5 * time.Second).Should(Succeed())
	})

	It("never batches a read into a ReadIndex issued before a leadership transfer (tikv#4680)", noReadIndexAcrossTransfer)
})

// noOldValueAfterNewLeaderWrite: once a new leader has committed a new
// write, a follower read on either side of the partition never returns the
// old value.
func noOldValueAfterNewLeaderWrite() {
	c := startCluster(raftstoretest.Options{Stores: 5})
	ctx := ctxFor(20 * time.Second)
	Expect(c.Put(ctx, []byte("x"), []byte("old"))).To(Succeed())
	old, _ := c.Leader(1)
	rest := otherThan(c, old)
	oldSide := []uint64{old, rest[0]}
	newSide := rest[1:]
	for _, id := range c.IDs() {
		Eventually(func() uint64 { st, _ := c.Status(id, 1); return st.LeaderStoreID }).WithTimeout(5 * time.Second).Should(Equal(old))
	}
	c.Net.AddFilter(raftstore.PartitionFilter(oldSide...))
	var newLeader uint64
	Eventually(func() bool {
		for _, id := range newSide {
			if st, ok := c.Status(id, 1); ok && st.IsLeader {
				newLeader = id
				return true
			}
		}
		return false
	}).WithTimeout(10 * time.Second).Should(BeTrue())
	Eventually(func() error {
		return mustStore(c, newLeader).Put(ctxFor(time.Second), raftstore.WriteOptions{}, []byte("x"), []byte("new"))
	}).WithTimeout(10 * time.Second).Should(Succeed())
	// Now through every store, on both sides, for a while.
	deadline := time.Now().Add(time.Second)
	served := map[uint64]int{}
	for time.Now().Before(deadline) {
		for _, id := range c.IDs() {
			v, _, _, err := readOn(c, id, raftstore.ReadOptions{ReplicaRead: true}, "x", 50*time.Millisecond)
			if err == nil {
				Expect(v).To(Equal("new"), "store %d returned the old value after the new write was acknowledged", id)
				served[id]++
			}
		}
	}
	for _, id := range newSide {
		Expect(served[id]).To(BeNumerically(">", 0), "store %d on the majority side served nothing", id)
	}
}

// timedRead is a read served in the background: when it started and
// ended, and what it returned.
type timedRead struct {
	start, end time.Time
	val        string
}

// backgroundReads are readers calling read again and again until halted,
// keeping the reads served.
type backgroundReads struct {
	mu       sync.Mutex
	reads    []timedRead
	attempts atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
	// halt stops the readers, waits for them and returns the reads
	// served; the spec's end halts them too.
	halt func() []timedRead
}

func startReads(readers int, read func() (string, error)) *backgroundReads {
	b := &backgroundReads{stop: make(chan struct{})}
	b.halt = sync.OnceValue(func() []timedRead {
		close(b.stop)
		b.wg.Wait()
		return b.reads
	})
	for range readers {
		b.wg.Go(b.readUntilHalted(read))
	}
	DeferCleanup(func() { b.halt() })
	return b
}

func (b *backgroundReads) readUntilHalted(read func() (string, error)) func() {
	return func() {
		for {
			select {
			case <-b.stop:
				return
			default:
			}
			b.attempts.Add(1)
			start := time.Now()
			v, err := read()
			if err != nil {
				time.Sleep(time.Millisecond)
				continue
			}
			b.mu.Lock()
			b.reads = append(b.reads, timedRead{start, time.Now(), v})
			b.mu.Unlock()
		}
	}
}

// servedSince counts the reads served that started after t.
func (b *backgroundReads) servedSince(t time.Time) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, r := range b.reads {
		if r.start.After(t) {
			n++
		}
	}
	return n
}

// noReadIndexAcrossTransfer: a read that starts after a write acknowledged
// by the new leader is never batched into a ReadIndex the old leader issued
// before the transfer (tikv#4680).
func noReadIndexAcrossTransfer() {
	c := startCluster(raftstoretest.Options{})
	ctx := ctxFor(20 * time.Second)
	Expect(c.Put(ctx, []byte("x"), []byte("before"))).To(Succeed())
	old, _ := c.Leader(1)
	target := otherThan(c, old)[0]
	oldStore := mustStore(c, old)
	// Slow heartbeats so ReadIndex batches stay in flight across the transfer.
	c.Net.AddFilter(raftstore.MsgTypeFilter(raftstore.DelayFilter(20*time.Millisecond, 0), raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp))
	rs := startReads(4, func() (string, error) {
		v, _, _, err := readOn(c, old, raftstore.ReadOptions{ReplicaRead: true}, "x", time.Second)
		return v, err
	})
	// The readers are running (their batches in flight) before the transfer.
	Eventually(rs.servedSince).WithArguments(time.Time{}).WithTimeout(5 * time.Second).Should(BeNumerically(">=", 8))
	Expect(oldStore.TransferLeader(ctxFor(5*time.Second), 1, target)).To(Succeed())
	Eventually(func() error {
		return mustStore(c, target).Put(ctxFor(time.Second), raftstore.WriteOptions{}, []byte("x"), []byte("after"))
	}).WithTimeout(5 * time.Second).Should(Succeed())
	acked := time.Now()
	Eventually(rs.servedSince).WithArguments(acked).WithTimeout(5 * time.Second).Should(BeNumerically(">=", 8))
	late := 0
	for _, r := range rs.halt() {
		if r.start.After(acked) {
			late++
			Expect(r.val).To(Equal("after"), "a read that started after the write was acknowledged saw the old value")
		}
	}
	Expect(late).To(BeNumerically(">", 0))
}

var _ = Describe("bounded-staleness read", Label("check"), func() {
	It("keeps serving within the bound while the region has no leader, and never older than the bound", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(20 * time.Second)
		const maxStale = 1500 * time.Millisecond
		// Writes with their acknowledgement times: the history to check against.
		type write struct {
			val   int
			acked time.Time
		}
		var writes []write
		for i := range 30 {
			Expect(c.Put(ctx, []byte("x"), []byte(strconv.Itoa(i)))).To(Succeed())
			writes = append(writes, write{i, time.Now()})
			time.Sleep(5 * time.Millisecond)
		}
		old, _ := c.Leader(1)
		followers := otherThan(c, old)
		// Let safe points reach the followers, then kill the leader and keep
		// the survivors from electing a new one.
		Eventually(func() error {
			_, _, _, err := readOn(c, followers[0], raftstore.ReadOptions{MaxStaleness: maxStale}, "x", time.Second)
			return err
		}).WithTimeout(5 * time.Second).Should(Succeed())
		heal := c.Net.AddFilter(raftstore.MsgTypeFilter(raftstore.DropFilter(1), electionMsgs...))
		Expect(c.StopStore(old)).To(Succeed())
		killed := time.Now()

		served := 0
		for time.Since(killed) < maxStale/2 {
			for _, id := range followers {
				start := time.Now()
				v, _, info, err := readOn(c, id, raftstore.ReadOptions{MaxStaleness: maxStale}, "x", time.Second)
				Expect(err).NotTo(HaveOccurred(), "stale read on store %d without a leader", id)
				Expect(info.Mode).To(Equal(readmode.Stale))
				Expect(info.StalenessBound).To(BeNumerically("<=", maxStale))
				got, _ := strconv.Atoi(v)
				// Every write acknowledged before start-bound must be visible.
				for _, w := range writes {
					if w.acked.Before(start.Add(-info.StalenessBound)) {
						Expect(got).To(BeNumerically(">=", w.val), "read returned state older than its bound %v", info.StalenessBound)
					}
				}
				served++
			}
			time.Sleep(10 * time.Millisecond)
		}
		Expect(served).To(BeNumerically(">", 10))

		// Without MaxStaleness a follower read cannot be served without a leader.
		_, _, _, err := readOn(c, followers[0], raftstore.ReadOptions{ReplicaRead: true}, "x", 200*time.Millisecond)
		Expect(err).To(HaveOccurred())
		// Past the bound the stale read is refused: the client must go elsewhere.
		Eventually(func() error {
			_, _, _, err := readOn(c, followers[0], raftstore.ReadOptions{MaxStaleness: maxStale}, "x", time.Second)
			return err
		}).WithTimeout(5 * time.Second).Should(MatchError(ContainSubstring("data is not ready")))

		// With elections allowed again, linearizable reads resume.
		heal()
		Eventually(func() error {
			_, _, _, err := readOn(c, followers[1], raftstore.ReadOptions{ReplicaRead: true}, "x", time.Second)
			return err
		}).WithTimeout(10 * time.Second).Should(Succeed())
	})

	It("keeps serving stale reads on a follower under a load of stale reads alone", func() {
		// Nothing reads or writes at the leader, so only the followers'
		// nudges keep its lease, and with it the safe points, alive.
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(20 * time.Second)
		Expect(c.Put(ctx, []byte("x"), []byte("v"))).To(Succeed())
		leader, _ := c.Leader(1)
		f := otherThan(c, leader)[0]
		const maxStale = 300 * time.Millisecond
		opts := raftstore.ReadOptions{MaxStaleness: maxStale}
		Eventually(func() error {
			_, _, _, err := readOn(c, f, opts, "x", time.Second)
			return err
		}).WithTimeout(5 * time.Second).Should(Succeed())
		refused, reads := 0, 0
		start := time.Now()
		for n := 0; time.Since(start) < 5*maxStale; n++ {
			reads++
			v, _, info, err := readOn(c, f, opts, "x", time.Second)
			if err != nil {
				refused++
				continue
			}
			Expect(v).To(Equal("v"))
			Expect(info.Mode).To(Equal(readmode.Stale))
			time.Sleep(2 * time.Millisecond)
		}
		// Without the nudges the leader's lease, and its safe points, stop
		// a lease after the last write, and every read from 300ms on is
		// refused: most of them. A loaded machine may delay a nudge's
		// round now and then, so a few refusals are tolerated.
		Expect(refused).To(BeNumerically("<=", reads/10), "%d of %d stale reads refused for want of fresh safe points", refused, reads)
	})
})
