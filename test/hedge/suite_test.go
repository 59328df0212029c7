// Package hedge_test holds the hedged-read specs: a cluster of in-process
// servers on loopback ports (cluster.StartLocal, real gRPC, faults
// allowed), read through the client with hedging on while a store's read
// path is slowed by an injected fault.
package hedge_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
)

func TestHedge(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Hedge Suite")
}

// startCluster starts three stores that accept injected faults, with the
// balancer paused and splits off so that region 1 holds every key and its
// leader stays put; everything is stopped after the spec.
func startCluster() *cluster.Local {
	GinkgoHelper()
	c, err := cluster.StartLocal(ctxFor(60*time.Second), cluster.LocalConfig{
		Dir:              GinkgoT().TempDir(),
		NoSync:           true,
		AllowFaults:      true,
		DisableBalancing: true,
		DisableSplit:     true,
		StatusHTTP:       true,
	})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(c.Stop)
	return c
}

// newClient connects to every store; it is closed after the spec (before
// the cluster stops: cleanups run last-registered first).
func newClient(c *cluster.Local) *client.Client {
	GinkgoHelper()
	cl, err := client.New(ctxFor(10*time.Second), client.Config{Endpoints: c.Endpoints})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(cl.Close)
	return cl
}

// metric reads one unlabelled counter from a store's /metrics.
func metric(c *cluster.Local, store uint64, name string) (float64, error) {
	resp, err := http.Get("http://" + c.StatusAddr(store) + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no %s on store %d's /metrics", name, store)
}

// leaderOf waits until region 1 has a leader that every store knows and
// returns its store.
func leaderOf(c *cluster.Local) uint64 {
	GinkgoHelper()
	var leader uint64
	Eventually(func() uint64 {
		leader = c.LeaderStore(1)
		return leader
	}).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).ShouldNot(BeZero())
	Expect(c.MoveLeader(ctxFor(10*time.Second), 1, leader)).To(Succeed())
	return leader
}

func ctxFor(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	DeferCleanup(cancel)
	return ctx
}
