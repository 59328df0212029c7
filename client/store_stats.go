package client

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/server/pb"
)

const (
	// latencyAlpha weighs a new latency sample in the EWMA: about the last
	// ten requests matter, so a store that slows down is noticed quickly
	// without one outlier dominating.
	latencyAlpha = 0.2
	// loadFreshness is how long a store's self-reported load is believed;
	// older reports describe a queue that has long drained or grown.
	loadFreshness = 500 * time.Millisecond
	// recentFailure is how long a store counts as "failed recently" for
	// ReplicaPreferLeader: long enough to cover a leader election, short
	// enough that reads return to the leader soon after it recovers.
	recentFailure = 5 * time.Second
	// defaultLatency stands in for a store never measured, so scores stay
	// comparable; it is a LAN round trip plus a little work.
	defaultLatency = time.Millisecond
)

// storeStats is what the client observes about one store. Fields are
// touched on every request, so they are atomics rather than behind the
// cache's lock.
type storeStats struct {
	inflight    atomic.Int64
	latencyNs   atomic.Int64 // EWMA of successful request latency; 0: never measured
	lastFailure atomic.Int64 // unix nanos of the last unreachable/timeout; 0: none

	// Load the store reported in its last answer.
	loadInflight atomic.Uint32
	loadWaitUs   atomic.Uint64
	loadAt       atomic.Int64 // unix nanos

	// reads is the sliding window of read latencies for percentile hedges.
	reads latencyWindow
}

// readWindow is the store's read-latency window.
func (s *storeStats) readWindow() *latencyWindow { return &s.reads }

// statsTable maps store id to its stats, created on first use.
type statsTable struct {
	m sync.Map // uint64 -> *storeStats
}

func (t *statsTable) get(storeID uint64) *storeStats {
	if s, ok := t.m.Load(storeID); ok {
		return s.(*storeStats)
	}
	s, _ := t.m.LoadOrStore(storeID, &storeStats{})
	return s.(*storeStats)
}

// start counts a request to the store as in flight; the returned func ends
// it and records its outcome.
func (s *storeStats) start() (done func(ok bool, load *pb.Load)) {
	s.inflight.Add(1)
	begin := time.Now()
	return func(ok bool, load *pb.Load) {
		s.inflight.Add(-1)
		now := time.Now()
		if !ok {
			return
		}
		s.observeLatency(now.Sub(begin))
		if load != nil {
			s.loadInflight.Store(load.GetInflightReads())
			s.loadWaitUs.Store(load.GetEstWaitUs())
			s.loadAt.Store(now.UnixNano())
		}
	}
}

func (s *storeStats) observeLatency(d time.Duration) {
	for {
		old := s.latencyNs.Load()
		next := int64(d)
		if old != 0 {
			next = int64(latencyAlpha*float64(d) + (1-latencyAlpha)*float64(old))
		}
		if next <= 0 {
			next = 1
		}
		if s.latencyNs.CompareAndSwap(old, next) {
			return
		}
	}
}

func (s *storeStats) markFailure() { s.lastFailure.Store(time.Now().UnixNano()) }

// failedRecently reports a failure within the recentFailure window.
func (s *storeStats) failedRecently() bool {
	t := s.lastFailure.Load()
	return t != 0 && time.Since(time.Unix(0, t)) < recentFailure
}

// latency returns the EWMA, and whether the store was ever measured.
func (s *storeStats) latency() (time.Duration, bool) {
	ns := s.latencyNs.Load()
	if ns == 0 {
		return defaultLatency, false
	}
	return time.Duration(ns), true
}

// score estimates how long a new request to this store would take: our own
// queue there times its latency, plus the wait the store itself last
// reported (which counts other clients' load we cannot see). Lower is
// better. It is the cost power of two choices compares.
func (s *storeStats) score() float64 {
	lat, _ := s.latency()
	cost := float64(s.inflight.Load()+1) * float64(lat)
	if at := s.loadAt.Load(); at != 0 && time.Since(time.Unix(0, at)) < loadFreshness {
		// Prefer the store's own estimate of its queueing delay; a store
		// that only reports its queue length is charged a latency per
		// queued read instead.
		if wait := s.loadWaitUs.Load(); wait > 0 {
			cost += float64(wait) * float64(time.Microsecond)
		} else {
			cost += float64(s.loadInflight.Load()) * float64(lat)
		}
	}
	return cost
}
