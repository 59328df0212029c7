package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/hedgekv/hedgekv/region"
)

// Hedging: a read that has not been answered within the hedge delay is sent
// again to another replica; the first good answer wins and the other
// attempt is cancelled through its context. Only reads (Get, BatchGet,
// Scan) are hedged, never writes. A budget per session and store
// (budget.go) caps the extra requests at ReadPolicy.HedgeBudget of the
// primaries over a sliding window of seconds.

const (
	// DefaultHedgeBudget is the share of primaries that may be hedged
	// (over the budget's window, DefaultHedgeWindow) when
	// ReadPolicy.HedgeBudget is zero.
	DefaultHedgeBudget = 0.05
	// DefaultHedgeMaxAttempts is how many attempts of one read may be in
	// flight at once (the primary and one hedge) when
	// ReadPolicy.HedgeMaxAttempts is zero.
	DefaultHedgeMaxAttempts = 2

	// Latency window per store for percentile hedges: hedgeWindows
	// histograms, the oldest replaced every hedgeRotateEvery, so the
	// percentiles describe the last 6–8 seconds.
	hedgeWindows     = 4
	hedgeRotateEvery = 2 * time.Second
	// hedgeMinSamples is how many reads a store must have answered in the
	// window before its percentile is believed; until then the delay is
	// defaultHedgeDelay.
	hedgeMinSamples   = 20
	defaultHedgeDelay = 10 * time.Millisecond
	// hedgeMergeEvery bounds how often the window's histograms are merged
	// to answer a percentile (merging on every read would cost more than
	// the read).
	hedgeMergeEvery = 100 * time.Millisecond
	// Histogram range, in microseconds: 1µs to 1 minute, 2 significant
	// figures.
	hedgeHistMax = int64(time.Minute / time.Microsecond)
)

type hedgeKind uint8

const (
	hedgeOff hedgeKind = iota
	hedgeFixed
	hedgePercentile
	hedgeMinOf // min(percentile, delay)
	hedgeMaxOf // max(percentile, delay)
)

// Hedge says when a read is hedged: never (HedgeOff), after a fixed delay,
// after a percentile of the recent latency of the store the primary went
// to, or the min or max of the two (Cassandra's hybrids). The zero value is
// HedgeOff.
type Hedge struct {
	kind  hedgeKind
	q     float64       // percentile, in (0,1)
	delay time.Duration // fixed delay, > 0
}

// HedgeOff never hedges.
var HedgeOff = Hedge{}

// HedgeAfter hedges a read not answered within d. A d <= 0 is HedgeOff.
func HedgeAfter(d time.Duration) Hedge {
	if d <= 0 {
		return HedgeOff
	}
	return Hedge{kind: hedgeFixed, delay: d}
}

// HedgeAfterPercentile hedges a read not answered within the q-quantile
// (0.99 for p99) of the recent read latency of the store it went to. A q
// outside (0,1) is HedgeOff.
func HedgeAfterPercentile(q float64) Hedge {
	if !(q > 0 && q < 1) {
		return HedgeOff
	}
	return Hedge{kind: hedgePercentile, q: q}
}

// HedgeMin hedges after min(the q-quantile, d): "min(p99,50ms)".
func HedgeMin(q float64, d time.Duration) Hedge {
	if !(q > 0 && q < 1) || d <= 0 {
		return HedgeOff
	}
	return Hedge{kind: hedgeMinOf, q: q, delay: d}
}

// HedgeMax hedges after max(the q-quantile, d): "max(p99,5ms)".
func HedgeMax(q float64, d time.Duration) Hedge {
	if !(q > 0 && q < 1) || d <= 0 {
		return HedgeOff
	}
	return Hedge{kind: hedgeMaxOf, q: q, delay: d}
}

// Off reports whether h never hedges.
func (h Hedge) Off() bool { return h.kind == hedgeOff }

// String returns the form ParseHedge accepts: off, 10ms, p99, p999,
// min(p99,50ms), max(p99,5ms).
func (h Hedge) String() string {
	switch h.kind {
	case hedgeFixed:
		return h.delay.String()
	case hedgePercentile:
		return percentileString(h.q)
	case hedgeMinOf:
		return fmt.Sprintf("min(%s,%s)", percentileString(h.q), h.delay)
	case hedgeMaxOf:
		return fmt.Sprintf("max(%s,%s)", percentileString(h.q), h.delay)
	}
	return "off"
}

