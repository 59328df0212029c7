package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/keyspace"
	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Fuzz targets for what the server accepts from the network before any of
// it reaches the store: KV and admin request validation and the raft
// message delivery path. Every refusal must be an InvalidArgument status
// (never a panic, never another code), and every acceptance must be within
// the documented limits. The seed corpora are in testdata/fuzz/<target>.

// maxStaleMs is the largest staleness bound, in ms, a Duration holds.
const maxStaleMs = uint64(math.MaxInt64 / int64(time.Millisecond))

// zeros backs padded keys and values, so long inputs cost no allocation.
var zeros = make([]byte, MaxValueSize+2)

// padded returns b followed by pad zero bytes, sharing zeros when b is empty.
func padded(b []byte, pad int) []byte {
	if len(b) == 0 {
		return zeros[:pad]
	}
	return append(bytes.Clone(b), zeros[:pad]...)
}

func wantInvalidArgument(t *testing.T, what string, err error) {
	t.Helper()
	if st, ok := status.FromError(err); !ok || st.Code() != codes.InvalidArgument {
		t.Fatalf("%s refused with %v, want an InvalidArgument status", what, err)
	}
}

// splitKeys reads a batch of keys: a length byte, then that many bytes
// (lengths past the end are cut short), so the fuzzer can make empty keys.
func splitKeys(b []byte) [][]byte {
	var keys [][]byte
	for len(b) > 0 {
		n := min(int(b[0]), len(b)-1)
		keys = append(keys, b[1:1+n])
		b = b[1+n:]
	}
	return keys
}

// FuzzValidateKV: Get/Put/Delete keys and values, BatchGet key lists, Scan
// ranges and limits, and the read context's staleness bound.
func FuzzValidateKV(f *testing.F) {
	f.Add([]byte("k"), uint16(0), []byte("v"), uint32(0), []byte("a"), []byte("z"), uint32(10), []byte("\x01a\x01b"), uint64(5))
	f.Add([]byte{}, uint16(0), []byte{}, uint32(0), []byte{}, []byte{}, uint32(0), []byte{}, uint64(0))
	f.Add([]byte{}, uint16(MaxKeySize), []byte{}, uint32(MaxValueSize), []byte("b"), []byte("a"), uint32(MaxScanLimit), []byte("\x00"), uint64(math.MaxUint64))
	f.Add([]byte("k"), uint16(MaxKeySize), []byte("v"), uint32(MaxValueSize), []byte("a"), []byte(""), uint32(MaxScanLimit+1), []byte("\x01a\x00"), maxStaleMs+1)
	f.Add([]byte("a\x00"), uint16(0), []byte(nil), uint32(0), []byte("a\x00"), []byte("a"), uint32(math.MaxUint32), []byte("\xff"), uint64(1))
	// The etcd API's keyspace: a key in it, a scan over it in a region
	// reaching past it (value: the region's end), one starting inside it.
	f.Add([]byte(keyspace.EtcdPrefix+"k"), uint16(0), []byte("\xff\xff"), uint32(0), []byte("a"), []byte(""), uint32(0), []byte("\x07\xffetcd/x\x01a"), uint64(0))
	f.Add([]byte(keyspace.EtcdEnd), uint16(0), []byte(keyspace.EtcdPrefix+"m"), uint32(0), []byte(keyspace.EtcdPrefix), []byte("\xff\xff"), uint32(5), []byte("\x06\xffetcd"), uint64(0))

	f.Fuzz(func(t *testing.T, key []byte, keyPad uint16, value []byte, valPad uint32, start, end []byte, limit uint32, batch []byte, staleMs uint64) {
		k := padded(key, int(keyPad)%(MaxKeySize+2))
		err := validateKey("key", k)
		if bad := len(k) == 0 || len(k) > MaxKeySize; bad != (err != nil) {
			t.Fatalf("validateKey(%d bytes) = %v", len(k), err)
		} else if bad {
			wantInvalidArgument(t, "key", err)
		}
		// The KV API's keys: the same, and none of the etcd API's.
		err = validateUserKey("key", k)
		if bad := len(k) == 0 || len(k) > MaxKeySize || bytes.HasPrefix(k, []byte(keyspace.EtcdPrefix)); bad != (err != nil) {
			t.Fatalf("validateUserKey(%q) = %v", shortKey(k), err)
		} else if bad {
			wantInvalidArgument(t, "user key", err)
		}

		// Only a value's length is checked: no need to copy it.
		v := zeros[:min(len(value)+int(valPad%(MaxValueSize+2)), len(zeros))]
		err = validateValue(v)
		if bad := len(v) > MaxValueSize; bad != (err != nil) {
			t.Fatalf("validateValue(%d bytes) = %v", len(v), err)
		} else if bad {
			wantInvalidArgument(t, "value", err)
		}

		// Long scan bounds come from the key padding.
		s, e := start, end
		if keyPad&1 == 1 {
			s = padded(start, int(keyPad)%(MaxKeySize+2))
		} else {
			e = padded(end, int(keyPad)%(MaxKeySize+2))
		}
		req := &kvpb.ScanRequest{StartKey: s, EndKey: e, Limit: limit}
		n, err := validateScan(req)
		bad := len(s) > MaxKeySize || len(e) > MaxKeySize || (len(e) > 0 && bytes.Compare(e, s) < 0) || limit > MaxScanLimit
		if bad != (err != nil) {
			t.Fatalf("validateScan(start %d bytes, end %d bytes, limit %d) = %d, %v", len(s), len(e), limit, n, err)
		}
		if bad {
			wantInvalidArgument(t, "scan", err)
		} else if n < 1 || n > MaxScanLimit || (limit > 0 && n != int(limit)) || (limit == 0 && n != DefaultScanLimit) {
			t.Fatalf("validateScan(limit %d) = %d", limit, n)
		} else {
			// value, as a store would answer it: the end of a region holding s.
			regionEnd := value
			if len(regionEnd) == 0 || bytes.Compare(regionEnd, s) > 0 {
				checkScanCut(t, s, e, regionEnd)
			}
		}

		keys := splitKeys(batch)
		err = validateBatchGet(&kvpb.BatchGetRequest{Keys: keys})
		bad = len(keys) > MaxBatchGetKeys
		for _, k := range keys {
			bad = bad || len(k) == 0 || len(k) > MaxKeySize || keyspace.IsEtcd(k)
		}
		if bad != (err != nil) {
			t.Fatalf("validateBatchGet(%q) = %v", keys, err)
		} else if bad {
			wantInvalidArgument(t, "batch get", err)
		}

		ro := readOptions(&kvpb.ReadContext{MaxStalenessMs: staleMs})
		if ro.MaxStaleness < 0 || (staleMs <= maxStaleMs && ro.MaxStaleness != time.Duration(staleMs)*time.Millisecond) {
			t.Fatalf("staleness %d ms became %v", staleMs, ro.MaxStaleness)
		}
	})
}

