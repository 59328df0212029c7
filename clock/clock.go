// Package clock is the one seam through which a store reads the time and
// waits on it: Real in the binary, Manual in tests that step time
// themselves. It is kept to what the store uses (Now, tickers, timers), in
// the spirit of k8s.io/utils/clock and jonboulle/clockwork, so that a
// manual clock can honour every method exactly.
package clock

import "time"

// Clock tells the time and makes tickers and timers that follow it.
type Clock interface {
	Now() time.Time
	// NewTicker is time.NewTicker on this clock: a tick the reader has
	// not taken yet makes later ones drop, never queue.
	NewTicker(d time.Duration) Ticker
	// NewTimer is time.NewTimer on this clock.
	NewTimer(d time.Duration) Timer
}

// Ticker is the part of *time.Ticker a store uses.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Timer is the part of *time.Timer a store uses.
type Timer interface {
	C() <-chan time.Time
	// Stop reports whether it stopped the timer before it fired.
	Stop() bool
}

// Real is the operating system's clock, over package time.
type Real struct{}

// Now is time.Now.
func (Real) Now() time.Time { return time.Now() }

// NewTicker is time.NewTicker.
func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

// NewTimer is time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }
