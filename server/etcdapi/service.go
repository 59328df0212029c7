// Package etcdapi serves etcd's v3 gRPC API (go.etcd.io/etcd/api/v3:
// KV, Lease, and the parts of Maintenance and Cluster etcdctl and clientv3
// call)
// on a hedgekv store, so that clients written for etcd run unchanged.
//
// The whole etcd keyspace lives in one region (its raw keys under Prefix,
// a range the store never splits), so a revision is that region's count of
// its writes, exactly etcd's model (etcd is one raft group): every promise
// etcd makes about revisions holds as it does there, and a Txn is atomic
// over any keys. Writes go through the region's raft log as commands the
// Applier evaluates with etcdmvcc; a store that does not lead the region
// forwards them to the one that does. Linearizable Ranges read after the
// session's read barrier (the leader's lease, or a follower's ReadIndex
// or follower lease, chosen per request by gRPC metadata or the endpoint's
// default); serializable ones read the closest replica's state. Leases
// live in the keyspace too; the store leading the region runs their
// expiry (lessor.go).
package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hedgekv/hedgekv/etcdmvcc"
	"github.com/hedgekv/hedgekv/keyspace"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
)

// Prefix is where the etcd keyspace's raw keys live; the store keeps
// [Prefix, End) one region, and hedgekv's own KV API refuses it.
const (
	Prefix = keyspace.EtcdPrefix
	End    = keyspace.EtcdEnd
)

// KeepRange is the range the store must keep whole
// (raftstore.Config.KeepWhole) for the etcd keyspace to be one region.
func KeepRange() raftstore.KeepRange {
	start, end := keyspace.EtcdRange()
	return raftstore.KeepRange{Start: start, End: end}
}

