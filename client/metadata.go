package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
)

// Metadata calls (the store list, the region holding a key, every region)
// are hedged like reads: one store that does not answer (cut off by a
// partition, stalled) must not hold up a client while others can answer.
// A call goes to the first target at once, to the next one when the first
// has not answered within its hedge delay (metaDelay) or has failed, and
// so on; the first good answer wins and the others are cancelled. A store
// that fails, or stays silent past its hedge delay while another answers,
// is remembered (see metaStats): later calls ask it last until its
// back-off ends, so a cut-off store costs one hedge delay per back-off
// rather than one per call.
const (
	// metaHedgeDelay is how long a metadata call waits for a store it has
	// not measured (or that answered slowly) before asking the next one
	// too. A first call on a new connection across a 28 ms WAN takes two
	// round trips (HTTP/2 preface, then the call).
	metaHedgeDelay = 100 * time.Millisecond
	// metaHedgeMin is the shortest hedge delay, for a store that answers
	// in well under a millisecond.
	metaHedgeMin = 20 * time.Millisecond
	// gatherGrace is how long a fan-out to every store (gatherRegions)
	// waits for the others once one has answered, at the least: enough for
	// a healthy store across a WAN or on a loaded machine, not the whole
	// DialTimeout of one that will never answer.
	gatherGrace = 500 * time.Millisecond
)

// metaStats is what metadata calls observe about each address they send
// to: latency (for the hedge delay) and the back-off after a failure,
// with storeStats' rules. It is kept by address, apart from the read
// path's per-store stats, because a store that is merely slower than the
// hedge delay on one metadata call should be asked later, not have its
// reads avoided; a store that failed outright is marked in both.
type metaStats struct {
	m sync.Map // address -> *storeStats
}

func (t *metaStats) get(addr string) *storeStats {
	if s, ok := t.m.Load(addr); ok {
		return s.(*storeStats)
	}
	s, _ := t.m.LoadOrStore(addr, &storeStats{})
	return s.(*storeStats)
}

// metaDelay is the hedge delay of a metadata call sent to addr: three
// times what it took lately, within [metaHedgeMin, metaHedgeDelay].
func (c *Client) metaDelay(addr string) time.Duration {
	lat, measured := c.meta.get(addr).latency()
	if !measured {
		return metaHedgeDelay
	}
	return min(max(3*lat, metaHedgeMin), metaHedgeDelay)
}

// avoided reports an address in its back-off after a failure, as a
// metadata target (metaStats) or as a store on the read path.
func (c *Client) avoided(addr string) bool {
	if c.meta.get(addr).failedRecently() {
		return true
	}
	id, ok := c.cache.storeAt(addr)
	return ok && c.stats.get(id).failedRecently()
}

// orderTargets sorts admin targets for a metadata call, stably: the
// client's own zone's store first (no WAN round trip), then the others in
// the order given, and every address in its back-off last.
func (c *Client) orderTargets(targets []string) []string {
	rank := make(map[string]int, len(targets))
	for _, addr := range targets {
		r := 1
		if id, ok := c.cache.storeAt(addr); ok && c.cfg.Zone != "" && c.cache.zoneOf(id) == c.cfg.Zone {
			r = 0
		}
		if c.avoided(addr) {
			r += 2
		}
		rank[addr] = r
	}
	slices.SortStableFunc(targets, func(a, b string) int { return cmp.Compare(rank[a], rank[b]) })
	return targets
}

// markUnreachable remembers that addr failed a metadata call the way an
// unreachable store does (Unavailable, timed out): in metaStats and, when
// addr is a known store, in the read path's back-off too.
func (c *Client) markUnreachable(addr string) {
	c.meta.get(addr).markFailure()
	if id, ok := c.cache.storeAt(addr); ok {
		c.stats.get(id).markFailure()
	}
}

// noAnswer is what a metadata call's fn returns for an answer that is no
// answer: a live store that knows nothing of what was asked (it hosts no
// region holding the key, e.g. it has not applied a split yet). The call
// asks another store at once; when none answers better, its error wraps
// errNoRegion, which the request loop retries within its deadline.
type noAnswer struct{ err error }

func (e noAnswer) Error() string { return e.err.Error() }
func (e noAnswer) Unwrap() error { return e.err }

