// Package cluster_test holds the whole-cluster specs: several stores in one
// process over the in-memory network, with faults injected as filters.
package cluster_test

import (
	"context"
	"os"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
)

func TestCluster(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Cluster Suite")
}

// startCluster starts an in-process cluster that is shut down after the
// spec. Before that, unless the spec failed already, the network is healed
// and the replicas of every region on the running stores must agree
// (checkReplicas).
func startCluster(opts raftstoretest.Options) *raftstoretest.Cluster {
	GinkgoHelper()
	opts.Dir = GinkgoT().TempDir()
	if os.Getenv("HEDGEKV_TEST_LOGS") != "" {
		opts.LogOutput = GinkgoWriter
	}
	c, err := raftstoretest.New(opts)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(c.Shutdown)
	// Cleanups run last-registered first: the check sees a running cluster.
	DeferCleanup(checkReplicas, c)
	return c
}

// replicaCheckTimeout bounds the wait for every region's replicas to reach
// one applied index once the spec is done.
const replicaCheckTimeout = 15 * time.Second

// checkReplicas heals the network and fails the spec unless the replicas of
// every region on the running stores agree at a common applied index, and
// no leader ever committed what the follower-lease rule forbids.
func checkReplicas(c *raftstoretest.Cluster) {
	if CurrentSpecReport().Failed() {
		return // the spec's own failure says more
	}
	c.Net.ClearFilters()
	ctx, cancel := context.WithTimeout(context.Background(), replicaCheckTimeout)
	defer cancel()
	start := time.Now()
	Expect(c.CheckReplicas(ctx)).To(Succeed(), "replica agreement check after the spec")
	Expect(c.FollowerLeaseViolations()).To(BeZero(), "a leader committed an entry the follower-lease rule forbade (see the stores' logs)")
	GinkgoWriter.Printf("replica check: %d region(s) agree (%v)\n", len(c.Regions()), time.Since(start).Round(time.Millisecond))
}

func ctxFor(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	DeferCleanup(cancel)
	return ctx
}

// mustStore returns a running store.
func mustStore(c *raftstoretest.Cluster, id uint64) *raftstore.Store {
	GinkgoHelper()
	s, ok := c.Store(id)
	Expect(ok).To(BeTrue(), "store %d is not running", id)
	return s
}

// otherThan returns the stores except the given ones.
func otherThan(c *raftstoretest.Cluster, ids ...uint64) []uint64 {
	var out []uint64
	for _, id := range c.IDs() {
		skip := false
		for _, x := range ids {
			skip = skip || x == id
		}
		if !skip {
			out = append(out, id)
		}
	}
	return out
}
