package etcdmvcc

import (
	"bytes"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

func TestReadRev(t *testing.T) {
	for _, tc := range []struct {
		req, compact, current int64
		want                  int64
		err                   error
	}{
		{0, -1, 5, 0, nil},
		{-3, -1, 5, 0, nil}, // ≤ 0: the current revision
		{5, -1, 5, 0, nil},  // the current revision: current records
		{4, -1, 5, 4, nil},
		{1, -1, 5, 1, nil},
		{6, -1, 5, 0, rpctypes.ErrGRPCFutureRev},
		{3, 3, 5, 3, nil}, // the compaction revision itself is readable
		{2, 3, 5, 0, rpctypes.ErrGRPCCompacted},
		{-1, 3, 5, 0, nil},
		{9, 3, 5, 0, rpctypes.ErrGRPCFutureRev}, // future before compacted, as etcd
	} {
		got, err := ReadRev(tc.req, tc.compact, tc.current)
		if got != tc.want || err != tc.err {
			t.Errorf("ReadRev(%d, %d, %d) = %d, %v; want %d, %v", tc.req, tc.compact, tc.current, got, err, tc.want, tc.err)
		}
	}
}

func TestCheckCompact(t *testing.T) {
	for _, tc := range []struct {
		rev, compact, current int64
		err                   error
	}{
		{0, -1, 1, nil}, // etcd accepts Compact(0) on a new store
		{-1, -1, 1, rpctypes.ErrGRPCCompacted},
		{5, -1, 5, nil},
		{6, -1, 5, rpctypes.ErrGRPCFutureRev},
		{3, 3, 5, rpctypes.ErrGRPCCompacted},
		{2, 3, 5, rpctypes.ErrGRPCCompacted},
		{4, 3, 5, nil},
	} {
		if err := CheckCompact(tc.rev, tc.compact, tc.current); err != tc.err {
			t.Errorf("CheckCompact(%d, %d, %d) = %v, want %v", tc.rev, tc.compact, tc.current, err, tc.err)
		}
	}
}

func TestRangeSpan(t *testing.T) {
	for _, tc := range []struct {
		key, end           string
		wantStart, wantEnd string
		unbounded          bool
	}{
		{"a", "", "a", "a\x00", false},
		{"a", "\x00", "a", "", true},
		{"a", "b", "a", "b", false},
		{"b", "a", "b", "a", false}, // empty, as etcd's
		{"a", "\x00\x00", "a", "\x00\x00", false},
	} {
		start, end := RangeSpan([]byte(tc.key), []byte(tc.end))
		if !bytes.Equal(start, []byte(tc.wantStart)) || (end == nil) != tc.unbounded || (!tc.unbounded && !bytes.Equal(end, []byte(tc.wantEnd))) {
			t.Errorf("RangeSpan(%q, %q) = %q, %q", tc.key, tc.end, start, end)
		}
	}
}
