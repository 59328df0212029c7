package etcdapi

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// BeginRestore sends the begin step of a restore of the snapshot info
// describes, as RestoreSnapshot's first call: a test stops there to see
// the keyspace while a restore is under way.
func BeginRestore(ctx context.Context, conn grpc.ClientConnInterface, info SnapshotInfo) error {
	c := &restoreCmd{op: restoreBegin, id: info.SHA256, rev: info.Revision, compact: info.CompactRevision}
	return conn.Invoke(ctx, restoreMethod, wrapperspb.Bytes(c.encode()), new(wrapperspb.Int64Value))
}

// SetBackendBatch makes the snapshot file's write transactions hold n
// entries at most, until the test ends.
func SetBackendBatch(t interface{ Cleanup(func()) }, n int) {
	old := backendBatch
	backendBatch = n
	t.Cleanup(func() { backendBatch = old })
}

// SetWatchBuffer makes a synced watcher's queue hold n events at most
// before it drops back to reading history, until the test ends.
func SetWatchBuffer(t interface{ Cleanup(func()) }, n int) {
	testWatchBuffer.Store(int64(n))
	t.Cleanup(func() { testWatchBuffer.Store(0) })
}

// WatchJoins counts the watchers that joined a store's feed, in this
// process.
func WatchJoins() int64 { return watchJoins.Load() }

// WatchFallbacks counts the synced watchers that fell behind and dropped
// back to reading history, in this process.
func WatchFallbacks() int64 { return watchFallbacks.Load() }

// WatchJoinReads counts the joins that found the feed ahead and read the
// rest of their history holding the feed's lock, in this process.
func WatchJoinReads() int64 { return watchJoinReads.Load() }

// SetBeforeJoin makes every watcher run fn between its last read of
// history and its join to the feed, until the test ends.
func SetBeforeJoin(t interface{ Cleanup(func()) }, fn func()) {
	testBeforeJoin.Store(&fn)
	t.Cleanup(func() { testBeforeJoin.Store(nil) })
}
