package keyspace

import (
	"bytes"
	"testing"
)

func TestEtcdRangeIsThePrefix(t *testing.T) {
	start, end := EtcdRange()
	if string(start) != EtcdPrefix || string(end) != EtcdEnd {
		t.Fatalf("EtcdRange = [%q, %q)", start, end)
	}
	// EtcdEnd is the prefix's end: the prefix with its last byte plus one.
	want := []byte(EtcdPrefix)
	want[len(want)-1]++
	if !bytes.Equal(end, want) {
		t.Fatalf("EtcdEnd %q, want the prefix end %q", EtcdEnd, want)
	}
	start[0] = 'x' // the caller's own copy
	if s, _ := EtcdRange(); string(s) != EtcdPrefix {
		t.Fatal("EtcdRange shares its slices")
	}
	for _, tc := range []struct {
		key string
		in  bool
	}{
		{"", false},
		{"\xffetcd", false},
		{"\xffetcd.", false},
		{EtcdPrefix, true},
		{EtcdPrefix + "\x00", true},
		{EtcdPrefix + "foo", true},
		{EtcdPrefix + "\xff\xff", true},
		{EtcdEnd, false},
		{"\xffetcd0a", false},
		{"etcd/foo", false},
		{"\xff", false},
	} {
		if got := IsEtcd([]byte(tc.key)); got != tc.in {
			t.Errorf("IsEtcd(%q) = %v", tc.key, got)
		}
		// IsEtcd is the range [EtcdPrefix, EtcdEnd).
		inRange := tc.key >= EtcdPrefix && tc.key < EtcdEnd
		if inRange != tc.in {
			t.Errorf("%q: in [EtcdPrefix, EtcdEnd) %v, IsEtcd %v", tc.key, inRange, tc.in)
		}
	}
}
