package raftstore

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestQuietTable runs testdata/hibernate.txt: when an idle leader may
// hibernate.
func TestQuietTable(t *testing.T) {
	f, err := os.Open("testdata/hibernate.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	cases := 0
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		lhs, want, ok := strings.Cut(text, "->")
		if !ok {
			t.Fatalf("line %d: %q has no ->", line, text)
		}
		num := func(v string) uint64 {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("line %d: %q: %v", line, v, err)
			}
			return n
		}
		var q quietFacts
		for _, kv := range strings.Fields(lhs) {
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
		if got := strconv.FormatBool(q.quiet()); got != strings.TrimSpace(want) {
			t.Errorf("line %d: %s: got %s", line, text, got)
		}
		cases++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cases < 10 {
		t.Fatalf("only %d cases read", cases)
	}
}
