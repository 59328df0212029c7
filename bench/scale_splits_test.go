package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSplitsAroundLoggedSplits: splits are read from the stores' info logs
// (only within the phase), each gets the slowest call that began in its
// window, and the baseline is the p99 of the calls away from every split.
func TestSplitsAroundLoggedSplits(t *testing.T) {
	start := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	log := `time=2026-11-25T11:59:59.000Z level=INFO msg="split region" store=1 left="region 1 [\"\", \"m\") epoch 1/2 peers []" right="region 9 [\"m\", \"\") epoch 1/2 peers []"
time=2026-11-25T12:00:02.000Z level=INFO msg="leader changed" store=1 region=9 leader=1 term=6
time=2026-11-25T12:00:05.000Z level=INFO msg="split region" store=1 left="region 1 [\"\", \"g\") epoch 1/3 peers []" right="region 65537 [\"g\", \"m\") epoch 1/3 peers []"
time=2026-11-25T12:00:05.010Z level=INFO msg="leader changed" store=2 region=65537 leader=0 term=6
time=2026-11-25T12:00:05.020Z level=INFO msg="leader changed" store=2 region=65537 leader=1 term=6
time=2026-11-25T12:00:05.015Z level=INFO msg="leader changed" store=1 region=65537 leader=1 term=6
`
	path := filepath.Join(dir, "store1.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	splits := splitsLogged([]string{path, filepath.Join(dir, "missing.log")}, start, start.Add(time.Minute))
	if len(splits) != 1 || splits[0].Store != 1 || splits[0].New != 65537 || !splits[0].At.Equal(start.Add(5*time.Second)) || splits[0].NewLeaderMs != 15 {
		t.Fatalf("splits %+v, want the one at 12:00:05 (region 65537 by store 1, a leader 15 ms later)", splits)
	}
	rec := newIntervalRec(start, time.Second, 100*time.Millisecond)
	rec.start = start
	// 2,000 calls of 5 ms, one every 5 ms (222 in flight from 4.9 s to
	// 6 s); one of 700 ms that began 0.2 s after the split, and one of
	// 300 ms that ended 0.2 s before it.
	for i := range 2000 {
		rec.spans = append(rec.spans, opSpan{begin: time.Duration(i) * 5 * time.Millisecond, lat: 5 * time.Millisecond})
	}
	rec.spans = append(rec.spans, opSpan{begin: 5200 * time.Millisecond, lat: 700 * time.Millisecond},
		opSpan{begin: 4500 * time.Millisecond, lat: 300 * time.Millisecond})
	base, all, w := rec.aroundSplits(splits)
	if w.Splits != 1 || w.Controls != 1 || w.SplitMaxMs != 700 || w.ControlMaxMs != 5 {
		t.Errorf("windows %+v, want the split's (slowest 700 ms) and one control 5 s before it (slowest 5 ms)", w)
	}
	if all || base < 4.9 || base > 5.1 {
		t.Errorf("baseline %v ms (all %v), want the p99 of the calls away from the split, 5 ms", base, all)
	}
	if s := splits[0]; s.SlowestMs != 700 || s.Around != 223 {
		t.Errorf("around the split: %d calls, slowest %v ms; want 223 (222 of 5 ms, 1 of 700 ms) and 700", s.Around, s.SlowestMs)
	}
}
