package client

import (
	"context"
	"testing"
	"time"
)

func near(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }

// withdrawN withdraws until refused or n granted; returns how many.
func withdrawN(b *hedgeBudget, now time.Time, n int) int {
	got := 0
	for got < n && b.withdraw(now) {
		got++
	}
	return got
}

func TestBudgetDepositsAndExpiry(t *testing.T) {
	clk := newFakeClock()
	b := newHedgeBudget(budgetParams{share: 0.05, window: 10 * time.Second}) // no floor
	// 19 reads at 5% are not a hedge; the 20th is.
	for range 19 {
		b.deposit(clk.now())
	}
	if b.withdraw(clk.now()) {
		t.Fatal("19 reads at 5% allowed a hedge")
	}
	b.deposit(clk.now())
	if !b.withdraw(clk.now()) {
		t.Fatal("20 reads at 5% allowed no hedge")
	}
	if b.withdraw(clk.now()) {
		t.Fatal("20 reads at 5% allowed two hedges")
	}

	// t=0: 980 more reads (1,000 in all: 50 hedges), 29 more hedges (30).
	b = newHedgeBudget(budgetParams{share: 0.05, window: 10 * time.Second})
	t0 := clk.now()
	for range 1000 {
		b.deposit(t0)
	}
	if n := withdrawN(b, t0, 30); n != 30 {
		t.Fatalf("%d of 30 hedges allowed from 1000 reads", n)
	}
	if got := b.balance(t0); !near(got, 20) {
		t.Fatalf("balance %v after 1000 reads and 30 hedges, want 20", got)
	}
	// t=5s: 1,000 more reads, 10 hedges, paid from the oldest tokens
	// (the first second's): 10 + 50 = 60 left.
	t5 := t0.Add(5 * time.Second)
	for range 1000 {
		b.deposit(t5)
	}
	if n := withdrawN(b, t5, 10); n != 10 {
		t.Fatalf("%d of 10 hedges allowed at 5s", n)
	}
	for _, c := range []struct {
		at   time.Duration
		want float64
	}{
		{5 * time.Second, 60},
		{9900 * time.Millisecond, 60}, // everything still in the window
		// The first second's 10 unspent tokens have expired.
		{10 * time.Second, 50},
		{14900 * time.Millisecond, 50},
		{15 * time.Second, 0}, // all expired
		{time.Hour, 0},
	} {
		if got := b.balance(t0.Add(c.at)); !near(got, c.want) {
			t.Errorf("balance at %v = %v, want %v", c.at, got, c.want)
		}
	}
	if b.withdraw(t0.Add(time.Hour)) {
		t.Error("a hedge allowed an hour after the last read, without a floor")
	}
	// A clock that goes back counts as now.
	b.deposit(t0)
	if got := b.balance(t0); !near(got, 0.05) {
		t.Errorf("balance after a deposit dated in the past = %v, want 0.05", got)
	}
}

func TestBudgetMinPerSecondIsAFloor(t *testing.T) {
	clk := newFakeClock()
	// 1 hedge a second over a 10 s window: 10 hedges with no read at all.
	b := newHedgeBudget(budgetParams{share: 0.05, window: 10 * time.Second, minPerSec: 1})
	if n := withdrawN(b, clk.now(), 100); n != 10 {
		t.Fatalf("a fresh account allowed %d hedges, want the floor's 10", n)
	}
	// 100 reads (5 hedges' worth) add nothing to the floor: it is a floor,
	// not an allowance on top of the share.
	for range 100 {
		b.deposit(clk.now())
	}
	if b.withdraw(clk.now()) {
		t.Fatal("100 reads at 5% added to the floor")
	}
	// 400 reads: 20 hedges' worth, 10 spent.
	for range 300 {
		b.deposit(clk.now())
	}
	if n := withdrawN(b, clk.now(), 100); n != 10 {
		t.Fatalf("400 reads at 5%% after 10 hedges allowed %d more, want 10", n)
	}
	// Once the window has passed, the floor is back.
	clk.advance(10 * time.Second)
	if n := withdrawN(b, clk.now(), 100); n != 10 {
		t.Fatalf("a window later, %d hedges allowed, want the floor's 10", n)
	}
	// Spread out: one hedge a second goes on for ever, unrepaid advances
	// forgiven as they leave the window.
	clk.advance(10 * time.Second)
	for i := range 60 {
		clk.advance(time.Second)
		if !b.withdraw(clk.now()) {
			t.Fatalf("hedge %d at one a second refused", i)
		}
	}

	// The defaults, through the policy.
	p := budgetParamsOf(ReadPolicy{})
	if p.share != DefaultHedgeBudget || p.window != DefaultHedgeWindow || p.minPerSec != DefaultHedgeMinPerSecond {
		t.Errorf("default params %+v", p)
	}
	if p := budgetParamsOf(ReadPolicy{HedgeMinPerSecond: -1, HedgeBudget: 3, HedgeWindow: time.Millisecond}); p.minPerSec != 0 || p.share != 1 || p.window != minHedgeWindow {
		t.Errorf("params %+v, want no floor, share 1, the shortest window", p)
	}
}

