package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/hedgekv/hedgekv/clock"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/test/kvmodel"
)

// The model lives in test/kvmodel, shared with the other linearizability specs.
type (
	kvInput  = kvmodel.Input
	kvOutput = kvmodel.Output
)

var kvModel = kvmodel.Model

// nemesisEnv reads a duration in seconds from the environment: the specs
// run briefly in `make test`, and for minutes when asked
// (HEDGEKV_NEMESIS_SECONDS=300 go test ./test/cluster -ginkgo.focus nemesis).
func nemesisEnv(name string, def time.Duration) time.Duration {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return def
}

// nemesisPreloadMB is how much data the nemesis runs start with, spread
// over every client key's range: enough that a snapshot (a replica move,
// a store that missed a compaction) and a split take real time, so faults
// land in the middle of them. Default 32 MB (about 3 MB per key range, the
// most make test's six seeds afford under -race); the long run takes tens
// of MB per region (HEDGEKV_NEMESIS_PRELOAD_MB=400).
//
// A power-loss run defaults to 4 MB: its stores write through the
// in-memory file system and sync for real, and under -race copying 32 MB
// through it took a minute.
func nemesisPreloadMB(run nemesisRun) int {
	if v, err := strconv.Atoi(os.Getenv("HEDGEKV_NEMESIS_PRELOAD_MB")); err == nil && v >= 0 {
		return v
	}
	if run.powerLoss {
		return 4
	}
	return 32
}

// preload writes mb megabytes as 128 KiB values under every client key
// ("a/pad/0001", ... in a's range), eight writers at a time. The keys are
// no client's: the history does not record them, the replica check covers
// them.
func preload(c *raftstoretest.Cluster, mb int) {
	GinkgoHelper()
	const size = 128 << 10
	n := mb << 20 / size
	if n == 0 {
		return
	}
	start := time.Now()
	ctx := ctxFor(5 * time.Minute)
	value := make([]byte, size)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	next := atomic.Int64{}
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				key := fmt.Sprintf("%s/pad/%05d", nemesisKeys[int(i)%len(nemesisKeys)], i)
				if err := c.Put(ctx, []byte(key), value); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	Expect(failed.Load()).To(BeZero(), "preload writes failed")
	GinkgoWriter.Printf("preloaded %d MB (%d values of %d KiB) in %v\n", mb, n, size>>10, time.Since(start).Round(time.Millisecond))
}

// clientState is one client's view: its cached regions, which may be
// stale (the split and replica-move faults make them so), as a real
// client's region cache would be.
type clientState struct {
	cache map[string]region.Region
}

func (cs *clientState) regionFor(c *raftstoretest.Cluster, key string, refresh bool) (region.Region, bool) {
	if r, ok := cs.cache[key]; ok && !refresh {
		return r, true
	}
	r, ok := c.RegionOf([]byte(key))
	if ok {
		cs.cache[key] = r
	}
	return r, ok
}

// shortLeaseStore runs 6 election ticks to the others' 10: it campaigns
// sooner, so elections race leases more often, and its own leases (leader
// lease, longest grant, deferral) are shorter than the others'.
const shortLeaseStore = 3

// runLinearizability runs one seed for duration: six clients and the
// nemesis against four stores, then the history's check.
//
// HEDGEKV_NEMESIS_SEED_OFFSET=n adds n to every entry's seed: the same
// configurations, other schedules.
func runLinearizability(run nemesisRun, duration time.Duration) {
	if v, err := strconv.ParseUint(os.Getenv("HEDGEKV_NEMESIS_SEED_OFFSET"), 10, 64); err == nil {
		run.seed += v
	}
	seed := run.seed
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	c, skews := startNemesisCluster(run, rng)
	h := kvmodel.NewHistory()
	const clients = 6
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for cl := range clients {
		wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer wg.Done()
			runNemesisClient(c, h, run, cl, stop)
		}()
	}
	faults := &faultLog{now: h.Now}
	nem := &nemesis{c: c, run: run, rng: rng, stop: stop, log: faults, h: h, clocks: skews}
	nemesisDone := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(nemesisDone)
		nem.loop()
	}()
	time.Sleep(duration)
	close(stop)
	wg.Wait()
	<-nemesisDone
	checkNemesisHistory(c, run, h, nem, faults, duration)
	// startCluster's cleanup then checks that every region's replicas agree.
}

