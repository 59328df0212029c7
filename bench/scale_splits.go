package bench

// Splits during the load: when each applied on its leader (the stores'
// logs) and the slowest call around it, beside the p99 of the calls away
// from every split: what "a split stalls no write by more than 50 ms over
// the p99" is checked against.

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ScaleSplit is one split during a phase, as its leader logged it.
type ScaleSplit struct {
	At    time.Time `json:"at"`
	T     float64   `json:"t_s"`   // seconds since the scenario started
	Store uint64    `json:"store"` // the leader that split
	New   uint64    `json:"new_region"`
	// Around counts the calls in flight from splitWindowBefore before the
	// split to splitWindowAfter after it; SlowestMs is the slowest.
	Around    int64   `json:"around"`
	SlowestMs float64 `json:"slowest_ms"`
	// NewLeaderMs: from the split's log line until a store first logged a
	// leader for the new region (negative: before; -1 with no line).
	NewLeaderMs float64 `json:"new_leader_ms"`
}

// The calls a split may have held up: those in flight at some moment from
// splitWindowBefore before it applied on its leader (its proposal and
// commit) until splitWindowAfter after (the new region's first leader: an
// election timeout is 0.5-1 s at the defaults).
const (
	splitWindowBefore = 100 * time.Millisecond
	splitWindowAfter  = time.Second
	// minAwayFromSplits: with fewer calls than this away from every split
	// (a --quick load splits every second or two), the baseline is the
	// whole phase's p99.
	minAwayFromSplits = 1000
	// controlOffset: each split has a control window this long before it,
	// midway between two split checks (every 10 s at the defaults), unless
	// it overlaps some split's window: the slowest call in a window of the
	// same length where nothing split, on a machine whose noise (other
	// processes, the disk) hits every window alike.
	controlOffset = 5 * time.Second
)

// SplitWindows compares the slowest call around each split with the
// slowest in control windows of the same length where nothing split.
type SplitWindows struct {
	Splits, Controls int
	// Medians and maxima of the windows' slowest calls.
	SplitP50Ms, SplitMaxMs     float64
	ControlP50Ms, ControlMaxMs float64
}

// opSpan is one call: when it began (since the phase started) and how long
// it took.
type opSpan struct {
	begin, lat time.Duration
}

var (
	logTime    = regexp.MustCompile(`^time=(\S+) `)
	logStore   = regexp.MustCompile(` store=(\d+)`)
	logNewRgn  = regexp.MustCompile(` right="region (\d+) `)
	splitLogIs = regexp.MustCompile(` msg="split region" `)
	leaderLog  = regexp.MustCompile(` msg="leader changed" .*region=(\d+) leader=([1-9]\d*) `)
)

// splitsLogged reads the automatic splits the stores' logs (at info)
// record between from and to, in time order, and when each new region
// first had a leader.
func splitsLogged(logs []string, from, to time.Time) []ScaleSplit {
	var out []ScaleSplit
	led := map[uint64]time.Time{} // region -> first leader logged
	for _, path := range logs {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			l := leaderLog.FindStringSubmatch(line)
			if l == nil && !splitLogIs.MatchString(line) {
				continue
			}
			m := logTime.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				continue
			}
			if l != nil {
				r, _ := strconv.ParseUint(l[1], 10, 64)
				if first, ok := led[r]; !ok || at.Before(first) {
					led[r] = at
				}
				continue
			}
			if at.Before(from) || at.After(to) {
				continue
			}
			s := ScaleSplit{At: at}
			if m := logStore.FindStringSubmatch(line); m != nil {
				s.Store, _ = strconv.ParseUint(m[1], 10, 64)
			}
			if m := logNewRgn.FindStringSubmatch(line); m != nil {
				s.New, _ = strconv.ParseUint(m[1], 10, 64)
			}
			out = append(out, s)
		}
		f.Close()
	}
	for i := range out {
		out[i].NewLeaderMs = -1
		if at, ok := led[out[i].New]; ok {
			out[i].NewLeaderMs = round(float64(at.Sub(out[i].At).Microseconds())/1000, 1)
		}
	}
	slices.SortFunc(out, func(a, b ScaleSplit) int { return a.At.Compare(b.At) })
	return out
}