// KeepRegion makes the etcd keyspace a region of its own, splitting at its
// two ends on the store that leads the region holding each, then returns
// (on a store that does not lead it, once the leader's split is applied
// here). Until then the keyspace lives, whole, inside a larger region,
// which serves it as well: nothing waits for this. The service runs it
// on the store that applies the keyspace's first write: a cluster that
// never uses the etcd API keeps its regions as they were.
func KeepRegion(ctx context.Context, store interface {
	EnsureBoundaries(ctx context.Context, keys ...[]byte) error
}, log *slog.Logger) {
	start, end := keyspace.EtcdRange()
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		err := store.EnsureBoundaries(ctx, start, end)
		var rnf *region.RegionNotFoundError
		if err == nil || errors.As(err, &rnf) {
			return // done, or this store holds no replica: its leader's store splits
		}
		if ctx.Err() != nil {
			return
		}
		var nl *region.NotLeaderError
		if !errors.As(err, &nl) {
			log.Debug("etcd keyspace region boundaries: will retry", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// Version is the etcd API version served (Maintenance.Status).
const Version = "3.7.3"

// clusterID names the etcd "cluster" in response headers: one hedgekv
// cluster, as one etcd cluster.
const clusterID = 0x6865646765

// Session read modes, chosen per request with the gRPC metadata key
// MetadataReadMode (clientv3: metadata.AppendToOutgoingContext), else
// the endpoint's default (Config.DefaultRead).
const (
	MetadataReadMode     = "hedgekv-read-mode"
	MetadataMaxStaleness = "hedgekv-max-staleness"
	// ReadLeader: the region's leader answers (its lease, else ReadIndex);
	// a follower forwards the read. etcd's own behaviour.
	ReadLeader = "leader"
	// ReadFollower: the store the client called answers, after a
	// ReadIndex round trip to the leader or under a follower lease:
	// linearizable, served in the caller's zone.
	ReadFollower = "follower"
	// ReadStale: the local replica answers from state at most
	// hedgekv-max-staleness old (default 10s), with no round trip.
	ReadStale = "stale"
)

// mdForwarded marks a request one store forwarded to the region's leader:
// the leader must not forward it again.
const mdForwarded = "hedgekv-forwarded"

// Store is what the service needs of a raftstore.Store.
type Store interface {
	ID() uint64
	Propose(ctx context.Context, opts raftstore.WriteOptions, key []byte, payload []byte) ([]byte, error)
	ReadView(ctx context.Context, opts raftstore.ReadOptions, key []byte, fn func(raftstore.StateView) error) (raftstore.ReadInfo, error)
	RegionsFrom(start []byte, limit int) ([]raftstore.RegionStatus, bool)
	Term(key []byte) (uint64, bool)
	Gauges() raftstore.Gauges
	EnsureBoundaries(ctx context.Context, keys ...[]byte) error
}

// Config wires the service to its store and its peers.
type Config struct {
	Store Store
	// Applier is the one the store applies the keyspace's writes with
	// (raftstore.Config.Applier): watchers wait on it, and the lessor
	// learns from it of the grants applied here (with another, a lease
	// granted while this store leads and never kept alive would not
	// expire until the next leader change).
	Applier *Applier
	// Conn returns a connection to another store's gRPC server, which
	// serves this API too: a write, or a read the session sends to the
	// leader, goes there when this store does not lead the region.
	Conn func(storeID uint64) (*grpc.ClientConn, error)
	// Members returns every store's client address (Cluster.MemberList).
	Members func() map[uint64]string
	// TLS: the members' URLs are https.
	TLS bool
	// DefaultRead is the read mode of a request that names none
	// (ReadLeader if empty).
	DefaultRead string
	// TickInterval and ElectionTicks are the store's raft timing
	// (raftstore.Config; zero: raftstore's defaults, 50ms and 10). As on
	// etcd, a lease is granted for at least 3/2 election timeouts
	// (rounded up to a second) and gets an election timeout more than its
	// TTL when a store becomes the region's leader.
	TickInterval  time.Duration
	ElectionTicks int
	Logger        *slog.Logger
	// Context bounds the service's background work (the split that makes
	// the keyspace its own region); nil: context.Background().
	Context context.Context
	// Knobs are tests' hooks into this service; nil in production.
	Knobs *TestingKnobs
}

// Service implements etcd's KV, Watch, Lease, Maintenance and Cluster
// services. Stop it (its lessor) when the server stops.
type Service struct {
	pb.UnimplementedKVServer
	pb.UnimplementedLeaseServer
	pb.UnimplementedMaintenanceServer
	pb.UnimplementedClusterServer
	pb.UnimplementedWatchServer
	cfg    Config
	split  sync.Once // KeepRegion, started once the keyspace is in use (keepRegion)
	lessor *lessor
	// minLeaseTTL is etcd's minLeaseTTL (seconds): a shorter grant is
	// raised to it.
	minLeaseTTL int64
	stopc       chan struct{} // closed by Stop: streams end
	stopOnce    sync.Once
	feed        *feed                      // the store's watch feed (feed.go)
	found       elsewhere                  // the leader other stores named (elsewhere.go)
	term        atomic.Pointer[cachedTerm] // watchHeader's
}

// Register serves the etcd API on g and starts its lessor, which runs
// until Stop.
func Register(g *grpc.Server, cfg Config) *Service {
	if cfg.DefaultRead == "" {
		cfg.DefaultRead = ReadLeader
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Applier == nil {
		cfg.Applier = NewApplier() // watchers then poll (tests)
	}
	if cfg.Context == nil {
		cfg.Context = context.Background()
	}
	if cfg.TickInterval <= 0 {
		cfg.TickInterval = 50 * time.Millisecond
	}
	if cfg.ElectionTicks <= 0 {
		cfg.ElectionTicks = 10
	}
	// etcd's (server/etcdserver/server.go): minTTL is 3/2 election
	// timeouts, in whole seconds rounded up; Promote extends by one.
	minTTL := time.Duration((3*cfg.ElectionTicks)/2) * cfg.TickInterval
	s := &Service{
		cfg:         cfg,
		minLeaseTTL: int64(math.Ceil(minTTL.Seconds())),
		stopc:       make(chan struct{}),
	}
	s.feed = newFeed(s)
	s.lessor = newLessor(s, time.Duration(cfg.ElectionTicks)*cfg.TickInterval)
	cfg.Applier.leases.Store(s.lessor)
	inUse := s.keepRegion
	cfg.Applier.inUse.Store(&inUse)
	pb.RegisterKVServer(g, s)
	pb.RegisterLeaseServer(g, s)
	pb.RegisterMaintenanceServer(g, s)
	pb.RegisterClusterServer(g, s)
	pb.RegisterWatchServer(g, s)
	registerRestore(g, s) // hedgekv etcd-restore's steps (restore.go)
	s.lessor.start()
	return s
}

// keepRegion starts KeepRegion once: the keyspace is in use, so it
// becomes a region of its own (its leader's store splits; KeepRegion
// returns on the others once that split applied there). It runs at this
// store's first write and when any command applies here in a larger
// region (Applier.inUse).
func (s *Service) keepRegion() {
	s.split.Do(func() { go KeepRegion(s.cfg.Context, s.cfg.Store, s.cfg.Logger) })
}

// Stop stops the lessor (no lease expires here after it returns) and ends
// the KeepAlive streams. It may be called more than once.
func (s *Service) Stop() {
	s.stopOnce.Do(func() {
		close(s.stopc)
		s.lessor.stop()
	})
}

func (s *Service) header(rev int64) *pb.ResponseHeader {
	h := &pb.ResponseHeader{ClusterId: clusterID, MemberId: s.cfg.Store.ID(), Revision: rev}
	// Every answer carries it: the term alone, not the region's status.
	if term, ok := s.cfg.Store.Term([]byte(Prefix)); ok {
		h.RaftTerm = term
	}
	return h
}

// regionStatus is this store's view of the etcd region.
func (s *Service) regionStatus() (raftstore.RegionStatus, bool) {
	// The region holding Prefix alone: the lessor asks every tick, and
	// every region's status costs a store of thousands of them dearly.
	page, _ := s.cfg.Store.RegionsFrom([]byte(Prefix), 1)
	if len(page) == 1 && page[0].Region.Contains([]byte(Prefix)) {
		return page[0], true
	}
	return raftstore.RegionStatus{}, false
}

// ---- writes ---------------------------------------------------------------------

// write proposes payload to the etcd region and returns its revision and
// response; leader is the store to forward to when this one cannot
// propose (0: no forwarding possible).
func (s *Service) write(ctx context.Context, payload []byte) (int64, *pb.ResponseOp, uint64, error) {
	resp := &pb.ResponseOp{}
	rev, leader, err := s.propose(ctx, payload, resp)
	return rev, resp, leader, err
}

// propose is write for any command: its result's response is decoded
// into resp (nil: none).
func (s *Service) propose(ctx context.Context, payload []byte, resp proto.Message) (int64, uint64, error) {
	var res []byte
	err := s.retry(ctx, false, func() (err error) {
		// Forward: a follower hands the write to the leader through raft
		// and answers from its own apply, as an etcd member does; a
		// store that cannot (no leader known) says whom to ask, and one
		// with no replica asks the others (elsewhere.go).
		res, err = s.cfg.Store.Propose(ctx, raftstore.WriteOptions{Forward: true}, []byte(Prefix), payload)
		return s.routeMissElsewhere(ctx, err)
	})
	if ee, ok := errors.AsType[*errElsewhere](err); ok {
		return 0, ee.leader, toStatus(err)
	}
	if err != nil {
		return 0, leaderOf(err), toStatus(err)
	}
	s.keepRegion()
	rev, err := decodeResultInto(res, resp)
	return rev, 0, err
}

// retryRouting runs op again while it fails because the region holding
// the keyspace changed under it (the split that makes the keyspace a
// region of its own), has no leader this store knows of yet (an
// election, or a leadership transfer away from this store, whose refusal
// may still name this store), or, op being a read of this replica's own
// state, the replica holds no data for a moment (a snapshot from the
// leader being applied, as a store restarted behind the leader's
// compacted log catches up), for at most noLeaderWait: such a read
// answered nothing, so trying again is safe. A watch's first read is one:
// clientv3 creates its watches again on a store that just restarted, and
// one whose creation fails is cancelled for good.
func (s *Service) retryRouting(ctx context.Context, op func() error) error {
	return s.retry(ctx, true, op)
}

// retry is retryRouting, waiting for the replica's data if waitData. A
// write must not (a peer removed from the region fails the proposals raft
// took with the same error), nor need a Range, which the leader answers
// instead. Any request waits out a store that finds no region for the key
// (RegionNotFound with no id: the route failed, nothing was proposed), as
// for a moment while the split that makes the keyspace its own region is
// published.
func (s *Service) retry(ctx context.Context, waitData bool, op func() error) error {
	give := time.Now().Add(noLeaderWait)
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		err := op()
		var kn *region.KeyNotInRegionError
		var ep *region.EpochNotMatchError
		var nl *region.NotLeaderError
		var rnf *region.RegionNotFoundError
		if errors.Is(err, raftstore.ErrMaybeApplied) {
			return err // raft took it: never again
		}
		if err == nil || !(errors.As(err, &kn) || errors.As(err, &ep) || errors.Is(err, raftstore.ErrProposalDropped) ||
			(errors.As(err, &nl) && (nl.Leader == nil || nl.Leader.StoreID == s.cfg.Store.ID())) ||
			(errors.As(err, &rnf) && (rnf.RegionID == 0 || waitData))) || time.Now().After(give) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
}

// noLeaderWait bounds how long a request waits for the keyspace's region
// to elect a leader or settle a split before it answers ErrNoLeader
// (etcd's clients retry reads on it, not writes).
const noLeaderWait = 3 * time.Second

// leaderOf is the store a NotLeader error names, 0 if none (and for a
// proposal raft took before its leader stepped down: forwarding it would
// apply it twice).
func leaderOf(err error) uint64 {
	var nl *region.NotLeaderError
	if errors.As(err, &nl) && nl.Leader != nil && !errors.Is(err, raftstore.ErrMaybeApplied) {
		return nl.Leader.StoreID
	}
	return 0
}

// toStatus maps a store's error to what an etcd client expects.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var nl *region.NotLeaderError
	var rnf *region.RegionNotFoundError
	switch {
	case errors.Is(err, raftstore.ErrMaybeApplied):
		return rpctypes.ErrGRPCLeaderChanged
	case errors.As(err, &nl):
		return rpctypes.ErrGRPCNoLeader
	case errors.As(err, &rnf), errors.Is(err, raftstore.ErrStopped):
		return status.Error(codes.Unavailable, "etcdserver: hedgekv: the etcd keyspace is not served here now: "+err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return rpctypes.ErrGRPCTimeout
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	var ep *region.EpochNotMatchError
	if errors.As(err, &ep) {
		return status.Error(codes.Unavailable, "etcdserver: hedgekv: "+err.Error())
	}
	return status.Error(codes.Unavailable, "etcdserver: hedgekv: "+err.Error())
}

// forwarded reports whether ctx carries a request another store forwarded.
func forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(mdForwarded)) > 0
}

// forward sends a request to store id's etcd KV service: the leader's.
func forward[T any](s *Service, ctx context.Context, id uint64, err error, call func(pb.KVClient, context.Context) (T, error)) (T, error) {
	return forwardWith(s, ctx, id, err, pb.NewKVClient, call)
}

// forwardWith sends a request to store id's etcd API (a client of one of
// its services, made by newClient); it returns err, the local failure, if
// there is no store to forward to.
func forwardWith[C, T any](s *Service, ctx context.Context, id uint64, err error, newClient func(grpc.ClientConnInterface) C, call func(C, context.Context) (T, error)) (T, error) {
	var zero T
	conn, out, ferr := s.forwardConn(ctx, id, err)
	if ferr != nil {
		return zero, ferr
	}
	return call(newClient(conn), out)
}

// forwardConn is the connection to store id and the context to forward a
// request with (marked forwarded, with the session's read mode), or err
// if the request cannot be forwarded there.
func (s *Service) forwardConn(ctx context.Context, id uint64, err error) (*grpc.ClientConn, context.Context, error) {
	if id == 0 || id == s.cfg.Store.ID() || forwarded(ctx) || s.cfg.Conn == nil {
		if err == nil {
			err = rpctypes.ErrGRPCNoLeader
		}
		return nil, nil, err
	}
	conn, cerr := s.cfg.Conn(id)
	if cerr != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "etcdserver: hedgekv: forward to store %d: %v", id, cerr)
	}
	out := metadata.AppendToOutgoingContext(ctx, mdForwarded, "1")
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for _, k := range []string{MetadataReadMode, MetadataMaxStaleness} {
			for _, v := range md.Get(k) {
				out = metadata.AppendToOutgoingContext(out, k, v)
			}
		}
	}
	return conn, out, nil
}