func TestBudgetZeroAndNoCap(t *testing.T) {
	now := newFakeClock().now()
	zero := newHedgeBudget(budgetParamsOf(ReadPolicy{HedgeBudget: -1}))
	for range 1000 {
		zero.deposit(now)
		if zero.withdraw(now) {
			t.Fatal("a zero budget allowed a hedge (the floor must not apply)")
		}
	}
	all := newHedgeBudget(budgetParamsOf(ReadPolicy{HedgeBudget: 1}))
	if n := withdrawN(all, now, 10000); n != 10000 {
		t.Fatalf("a budget of 1 refused a hedge after %d", n)
	}
}

// steadyReads runs rate reads a second on the fake clock for d: every read
// deposits, and wantHedge(i) says whether read i is late and asks for a
// hedge. It returns the hedges asked for and granted.
func steadyReads(b *hedgeBudget, clk *fakeClock, rate int, d time.Duration, wantHedge func(i int) bool) (asked, granted int) {
	step := time.Second / time.Duration(rate)
	n := int(d / step)
	for i := range n {
		b.deposit(clk.now())
		if wantHedge(i) {
			asked++
			if b.withdraw(clk.now()) {
				granted++
			}
		}
		clk.advance(step)
	}
	return asked, granted
}

func everyNth(n int) func(int) bool { return func(i int) bool { return i%n == 0 } }
func everyRead(int) bool            { return true }

func TestBudgetPauseHedgedInFull(t *testing.T) {
	for _, pause := range []time.Duration{150 * time.Millisecond, 400 * time.Millisecond} {
		clk := newFakeClock()
		b := newHedgeBudget(budgetParamsOf(ReadPolicy{})) // the defaults: 5%, 10 s, 1/s
		// 10 s of normal traffic at 2,000 reads/s, hedging its p99.9.
		asked, granted := steadyReads(b, clk, 2000, 10*time.Second, everyNth(1000))
		if granted != asked {
			t.Fatalf("normal tail: %d of %d hedges granted", granted, asked)
		}
		// The pause: every read is late.
		asked, granted = steadyReads(b, clk, 2000, pause, everyRead)
		if granted != asked || asked != int(pause/(time.Second/2000)) {
			t.Errorf("%v pause: %d of %d reads hedged, want all", pause, granted, asked)
		}
	}
	// A pause longer than share × window (0.5 s) is not covered in full.
	clk := newFakeClock()
	b := newHedgeBudget(budgetParamsOf(ReadPolicy{}))
	steadyReads(b, clk, 2000, 10*time.Second, everyNth(1000))
	asked, granted := steadyReads(b, clk, 2000, time.Second, everyRead)
	if granted >= asked || granted > 1100 {
		t.Errorf("1 s pause: %d of %d hedged, want the budget's ~1,000", granted, asked)
	}
}

