package server

import (
	"bytes"
	"math"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
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
		if err := validateKey("key in batch", k); err != nil {
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
