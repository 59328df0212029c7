package raftstore

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStaleBoundTable runs testdata/stale.txt: when a local read may be
// served stale, and its bound.
func TestStaleBoundTable(t *testing.T) {
	epoch := time.Unix(1_000_000, 0)
	at := func(ms uint64) time.Time { return epoch.Add(time.Duration(ms) * time.Millisecond) }
	eachCase(t, "testdata/stale.txt", 10, func(line int, inputs []string, want string) {
		num := func(v string) uint64 {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("line %d: %q: %v", line, v, err)
			}
			return n
		}
		var sps safePoints
		var applied, now, offset, maxStale uint64
		for _, kv := range inputs {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "points":
				for _, p := range strings.Split(v, ",") {
					commit, ms, ok := strings.Cut(p, "@")
					if !ok {
						t.Fatalf("line %d: safe point %q: want commit@ms", line, p)
					}
					sps.ring[sps.n%safePointRing] = SafePoint{Term: 1, Commit: num(commit), Time: at(num(ms))}
					sps.n++
				}
			case "applied":
				applied = num(v)
			case "now":
				now = num(v)
			case "offset":
				offset = num(v)
			case "max":
				maxStale = num(v)
			default:
				t.Fatalf("line %d: unknown input %q", line, k)
			}
		}
		ms := func(n uint64) time.Duration { return time.Duration(n) * time.Millisecond }
		bound, age, ok := sps.bound(applied, at(now), ms(offset), ms(maxStale))
		got := fmt.Sprintf("refuse %d", age)
		if ok {
			got = fmt.Sprintf("ok %d", bound.Milliseconds())
		}
		if got != want {
			t.Errorf("line %d: %v -> %s: got %s", line, inputs, want, got)
		}
	})
}