// endBefore orders range ends: an empty end is +infinity.
func endBefore(a, b []byte) bool {
	return len(a) > 0 && (len(b) == 0 || bytes.Compare(a, b) < 0)
}

func minEnd(a, b []byte) []byte {
	if endBefore(b, a) {
		return b
	}
	return a
}

// checkScanCut: a validated scan of [start, end) served by a region
// ending at regionEnd reads no key of the etcd API's keyspace, never
// widens the range, moves the client forward, and skips no other key: the
// keys between what it read and where the client goes on from are all
// the etcd API's.
func checkScanCut(t *testing.T, start, end, regionEnd []byte) {
	t.Helper()
	p, pe := []byte(keyspace.EtcdPrefix), []byte(keyspace.EtcdEnd)
	readEnd, none := scanReadRange(start, end)
	next := scanRegionEnd(start, end, regionEnd)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("scan [%q, %q) in a region ending at %q: reads to %q (none %v), goes on at %q: %s",
			start, end, regionEnd, readEnd, none, next, fmt.Sprintf(format, args...))
	}
	if none != keyspace.IsEtcd(start) {
		fail("reads nothing only when it starts in the etcd keyspace")
	}
	if endBefore(end, readEnd) {
		fail("widened")
	}
	if !none && bytes.Compare(start, p) < 0 && endBefore(p, readEnd) {
		fail("reads into the etcd keyspace")
	}
	if len(next) > 0 && bytes.Compare(next, start) <= 0 {
		fail("no progress")
	}
	// What the store read, clamped to its region, and where the client
	// stops this step: the gap between must be the etcd API's.
	read := start
	if !none {
		read = minEnd(readEnd, regionEnd)
	}
	upto := minEnd(next, end)
	if endBefore(read, upto) && (bytes.Compare(read, p) < 0 || endBefore(pe, upto)) {
		fail("skips keys in [%q, %q) that are not the etcd API's", read, upto)
	}
}

