package server

import (
	"math"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/server/pb"
)

// loadTracker measures what every KV answer reports in pb.Load: how many
// reads this server is serving and how long a new one may expect to take.
// Clients compare these across replicas (power of two choices), so the
// numbers only need to be cheap and comparable, not exact.
type loadTracker struct {
	inflight atomic.Int64
	// ewmaNanos is an exponentially weighted moving average of read
	// latency; it carries a stalled store's slowness even to a client that
	// has no read of its own in flight there.
	ewmaNanos atomic.Int64
}

// ewmaWeight is the weight of the newest sample: about the last ten reads
// dominate, so the estimate follows a stall within a few requests.
const ewmaWeight = 0.1

func (l *loadTracker) begin() time.Time {
	l.inflight.Add(1)
	return time.Now()
}

func (l *loadTracker) end(start time.Time) {
	l.inflight.Add(-1)
	sample := float64(time.Since(start))
	for {
		old := l.ewmaNanos.Load()
		next := int64(sample)
		if old != 0 {
			next = int64(float64(old) + ewmaWeight*(sample-float64(old)))
		}
		if l.ewmaNanos.CompareAndSwap(old, next) {
			return
		}
	}
}

func (l *loadTracker) inflightReads() int64 { return l.inflight.Load() }

// load estimates the wait of a new read as the recent read latency, grown by
// the queue of reads already in flight per CPU.
func (l *loadTracker) load() *pb.Load {
	n := max(l.inflight.Load(), 0)
	ewma := float64(l.ewmaNanos.Load())
	wait := ewma * (1 + float64(n)/float64(runtime.GOMAXPROCS(0)))
	return &pb.Load{
		InflightReads: uint32(min(n, math.MaxUint32)),
		EstWaitUs:     uint64(wait / float64(time.Microsecond)),
	}
}
