package client

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
)

const (
	// latencyAlpha weighs a new latency sample in the EWMA: about the last
	// ten requests matter, so a store that slows down is noticed quickly
	// without one outlier dominating.
	latencyAlpha = 0.2
	// loadFreshness is how long a store's self-reported load is believed;
	// older reports describe a queue that has long drained or grown.
	loadFreshness = 500 * time.Millisecond
	// A store that failed (unreachable, timed out) is avoided for a
	// back-off that doubles with each failure in a row, from failureBackoff
	// up to maxFailureBackoff (long enough to cover a leader election,
	// short enough that reads return soon after it recovers). Once the
	// back-off has passed, one request probes it; the others keep avoiding
	// it for probeHold, so a store that hangs costs one timed-out attempt
	// per probe rather than one per request.
	failureBackoff    = 200 * time.Millisecond
	maxFailureBackoff = 5 * time.Second
	probeHold         = 500 * time.Millisecond
	// latencyHalfLife is how fast a store's latency estimate fades back to
	// defaultLatency while no request measures it. Power of two choices
	// never picks a store that looks slow, so without fading a store that
	// was slow once would never be measured, or used, again; with it, a
	// store slowed by 200x is tried again after about eight half-lives.
	latencyHalfLife = time.Second
	// defaultLatency stands in for a store never measured, so scores stay
	// comparable; it is a LAN round trip plus a little work.
	defaultLatency = time.Millisecond
)

// storeStats is what the client observes about one store. Fields are
// touched on every request, so they are atomics rather than behind the
// cache's lock.
type storeStats struct {
	inflight  atomic.Int64
	latencyNs atomic.Int64 // EWMA of successful request latency; 0: never measured
	latencyAt atomic.Int64 // unix nanos of the last latency sample
	// failures counts failures in a row; avoidUntil (unix nanos) ends the
	// current back-off, or the hold of a probe under way.
	failures   atomic.Int32
	avoidUntil atomic.Int64

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
func (s *storeStats) start() (done func(ok bool, load *kvpb.Load)) {
	s.inflight.Add(1)
	begin := time.Now()
	return func(ok bool, load *kvpb.Load) {
		s.inflight.Add(-1)
		now := time.Now()
		if !ok {
			return
		}
		if s.failures.Load() != 0 {
			s.failures.Store(0)
			s.avoidUntil.Store(0)
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
			s.latencyAt.Store(time.Now().UnixNano())
			return
		}
	}
}

// markFailure starts (or doubles) the store's back-off.
func (s *storeStats) markFailure() {
	n := s.failures.Add(1)
	d := failureBackoff << min(max(n-1, 0), 16)
	if d > maxFailureBackoff || d <= 0 {
		d = maxFailureBackoff
	}
	// Jitter, so that clients that saw the same failure do not all probe
	// at the same moment.
	d = d/2 + rand.N(d/2+1)
	s.avoidUntil.Store(time.Now().Add(d).UnixNano())
}

// observeBusy records a ServerIsBusy answer: the store's own estimate of
// its wait, which the score then charges like a reported load.
func (s *storeStats) observeBusy(wait time.Duration) {
	s.loadWaitUs.Store(uint64(max(wait, 0) / time.Microsecond))
	s.loadAt.Store(time.Now().UnixNano())
}

// failedRecently reports a store in its back-off after a failure (or
// being probed by another request).
func (s *storeStats) failedRecently() bool {
	return s.failures.Load() != 0 && time.Now().UnixNano() < s.avoidUntil.Load()
}

// usable reports whether a request may go to the store: yes unless it is
// in its back-off. A store past its back-off but not yet seen to work
// again admits one probe: the first caller to ask claims it and the
// store is held back from others for probeHold, until an answer resets it.
func (s *storeStats) usable() bool {
	if s.failures.Load() == 0 {
		return true
	}
	now := time.Now().UnixNano()
	until := s.avoidUntil.Load()
	if now < until {
		return false
	}
	return s.avoidUntil.CompareAndSwap(until, now+int64(probeHold))
}

// latency returns the EWMA, faded towards defaultLatency by the time since
// it was last measured (see latencyHalfLife), and whether the store was
// ever measured.
func (s *storeStats) latency() (time.Duration, bool) {
	ns := s.latencyNs.Load()
	if ns == 0 {
		return defaultLatency, false
	}
	lat := time.Duration(ns)
	if at := s.latencyAt.Load(); at != 0 && lat > defaultLatency {
		if age := time.Since(time.Unix(0, at)); age > 0 {
			fade := math.Exp2(-float64(age) / float64(latencyHalfLife))
			lat = defaultLatency + time.Duration(float64(lat-defaultLatency)*fade)
		}
	}
	return lat, true
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