// FuzzCheckFaultRequest: the Admin Fault call. An accepted request must
// apply without panicking and leave the state it asked for.
func FuzzCheckFaultRequest(f *testing.F) {
	f.Add(int64(200*time.Millisecond), 0.5, int64(0), false)
	f.Add(int64(0), 0.0, int64(time.Second), false)
	f.Add(int64(0), 0.0, int64(0), true)
	f.Add(int64(0), 0.0, int64(0), false)
	f.Add(int64(-1), 1.0, int64(0), false)
	f.Add(int64(1), math.NaN(), int64(0), false)
	f.Add(int64(1), math.Inf(1), int64(math.MaxInt64), true)
	f.Add(int64(0), 0.25, int64(0), false)
	f.Add(int64(math.MaxInt64), 1.0, int64(math.MaxInt64), true)
	f.Add(int64(1), 1e-300, int64(-5), false)

	f.Fuzz(func(t *testing.T, delay int64, prob float64, stall int64, clear bool) {
		req := &kvpb.FaultRequest{DelayNanos: delay, Prob: prob, StallNanos: stall, Clear: clear}
		err := checkFaultRequest(req)
		ok := delay >= 0 && stall >= 0 && !math.IsNaN(prob) && prob >= 0 && prob <= 1 &&
			(delay > 0) == (prob > 0) && (clear || delay > 0 || stall > 0)
		if ok != (err == nil) {
			t.Fatalf("checkFaultRequest(%+v) = %v", req, err)
		}
		if err != nil {
			wantInvalidArgument(t, "fault", err)
			return
		}
		fi := newFaultInjector(nil)
		fi.apply(&kvpb.FaultRequest{DelayNanos: int64(time.Hour), Prob: 1, StallNanos: int64(time.Hour)})
		fi.apply(req)
		st := fi.state.Load()
		switch {
		case delay > 0:
			if st.delay != time.Duration(delay) || st.prob != prob {
				t.Fatalf("after %+v: delay %v prob %v", req, st.delay, st.prob)
			}
		case clear:
			if st.delay != 0 || st.prob != 0 {
				t.Fatalf("after %+v: delay %v prob %v", req, st.delay, st.prob)
			}
		}
		if clear && stall == 0 && fi.stalled() {
			t.Fatalf("after %+v: still stalled", req)
		}
		if stall > int64(time.Minute) && !fi.stalled() {
			t.Fatalf("after %+v: not stalled", req)
		}
	})
}

// recordingHandler is the store as deliver sees it.
type recordingHandler struct {
	got []*raftstore.Message
	err error
}

func (h *recordingHandler) HandleRaftMessage(m *raftstore.Message) error {
	h.got = append(h.got, m)
	return h.err
}
func (h *recordingHandler) ReportUnreachable(uint64, uint64)        {}
func (h *recordingHandler) ReportSnapshot(*raftstore.Message, bool) {}

