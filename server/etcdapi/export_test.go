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
