package server

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Cluster identity. Every cluster's first region is region 1 with peers
// 1, 2 and 3 on stores 1, 2 and 3, so raft traffic from one cluster's
// store reaching another cluster's store of the same ID is taken as its
// own: a leader's heartbeat carrying a commit index the receiver's log
// never held panics its raft (`tocommit(N) is out of range`). It takes
// only an address that changed hands: a store replaced on the same
// host and port, a port a stopped test cluster freed and another bound.
// So, as etcd's peers send X-Etcd-Cluster-ID, every call a store makes to
// another carries its cluster's ID in gRPC metadata, and a store refuses
// a call that names another cluster. A call naming none (a client, or a
// store of a version that sent none) goes on.
//
// The ID is a hash of the cluster token every store of a cluster is
// started with (--cluster-token, etcd's --initial-cluster-token); the
// first open records it in the data dir (raftstore.Config.ClusterID).

// DefaultClusterToken is the token of a store started without one.
const DefaultClusterToken = "hedgekv-cluster"

// clusterIDKey is the metadata key stores send their cluster's ID under.
const clusterIDKey = "hedgekv-cluster-id"

// ClusterIDOf is the cluster ID of token (DefaultClusterToken's if empty):
// never 0, which means "none".
func ClusterIDOf(token string) uint64 {
	if token == "" {
		token = DefaultClusterToken
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(token))
	if id := h.Sum64(); id != 0 {
		return id
	}
	return 1
}

// clusterIDDialOptions makes every call on a connection to another store
// name cluster id.
func clusterIDDialOptions(id uint64) []grpc.DialOption {
	if id == 0 {
		return nil
	}
	v := strconv.FormatUint(id, 16)
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(metadata.AppendToOutgoingContext(ctx, clusterIDKey, v), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(metadata.AppendToOutgoingContext(ctx, clusterIDKey, v), desc, cc, method, opts...)
		}),
	}
}

// clusterGuard refuses calls from another cluster's stores.
type clusterGuard struct {
	id     uint64
	logger *slog.Logger
	// refused counts the calls refused; lastLog throttles the warning
	// (a refused store retries its stream every few hundred ms).
	refused atomic.Uint64
	lastLog atomic.Int64
}

// check returns FailedPrecondition if ctx's call names a cluster other
// than g's.
func (g *clusterGuard) check(ctx context.Context, method string) error {
	if g == nil || g.id == 0 {
		return nil
	}
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return nil
	}
	vs := md.Get(clusterIDKey)
	if len(vs) == 0 {
		return nil
	}
	from, err := strconv.ParseUint(vs[0], 16, 64)
	if err == nil && from == g.id {
		return nil
	}
	g.refused.Add(1)
	msg := fmt.Sprintf("call from a store of cluster %s: this store belongs to cluster %016x (started with another --cluster-token?)", vs[0], g.id)
	now := time.Now().UnixNano()
	if last := g.lastLog.Load(); now-last >= int64(10*time.Second) && g.lastLog.CompareAndSwap(last, now) {
		g.logger.Warn("refused a call from another cluster", "method", method, "from_cluster", vs[0], "cluster", fmt.Sprintf("%016x", g.id), "refused_total", g.refused.Load())
	}
	return status.Error(codes.FailedPrecondition, msg)
}

func (g *clusterGuard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (g *clusterGuard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
