package etcdapi

import (
	"context"
	"errors"
	"io"
	"sort"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/raftstore"
)

// errStopping ends the KeepAlive streams of a store that stops.
var errStopping = status.Error(codes.Unavailable, "etcdserver: hedgekv: the server is stopping")

// LeaseGrant implements etcd's Lease.LeaseGrant: a command for the
// Applier, its TTL raised to the minimum here, its ID (if 0) chosen by the
// apply. A grant makes no revision: the header carries the current one.
func (s *Service) LeaseGrant(ctx context.Context, req *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	payload, err := encodeCommand(kindLeaseGrant, &pb.LeaseGrantRequest{ID: req.ID, TTL: max(req.TTL, s.minLeaseTTL)})
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	out := &pb.LeaseGrantResponse{}
	rev, leader, err := s.propose(ctx, payload, out)
	if leader != 0 {
		return forwardWith(s, ctx, leader, err, pb.NewLeaseClient, func(c pb.LeaseClient, ctx context.Context) (*pb.LeaseGrantResponse, error) {
			return c.LeaseGrant(ctx, req)
		})
	}
	if err != nil {
		return nil, err
	}
	out.Header = s.header(rev)
	return out, nil
}

// LeaseRevoke implements etcd's Lease.LeaseRevoke: the lease's keys are
// deleted at one revision (none if it had none), and the lease with them.
func (s *Service) LeaseRevoke(ctx context.Context, req *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	rev, leader, err := s.revokeAt(ctx, req.ID)
	if leader != 0 {
		return forwardWith(s, ctx, leader, err, pb.NewLeaseClient, func(c pb.LeaseClient, ctx context.Context) (*pb.LeaseRevokeResponse, error) {
			return c.LeaseRevoke(ctx, req)
		})
	}
	if err != nil {
		return nil, err
	}
	return &pb.LeaseRevokeResponse{Header: s.header(rev)}, nil
}

// revoke proposes the revoke of lease id here (the lessor's, for a lease
// that expired: no forwarding).
func (s *Service) revoke(ctx context.Context, id int64) error {
	_, _, err := s.revokeAt(ctx, id)
	return err
}

func (s *Service) revokeAt(ctx context.Context, id int64) (int64, uint64, error) {
	payload, err := encodeCommand(kindLeaseRevoke, &pb.LeaseRevokeRequest{ID: id})
	if err != nil {
		return 0, 0, status.Error(codes.Internal, err.Error())
	}
	return s.propose(ctx, payload, nil)
}

// LeaseTimeToLive implements etcd's Lease.LeaseTimeToLive: the leader
// answers, from its lessor's expiry; another store forwards the request.
// An unknown lease is TTL -1, as etcd answers.
func (s *Service) LeaseTimeToLive(ctx context.Context, req *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	out, err := s.lessor.timeToLive(ctx, req)
	if errors.Is(err, errNotPrimary) {
		if forwarded(ctx) {
			return nil, rpctypes.ErrGRPCLeaderChanged
		}
		leader := s.leaderFor(ctx, nil)
		return forwardWith(s, ctx, leader, rpctypes.ErrGRPCNoLeader, pb.NewLeaseClient, func(c pb.LeaseClient, ctx context.Context) (*pb.LeaseTimeToLiveResponse, error) {
			return c.LeaseTimeToLive(ctx, req)
		})
	}
	return out, err
}

// LeaseLeases implements etcd's Lease.LeaseLeases: every lease the
// keyspace holds, by ID, read as a linearizable Range of the session is
// (etcd lists its member's lessor).
func (s *Service) LeaseLeases(ctx context.Context, req *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	opts, err := s.readOptions(ctx, false)
	if err != nil {
		return nil, err
	}
	out := &pb.LeaseLeasesResponse{Leases: []*pb.LeaseStatus{}}
	var rev int64
	_, err = s.cfg.Store.ReadView(ctx, opts, []byte(Prefix), func(sv raftstore.StateView) error {
		v := readView(ctx, sv)
		var err error
		if rev, err = v.currentRev(); err != nil {
			return err
		}
		out.Leases = out.Leases[:0]
		return v.leases(func(l leaseRecord) bool {
			out.Leases = append(out.Leases, &pb.LeaseStatus{ID: l.ID})
			return true
		})
	})
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		if leader := s.leaderFor(ctx, err); leader != 0 {
			return forwardWith(s, ctx, leader, toStatus(err), pb.NewLeaseClient, func(c pb.LeaseClient, ctx context.Context) (*pb.LeaseLeasesResponse, error) {
				return c.LeaseLeases(ctx, req)
			})
		}
		return nil, toStatus(err)
	}
	sort.Slice(out.Leases, func(i, j int) bool { return out.Leases[i].ID < out.Leases[j].ID })
	out.Header = s.header(rev)
	return out, nil
}

