package raftstore

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// eachCase runs fn on each case of a decision table under testdata: one
// case per line, its inputs, "->", the verdict; blank lines and lines
// starting with # are skipped. It fails the test if the file holds fewer
// than min cases, so that a table that stopped parsing cannot pass.
func eachCase(t *testing.T, path string, min int, fn func(line int, inputs []string, want string)) {
	t.Helper()
	f, err := os.Open(path)
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
			t.Fatalf("%s:%d: %q has no ->", path, line, text)
		}
		fn(line, strings.Fields(lhs), strings.TrimSpace(want))
		cases++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cases < min {
		t.Fatalf("%s: only %d cases read", path, cases)
	}
}