// delayFor is the hedge delay of a read whose primary went to a store with
// this latency window.
func (h Hedge) delayFor(w *latencyWindow) time.Duration {
	switch h.kind {
	case hedgeFixed:
		return h.delay
	case hedgePercentile:
		return w.quantile(h.q, time.Now())
	case hedgeMinOf:
		return min(w.quantile(h.q, time.Now()), h.delay)
	case hedgeMaxOf:
		return max(w.quantile(h.q, time.Now()), h.delay)
	}
	return 0
}

func percentileString(q float64) string {
	for k := 3; k <= 6; k++ {
		if math.Abs(q-(1-math.Pow10(-k))) < 1e-12 {
			return "p" + strings.Repeat("9", k)
		}
	}
	return "p" + strconv.FormatFloat(math.Round(q*1e8)/1e6, 'f', -1, 64)
}

var (
	hedgePctRE    = regexp.MustCompile(`^p(\d+)(\.\d+)?$`)
	hedgeHybridRE = regexp.MustCompile(`^(min|max)\(\s*([^,\s]+)\s*,\s*([^,\s)]+)\s*\)$`)
)

// ParseHedge parses a hedge policy: "off"; a positive duration ("10ms");
// a percentile ("p90", "p99", "p999" = 0.999, "p99.9" = 0.999); or a
// hybrid "min(p99,50ms)" / "max(p99,5ms)". Errors are one line.
func ParseHedge(s string) (Hedge, error) {
	s = strings.TrimSpace(s)
	if s == "off" {
		return HedgeOff, nil
	}
	if m := hedgeHybridRE.FindStringSubmatch(s); m != nil {
		q, err := parsePercentile(m[2])
		if err != nil {
			return HedgeOff, fmt.Errorf("hedge %q: %v", s, err)
		}
		d, err := parseHedgeDelay(m[3])
		if err != nil {
			return HedgeOff, fmt.Errorf("hedge %q: %v", s, err)
		}
		if m[1] == "min" {
			return HedgeMin(q, d), nil
		}
		return HedgeMax(q, d), nil
	}
	if strings.HasPrefix(s, "p") {
		q, err := parsePercentile(s)
		if err != nil {
			return HedgeOff, fmt.Errorf("hedge %q: %v", s, err)
		}
		return HedgeAfterPercentile(q), nil
	}
	d, err := parseHedgeDelay(s)
	if err != nil {
		return HedgeOff, fmt.Errorf("hedge %q: want off, a positive duration (10ms), a percentile (p99) or min(p99,50ms) / max(p99,5ms)", s)
	}
	return HedgeAfter(d), nil
}

func parsePercentile(s string) (float64, error) {
	m := hedgePctRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not a percentile (want e.g. p90, p99, p999)", s)
	}
	var (
		q   float64
		err error
	)
	if m[2] == "" && len(m[1]) > 2 && strings.Trim(m[1], "9") == "" {
		// Three or more nines read as in p999 = 0.999, p9999 = 0.9999.
		q, err = strconv.ParseFloat("0."+m[1], 64)
	} else {
		q, err = strconv.ParseFloat(m[1]+m[2], 64)
		q /= 100
	}
	if err != nil || q <= 0 || q >= 1 {
		return 0, fmt.Errorf("percentile %s must be strictly between p0 and p100", s)
	}
	return q, nil
}

func parseHedgeDelay(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (want e.g. 10ms)", s)
	}
	if d <= 0 {
		return 0, fmt.Errorf("delay %s must be positive", s)
	}
	return d, nil
}

// ---- latency window -------------------------------------------------------

// latencyWindow is a sliding-window histogram of one store's read
// latencies, for percentile hedges.
type latencyWindow struct {
	mu       sync.Mutex
	w        *hdrhistogram.WindowedHistogram
	rotated  time.Time
	merged   *hdrhistogram.Histogram // w's merge as of mergedAt
	mergedAt time.Time
}

