package client

import (
	"sync"
	"time"
)

// The hedge budget: a share of the reads over a sliding window of time,
// after Finagle's RetryBudget. Each read deposits share of a token in the
// account of the store its primary went to; the token expires a window
// after it was deposited (the window is cut into budgetSlices slices, so a
// deposit expires between window·(n-1)/n and window after it was made). A
// hedge of that read spends one token, the oldest first. A pause of up to
// share · window (0.5 s at 5% and 10 s) is therefore hedged in full from
// what the seconds before it deposited, while a store that stays slow,
// once that is spent, gets share of its reads hedged, evenly: a spent
// token is gone, so nothing comes back when the window moves on (in
// Finagle's RetryBudget withdrawals expire too, so a store that stays slow
// gets a window's worth of retries in a burst once per window).
//
// The floor: while fewer than minPerSec · window hedges were sent in the
// window, a hedge the tokens cannot pay for is advanced, and the next
// deposits repay the advance before they save anything; an advance not
// repaid within the window is forgiven. So a quiet session (a CLI get, a
// few reads a second) may hedge minPerSec a second, and a session that
// reads faster than minPerSec / share reads a second is held to share
// exactly: the floor is a floor, as Envoy's min_retry_concurrency is, not
// an allowance on top of the share as in Finagle. HedgeBudget thus keeps
// meaning "at most this share of the reads".

const (
	// DefaultHedgeWindow is how long a read's deposit counts when
	// ReadPolicy.HedgeWindow is zero (Finagle's default TTL).
	DefaultHedgeWindow = 10 * time.Second
	// DefaultHedgeMinPerSecond is the budget's floor, in hedges per
	// second over the window, when ReadPolicy.HedgeMinPerSecond is zero:
	// 10 hedges per 10 s window, whatever the read rate.
	DefaultHedgeMinPerSecond = 1.0

	// budgetSlices is how many slices the window is cut into.
	budgetSlices = 10
	// minHedgeWindow bounds the window from below (a window shorter than a
	// pause could not pay for it).
	minHedgeWindow = 100 * time.Millisecond
)

// budgetParams are a session's budget settings, defaults applied.
type budgetParams struct {
	share     float64       // <= 0: never; >= 1: no cap
	window    time.Duration // > 0
	minPerSec float64       // >= 0
}

func budgetParamsOf(p ReadPolicy) budgetParams {
	b := budgetParams{share: p.HedgeBudget, window: p.HedgeWindow, minPerSec: p.HedgeMinPerSecond}
	switch {
	case b.share == 0:
		b.share = DefaultHedgeBudget
	case b.share < 0:
		b.share = 0
	case b.share > 1:
		b.share = 1
	}
	if b.window <= 0 {
		b.window = DefaultHedgeWindow
	}
	b.window = max(b.window, minHedgeWindow)
	switch {
	case b.minPerSec == 0:
		b.minPerSec = DefaultHedgeMinPerSecond
	case b.minPerSec < 0:
		b.minPerSec = 0
	}
	return b
}

// hedgeBudget is one account. Safe for concurrent use.
type hedgeBudget struct {
	share float64
	floor float64 // minPerSec · window, in hedges
	slice time.Duration

	mu    sync.Mutex
	epoch time.Time // slice k covers [epoch + k·slice, epoch + (k+1)·slice)
	cur   int64     // the newest slice held; -1 before the first call
	// Per slice (index k mod budgetSlices): the tokens deposited in it and
	// not yet spent, the hedges sent in it, and the floor's advances made
	// in it and not yet repaid.
	tokens [budgetSlices]float64
	hedges [budgetSlices]int64
	owed   [budgetSlices]float64
}

func newHedgeBudget(p budgetParams) *hedgeBudget {
	return &hedgeBudget{
		share: p.share,
		floor: p.minPerSec * p.window.Seconds(),
		slice: p.window / budgetSlices,
		cur:   -1,
	}
}

// unlimited: a share of 1 or more never refuses (every read may be hedged
// once per try).
func (b *hedgeBudget) unlimited() bool { return b.share >= 1 }

// advanceLocked moves the window to now, dropping the slices that left it
// (their unspent tokens expire, their advances are forgiven). A clock that
// went back counts as the newest slice.
func (b *hedgeBudget) advanceLocked(now time.Time) {
	if b.cur < 0 {
		b.epoch, b.cur = now, 0
		return
	}
	k := int64(now.Sub(b.epoch) / b.slice)
	if k <= b.cur {
		return
	}
	for s := b.cur + 1; s <= k && s <= b.cur+budgetSlices; s++ {
		i := s % budgetSlices
		b.tokens[i], b.hedges[i], b.owed[i] = 0, 0, 0
	}
	b.cur = k
}

// oldestFirst calls f with each slice's index, oldest first, until f
// returns false.
func (b *hedgeBudget) oldestFirst(f func(i int) bool) {
	for s := b.cur - budgetSlices + 1; s <= b.cur; s++ {
		if s >= 0 && !f(int(s%budgetSlices)) {
			return
		}
	}
}

// deposit counts one read (a primary): share of a token, which first
// repays what the floor advanced.
func (b *hedgeBudget) deposit(now time.Time) {
	if b.share <= 0 || b.unlimited() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advanceLocked(now)
	amount := b.share
	b.oldestFirst(func(i int) bool {
		pay := min(amount, b.owed[i])
		b.owed[i] -= pay
		amount -= pay
		return amount > 0
	})
	b.tokens[b.cur%budgetSlices] += amount
}

// withdraw reports whether a hedge may be sent now, and pays for it if so.
func (b *hedgeBudget) withdraw(now time.Time) bool {
	if b.share <= 0 {
		return false
	}
	if b.unlimited() {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advanceLocked(now)
	tokens, hedges := b.sumsLocked()
	const eps = 1e-9 // 20 deposits of 0.05 make a token
	switch {
	case tokens >= 1-eps:
		b.spendLocked(1)
	case float64(hedges) < b.floor:
		b.spendLocked(tokens)
		b.owed[b.cur%budgetSlices] += 1 - tokens
	default:
		return false
	}
	b.hedges[b.cur%budgetSlices]++
	return true
}

func (b *hedgeBudget) spendLocked(amount float64) {
	b.oldestFirst(func(i int) bool {
		take := min(amount, b.tokens[i])
		b.tokens[i] -= take
		amount -= take
		return amount > 1e-12
	})
}

func (b *hedgeBudget) sumsLocked() (tokens float64, hedges int64) {
	for i := range budgetSlices {
		tokens += b.tokens[i]
		hedges += b.hedges[i]
	}
	return tokens, hedges
}

// balance is the account's tokens now, less what the floor advanced and
// the deposits have not repaid yet. For tests and logs.
func (b *hedgeBudget) balance(now time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advanceLocked(now)
	tokens, _ := b.sumsLocked()
	for _, o := range b.owed {
		tokens -= o
	}
	return tokens
}

// hedgeAccounts are a session's budget accounts, one per store its
// primaries go to: hedging away from one slow store spends only what the
// reads sent to that store deposited, so a store that stays slow cannot
// empty the budget a pause on another store needs.
type hedgeAccounts struct {
	params budgetParams
	mu     sync.Mutex
	byID   map[uint64]*hedgeBudget
}

func (a *hedgeAccounts) get(storeID uint64) *hedgeBudget {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.byID[storeID]
	if !ok {
		if a.byID == nil {
			a.byID = map[uint64]*hedgeBudget{}
		}
		b = newHedgeBudget(a.params)
		a.byID[storeID] = b
	}
	return b
}