// aroundSplits fills each split's calls around it and returns the p99 of
// the calls away from every split, or of every call (all true) if fewer
// than minAwayFromSplits were, and the split and control windows.
func (r *intervalRec) aroundSplits(splits []ScaleSplit) (baselineMs float64, all bool, w SplitWindows) {
	r.mu.Lock()
	defer r.mu.Unlock()
	inWindow := func(begin, end, at time.Time) bool {
		return !end.Before(at.Add(-splitWindowBefore)) && !begin.After(at.Add(splitWindowAfter))
	}
	var controls []time.Time
	for _, s := range splits {
		c, clear := s.At.Add(-controlOffset), true
		for _, o := range splits {
			if d := c.Sub(o.At); d > -(splitWindowBefore+splitWindowAfter) && d < splitWindowBefore+splitWindowAfter {
				clear = false
			}
		}
		if clear && !c.Before(r.start) {
			controls = append(controls, c)
		}
	}
	controlSlowest := make([]float64, len(controls))
	away, every := newHist(), newHist()
	for _, sp := range r.spans {
		recordLatency(every, sp.lat)
		begin := r.start.Add(sp.begin)
		end := begin.Add(sp.lat)
		ms := round(float64(sp.lat.Microseconds())/1000, 1)
		near := false
		for i := range splits {
			s := &splits[i]
			if !inWindow(begin, end, s.At) {
				continue
			}
			near = true
			s.Around++
			s.SlowestMs = max(s.SlowestMs, ms)
		}
		for i, c := range controls {
			if inWindow(begin, end, c) {
				controlSlowest[i] = max(controlSlowest[i], ms)
			}
		}
		if !near {
			recordLatency(away, sp.lat)
		}
	}
	splitSlowest := make([]float64, len(splits))
	for i, s := range splits {
		splitSlowest[i] = s.SlowestMs
	}
	w.Splits, w.Controls = len(splits), len(controls)
	w.SplitP50Ms, w.SplitMaxMs = medianMax(splitSlowest)
	w.ControlP50Ms, w.ControlMaxMs = medianMax(controlSlowest)
	if away.TotalCount() < minAwayFromSplits {
		return quantileMs(every, 99), true, w
	}
	return quantileMs(away, 99), false, w
}

func medianMax(v []float64) (p50, most float64) {
	if len(v) == 0 {
		return 0, 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2], v[len(v)-1]
}

// splitsDuring records in p the splits the stores logged between begin and
// end, and the calls around each.
func (st *scaleState) splitsDuring(p *ScalePhase, rec *intervalRec, begin, end time.Time) {
	var logs []string
	for _, id := range st.c.StoreIDs() {
		logs = append(logs, st.c.LogPath(id))
	}
	p.Splits = splitsLogged(logs, begin, end)
	for i := range p.Splits {
		p.Splits[i].T = round(p.Splits[i].At.Sub(st.res.started).Seconds(), 3)
	}
	p.SplitBaselineP99Ms, p.SplitBaselineAll, p.SplitWindows = rec.aroundSplits(p.Splits)
	if w, ok := worstSplit(p); ok {
		st.prog.Printf("scale: %d splits during the load; the slowest call around one took %.1f ms, %.1f ms over the p99 away from splits (%.1f ms)",
			len(p.Splits), w.SlowestMs, w.SlowestMs-p.SplitBaselineP99Ms, p.SplitBaselineP99Ms)
	}
	rec.mu.Lock()
	rec.spans = nil
	rec.mu.Unlock()
}

// worstSplit is the split with the slowest call around it.
func worstSplit(p *ScalePhase) (ScaleSplit, bool) {
	if p == nil || len(p.Splits) == 0 {
		return ScaleSplit{}, false
	}
	return slices.MaxFunc(p.Splits, func(a, b ScaleSplit) int {
		switch {
		case a.SlowestMs < b.SlowestMs:
			return -1
		case a.SlowestMs > b.SlowestMs:
			return 1
		}
		return 0
	}), true
}

// writeSplits writes each split of p with the slowest call around it.
func writeSplits(b *strings.Builder, p *ScalePhase) {
	w, ok := worstSplit(p)
	if !ok {
		return
	}
	base := "the calls away from every split"
	if p.SplitBaselineAll {
		base = "every call (too few began away from every split)"
	}
	fmt.Fprintf(b, "\nThe splits the leaders logged during the load, and the slowest call in flight at some moment from %v before to %v after each; baseline: the p99 of %s, **%.1f ms**. The worst split: **%.1f ms**, %.1f ms over the baseline.\n\n",
		splitWindowBefore, splitWindowAfter, base, p.SplitBaselineP99Ms, w.SlowestMs, w.SlowestMs-p.SplitBaselineP99Ms)
	var rows [][]string
	for _, s := range p.Splits {
		lead := "-"
		if s.NewLeaderMs != -1 {
			lead = FormatFloat(s.NewLeaderMs, 1)
		}
		rows = append(rows, []string{s.At.UTC().Format("15:04:05.000"), FormatFloat(s.T, 1), strconv.FormatUint(s.Store, 10), strconv.FormatUint(s.New, 10), lead,
			strconv.FormatInt(s.Around, 10), FormatFloat(s.SlowestMs, 1), FormatFloat(s.SlowestMs-p.SplitBaselineP99Ms, 1)})
	}
	b.WriteString(MarkdownTable([]string{"at (UTC)", "t s", "leader store", "new region", "its leader after ms", "calls around", "slowest ms", "over baseline ms"}, rows))
	if w := p.SplitWindows; w.Controls > 0 {
		fmt.Fprintf(b, "\nControl: the same window %v before each split where nothing split (%d of %d): its slowest call %.1f ms at the median, %.1f ms at most; around the splits %.1f ms and %.1f ms.\n",
			controlOffset, w.Controls, w.Splits, w.ControlP50Ms, w.ControlMaxMs, w.SplitP50Ms, w.SplitMaxMs)
	}
}