func (s *Service) request(ctx context.Context, op *pb.RequestOp) (int64, *pb.ResponseOp, uint64, error) {
	if err := etcdmvcc.CheckRequest(op, etcdmvcc.DefaultMaxTxnOps); err != nil {
		if errors.Is(err, etcdmvcc.ErrEmptyRequest) {
			return 0, nil, 0, status.Error(codes.InvalidArgument, "etcdserver: hedgekv: empty request")
		}
		return 0, nil, 0, err
	}
	payload, err := encodeRequest(op)
	if err != nil {
		return 0, nil, 0, status.Error(codes.Internal, err.Error())
	}
	return s.write(ctx, payload)
}

// Put implements etcd's KV.Put.
func (s *Service) Put(ctx context.Context, req *pb.PutRequest) (*pb.PutResponse, error) {
	rev, resp, leader, err := s.request(ctx, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: req}})
	if leader != 0 {
		return forward(s, ctx, leader, err, func(c pb.KVClient, ctx context.Context) (*pb.PutResponse, error) { return c.Put(ctx, req) })
	}
	if err != nil {
		return nil, err
	}
	out := resp.GetResponsePut()
	if out == nil {
		out = &pb.PutResponse{}
	}
	out.Header = s.header(rev)
	return out, nil
}

// DeleteRange implements etcd's KV.DeleteRange.
func (s *Service) DeleteRange(ctx context.Context, req *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	rev, resp, leader, err := s.request(ctx, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: req}})
	if leader != 0 {
		return forward(s, ctx, leader, err, func(c pb.KVClient, ctx context.Context) (*pb.DeleteRangeResponse, error) {
			return c.DeleteRange(ctx, req)
		})
	}
	if err != nil {
		return nil, err
	}
	out := resp.GetResponseDeleteRange()
	if out == nil {
		out = &pb.DeleteRangeResponse{}
	}
	out.Header = s.header(rev)
	return out, nil
}