// startNemesisCluster starts three stores with skewed clocks, and a fourth
// without a replica for the nemesis to move replicas to; splits off the
// quiet key and preloads the data. It returns the stores' clocks.
func startNemesisCluster(run nemesisRun, rng *rand.Rand) (*raftstoretest.Cluster, map[uint64]clock.Clock) {
	GinkgoHelper()
	// Clocks skewed within what the lease and the staleness bounds allow
	// for: a rate off by up to 3% (the lease gives up 10%), an offset of
	// up to 20ms (MaxClockOffset is 50ms). shortLeaseStore campaigns
	// sooner than the others, and its own leases are shorter.
	skews := map[uint64]clock.Clock{}
	for id := uint64(1); id <= 4; id++ {
		skews[id] = raftstoretest.SkewedClock(time.Duration(rng.IntN(41)-20)*time.Millisecond, 0.97+rng.Float64()*0.06)
		if run.trueClocks {
			skews[id] = clock.Real{}
		}
	}
	c := startCluster(raftstoretest.Options{
		TickInterval:       run.tick,
		DedupWindow:        run.dedupWindow,
		LogGCThreshold:     200,
		StoreElectionTicks: map[uint64]int{shortLeaseStore: 6},
		Clock:              func(id uint64) clock.Clock { return skews[id] },
		FollowerLeases:     run.followerLeases,
		PowerLoss:          run.powerLoss,
	})
	_, err := c.AddStore()
	Expect(err).NotTo(HaveOccurred())
	Expect(c.Split(ctxFor(10*time.Second), []byte(quietSplit))).To(Succeed())
	preload(c, nemesisPreloadMB(run))
	return c, skews
}

// runNemesisClient is client cl: puts, deletes, puts whose first
// acknowledgement is lost, leader reads and follower reads routed by its own (possibly
// stale) region cache, each recorded in h, until stop.
func runNemesisClient(c *raftstoretest.Cluster, h *kvmodel.History, run nemesisRun, cl int, stop <-chan struct{}) {
	seed := run.seed
	keys := nemesisKeys
	crng := rand.New(rand.NewPCG(seed+uint64(cl), uint64(cl)))
	cs := &clientState{cache: map[string]region.Region{}}
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		key := keys[crng.IntN(len(keys))]
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		call := h.Now()
		switch r := crng.IntN(20); {
		case r < 1:
			// A delete: a replica that kept a deleted key (a merged
			// region's snapshot over a frozen source did) answers it.
			err := c.Delete(ctx, []byte(key))
			in := kvInput{Delete: true, Key: key}
			if err != nil {
				h.Add(porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
			} else {
				h.Add(porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: kvOutput{}, Return: h.Now()})
			}
		case r < 6:
			val := fmt.Sprintf("%d.%d", cl, n)
			err := c.Put(ctx, []byte(key), []byte(val))
			in := kvInput{Put: true, Key: key, Value: val}
			if err != nil {
				// It may still happen at any later time.
				h.Add(porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
			} else {
				h.Add(porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: kvOutput{}, Return: h.Now()})
			}
		case r < 8:
			// A write whose acknowledgement is lost: a first attempt
			// under a tiny deadline, then, after faults had time to
			// split the region or add a replica, a retry with the same
			// request ID. One operation from the first call to the
			// retry's answer.
			val := fmt.Sprintf("%d.%d", cl, n)
			id := crng.Uint64() | 1
			first, cancelFirst := context.WithTimeout(ctx, time.Duration(1+crng.IntN(3))*time.Millisecond)
			_ = c.PutWithID(first, id, []byte(key), []byte(val))
			cancelFirst()
			select {
			case <-stop:
			case <-time.After(retryDelay(crng, run)):
			}
			retry, cancelRetry := context.WithTimeout(context.Background(), time.Second)
			err := c.PutWithID(retry, id, []byte(key), []byte(val))
			cancelRetry()
			recordRetried(h, cl, key, val, call, err, run.dedupWindow > 0)
		case r < 13:
			v, found, err := c.Get(ctx, []byte(key))
			if err == nil {
				h.Add(porcupine.Operation{ClientId: cl, Input: kvInput{Key: key, Mode: "leader"}, Call: call, Output: kvOutput{Value: string(v), Found: found}, Return: h.Now()})
			}
		default:
			// A follower read routed by the client's cache, which may
			// predate a split or a move.
			ids := c.IDs()
			reg, ok := cs.regionFor(c, key, false)
			s, up := c.Store(ids[crng.IntN(len(ids))])
			if !ok || !up {
				break
			}
			v, found, info, err := s.Get(ctx, raftstore.ReadOptions{RegionID: reg.ID, Epoch: reg.Epoch, ReplicaRead: true}, []byte(key))
			if err == nil {
				// How it was served, for whoever reads a failing history.
				mode := fmt.Sprintf("follower: %s on store %d", info.Mode, info.StoreID)
				h.Add(porcupine.Operation{ClientId: cl, Input: kvInput{Key: key, Mode: mode}, Call: call, Output: kvOutput{Value: string(v), Found: found}, Return: h.Now()})
			} else if region.IsRegionError(err) && crng.IntN(2) == 0 {
				// Half the time refresh at once; otherwise keep the
				// stale epoch a while, as a slow client would.
				cs.regionFor(c, key, true)
			}
		}
		cancel()
	}
}

