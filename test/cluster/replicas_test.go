package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/replica"
)

// checkWithin runs the replica check, bounded by d.
func checkWithin(c *raftstoretest.Cluster, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return c.CheckReplicas(ctx)
}

// The check every startCluster spec ends with (checkReplicas) must be able
// to fail: these specs show it catches a replica that diverged behind
// raft's back and that it refuses to pass without a quiet moment.
var _ = Describe("replica agreement check", Label("check"), func() {
	It("agrees on a healthy cluster after writes, deletes and a split", agreesWhenHealthy)

	It("checks only the running stores", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(20 * time.Second)
		leader, _ := c.Leader(1)
		down := otherThan(c, leader)[0]
		Expect(c.StopStore(down)).To(Succeed())
		for i := range 20 {
			Expect(c.Put(ctx, key(i), []byte("v"))).To(Succeed())
		}
		Expect(checkWithin(c, 10*time.Second)).To(Succeed())
	})

	DescribeTable("names the first differing key of a replica corrupted behind raft's back",
		func(corruptLeader bool, k, corrupt []byte, wantA, wantB string) {
			// One store applies a write of k differently from its peers
			// (raftstore.TestingKnobs.ApplyFilter), as a bug or a bad disk
			// would: the victim writes corrupt (nil: deletes k), the others
			// keep what they held.
			var active atomic.Pointer[rewrite]
			c := startCluster(raftstoretest.Options{Knobs: func(id uint64) raftstore.TestingKnobs {
				return raftstore.TestingKnobs{ApplyFilter: func(_ uint64, key, value []byte, del bool) ([]byte, bool) {
					rw := active.Load()
					if rw == nil || !bytes.Equal(key, rw.key) {
						return value, del
					}
					v := rw.others
					if id == rw.victim {
						v = rw.victimValue
					}
					return v, v == nil
				}}
			}})
			ctx := ctxFor(20 * time.Second)
			for i := range 100 {
				Expect(c.Put(ctx, key(i), fmt.Appendf(nil, "v%d", i))).To(Succeed())
			}
			Expect(checkWithin(c, 10*time.Second)).To(Succeed())
			leader, _ := c.Leader(1)
			victim := otherThan(c, leader)[0]
			if corruptLeader {
				victim = leader
			}
			orig, found, _, err := mustStore(c, victim).Get(ctx, raftstore.ReadOptions{ReplicaRead: true}, k)
			Expect(err).NotTo(HaveOccurred())
			if !found {
				orig = nil
			}
			active.Store(&rewrite{key: k, victim: victim, victimValue: corrupt, others: orig})
			Expect(c.Put(ctx, k, []byte("rewritten on apply"))).To(Succeed())

			err = checkWithin(c, 5*time.Second)
			var me *replica.MismatchError
			Expect(errors.As(err, &me)).To(BeTrue(), "got %v", err)
			Expect(me.RegionID).To(BeEquivalentTo(1))
			Expect(me.What).To(Equal("data"))
			Expect(me.Groups).To(HaveLen(2))
			Expect(me.Groups[1]).To(Equal([]uint64{victim}), "the corrupted store is the odd one out")
			Expect(me.Diff).NotTo(BeNil(), "%v", err)
			Expect(string(me.Diff.Key)).To(Equal(string(k)))
			Expect(me.Diff.StoreB).To(Equal(victim))
			Expect(err.Error()).To(ContainSubstring(fmt.Sprintf("first differing key %q", k)))
			Expect(err.Error()).To(ContainSubstring(wantA))
			Expect(err.Error()).To(ContainSubstring(wantB))
			GinkgoWriter.Println(err)

			// Undo the damage through raft: the check agrees again (and so
			// does the one after the spec).
			active.Store(nil)
			if found {
				Expect(c.Put(ctx, k, orig)).To(Succeed())
			} else {
				Expect(c.Delete(ctx, k)).To(Succeed())
			}
			Expect(checkWithin(c, 10*time.Second)).To(Succeed())
		},
		Entry("a changed value on a follower", false, key(42), []byte("corrupt"), `has "v42"`, `has "corrupt"`),
		Entry("a changed value on the leader", true, key(42), []byte("corrupt"), `has "v42"`, `has "corrupt"`),
		Entry("a key deleted on a follower", false, key(42), nil, `has "v42"`, "has no such key"),
		Entry("an extra key on a follower", false, key(1042), []byte("extra"), "has no such key", `has "extra"`),
	)

	It("says there was no quiet moment while a replica is partitioned away and lags", func() {
		c := startCluster(raftstoretest.Options{})
		ctx := ctxFor(20 * time.Second)
		leader, _ := c.Leader(1)
		lagging := otherThan(c, leader)[0]
		heal := c.Net.AddFilter(raftstore.IsolateFilter(lagging))
		for i := range 20 {
			Expect(c.Put(ctx, key(i), []byte("v"))).To(Succeed())
		}
		start := time.Now()
		err := checkWithin(c, 500*time.Millisecond)
		Expect(err).To(HaveOccurred(), "the check passed without comparing the lagging replica")
		Expect(time.Since(start)).To(BeNumerically("<", 2*time.Second), "the check outlived its context")
		Expect(err.Error()).To(ContainSubstring("no quiet moment"))
		Expect(err.Error()).To(ContainSubstring("region 1: replicas not at the same applied index"))
		Expect(err.Error()).To(ContainSubstring(fmt.Sprintf("store %d at", lagging)))
		GinkgoWriter.Println(err)

		heal()
		Expect(checkWithin(c, 10*time.Second)).To(Succeed())
	})
})

// agreesWhenHealthy: the check passes on a healthy cluster after writes,
// deletes and a split, every replica holding the keys.
func agreesWhenHealthy() {
	c := startCluster(raftstoretest.Options{})
	ctx := ctxFor(20 * time.Second)
	for i := range 200 {
		Expect(c.Put(ctx, key(i), fmt.Appendf(nil, "v%d", i))).To(Succeed())
	}
	Expect(c.Split(ctx, key(100))).To(Succeed())
	for i := 0; i < 200; i += 7 {
		Expect(c.Delete(ctx, key(i))).To(Succeed())
	}
	Expect(c.Regions()).To(HaveLen(2))
	everyRegionHasLeader(c)
	Expect(checkWithin(c, 10*time.Second)).To(Succeed())
	for _, r := range c.Regions() {
		for _, id := range c.IDs() {
			d, err := mustStore(c, id).RegionDigest(r.ID)
			Expect(err).NotTo(HaveOccurred())
			Expect(d.Keys).To(BeNumerically(">", 80), "store %d region %d", id, r.ID)
		}
	}
}

// rewrite is the write of key the replicas apply instead of the one
// proposed: victimValue on victim, others elsewhere (nil: a delete).
type rewrite struct {
	key                 []byte
	victim              uint64
	victimValue, others []byte
}