// FuzzRaftDeliver: one kvpb.RaftMessage as the Raft service receives it
// (wire bytes, unmarshalled as grpc does) on the Stream RPC, or as the
// header of a Snapshot RPC with the reassembled data. deliver must refuse
// what does not decode or is not for this store with InvalidArgument and
// hand everything else to the store intact. (What the store then checks,
// the MsgSnap validation included, is raftstore's FuzzHandleRaftMessage.)
func FuzzRaftDeliver(f *testing.F) {
	msg := func(m raftpb.Message) []byte {
		b, err := m.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	rm := func(r *kvpb.RaftMessage) []byte {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	app := msg(raftpb.Message{Type: raftpb.MsgApp, From: 2, To: 1, Term: 3, Index: 5, LogTerm: 2, Entries: []raftpb.Entry{{Term: 3, Index: 6, Data: []byte("x")}}, Commit: 5})
	snap := msg(raftpb.Message{Type: raftpb.MsgSnap, From: 2, To: 1, Term: 3, Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 9, Term: 3}}})
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 1, Message: app}), false, []byte(nil), false)
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 1, Message: snap}), true, []byte("HKVS3..."), false)
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 1, Message: snap}), false, []byte(nil), true)
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 1, Message: app}), true, []byte("x"), true) // a snapshot header that is not a MsgSnap
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 1, Message: msg(raftpb.Message{Type: raftpb.MsgSnap, From: 2, To: 1})}), true, []byte("x"), false)
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 3, Message: app}), false, []byte(nil), false) // another store's
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 1, Message: app[:len(app)/2]}), false, []byte(nil), false)
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 1, Message: app,
		SafePoint: &kvpb.SafePoint{Term: 3, Commit: 5, TimeUnixNano: math.MinInt64}}), false, []byte(nil), false)
	grant := &kvpb.Notice{Kind: kvpb.NoticeKind_NOTICE_KIND_LEASE_GRANT, From: 2, To: 1, Term: 3,
		Lease: &kvpb.LeaseMsg{Seq: 1, Commit: 5, DurationNanos: math.MaxUint64}}
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 1, Notice: grant}), false, []byte(nil), false)
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 1, Notice: grant, Message: app}), false, []byte(nil), false) // both
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 1, Notice: grant}), true, []byte("x"), false)                // a notice as a snapshot header
	f.Add(rm(&kvpb.RaftMessage{RegionId: 1, FromStore: 2, ToStore: 1, Notice: &kvpb.Notice{Kind: 99}}), false, []byte(nil), false)
	f.Add([]byte{0x0a, 0xff}, false, []byte(nil), false)

	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, wire []byte, isSnap bool, snapData []byte, refuse bool) {
		var in kvpb.RaftMessage
		if err := proto.Unmarshal(wire, &in); err != nil {
			return // grpc refuses it before the service sees it
		}
		h := &recordingHandler{}
		if refuse {
			h.err = errors.New("refused")
		}
		s := newRaftService(1, h, logger)
		err := s.deliver(&in, isSnap, snapData)

		var m raftpb.Message
		decodeErr := m.Unmarshal(in.GetMessage())
		pn := in.GetNotice()
		if pn != nil {
			decodeErr = nil
			if len(in.GetMessage()) > 0 || !raftstore.NoticeKind(pn.GetKind()).Valid() || pn.GetKind() < 0 || pn.GetKind() > 255 {
				decodeErr = errors.New("not a notice")
			}
		}
		bad := in.GetToStore() != 1 || decodeErr != nil || (isSnap && (pn != nil || m.Type != raftpb.MsgSnap || m.Snapshot == nil))
		if bad {
			if len(h.got) != 0 {
				t.Fatalf("a bad message (to store %d, decode %v) reached the store", in.GetToStore(), decodeErr)
			}
			wantInvalidArgument(t, "raft message", err)
			return
		}
		if len(h.got) != 1 {
			t.Fatalf("%d messages reached the store, want 1", len(h.got))
		}
		if (err != nil) != (refuse && isSnap) {
			t.Fatalf("deliver = %v with the store refusing: %v (snapshot %v)", err, refuse, isSnap)
		}
		got := h.got[0]
		if got.RegionID != in.GetRegionId() || got.FromStore != in.GetFromStore() || got.ToStore != 1 {
			t.Fatalf("envelope %+v became %+v", &in, got)
		}
		if pn != nil {
			n := got.Notice
			if n == nil || int32(n.Kind) != int32(pn.GetKind()) || n.From != pn.GetFrom() || n.To != pn.GetTo() || n.Term != pn.GetTerm() || n.Commit != pn.GetCommit() {
				t.Fatalf("notice %v became %+v", pn, n)
			}
			if l := pn.GetLease(); l != nil && (n.Lease == nil || n.Lease.Duration < 0 || n.Lease.Seq != l.GetSeq() || n.Lease.Instance != l.GetInstance()) {
				t.Fatalf("lease %v became %+v", l, n.Lease)
			}
		} else if got.Notice != nil || got.Msg.Type != m.Type || got.Msg.From != m.From || got.Msg.To != m.To || got.Msg.Term != m.Term || len(got.Msg.Entries) != len(m.Entries) {
			t.Fatalf("message %v became %v", m, got.Msg)
		}
		if isSnap && !bytes.Equal(got.Msg.Snapshot.Data, snapData) {
			t.Fatalf("snapshot data of %d bytes became %d", len(snapData), len(got.Msg.Snapshot.Data))
		}
		if (in.GetSafePoint() != nil) != (got.SafePoint != nil) {
			t.Fatalf("safe point %v became %+v", in.GetSafePoint(), got.SafePoint)
		}
	})
}