// Txn implements etcd's KV.Txn. A Txn of Ranges alone is still proposed,
// as etcd applies every Txn through raft: it is linearizable.
func (s *Service) Txn(ctx context.Context, req *pb.TxnRequest) (*pb.TxnResponse, error) {
	rev, resp, leader, err := s.request(ctx, &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: req}})
	if leader != 0 {
		return forward(s, ctx, leader, err, func(c pb.KVClient, ctx context.Context) (*pb.TxnResponse, error) { return c.Txn(ctx, req) })
	}
	if err != nil {
		return nil, err
	}
	out := resp.GetResponseTxn()
	if out == nil {
		out = &pb.TxnResponse{}
	}
	out.Header = s.header(rev)
	return out, nil
}

// Compact implements etcd's KV.Compact: history before the revision is
// dropped on every replica, in the apply; Physical changes nothing (the
// apply is physical already).
func (s *Service) Compact(ctx context.Context, req *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	payload, err := encodeCompact(req)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	rev, _, leader, err := s.write(ctx, payload)
	if leader != 0 {
		return forward(s, ctx, leader, err, func(c pb.KVClient, ctx context.Context) (*pb.CompactionResponse, error) {
			return c.Compact(ctx, req)
		})
	}
	if err != nil {
		return nil, err
	}
	return &pb.CompactionResponse{Header: s.header(rev)}, nil
}