func (l *latencyWindow) rotateLocked(now time.Time) {
	if l.w == nil {
		l.w = hdrhistogram.NewWindowed(hedgeWindows, 1, hedgeHistMax, 2)
		l.rotated = now
		return
	}
	for n := 0; now.Sub(l.rotated) >= hedgeRotateEvery; n++ {
		if n >= hedgeWindows {
			l.rotated = now
			break
		}
		l.w.Rotate()
		l.rotated = l.rotated.Add(hedgeRotateEvery)
		l.merged = nil
	}
}

// record adds one read latency.
func (l *latencyWindow) record(d time.Duration, now time.Time) {
	us := max(int64(d/time.Microsecond), 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rotateLocked(now)
	_ = l.w.Current.RecordValue(min(us, hedgeHistMax))
}

// quantile returns the q-quantile of the window, or defaultHedgeDelay
// while the window holds fewer than hedgeMinSamples reads.
func (l *latencyWindow) quantile(q float64, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rotateLocked(now)
	if l.merged == nil || now.Sub(l.mergedAt) >= hedgeMergeEvery {
		l.merged = l.w.Merge()
		l.mergedAt = now
	}
	if l.merged.TotalCount() < hedgeMinSamples {
		return defaultHedgeDelay
	}
	return time.Duration(l.merged.ValueAtQuantile(q*100)) * time.Microsecond
}

// ---- stats ----------------------------------------------------------------

// HedgeStats counts a session's (or, from Client.HedgeStats, every
// session's) hedging.
type HedgeStats struct {
	// Primaries is the reads sent under a hedging policy (first attempts of
	// each try; retries after a region error count again).
	Primaries uint64
	// HedgesSent is the backup requests sent; HedgesWon those that answered
	// first.
	HedgesSent, HedgesWon uint64
	// DeniedByBudget is the hedges due but not sent because the budget
	// was spent.
	DeniedByBudget uint64
}

// ExtraRequestRatio is HedgesSent / Primaries (0 without primaries).
func (s HedgeStats) ExtraRequestRatio() float64 {
	if s.Primaries == 0 {
		return 0
	}
	return float64(s.HedgesSent) / float64(s.Primaries)
}

type hedgeCounters struct {
	primaries, sent, won, denied atomic.Uint64
}

func (c *hedgeCounters) snapshot() HedgeStats {
	return HedgeStats{Primaries: c.primaries.Load(), HedgesSent: c.sent.Load(), HedgesWon: c.won.Load(), DeniedByBudget: c.denied.Load()}
}

// hedger is a session's hedging state; nil for a session that never hedges.
type hedger struct {
	policy      Hedge
	maxAttempts int
	budget      hedgeAccounts // per store of the primary
	stats       hedgeCounters
	all         *hedgeCounters // the client's aggregate
	// now is the budget's clock: time.Now (tests use a fake one).
	now func() time.Time
}

func newHedger(p ReadPolicy, all *hedgeCounters) *hedger {
	n := p.HedgeMaxAttempts
	if n <= 0 {
		n = DefaultHedgeMaxAttempts
	}
	return &hedger{policy: p.Hedge, maxAttempts: n, budget: hedgeAccounts{params: budgetParamsOf(p)}, all: all, now: time.Now}
}

func (h *hedger) count(f func(*hedgeCounters) *atomic.Uint64) {
	f(&h.stats).Add(1)
	f(h.all).Add(1)
}

// ---- the race -------------------------------------------------------------

// race sends primary, and after the hedge delay without an answer the same
// read to another replica (at most maxAttempts in flight, each hedge
// allowed by the budget account of the primary's store). The first success wins and the others are cancelled. A
// failed attempt ends the race only when no other is outstanding; the
// error returned then is the primary's if it failed, so the retry loop acts
// on it as on an unhedged attempt.
func (c *Client) race(ctx context.Context, req *regionRequest, loc cachedRegion, excluded storeSet, primary *attempt) (*attempt, error) {
	h := req.hedger
	h.count(func(s *hedgeCounters) *atomic.Uint64 { return &s.primaries })
	account := h.budget.get(primary.storeID)
	account.deposit(h.now())

	rctx, cancelAll := context.WithCancel(ctx)
	defer cancelAll()
	type outcome struct {
		a   *attempt
		err error
	}
	ch := make(chan outcome, h.maxAttempts)
	launch := func(a *attempt) {
		go func() { ch <- outcome{a, c.runAttempt(rctx, req, a)} }()
	}
	launch(primary)
	pending := 1
	tried := storeSet{primary.storeID: {}}
	delay := h.policy.delayFor(c.stats.get(primary.storeID).readWindow())
	// note is what the try tells ReadInfo.Hedge; req keeps the last
	// try's, which is the one that answered.
	note := HedgeInfo{Outcome: HedgeNotDue, Delay: delay, PrimaryStoreID: primary.storeID}
	defer func() { req.hedgeInfo = note }()
	// notSent records why a due hedge was not sent, unless one was sent
	// before (a third attempt refused does not undo the second's fate).
	notSent := func(why HedgeOutcome) {
		if note.StoreID == 0 {
			note.Outcome = why
		}
	}
	timer := time.NewTimer(delay)
	defer timer.Stop()
	timerC := timer.C
	var primaryErr, lastErr error
	var lastFailed *attempt
	for {
		select {
		case o := <-ch:
			pending--
			if o.err == nil {
				if o.a.hedge {
					h.count(func(s *hedgeCounters) *atomic.Uint64 { return &s.won })
					note.Outcome, note.StoreID = HedgeWonRace, o.a.storeID
				}
				return o.a, nil
			}
			if o.a == primary {
				primaryErr = o.err
			} else {
				c.noteHedgeFailure(ctx, o.a, o.err)
			}
			lastFailed, lastErr = o.a, o.err
			if pending == 0 {
				if primaryErr != nil {
					return primary, primaryErr
				}
				return lastFailed, lastErr
			}
		case <-timerC:
			timerC = nil
			if pending >= h.maxAttempts {
				notSent(HedgeAtLimit)
				continue
			}
			a, why := c.hedgeAttempt(req, loc, excluded, tried, account)
			if a == nil {
				notSent(why)
				continue
			}
			note.Outcome, note.StoreID = HedgeLost, a.storeID // until it wins
			tried[a.storeID] = struct{}{}
			h.count(func(s *hedgeCounters) *atomic.Uint64 { return &s.sent })
			c.log.Debug("hedging", "op", req.op, "region", loc.ID, "primary", primary.storeID, "hedge", a.storeID, "after", delay)
			launch(a)
			pending++
			if pending < h.maxAttempts {
				timer.Reset(delay)
				timerC = timer.C
			}
		case <-ctx.Done():
			return primary, ctx.Err()
		}
	}
}

// noteHedgeFailure remembers what the store of a failed hedge said, so the
// selector avoids it: the retry loop sees only the primary's error.
func (c *Client) noteHedgeFailure(ctx context.Context, a *attempt, err error) {
	var sb *region.ServerIsBusyError
	switch {
	case errors.As(err, &sb):
		c.stats.get(a.storeID).observeBusy(sb.EstimatedWait)
	case isUnreachable(ctx, err):
		c.stats.get(a.storeID).markFailure()
	}
}

// hedgeAttempt is the backup attempt of the race: a replica read at a
// replica neither excluded nor tried yet, its store known, and the hedge
// allowed by account; nil, with the reason, if there is none or the budget
// denies it.
func (c *Client) hedgeAttempt(req *regionRequest, loc cachedRegion, excluded, tried storeSet, account *hedgeBudget) (*attempt, HedgeOutcome) {
	h := req.hedger
	ex := storeSet{}
	for id := range excluded {
		ex[id] = struct{}{}
	}
	for id := range tried {
		ex[id] = struct{}{}
	}
	sel, ok := c.selector.pick(&loc, ReplicaMixed, false, ex)
	if !ok {
		return nil, HedgeNoReplica // no other replica: nothing to hedge to
	}
	st, ok := c.cache.store(sel.peer.StoreID)
	if !ok {
		return nil, HedgeNoReplica
	}
	if !account.withdraw(h.now()) {
		h.count(func(s *hedgeCounters) *atomic.Uint64 { return &s.denied })
		return nil, HedgeDenied
	}
	a := newAttempt(req, loc, sel.peer, true)
	a.hedge = true
	a.addr = st.addr
	return a, ""
}
