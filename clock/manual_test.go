package clock

import (
	"testing"
	"time"
)

var start = time.Unix(1_700_000_000, 0)

// recv takes what c holds now, if anything: a Manual fires inside Advance,
// so after it returns a tick is either in the channel or was never sent.
func recv(c <-chan time.Time) (time.Time, bool) {
	select {
	case t := <-c:
		return t, true
	default:
		return time.Time{}, false
	}
}

func TestManualMovesOnlyWhenAdvanced(t *testing.T) {
	m := NewManual(start)
	tk := m.NewTicker(10 * time.Millisecond)
	defer tk.Stop()
	if !m.Now().Equal(start) {
		t.Fatalf("Now = %v, want %v", m.Now(), start)
	}
	m.Advance(9 * time.Millisecond)
	if _, ok := recv(tk.C()); ok {
		t.Fatal("ticker fired before its interval")
	}
	m.Advance(time.Millisecond)
	if got, ok := recv(tk.C()); !ok || !got.Equal(start.Add(10*time.Millisecond)) {
		t.Fatalf("tick = %v %v, want one at +10ms", got, ok)
	}
	if want := start.Add(10 * time.Millisecond); !m.Now().Equal(want) {
		t.Fatalf("Now = %v, want %v", m.Now(), want)
	}
}

func TestManualTickerDropsUnreadTicks(t *testing.T) {
	m := NewManual(start)
	tk := m.NewTicker(10 * time.Millisecond)
	m.Advance(35 * time.Millisecond) // due at 10, 20, 30: the first waits, two drop
	if got, ok := recv(tk.C()); !ok || !got.Equal(start.Add(10*time.Millisecond)) {
		t.Fatalf("tick = %v %v, want the one at +10ms", got, ok)
	}
	if _, ok := recv(tk.C()); ok {
		t.Fatal("an unread tick queued another")
	}
	m.Advance(5 * time.Millisecond) // the next is due at 40
	if got, ok := recv(tk.C()); !ok || !got.Equal(start.Add(40*time.Millisecond)) {
		t.Fatalf("tick = %v %v, want the one at +40ms", got, ok)
	}
	tk.Stop()
	m.Advance(time.Second)
	if _, ok := recv(tk.C()); ok || m.Waiters() != 0 {
		t.Fatalf("a stopped ticker fired or stayed armed (%d armed)", m.Waiters())
	}
}

func TestManualFiresInOrderAtEachTime(t *testing.T) {
	m := NewManual(start)
	late, early := m.NewTimer(30*time.Millisecond), m.NewTimer(20*time.Millisecond)
	stopped := m.NewTimer(10 * time.Millisecond)
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop of an armed timer must report true once")
	}
	m.Advance(time.Minute)
	e, ok1 := recv(early.C())
	l, ok2 := recv(late.C())
	if !ok1 || !ok2 || !e.Equal(start.Add(20*time.Millisecond)) || !l.Equal(start.Add(30*time.Millisecond)) {
		t.Fatalf("timers fired at %v (%v), %v (%v); want +20ms, +30ms", e, ok1, l, ok2)
	}
	if _, ok := recv(stopped.C()); ok {
		t.Fatal("a stopped timer fired")
	}
	if early.Stop() || m.Waiters() != 0 {
		t.Fatal("a fired timer stays armed")
	}
}
