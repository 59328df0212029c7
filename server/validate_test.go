package server

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/keyspace"
	"github.com/hedgekv/hedgekv/kvpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestValidateRequests(t *testing.T) {
	bigKey := bytes.Repeat([]byte("k"), MaxKeySize+1)
	okKey := bytes.Repeat([]byte("k"), MaxKeySize)
	manyKeys := make([][]byte, MaxBatchGetKeys+1)
	for i := range manyKeys {
		manyKeys[i] = []byte("k")
	}
	cases := []struct {
		name string
		err  error
		ok   bool
	}{
		{"key ok", validateKey("key", []byte("a")), true},
		{"key at limit", validateKey("key", okKey), true},
		{"key empty", validateKey("key", nil), false},
		{"key over limit", validateKey("key", bigKey), false},
		{"value empty", validateValue(nil), true},
		{"value at limit", validateValue(make([]byte, MaxValueSize)), true},
		{"value over limit", validateValue(make([]byte, MaxValueSize+1)), false},
		{"batch get ok", validateBatchGet(&kvpb.BatchGetRequest{Keys: [][]byte{[]byte("a"), []byte("b")}}), true},
		{"batch get empty", validateBatchGet(&kvpb.BatchGetRequest{}), true},
		{"batch get too many", validateBatchGet(&kvpb.BatchGetRequest{Keys: manyKeys}), false},
		{"batch get empty key", validateBatchGet(&kvpb.BatchGetRequest{Keys: [][]byte{[]byte("a"), nil}}), false},
		{"batch get big key", validateBatchGet(&kvpb.BatchGetRequest{Keys: [][]byte{bigKey}}), false},
		{"scan all", scanErr(&kvpb.ScanRequest{}), true},
		{"scan limit max", scanErr(&kvpb.ScanRequest{Limit: MaxScanLimit}), true},
		{"scan limit over", scanErr(&kvpb.ScanRequest{Limit: MaxScanLimit + 1}), false},
		{"scan end before start", scanErr(&kvpb.ScanRequest{StartKey: []byte("b"), EndKey: []byte("a")}), false},
		{"scan end equals start", scanErr(&kvpb.ScanRequest{StartKey: []byte("b"), EndKey: []byte("b")}), true},
		{"scan big start", scanErr(&kvpb.ScanRequest{StartKey: bigKey}), false},
		{"scan big end", scanErr(&kvpb.ScanRequest{EndKey: bigKey}), false},
		{"scan over the etcd keyspace", scanErr(&kvpb.ScanRequest{StartKey: []byte(keyspace.EtcdPrefix)}), true},
		{"user key ok", validateUserKey("key", []byte("a")), true},
		{"user key empty", validateUserKey("key", nil), false},
		{"user key over limit", validateUserKey("key", bigKey), false},
		{"user key before the etcd keyspace", validateUserKey("key", []byte("\xffetcd")), true},
		{"user key at the etcd keyspace's end", validateUserKey("key", []byte(keyspace.EtcdEnd)), true},
		{"user key is the etcd prefix", validateUserKey("key", []byte(keyspace.EtcdPrefix)), false},
		{"user key in the etcd keyspace", validateUserKey("key", []byte(keyspace.EtcdPrefix+"foo")), false},
		{"batch get etcd key", validateBatchGet(&kvpb.BatchGetRequest{Keys: [][]byte{[]byte("a"), []byte(keyspace.EtcdPrefix + "k")}}), false},
	}
	for _, tc := range cases {
		if tc.ok && tc.err != nil {
			t.Errorf("%s: unexpected error %v", tc.name, tc.err)
		}
		if !tc.ok && status.Code(tc.err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", tc.name, tc.err)
		}
	}
}

func scanErr(req *kvpb.ScanRequest) error {
	_, err := validateScan(req)
	return err
}

func TestScanLimitDefault(t *testing.T) {
	if n, err := validateScan(&kvpb.ScanRequest{}); err != nil || n != DefaultScanLimit {
		t.Fatalf("limit 0 -> %d, %v; want %d", n, err, DefaultScanLimit)
	}
	if n, err := validateScan(&kvpb.ScanRequest{Limit: 7}); err != nil || n != 7 {
		t.Fatalf("limit 7 -> %d, %v", n, err)
	}
}

func TestReadOptions(t *testing.T) {
	o := readOptions(&kvpb.ReadContext{RegionId: 3, RegionEpoch: &kvpb.Epoch{ConfVer: 2, Version: 5}, ReplicaRead: true, MaxStalenessMs: 1500})
	if o.RegionID != 3 || o.Epoch.ConfVer != 2 || o.Epoch.Version != 5 || !o.ReplicaRead || o.MaxStaleness != 1500*time.Millisecond {
		t.Fatalf("readOptions = %+v", o)
	}
	if o := readOptions(nil); o.RegionID != 0 || o.ReplicaRead || o.MaxStaleness != 0 {
		t.Fatalf("readOptions(nil) = %+v", o)
	}
	if d := msDuration(math.MaxUint64); d != time.Duration(math.MaxInt64) {
		t.Fatalf("msDuration saturates to %v", d)
	}
	w := writeOptions(&kvpb.WriteContext{RegionId: 4, RegionEpoch: &kvpb.Epoch{Version: 9}})
	if w.RegionID != 4 || w.Epoch.Version != 9 {
		t.Fatalf("writeOptions = %+v", w)
	}
}

