package raftstore

import (
	"strconv"
	"strings"
	"testing"
)

// TestQuietTable runs testdata/hibernate.txt: when an idle leader may
// hibernate.
func TestQuietTable(t *testing.T) {
	eachCase(t, "testdata/hibernate.txt", 10, func(line int, inputs []string, want string) {
		num := func(v string) uint64 {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("line %d: %q: %v", line, v, err)
			}
			return n
		}
		var q quietFacts
		for _, kv := range inputs {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "last":
				q.lastIndex = num(v)
			case "commit":
				q.commit = num(v)
			case "applied":
				q.applied = num(v)
			case "matches":
				for _, m := range strings.Split(v, ",") {
					q.matches = append(q.matches, num(m))
				}
			case "proposals":
				q.proposals = int(num(v))
			case "reads":
				q.reads = int(num(v))
			case "transferring":
				q.transferring = true
			case "joint":
				q.joint = true
			default:
				t.Fatalf("line %d: unknown input %q", line, k)
			}
		}
		if got := strconv.FormatBool(q.quiet()); got != want {
			t.Errorf("line %d: %v -> %s: got %s", line, inputs, want, got)
		}
	})
}
