package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress shows how far a scenario is: on a terminal, one stderr line
// redrawn in place (a bar, the current step, its ops/s and failures, the
// elapsed time and an estimate of what is left of the step); elsewhere (a log file, CI)
// a plain line every interval (steps that end sooner print none; the
// scenarios print a line of their own after each). Messages printed through
// Printf appear above the bar. A nil *Progress does nothing, so callers need not check.
//
// A scenario is a fixed number of steps (load, then one step per measured
// run); a step's own fraction is the larger of its operations done over
// its target and its elapsed time over its time cap, so duration-capped
// runs advance smoothly. The estimate of what is left covers the current
// step only (StepLeft), from the step's own clock: steps differ too much
// (a load of millions of records, then a restart of seconds) for the
// scenario's elapsed time over its share of steps done to predict the
// rest, which made bench scale's bar promise three times its load's own
// estimate.
type Progress struct {
	w        io.Writer
	tty      bool
	title    string
	steps    int
	interval time.Duration
	start    time.Time

	mu        sync.Mutex
	step      int // steps begun
	label     string
	stepStart time.Time
	rateStart time.Time // of the ops/s shown: SetLabel starts it again
	target    int64
	maxDur    time.Duration
	done      int64
	failed    int64
	lastLen   int
	lastPlain time.Time
	stopped   bool

	stop chan struct{}
	wg   sync.WaitGroup
}

// NewProgress starts a progress display of steps steps on w (normally
// os.Stderr). interval spaces the plain lines written when w is not a
// terminal (0: 10s).
func NewProgress(w io.Writer, title string, steps int, interval time.Duration) *Progress {
	if w == nil {
		w = io.Discard
	}
	if interval <= 0 {
		interval = 10 * time.Second
	}
	p := &Progress{
		w: w, tty: isTerminal(w), title: title, steps: max(steps, 1), interval: interval,
		start: time.Now(), stop: make(chan struct{}),
	}
	p.lastPlain = p.start
	tick := interval
	if p.tty {
		tick = 200 * time.Millisecond
	}
	p.wg.Go(func() {
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.mu.Lock()
				p.drawLocked(false)
				p.mu.Unlock()
			}
		}
	})
	return p
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Step begins the next step: label names it, target is its operation
// count (0: unknown), maxDur its time cap (0: none).
func (p *Progress) Step(label string, target int64, maxDur time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.step = min(p.step+1, p.steps)
	p.label, p.target, p.maxDur = label, target, maxDur
	p.stepStart, p.done, p.failed = time.Now(), 0, 0
	p.rateStart = p.stepStart
	if p.tty {
		p.drawLocked(true)
	}
}

// SetLabel renames the current step (a warm-up becoming the measured
// run) and starts its count and clock again.
func (p *Progress) SetLabel(label string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.label = label
	p.done, p.failed, p.rateStart = 0, 0, time.Now()
}

// Update records the current step's operations done and failed so far
// (Spec.OnProgress).
func (p *Progress) Update(done, failed int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.done, p.failed = done, failed
	p.mu.Unlock()
}

// Printf prints a line above the bar (or between the plain lines).
func (p *Progress) Printf(format string, args ...any) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	fmt.Fprintf(p.w, strings.TrimRight(format, "\n")+"\n", args...)
	if p.tty && !p.stopped {
		p.drawLocked(true)
	}
}

// Done removes the bar and prints the total time.
func (p *Progress) Done() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	p.mu.Unlock()
	close(p.stop)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	fmt.Fprintf(p.w, "%s: done in %s\n", p.title, fmtClock(time.Since(p.start)))
}

// fraction is the share of the whole scenario done.
func (p *Progress) fractionLocked() float64 {
	f := 0.0
	if p.target > 0 {
		f = float64(p.done) / float64(p.target)
	}
	if p.maxDur > 0 {
		f = max(f, float64(time.Since(p.stepStart))/float64(p.maxDur))
	}
	f = min(f, 1)
	if p.step == 0 {
		return 0
	}
	return (float64(p.step-1) + f) / float64(p.steps)
}