func TestBudgetLongSlowdownCapped(t *testing.T) {
	clk := newFakeClock()
	b := newHedgeBudget(budgetParamsOf(ReadPolicy{})) // 5%
	const rate = 2000
	_, normal := steadyReads(b, clk, rate, 10*time.Second, everyNth(1000))
	// A minute in which every read is late, second by second.
	var hedges, reads []int
	for range 60 {
		_, g := steadyReads(b, clk, rate, time.Second, everyRead)
		hedges, reads = append(hedges, g), append(reads, rate)
	}
	total := normal
	for _, h := range hedges {
		total += h
	}
	allReads := 70 * rate
	if ratio := float64(total) / float64(allReads); ratio > 0.05 {
		t.Errorf("%d hedges for %d reads (%.2f%%), want at most 5%%", total, allReads, 100*ratio)
	}
	// After the first window, every 10 s window is held to 5% of its reads,
	// and the budget is not starved either.
	for end := 20; end <= 60; end += 5 {
		sum := 0
		for _, h := range hedges[end-10 : end] {
			sum += h
		}
		if sum > rate*10/20+5 || sum < rate*10/20*9/10 {
			t.Errorf("%d hedges in seconds %d-%d of the slowdown, want about %d (5%% of %d reads)", sum, end-10, end, rate*10/20, rate*10)
		}
	}
	// The first second spends what the normal seconds saved (a pause's
	// worth), no more.
	if hedges[0] > 1000+rate/20 {
		t.Errorf("%d hedges in the slowdown's first second", hedges[0])
	}
}

func TestBudgetPerStore(t *testing.T) {
	h := newHedger(ReadPolicy{Hedge: HedgeAfter(time.Millisecond)}, &hedgeCounters{})
	clk := onFakeClock(h)
	s1, s2 := h.budget.get(1), h.budget.get(2)
	if h.budget.get(1) != s1 {
		t.Fatal("a store's account is not kept")
	}
	// Two stores share 2,000 reads/s; store 1 stays slow: all of its reads
	// are late for 30 s.
	step := time.Second / 2000
	var s1Hedges int
	for i := range 60000 {
		if i%2 == 0 {
			s1.deposit(clk.now())
			if s1.withdraw(clk.now()) {
				s1Hedges++
			}
		} else {
			s2.deposit(clk.now())
		}
		clk.advance(step)
	}
	if s1Hedges > 30000/20 {
		t.Errorf("store 1: %d hedges for 30000 reads, want at most 5%%", s1Hedges)
	}
	// Then store 2 pauses for 150 ms: its own reads paid for its hedges.
	asked, granted := 0, 0
	for i := range 300 {
		if i%2 == 0 {
			s1.deposit(clk.now())
			s1.withdraw(clk.now())
		} else {
			s2.deposit(clk.now())
			asked++
			if s2.withdraw(clk.now()) {
				granted++
			}
		}
		clk.advance(step)
	}
	if granted != asked {
		t.Errorf("store 2's pause, while store 1 stays slow: %d of %d hedged", granted, asked)
	}
}

// TestHedgeBudgetInTheRace: the race deposits each primary in its store's
// account and asks it before each hedge; deposits expire on the budget's
// clock.
func TestHedgeBudgetInTheRace(t *testing.T) {
	_, c := newLateLeader(t)
	// Half a hedge per read, no floor: the first read cannot pay for its
	// hedge, the second pays for one.
	s := c.Session(ReadPolicy{Hedge: HedgeAfter(5 * time.Millisecond), HedgeBudget: 0.5, HedgeMinPerSecond: -1})
	clk := onFakeClock(s.hedger)
	get := func() ReadInfo {
		t.Helper()
		_, info, err := s.GetWithInfo(context.Background(), []byte("k"))
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	if info := get(); info.HedgeWon {
		t.Errorf("first read: %+v, want no hedge", info)
	}
	if info := get(); !info.HedgeWon {
		t.Errorf("second read: %+v, want the hedge's answer", info)
	}
	// Both deposits expire: a third read's half token is not enough.
	clk.advance(11 * time.Second)
	if info := get(); info.HedgeWon {
		t.Errorf("read after the window: %+v, want no hedge", info)
	}
	want := HedgeStats{Primaries: 3, HedgesSent: 1, HedgesWon: 1, DeniedByBudget: 2}
	if got := s.HedgeStats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}
