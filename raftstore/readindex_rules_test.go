package raftstore

import (
	"strconv"
	"strings"
	"testing"
)

// TestDecideIssueTable runs testdata/readindex.txt: what a round does
// with the queued reads.
func TestDecideIssueTable(t *testing.T) {
	eachCase(t, "testdata/readindex.txt", 10, func(line int, inputs []string, want string) {
		var pending, inflight int
		var renew, leader, knows bool
		for _, kv := range inputs {
			k, v, _ := strings.Cut(kv, "=")
			n := 0
			if v != "" {
				var err error
				if n, err = strconv.Atoi(v); err != nil {
					t.Fatalf("line %d: %s: %v", line, kv, err)
				}
			}
			switch k {
			case "pending":
				pending = n
			case "inflight":
				inflight = n
			case "renew":
				renew = true
			case "leader":
				leader = true
			case "knows-leader":
				knows = true
			default:
				t.Fatalf("line %d: unknown input %q", line, k)
			}
		}
		if got := decideIssue(pending, renew, leader, knows, inflight).String(); got != want {
			t.Errorf("line %d: %v -> %s: got %s", line, inputs, want, got)
		}
	})
}