// LeaseKeepAlive implements etcd's Lease.LeaseKeepAlive: each request
// renews a lease on the leader's lessor and is answered with its granted
// TTL (0: no such lease). On a store that does not lead the region the
// stream is forwarded, whole, to the leader's: every request from the
// first this store cannot answer on, and every answer back, in order.
// A leader that loses the leadership ends a forwarded stream with
// ErrGRPCLeaderChanged (clientv3 opens a new one).
func (s *Service) LeaseKeepAlive(stream pb.Lease_LeaseKeepAliveServer) error {
	ctx := stream.Context()
	reqs := make(chan *pb.LeaseKeepAliveRequest)
	recvErrc := make(chan error, 1)
	// The receiver ends when the stream does (after this handler returns
	// at the latest).
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErrc <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	recvErr := (<-chan error)(recvErrc) // nil once the client is done sending
	var up *keepAliveUpstream
	defer func() {
		if up != nil {
			up.cancel()
		}
	}()
	for {
		var upResps <-chan *pb.LeaseKeepAliveResponse
		var upErr <-chan error
		if up != nil {
			upResps, upErr = up.resps, up.errc
		}
		select {
		case <-s.stopc:
			return errStopping
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			if !errors.Is(err, io.EOF) {
				return err
			}
			if up == nil {
				return nil
			}
			// The client is done sending: so are we; the leader's
			// answers still come back.
			_ = up.stream.CloseSend()
			recvErr = nil
		case req := <-reqs:
			if up != nil {
				// A failed send ends the upstream: its Recv says why.
				_ = up.stream.Send(req)
				continue
			}
			ttl, rev, err := s.lessor.renew(ctx, req.ID)
			if errors.Is(err, errNotPrimary) {
				if forwarded(ctx) {
					return rpctypes.ErrGRPCLeaderChanged
				}
				if up, err = s.keepAliveUpstream(ctx); err != nil {
					return err
				}
				_ = up.stream.Send(req)
				continue
			}
			if err != nil {
				return err
			}
			if err := stream.Send(&pb.LeaseKeepAliveResponse{Header: s.header(rev), ID: req.ID, TTL: ttl}); err != nil {
				return err
			}
		case resp := <-upResps:
			if err := stream.Send(resp); err != nil {
				return err
			}
		case err := <-upErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// keepAliveUpstream is a KeepAlive stream this store opened to the
// leader's for a client's: its answers, then its end.
type keepAliveUpstream struct {
	stream pb.Lease_LeaseKeepAliveClient
	resps  chan *pb.LeaseKeepAliveResponse
	errc   chan error
	cancel context.CancelFunc
}

// keepAliveUpstream opens a KeepAlive stream to the region's leader, which
// ends with ctx or its cancel.
func (s *Service) keepAliveUpstream(ctx context.Context) (*keepAliveUpstream, error) {
	conn, out, err := s.forwardConn(ctx, s.leaderFor(ctx, nil), rpctypes.ErrGRPCNoLeader)
	if err != nil {
		return nil, err
	}
	out, cancel := context.WithCancel(out)
	st, err := pb.NewLeaseClient(conn).LeaseKeepAlive(out)
	if err != nil {
		cancel()
		return nil, toStatus(err)
	}
	up := &keepAliveUpstream{stream: st, resps: make(chan *pb.LeaseKeepAliveResponse), errc: make(chan error, 1), cancel: cancel}
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				up.errc <- err
				return
			}
			select {
			case up.resps <- resp:
			case <-out.Done():
				return
			}
		}
	}()
	return up, nil
}

var _ pb.LeaseServer = (*Service)(nil)