// StepLeft estimates how long the current step has left: its operations
// still to do at the rate since its count began (remainingAt), or what is
// left of its time cap, whichever is less. ok is false while there is
// nothing to go by (under 2% of the operations done, no cap).
func (p *Progress) StepLeft() (left time.Duration, ok bool) {
	if p == nil {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stepLeftLocked(time.Now())
}

func (p *Progress) stepLeftLocked(now time.Time) (left time.Duration, ok bool) {
	if p.step == 0 {
		return 0, false
	}
	if p.target > 0 && float64(p.done) >= 0.02*float64(p.target) {
		left, ok = remainingAt(p.done, p.target, now.Sub(p.rateStart)), true
	}
	if p.maxDur > 0 {
		if capLeft := max(p.maxDur-now.Sub(p.stepStart), 0); !ok || capLeft < left {
			left, ok = capLeft, true
		}
	}
	return left, ok
}

// remainingAt is how long the rest of target operations takes at the rate
// of done (> 0) in elapsed; 0 once done reaches target.
func remainingAt(done, target int64, elapsed time.Duration) time.Duration {
	if done >= target {
		return 0
	}
	return time.Duration(float64(elapsed) * float64(target-done) / float64(done))
}

func (p *Progress) lineLocked(width int) string {
	frac := p.fractionLocked()
	elapsed := time.Since(p.start)
	eta := "?"
	if left, ok := p.stepLeftLocked(time.Now()); ok {
		eta = fmtClock(left)
	}
	rate := 0.0
	if secs := time.Since(p.rateStart).Seconds(); secs > 0 {
		rate = float64(p.done) / secs
	}
	stats := fmt.Sprintf(" %3.0f%% %d/%d %s | %d ops %.0f/s", 100*frac, p.step, p.steps, p.label, p.done, rate)
	if p.failed > 0 {
		stats += fmt.Sprintf(" %d FAILED", p.failed)
	}
	stats += fmt.Sprintf(" | %s | step ~%s left", fmtClock(elapsed), eta)
	if width <= 0 {
		return p.title + ":" + stats
	}
	barLen := 12
	filled := int(frac * float64(barLen))
	bar := "[" + strings.Repeat("#", filled) + strings.Repeat(".", barLen-filled) + "]"
	line := p.title + " " + bar + stats
	if len(line) > width {
		line = p.title + ":" + stats // drop the bar first
	}
	if len(line) > width {
		line = line[:width]
	}
	return line
}

// drawLocked redraws the terminal line, or writes a plain line when the
// interval has passed (force: now).
func (p *Progress) drawLocked(force bool) {
	if p.stopped {
		return
	}
	if !p.tty {
		if force || time.Since(p.lastPlain) >= p.interval {
			p.plainLocked()
		}
		return
	}
	line := p.lineLocked(p.width())
	pad := max(0, p.lastLen-len(line))
	fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
	p.lastLen = len(line)
}

func (p *Progress) plainLocked() {
	fmt.Fprintln(p.w, p.lineLocked(0))
	p.lastPlain = time.Now()
}

func (p *Progress) clearLocked() {
	if p.tty && p.lastLen > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.lastLen))
		p.lastLen = 0
	}
}

// width is the terminal's width less one column (so the line never
// wraps), else $COLUMNS, else 80.
func (p *Progress) width() int {
	if f, ok := p.w.(*os.File); ok {
		if n := terminalWidth(f); n > 20 {
			return n - 1
		}
	}
	var n int
	if _, err := fmt.Sscan(os.Getenv("COLUMNS"), &n); err == nil && n > 20 {
		return n - 1
	}
	return 79
}

// fmtClock renders a duration as m:ss.
func fmtClock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}