// ---- reads ----------------------------------------------------------------------

// readOptions is the read barrier a Range takes: serializable ones read
// the local replica's state; linearizable ones follow the session's mode.
func (s *Service) readOptions(ctx context.Context, serializable bool) (raftstore.ReadOptions, error) {
	mode, staleness := s.cfg.DefaultRead, 10*time.Second
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(MetadataReadMode); len(v) > 0 {
			mode = strings.ToLower(v[len(v)-1])
		}
		if v := md.Get(MetadataMaxStaleness); len(v) > 0 {
			d, err := time.ParseDuration(v[len(v)-1])
			if err != nil || d <= 0 {
				return raftstore.ReadOptions{}, status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: %s %q: want a positive duration", MetadataMaxStaleness, v[len(v)-1])
			}
			staleness = d
		}
	}
	if serializable {
		// etcd's serializable read: the member's own state, however old.
		return raftstore.ReadOptions{MaxStaleness: time.Hour}, nil
	}
	switch mode {
	case ReadLeader:
		return raftstore.ReadOptions{}, nil
	case ReadFollower:
		return raftstore.ReadOptions{ReplicaRead: true}, nil
	case ReadStale:
		return raftstore.ReadOptions{MaxStaleness: staleness}, nil
	}
	return raftstore.ReadOptions{}, status.Errorf(codes.InvalidArgument, "etcdserver: hedgekv: read mode %q: want %s, %s or %s", mode, ReadLeader, ReadFollower, ReadStale)
}