// adminCall runs fn against the admin targets until one succeeds. With
// hedge it is a hedged call (see the top of this file); without, for calls
// that change something, one store at a time, each given DialTimeout. A
// finalError ends the call at once; the endpoint that answered is tried
// first next time.
func adminCall[T any](c *Client, ctx context.Context, what string, hedge bool, fn func(ctx context.Context, a kvpb.AdminClient) (T, error)) (T, error) {
	var zero T
	targets := c.orderTargets(c.adminTargets())
	if len(targets) == 0 {
		return zero, fmt.Errorf("%s: %w", what, errNoStore)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answers := make(chan adminAnswer[T], len(targets))
	began := make(map[string]time.Time, len(targets)) // attempts in flight
	next := 0
	hedgeTimer := time.NewTimer(time.Hour)
	defer hedgeTimer.Stop()
	var hedgeC <-chan time.Time
	armHedge := func() {
		hedgeC = nil
		if hedge && next < len(targets) {
			hedgeTimer.Reset(c.metaDelay(targets[next-1]))
			hedgeC = hedgeTimer.C
		}
	}
	// launch asks the next target, then arms the hedge for the one after.
	launch := func() error {
		addr := targets[next]
		next++
		stub, err := c.conns.admin(addr)
		if err != nil {
			return err
		}
		began[addr] = time.Now()
		go askAdmin(c, ctx, addr, stub, c.meta.get(addr), fn, answers)
		armHedge()
		return nil
	}
	var (
		errs     []error
		noRegion bool
		// settleC fires once every target has been asked, some said they
		// know nothing, and the ones still silent have had gatherGrace:
		// see below.
		settle  *time.Timer
		settleC <-chan time.Time
	)
	defer func() { stopTimer(settle) }()
	noRegionErr := func() error {
		return fmt.Errorf("%s: %w: %w", what, errNoRegion, errors.Join(errs...))
	}
	for {
		if len(began) == 0 {
			if next == len(targets) {
				if noRegion {
					return zero, noRegionErr()
				}
				return zero, fmt.Errorf("%s: no store answered: %w", what, errors.Join(errs...))
			}
			if err := launch(); err != nil {
				return zero, fmt.Errorf("%s: %w", what, err)
			}
		}
		select {
		case a := <-answers:
			delete(began, a.addr)
			if a.err == nil {
				c.demoteLosers(began)
				c.preferEndpoint(a.addr)
				return a.v, nil
			}
			if f, ok := errors.AsType[finalError](a.err); ok {
				return zero, fmt.Errorf("%s: %w", what, &storeError{addr: a.addr, err: f.err})
			}
			err, knowsNothing := c.adminFailure(ctx, a.addr, a.err)
			noRegion = noRegion || knowsNothing
			errs = append(errs, err)
			// Another store at once, rather than after the hedge delay.
			if next < len(targets) && ctx.Err() == nil {
				if err := launch(); err != nil {
					return zero, fmt.Errorf("%s: %w", what, err)
				}
			}
			// Every store asked, the ones that answered know nothing, the
			// rest silent: end after graceLeft.
			if next == len(targets) && noRegion && len(began) > 0 && settleC == nil {
				settle = time.NewTimer(graceLeft(began))
				settleC = settle.C
			}
		case <-settleC:
			for addr := range began {
				c.meta.get(addr).markFailure()
			}
			return zero, noRegionErr()
		case <-hedgeC:
			c.log.Debug("hedging metadata call", "what", what, "to", targets[next])
			if err := launch(); err != nil {
				return zero, fmt.Errorf("%s: %w", what, err)
			}
		case <-ctx.Done():
			return zero, fmt.Errorf("%s: no store answered in time: %w", what, errors.Join(append([]error{ctx.Err()}, errs...)...))
		}
	}
}

// adminAnswer is one store's answer to an admin call.
type adminAnswer[T any] struct {
	addr string
	v    T
	err  error
}

// askAdmin makes one attempt of an admin call at addr, given DialTimeout,
// and sends its answer to answers.
func askAdmin[T any](c *Client, ctx context.Context, addr string, stub kvpb.AdminClient, st *storeStats, fn func(ctx context.Context, a kvpb.AdminClient) (T, error), answers chan<- adminAnswer[T]) {
	actx, acancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer acancel()
	done := st.start()
	v, err := fn(actx, stub)
	// A store that said it knows nothing is alive all the same.
	done(err == nil || (ctx.Err() == nil && !isUnreachable(ctx, err)), nil)
	answers <- adminAnswer[T]{addr, v, err}
}

// demoteLosers: whoever is still silent past its hedge delay (began says
// since when) lost to a store asked after it: ask it last for a while.
func (c *Client) demoteLosers(began map[string]time.Time) {
	for addr, t := range began {
		if time.Since(t) >= c.metaDelay(addr) {
			c.meta.get(addr).markFailure()
		}
	}
}

// adminFailure is the failed answer of addr as a storeError, and whether
// it said it knows nothing (noAnswer); an unreachable store is marked so.
func (c *Client) adminFailure(ctx context.Context, addr string, err error) (_ error, knowsNothing bool) {
	if na, ok := errors.AsType[noAnswer](err); ok {
		knowsNothing, err = true, na.err
	} else if isUnreachable(ctx, err) {
		c.markUnreachable(addr)
	}
	return &storeError{addr: addr, err: err}, knowsNothing
}

// graceLeft is how long until every store still silent (began says since
// when each was asked) has had gatherGrace. When every store was asked, the
// ones that answered know nothing (they have not applied a split yet), and
// the rest are silent (perhaps the one store that does know, stalled or cut
// off), waiting for them up to DialTimeout would hold the request that
// long; once each has had gatherGrace (enough for a healthy store on a
// loaded machine), adminCall ends with errNoRegion and the request retries
// after a back-off, with the silent ones asked last.
func graceLeft(began map[string]time.Time) time.Duration {
	var wait time.Duration
	for _, t := range began {
		wait = max(wait, gatherGrace-time.Since(t))
	}
	return max(wait, 0)
}

// stopTimer stops t, if there is one.
func stopTimer(t *time.Timer) {
	if t != nil {
		t.Stop()
	}
}
