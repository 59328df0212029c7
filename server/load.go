package server

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
)

// loadTracker measures what every KV answer reports in kvpb.Load: how many
// reads this server is serving and how long a new one may expect to take.
// Clients compare these across replicas (power of two choices), and a read
// carrying a busy threshold is refused when the estimate exceeds it, so the
// numbers only need to be cheap and comparable, not exact.
//
// The latency part is a sliding window (two slots of loadSlot), not an
// EWMA: a store that clients avoid, or that refuses reads as busy, gets few
// new samples, and an EWMA would keep reporting a slowness long gone. With
// a window, a store that stops seeing slow reads reports no latency after
// at most 2×loadSlot, and the in-flight part alone describes it.
type loadTracker struct {
	inflight atomic.Int64

	mu    sync.Mutex
	slots [2]loadSlotSum // slots[cur] is the slot of now; the other the one before
	cur   int
	at    int64 // index of slots[cur] (unix nanos / loadSlot)
}

type loadSlotSum struct {
	sum   time.Duration
	count int64
}

// loadSlot is one slot of the latency window: a stall is noticed within a
// few reads, and forgotten within a second of ending.
const loadSlot = 500 * time.Millisecond

func (l *loadTracker) begin() time.Time {
	l.inflight.Add(1)
	return time.Now()
}

func (l *loadTracker) end(start time.Time) {
	l.inflight.Add(-1)
	now := time.Now()
	d := now.Sub(start)
	l.mu.Lock()
	l.advanceLocked(now)
	l.slots[l.cur].sum += d
	l.slots[l.cur].count++
	l.mu.Unlock()
}

// advanceLocked moves the window to now, clearing slots that ended.
func (l *loadTracker) advanceLocked(now time.Time) {
	idx := now.UnixNano() / int64(loadSlot)
	switch gap := idx - l.at; {
	case gap <= 0:
	case gap == 1:
		l.cur ^= 1
		l.slots[l.cur] = loadSlotSum{}
	default:
		l.slots = [2]loadSlotSum{}
	}
	if idx > l.at {
		l.at = idx
	}
}

// recentLatency is the mean read latency over the window, zero if it holds
// no read.
func (l *loadTracker) recentLatency(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.advanceLocked(now)
	n := l.slots[0].count + l.slots[1].count
	if n == 0 {
		return 0
	}
	return (l.slots[0].sum + l.slots[1].sum) / time.Duration(n)
}

func (l *loadTracker) inflightReads() int64 { return l.inflight.Load() }

// estimatedWait is how long a new read may expect to take: the recent read
// latency grown by the queue of reads already in flight per CPU.
func (l *loadTracker) estimatedWait(now time.Time) time.Duration {
	n := max(l.inflight.Load(), 0)
	lat := float64(l.recentLatency(now))
	return time.Duration(lat * (1 + float64(n)/float64(runtime.GOMAXPROCS(0))))
}

func (l *loadTracker) load() *kvpb.Load {
	n := max(l.inflight.Load(), 0)
	return &kvpb.Load{
		InflightReads: uint32(min(n, math.MaxUint32)),
		EstWaitUs:     uint64(l.estimatedWait(time.Now()) / time.Microsecond),
	}
}
