package server

import (
	"bytes"
	"fmt"
	"math"
	"time"

	"github.com/hedgekv/hedgekv/keyspace"
	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits on request contents (docs/design.md; the CLI and gRPC contract). Requests beyond them
// are refused with InvalidArgument before they reach the store, so a bad
// request never changes anything.
const (
	MaxKeySize   = 8 << 10 // 8 KiB
	MaxValueSize = 8 << 20 // 8 MiB
	MaxScanLimit = 10000
	// DefaultScanLimit applies when a ScanRequest leaves limit at 0, so a
	// client that forgets the field still gets a bounded answer.
	DefaultScanLimit = 1000
	MaxBatchGetKeys  = 10000

	// maxRecvMsgSize lets a maximal value plus its key and envelope arrive,
	// so an oversized value is refused by validation with InvalidArgument
	// rather than by grpc with ResourceExhausted.
	maxRecvMsgSize = 16 << 20
)

func validateKey(what string, key []byte) error {
	if len(key) == 0 {
		return status.Errorf(codes.InvalidArgument, "%s is empty", what)
	}
	if len(key) > MaxKeySize {
		return status.Errorf(codes.InvalidArgument, "%s is %d bytes, over the %d byte limit", what, len(key), MaxKeySize)
	}
	return nil
}

// validateUserKey checks a key the KV API reads or writes: validateKey's
// limits, and outside the etcd API's keyspace (package keyspace), which
// is the etcd layer's alone: a KV write there would change its records
// behind its back, and a KV read would show them as they are stored.
func validateUserKey(what string, key []byte) error {
	if err := validateKey(what, key); err != nil {
		return err
	}
	if keyspace.IsEtcd(key) {
		return status.Errorf(codes.InvalidArgument, "%s %s has the reserved prefix %s: keys under it are the etcd API's keyspace, not the KV API's",
			what, shortKey(key), region.FormatKey([]byte(keyspace.EtcdPrefix)))
	}
	return nil
}

// shortKey shows a key in an error message (region.FormatKey), its first
// 64 bytes if it is longer.
func shortKey(key []byte) string {
	const most = 64
	if len(key) <= most {
		return region.FormatKey(key)
	}
	return fmt.Sprintf("%s... (%d bytes)", region.FormatKey(key[:most]), len(key))
}

func validateValue(value []byte) error {
	if len(value) > MaxValueSize {
		return status.Errorf(codes.InvalidArgument, "value is %d bytes, over the %d byte limit", len(value), MaxValueSize)
	}
	return nil
}

func validateBatchGet(req *kvpb.BatchGetRequest) error {
	if n := len(req.GetKeys()); n > MaxBatchGetKeys {
		return status.Errorf(codes.InvalidArgument, "batch get of %d keys, over the %d key limit", n, MaxBatchGetKeys)
	}
	for _, k := range req.GetKeys() {
		if err := validateUserKey("key in batch", k); err != nil {
			return err
		}
	}
	return nil
}

// validateScan checks a scan and returns the limit to use. The start key may
// be empty (the start of the key space); the end key may be empty (the
// region's end).
func validateScan(req *kvpb.ScanRequest) (int, error) {
	if len(req.GetStartKey()) > MaxKeySize {
		return 0, status.Errorf(codes.InvalidArgument, "start key is %d bytes, over the %d byte limit", len(req.GetStartKey()), MaxKeySize)
	}
	if len(req.GetEndKey()) > MaxKeySize {
		return 0, status.Errorf(codes.InvalidArgument, "end key is %d bytes, over the %d byte limit", len(req.GetEndKey()), MaxKeySize)
	}
	if len(req.GetEndKey()) > 0 && bytes.Compare(req.GetEndKey(), req.GetStartKey()) < 0 {
		return 0, status.Errorf(codes.InvalidArgument, "end key %q sorts before start key %q", req.GetEndKey(), req.GetStartKey())
	}
	switch limit := req.GetLimit(); {
	case limit == 0:
		return DefaultScanLimit, nil
	case limit > MaxScanLimit:
		return 0, status.Errorf(codes.InvalidArgument, "scan limit %d over the maximum %d", limit, MaxScanLimit)
	default:
		return int(limit), nil
	}
}

// A scan's range may cover the etcd API's keyspace [keyspace.EtcdPrefix,
// keyspace.EtcdEnd): the KV API reads around it, never in it, and answers
// so that a client's scan across regions, which goes on from each
// answer's RegionEndKey (client.Session.Scan), steps over it:
//
//   - a scan that starts before the range and reaches into it reads up to
//     the range's start only, and answers a RegionEndKey no later than
//     the range's start: the client's next request starts there;
//   - a scan that starts inside the range reads nothing (it still passes
//     the region's read barrier, so it is routed, and refused with
//     NotLeader or EpochNotMatch, as any read is) and answers the range's
//     end as its RegionEndKey: the client goes on from there.
//
// Refusing a scan that starts inside would break every scan of the whole
// key space (ctl kv scan with no end) once the range is a region of its
// own; as it is, such a scan costs one more round trip, answered empty.

// scanReadRange returns what a validated scan of [start, end) reads:
// [start, readEnd), or nothing if none.
func scanReadRange(start, end []byte) (readEnd []byte, none bool) {
	if keyspace.IsEtcd(start) {
		return end, true
	}
	if scanReachesEtcd(start, end) {
		return []byte(keyspace.EtcdPrefix), false
	}
	return end, false
}

// scanRegionEnd returns the RegionEndKey to answer a validated scan of
// [start, end) served by a region ending at regionEnd (empty: +infinity).
func scanRegionEnd(start, end, regionEnd []byte) []byte {
	if keyspace.IsEtcd(start) {
		return []byte(keyspace.EtcdEnd)
	}
	if scanReachesEtcd(start, end) && (len(regionEnd) == 0 || bytes.Compare(regionEnd, []byte(keyspace.EtcdPrefix)) > 0) {
		return []byte(keyspace.EtcdPrefix)
	}
	return regionEnd
}

// scanReachesEtcd: a scan of [start, end) starts before the etcd API's
// keyspace and reaches into it.
func scanReachesEtcd(start, end []byte) bool {
	prefix := []byte(keyspace.EtcdPrefix)
	return bytes.Compare(start, prefix) < 0 && (len(end) == 0 || bytes.Compare(end, prefix) > 0)
}

func readOptions(rc *kvpb.ReadContext) raftstore.ReadOptions {
	return raftstore.ReadOptions{
		RegionID:     rc.GetRegionId(),
		Epoch:        rc.GetRegionEpoch().ToEpoch(),
		ReplicaRead:  rc.GetReplicaRead(),
		MaxStaleness: msDuration(rc.GetMaxStalenessMs()),
	}
}

func writeOptions(wc *kvpb.WriteContext) raftstore.WriteOptions {
	return raftstore.WriteOptions{
		RegionID:  wc.GetRegionId(),
		Epoch:     wc.GetRegionEpoch().ToEpoch(),
		RequestID: wc.GetRequestId(),
	}
}

// msDuration converts milliseconds, saturating instead of overflowing so a
// huge staleness bound keeps its meaning ("any staleness").
func msDuration(ms uint64) time.Duration {
	if ms > uint64(math.MaxInt64/int64(time.Millisecond)) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ms) * time.Millisecond
}
