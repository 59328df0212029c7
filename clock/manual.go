package clock

import (
	"slices"
	"sync"
	"time"
)

// Manual is a clock that moves only when told (Advance), so a test decides
// when a store ticks and when a lease or a staleness bound runs out. Its
// tickers and timers fire inside Advance, in the order they fall due, each
// at its own time; a ticker whose last tick was not taken drops the next,
// as a *time.Ticker does. It is safe for concurrent use.
type Manual struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*waiter // armed tickers and timers
}

// NewManual returns a manual clock that reads start until advanced.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

// waiter is one armed ticker (period > 0) or timer.
type waiter struct {
	m      *Manual
	when   time.Time
	period time.Duration
	c      chan time.Time
}

// Now is the clock's time: start plus everything Advance added.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// NewTicker ticks every d of this clock's time, from now.
func (m *Manual) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker") // as time.NewTicker
	}
	return manualTicker{m.arm(d, d)}
}

// NewTimer fires once, d from now (at once, on the next Advance, if d <= 0).
func (m *Manual) NewTimer(d time.Duration) Timer { return m.arm(d, 0) }

func (m *Manual) arm(d, period time.Duration) *waiter {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := &waiter{m: m, when: m.now.Add(d), period: period, c: make(chan time.Time, 1)}
	m.waiters = append(m.waiters, w)
	return w
}

// Advance moves the clock d forward, firing every ticker and timer that
// falls due on the way, earliest first; Now reads each one's time while it
// fires. It returns once all have fired; their readers take the ticks in
// their own time.
func (m *Manual) Advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	end := m.now.Add(d)
	for {
		i := m.nextDueLocked(end)
		if i < 0 {
			break
		}
		w := m.waiters[i]
		m.now = w.when
		select {
		case w.c <- w.when:
		default: // the last tick is still unread: drop this one, as time does
		}
		if w.period > 0 {
			w.when = w.when.Add(w.period)
		} else {
			m.waiters = slices.Delete(m.waiters, i, i+1)
		}
	}
	m.now = end
}

// nextDueLocked is the index of the earliest waiter due by end (the first
// armed among equals, so firing order is deterministic), or -1.
func (m *Manual) nextDueLocked(end time.Time) int {
	best := -1
	for i, w := range m.waiters {
		if w.when.After(end) {
			continue
		}
		if best < 0 || w.when.Before(m.waiters[best].when) {
			best = i
		}
	}
	return best
}

// Waiters is how many tickers and timers are armed: a test that must
// advance only once a goroutine waits can poll it.
func (m *Manual) Waiters() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.waiters)
}

func (w *waiter) C() <-chan time.Time { return w.c }

// manualTicker is a waiter with time.Ticker's Stop.
type manualTicker struct{ *waiter }

func (t manualTicker) Stop() { t.waiter.Stop() }

// Stop disarms the ticker or timer; it reports whether it was still armed.
func (w *waiter) Stop() bool {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	i := slices.Index(w.m.waiters, w)
	if i < 0 {
		return false
	}
	w.m.waiters = slices.Delete(w.m.waiters, i, i+1)
	return true
}