func TestMethodLabel(t *testing.T) {
	if got := methodLabel("/hedgekv.KV/Get"); got != "KV.Get" {
		t.Fatalf("methodLabel = %q", got)
	}
}

func TestLoadTracker(t *testing.T) {
	var l loadTracker
	if ld := l.load(); ld.InflightReads != 0 || ld.EstWaitUs != 0 {
		t.Fatalf("idle load = %v", ld)
	}
	start := l.begin()
	if l.load().InflightReads != 1 {
		t.Fatal("in-flight read not counted")
	}
	time.Sleep(2 * time.Millisecond)
	l.end(start)
	if ld := l.load(); ld.InflightReads != 0 || ld.EstWaitUs < 1000 {
		t.Fatalf("after one 2ms read: %v", ld)
	}
}

// TestValidateMembership: AddPeer and RemovePeer need a region and a store.
func TestValidateMembership(t *testing.T) {
	for _, tc := range []struct {
		region, store uint64
		ok            bool
	}{{1, 1, true}, {0, 1, false}, {1, 0, false}, {0, 0, false}} {
		err := validateMembership(tc.region, tc.store)
		if (err == nil) != tc.ok {
			t.Errorf("validateMembership(%d, %d) = %v", tc.region, tc.store, err)
		} else if err != nil && status.Code(err) != codes.InvalidArgument {
			t.Errorf("validateMembership(%d, %d) = %v, want InvalidArgument", tc.region, tc.store, err)
		}
	}
}

// TestReservedKeyRefusal: a key of the etcd API's keyspace is refused with
// InvalidArgument naming the prefix and whose keyspace it is; a long one
// is shown cut short.
func TestReservedKeyRefusal(t *testing.T) {
	err := validateUserKey("key", []byte(keyspace.EtcdPrefix+"foo"))
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), `\xffetcd/`) || !strings.Contains(st.Message(), "etcd API's keyspace") ||
		!strings.Contains(st.Message(), `\xffetcd/foo`) {
		t.Fatalf("refusal: %v", err)
	}
	long := append([]byte(keyspace.EtcdPrefix), bytes.Repeat([]byte("x"), MaxKeySize-len(keyspace.EtcdPrefix))...)
	if err := validateUserKey("key", long); status.Code(err) != codes.InvalidArgument || len(err.Error()) > 400 {
		t.Fatalf("a long reserved key: %d bytes of message: %v", len(err.Error()), err)
	}
}

// TestScanAroundTheEtcdKeyspace: what a scan reads and where its answer
// sends the client next, for ranges before, reaching into, starting
// inside and after the etcd API's keyspace, and regions ending before, at,
// inside and after it.
func TestScanAroundTheEtcdKeyspace(t *testing.T) {
	const (
		p   = keyspace.EtcdPrefix
		e   = keyspace.EtcdEnd
		inf = "" // an empty end: +infinity
	)
	for _, tc := range []struct {
		start, end, regionEnd string
		readEnd               string
		none                  bool
		next                  string
	}{
		// Before the keyspace, not reaching it: as it was.
		{"a", "b", inf, "b", false, inf},
		{"a", p, inf, p, false, inf},
		{"a", "b", "c", "b", false, "c"},
		// Reaching into it: read up to its start, go on from there.
		{"a", inf, inf, p, false, p},
		{"", inf, inf, p, false, p},
		{"a", p + "x", inf, p, false, p},
		{"a", "\xff\xff", "\xfe", p, false, "\xfe"}, // the region ends first
		{"a", "\xff\xff", p, p, false, p},           // the region ends at it
		{"a", inf, p + "m", p, false, p},            // the region ends inside it
		{"a", inf, "\xff\xff", p, false, p},         // the region holds it all
		// Starting inside it: read nothing, go on from its end.
		{p, inf, e, inf, true, e},
		{p, inf, inf, inf, true, e},
		{p + "x", "\xff\xff", inf, "\xff\xff", true, e},
		{p + "x", p + "y", p + "z", p + "y", true, e},
		// After it: as it was.
		{e, inf, inf, inf, false, inf},
		{"\xff\xff", inf, inf, inf, false, inf},
		{e, "\xff\xff", "\xff\x01", "\xff\xff", false, "\xff\x01"},
	} {
		start, end, regionEnd := []byte(tc.start), []byte(tc.end), []byte(tc.regionEnd)
		readEnd, none := scanReadRange(start, end)
		next := scanRegionEnd(start, end, regionEnd)
		if string(readEnd) != tc.readEnd || none != tc.none || string(next) != tc.next {
			t.Errorf("scan [%q, %q) in a region ending at %q: reads to %q (none %v), goes on at %q; want %q (none %v), %q",
				start, end, regionEnd, readEnd, none, next, tc.readEnd, tc.none, tc.next)
		}
	}
}
