package bench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// watch, tiny, in-process: every event expected is delivered once, and
// the results say so. Nothing here checks timing.
func TestWatchTiny(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	res, err := RunWatch(ctx, WatchConfig{
		Watchers: []int{40}, Clients: 2, Streams: 2, Rate: 100, Duration: time.Second,
		OutDir: dir, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 1 {
		t.Fatalf("%d runs, want 1", len(res.Runs))
	}
	w := res.Runs[0]
	if w.Writes == 0 || w.Expected == 0 || w.Delivered != w.Expected || w.Missing != 0 || w.Duplicated != 0 || w.Streams != 4 {
		t.Fatalf("run %+v", w)
	}
	// Every write has a watcher: at least one event per write.
	if w.Expected < int64(w.Writes) {
		t.Fatalf("%d events expected of %d writes", w.Expected, w.Writes)
	}
	// A write's first event is no later than its slowest.
	if w.FirstP99Ms < 0 || w.FirstP99Ms > w.MaxMs {
		t.Fatalf("first event p99 %v ms, slowest event %v ms", w.FirstP99Ms, w.MaxMs)
	}
	doc, err := ReadResults(filepath.Join(dir, "watch", "results.json"))
	if err != nil || doc.Scenario != "watch" || len(doc.Rows) != 1 || doc.Rows[0].Watch == nil || doc.Rows[0].Watch.Delivered != w.Delivered {
		t.Fatalf("results.json: %+v %v", doc, err)
	}
}

func TestWatchLayout(t *testing.T) {
	l := newWatchLayout("p/", 10000)
	watchers := make([]int, l.k)
	for i := range l.n {
		key, group := l.watched(i)
		if group >= 0 {
			for k := group * watchGroup; k < min((group+1)*watchGroup, l.k); k++ {
				watchers[k]++
			}
			if !strings.HasPrefix(l.key(group*watchGroup), l.groupPrefix(group)) {
				t.Fatalf("group %d's prefix %q does not hold its first key %q", group, l.groupPrefix(group), l.key(group*watchGroup))
			}
			continue
		}
		watchers[key]++
	}
	for k, n := range watchers {
		if n == 0 {
			t.Fatalf("key %d has no watcher", k)
		}
	}
	if watchers[0] < 100 {
		t.Fatalf("hot key 0 has %d watchers", watchers[0])
	}
	// A group's prefix holds no key of another group.
	if strings.HasPrefix(l.key(10*watchGroup), l.groupPrefix(1)) {
		t.Fatal("group 1's prefix holds a key of group 10")
	}
}

func TestParseProcessMetrics(t *testing.T) {
	cpu, rss, err := parseProcessMetrics(strings.NewReader("# HELP x\nprocess_cpu_seconds_total 12.5\nprocess_resident_memory_bytes 1.048576e+06\nother 1\n"))
	if err != nil || cpu != 12.5 || rss != 1<<20 {
		t.Fatalf("cpu %v rss %v err %v", cpu, rss, err)
	}
}
