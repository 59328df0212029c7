package engine

import (
	"fmt"
	"testing"
)

func TestFreeRanges(t *testing.T) {
	r := func(s, e string) Span { return Span{StartKey: []byte(s), EndKey: []byte(e)} }
	for _, tc := range []struct {
		start, end string
		claimed    []Span
		want       string
	}{
		{"", "", nil, `["",""); `},
		{"b", "m", []Span{r("a", "c"), r("f", "g"), r("k", "")}, `["c","f"); ["g","k"); `},
		{"", "", []Span{r("d", "e")}, `["","d"); ["e",""); `},
		{"d", "e", []Span{r("", "")}, ``},
		{"c", "f", []Span{r("a", "b"), r("x", "y")}, `["c","f"); `},
	} {
		var got string
		for _, iv := range FreeRanges([]byte(tc.start), []byte(tc.end), tc.claimed) {
			got += fmt.Sprintf("[%q,%q); ", iv[0], iv[1])
		}
		if got != tc.want {
			t.Errorf("FreeRanges(%q, %q, %v) = %s, want %s", tc.start, tc.end, tc.claimed, got, tc.want)
		}
	}
}
