package bench

// The open-loop read driver (a fixed rate, a goroutine per read) and the
// percentile plot that both fault scenarios, hedge-tail and
// overloaded-replica, use.

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"

	"github.com/hedgekv/hedgekv/client"
)

// An open-loop read driver for hedge-tail and overloaded-replica. Reads are
// sent at a fixed rate whatever the answers do, each in its own goroutine:
// a closed loop (go-ycsb's threads) would stop sending while a store is
// paused, so a pause would touch one read per thread and the tail would
// depend on the thread count rather than on the pause (coordinated
// omission). Here the fraction of reads a pause touches is its share of
// the run's time.

// openLoopSpec is one open-loop run.
type openLoopSpec struct {
	Rate     float64       // reads per second, evenly spaced
	Duration time.Duration // how long reads are started
	Timeout  time.Duration // per read
	// Read performs read i.
	Read func(ctx context.Context, i int64) (client.ReadInfo, error)
	// OnProgress gets the reads done and failed so far, every 100ms.
	OnProgress func(done, failed int64)
}

// openLoopResult is what an open-loop run measured.
type openLoopResult struct {
	// Latency of the successful reads, µs, from the moment each was
	// started.
	Latency    *hdrhistogram.Histogram
	OK, Failed int64
	// Elapsed runs from the first read's start to the last read's end.
	Elapsed time.Duration
	// ByStore counts successful reads by the store that answered.
	ByStore  map[uint64]int64
	FirstErr string
	// MaxLag is how far the sender fell behind its schedule (CPU
	// starvation would show here).
	MaxLag time.Duration
}

// runOpenLoop sends s.Rate reads per second for s.Duration and waits for
// them all. A read cut short by ctx counts as neither ok nor failed.
func runOpenLoop(ctx context.Context, s openLoopSpec) *openLoopResult {
	res := &openLoopResult{Latency: newHist(), ByStore: map[uint64]int64{}}
	if s.Rate <= 0 || s.Duration <= 0 {
		return res
	}
	interval := time.Duration(float64(time.Second) / s.Rate)
	n := int64(s.Duration / interval)
	var (
		mu         sync.Mutex
		wg         sync.WaitGroup
		ok, failed atomic.Int64
	)
	stopProg := make(chan struct{})
	var progWG sync.WaitGroup
	reportProgress(&progWG, stopProg, &ok, &failed, s.OnProgress)
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		} else {
			res.MaxLag = max(res.MaxLag, -d)
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, s.Timeout)
			defer cancel()
			begin := time.Now()
			info, err := s.Read(rctx, i)
			lat := time.Since(begin)
			if err != nil && ctx.Err() != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed.Add(1)
				if res.FirstErr == "" {
					res.FirstErr = err.Error()
				}
				return
			}
			ok.Add(1)
			recordLatency(res.Latency, lat)
			res.ByStore[info.StoreID]++
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	close(stopProg)
	progWG.Wait()
	res.OK, res.Failed = ok.Load(), failed.Load()
	if s.OnProgress != nil {
		s.OnProgress(res.OK+res.Failed, res.Failed)
	}
	return res
}

// row turns the run into a results row (with p95).
func (r *openLoopResult) row(variant, param string) Row {
	row := latencyRow(variant, param, r.Latency, r.OK, r.Failed, r.Elapsed)
	row.P95Ms = ptr(quantileMs(r.Latency, 95))
	return row
}

// shares is the fraction of successful reads each store answered.
func (r *openLoopResult) shares() map[uint64]float64 {
	out := map[uint64]float64{}
	if r.OK == 0 {
		return out
	}
	for id, n := range r.ByStore {
		out[id] = float64(n) / float64(r.OK)
	}
	return out
}

// fmtShares renders shares as "store 1 33%, store 2 33%, store 3 34%".
func fmtShares(shares map[uint64]float64, stores []uint64) string {
	ids := slices.Sorted(maps.Keys(shares))
	for _, id := range stores {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var parts []string
	for _, id := range ids {
		parts = append(parts, fmt.Sprintf("store %d %.1f%%", id, 100*shares[id]))
	}
	return strings.Join(parts, ", ")
}

// percentilePlot draws latency against percentile, the tail stretched out:
// x is -log10(1-q), so p90, p99, p99.9 and p99.99 are evenly spaced (a
// CDF's tail is a vertical line at the top of its plot).
func percentilePlot(dir, file, title string, names []string, hists []*hdrhistogram.Histogram, labels []string) (string, error) {
	p := newPlot(title, "percentile", "latency (ms, log scale)")
	var ss []series
	lo, hi := math.Inf(1), 0.0
	const maxNines = 4.3 // just past p99.99
	for i, h := range hists {
		if h == nil || h.TotalCount() == 0 {
			continue
		}
		var xys plotter.XYs
		// From p50: below it the lines say nothing about tails.
		for x := math.Log10(2); x <= maxNines+1e-9; x += 0.05 {
			q := 100 * (1 - math.Pow(10, -x))
			v := max(float64(h.ValueAtQuantile(q))/1000, 0.001)
			xys = append(xys, plotter.XY{X: x, Y: v})
			lo, hi = min(lo, v), max(hi, v)
		}
		ss = append(ss, series{name: labels[i], xys: xys})
	}
	if len(ss) == 0 {
		return "", nil
	}
	logAxis(&p.Y, lo, hi)
	p.X.Min, p.X.Max = math.Log10(2), maxNines
	p.X.Tick.Marker = plot.ConstantTicks([]plot.Tick{
		{Value: math.Log10(2), Label: "p50"}, {Value: 1, Label: "p90"}, {Value: 2, Label: "p99"},
		{Value: 3, Label: "p99.9"}, {Value: 4, Label: "p99.99"},
	})
	if err := addSeries(p, names, ss, false); err != nil {
		return "", err
	}
	return savePlot(p, dir, file)
}