// Range implements etcd's KV.Range.
func (s *Service) Range(ctx context.Context, req *pb.RangeRequest) (*pb.RangeResponse, error) {
	if err := etcdmvcc.CheckRequest(&pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: req}}, etcdmvcc.DefaultMaxTxnOps); err != nil {
		return nil, err
	}
	opts, err := s.readOptions(ctx, req.Serializable)
	if err != nil {
		return nil, err
	}
	var out *pb.RangeResponse
	err = s.retry(ctx, false, func() error {
		_, err := s.cfg.Store.ReadView(ctx, opts, []byte(Prefix), func(sv raftstore.StateView) error {
			v := readView(ctx, sv)
			cur, err := v.currentRev()
			if err != nil {
				return err
			}
			compacted, err := v.compactRev()
			if err != nil {
				return err
			}
			at, err := etcdmvcc.ReadRev(req.Revision, compacted, cur)
			if err != nil {
				return err
			}
			if out, err = etcdmvcc.Range(v, req, at); err != nil {
				return err
			}
			out.Header = s.header(cur)
			return nil
		})
		return s.routeMissElsewhere(ctx, err)
	})
	if err != nil {
		if ee, ok := errors.AsType[*errElsewhere](err); ok {
			return forward(s, ctx, ee.leader, toStatus(err), func(c pb.KVClient, ctx context.Context) (*pb.RangeResponse, error) {
				return c.Range(ctx, req)
			})
		}
		if _, ok := status.FromError(err); ok {
			return nil, err // etcd's refusal: compacted, future revision...
		}
		if leader := s.leaderFor(ctx, err); leader != 0 {
			return forward(s, ctx, leader, toStatus(err), func(c pb.KVClient, ctx context.Context) (*pb.RangeResponse, error) {
				return c.Range(ctx, req)
			})
		}
		return nil, toStatus(err)
	}
	return out, nil
}

// leaderFor is the store a read that failed here should go to: the leader
// a NotLeader names, or the one this store last knew (a replica that
// cannot serve: no stale safe point yet, a snapshot being applied).
func (s *Service) leaderFor(ctx context.Context, err error) uint64 {
	if id := leaderOf(err); id != 0 {
		return id
	}
	if st, ok := s.regionStatus(); ok {
		return st.LeaderStoreID
	}
	return s.leaderElsewhere(ctx) // no replica here
}

// ---- maintenance and cluster -------------------------------------------------------

// Status implements etcd's Maintenance.Status (etcdctl endpoint status).
func (s *Service) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	var rev int64 = 1
	_, err := s.cfg.Store.ReadView(ctx, raftstore.ReadOptions{MaxStaleness: time.Hour}, []byte(Prefix), func(sv raftstore.StateView) error {
		var err error
		rev, err = readView(ctx, sv).currentRev()
		return err
	})
	out := &pb.StatusResponse{Header: s.header(rev), Version: Version, StorageVersion: "3.6.0"}
	if err != nil {
		out.Errors = append(out.Errors, fmt.Sprintf("etcd keyspace: %v", err))
	}
	g := s.cfg.Store.Gauges()
	out.DbSize, out.DbSizeInUse, out.DbSizeQuota = g.DBFileBytes, g.DBFileBytes, 0
	if st, ok := s.regionStatus(); ok {
		out.Leader = st.LeaderStoreID
		out.RaftIndex, out.RaftTerm, out.RaftAppliedIndex = st.CommitIndex, st.Term, st.AppliedIndex
	} else {
		out.Errors = append(out.Errors, "this store holds no replica of the etcd keyspace")
	}
	return out, nil
}

// MemberList implements etcd's Cluster.MemberList: a member per store,
// its client URL the store's gRPC address.
func (s *Service) MemberList(ctx context.Context, _ *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	var ids []uint64
	addrs := map[uint64]string{}
	if s.cfg.Members != nil {
		addrs = s.cfg.Members()
	}
	for id := range addrs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	scheme := "http://"
	if s.cfg.TLS {
		scheme = "https://"
	}
	out := &pb.MemberListResponse{Header: s.header(0)}
	for _, id := range ids {
		u := scheme + addrs[id]
		out.Members = append(out.Members, &pb.Member{ID: id, Name: fmt.Sprintf("store-%d", id), PeerURLs: []string{u}, ClientURLs: []string{u}})
	}
	return out, nil
}

// Alarm implements etcd's Maintenance.Alarm for what clients ask of it
// (etcdctl endpoint health lists the alarms): the list, empty. hedgekv
// raises no etcd alarm (a store whose disk fails freezes and says so on
// its status endpoint); setting or clearing one is refused.
func (s *Service) Alarm(ctx context.Context, req *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	if req.Action != pb.AlarmRequest_GET {
		return nil, status.Error(codes.Unimplemented, "etcdserver: hedgekv: alarms are not set or cleared through the etcd API")
	}
	return &pb.AlarmResponse{Header: s.header(0)}, nil
}