// checkNemesisHistory checks the recorded history with porcupine and
// saves it (HTML and JSON under failures/) if it is not linearizable.
func checkNemesisHistory(c *raftstoretest.Cluster, run nemesisRun, h *kvmodel.History, nem *nemesis, faults *faultLog, duration time.Duration) {
	GinkgoHelper()
	seed := run.seed
	recorded := h.Ops()
	ops := kvmodel.Prepare(recorded, h.Now()+1)
	reads := 0
	for i := range ops {
		if in := ops[i].Input.(kvInput); !in.Put && !in.Delete {
			reads++
		}
	}
	var leaseReads, splitsOverSnapshot uint64
	for _, id := range c.IDs() {
		if s, ok := c.Store(id); ok {
			leaseReads += s.Stats().ReadsFollowerLease
			splitsOverSnapshot += s.Stats().SplitsOverSnapshot
		}
	}
	// A split over an admitted snapshot (the split-chain fault provokes
	// the overlap the snapshot claims refuse): on the stores up now.
	Expect(splitsOverSnapshot).To(BeZero(), "seed %d: splits applied over their new region's snapshot", seed)
	GinkgoWriter.Printf("seed %d (tick %v, dedup window %d, follower leases %v): %d operations (%d reads, %d by probes, %d follower-lease reads on the stores up now) in %v, %d regions, %s\n",
		seed, run.tick, run.dedupWindow, run.followerLeases, len(recorded), reads, nem.probes, leaseReads, duration, len(c.Regions()), faults.summary())
	Expect(reads).To(BeNumerically(">", 20), "too few successful reads to check anything")
	Expect(nem.staleViolations).To(BeZero(), "bounded-staleness reads answered older than their bound: %v", faults.list)
	Expect(nem.reopenErrs).To(BeEmpty(), "stores failed to restart after a power loss (seed %d): %v", seed, faults.list)

	res, info := porcupine.CheckOperationsVerbose(kvModel, ops, 60*time.Second)
	if res != porcupine.Ok {
		dir, _ := filepath.Abs("failures")
		_ = os.MkdirAll(dir, 0o755)
		html := filepath.Join(dir, fmt.Sprintf("linearizability-seed-%d.html", seed))
		_ = porcupine.VisualizePath(kvModel, info, html)
		raw, _ := json.MarshalIndent(ops, "", " ")
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("linearizability-seed-%d.json", seed)), raw, 0o644)
		Fail(fmt.Sprintf("history is %v (not linearizable); saved to %s; %s: %v", res, html, faults.summary(), faults.list))
	}
}

// retryDelay is how long a client waits before retrying a write whose
// acknowledgement it lost: with a tiny dedup window, sometimes longer than
// the window lasts.
func retryDelay(rng *rand.Rand, run nemesisRun) time.Duration {
	if run.dedupWindow > 0 {
		return time.Duration(50+rng.IntN(1500)) * time.Millisecond
	}
	return time.Duration(50+rng.IntN(300)) * time.Millisecond
}

var _ = Describe("linearizability", func() {
	duration := nemesisEnv("HEDGEKV_NEMESIS_SECONDS", 4*time.Second)
	DescribeTable("puts and gets in every read mode under a nemesis",
		func(run nemesisRun) { runLinearizability(run, duration) },
		Entry("seed 1", nemesisRun{seed: 1, tick: 10 * time.Millisecond}),
		Entry("seed 2, power loss", nemesisRun{seed: 2, tick: 10 * time.Millisecond, powerLoss: true}),
		Entry("seed 3, 50ms ticks (longer leases)", nemesisRun{seed: 3, tick: 50 * time.Millisecond}),
		Entry("seed 4, a dedup window retries outlive", nemesisRun{seed: 4, tick: 10 * time.Millisecond, dedupWindow: 100}),
		Entry("seed 5, follower leases, power loss", nemesisRun{seed: 5, tick: 10 * time.Millisecond, followerLeases: true, powerLoss: true}),
		Entry("seed 6, follower leases, 50ms ticks", nemesisRun{seed: 6, tick: 50 * time.Millisecond, followerLeases: true}),
	)
})
