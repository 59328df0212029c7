package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc"

	"github.com/hedgekv/hedgekv/kvpb"
)

// peerRegionIDs is a store's raftstore.RegionIDSource: a store with no
// replica of the first region, which keeps the cluster's region ID counter,
// asks its peers in turn (Raft.AllocRegionID) until one with a replica
// answers.
type peerRegionIDs struct {
	self    uint64
	members func() map[uint64]string
	conn    func(id uint64) (*grpc.ClientConn, error)
}

// allocRegionIDTimeout bounds one peer's answer: a forwarded proposal
// waits about this long (raftstore's forwardWait) before it gives up.
const allocRegionIDTimeout = 6 * time.Second

func (p peerRegionIDs) AllocRegionID(ctx context.Context) (uint64, error) {
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(p.members())) {
		if id == p.self {
			continue
		}
		conn, err := p.conn(id)
		if err != nil {
			errs = append(errs, fmt.Errorf("store %d: %w", id, err))
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, allocRegionIDTimeout)
		resp, err := kvpb.NewRaftClient(conn).AllocRegionID(cctx, &kvpb.AllocRegionIDRequest{})
		cancel()
		if err == nil {
			return resp.GetRegionId(), nil
		}
		errs = append(errs, fmt.Errorf("store %d: %w", id, err))
		if ctx.Err() != nil {
			break
		}
	}
	return 0, fmt.Errorf("no peer took a region id: %w", errors.Join(errs...))
}

// AllocRegionID serves a peer's Raft.AllocRegionID from this store's
// replica of the first region.
func (s *raftService) AllocRegionID(ctx context.Context, _ *kvpb.AllocRegionIDRequest) (*kvpb.AllocRegionIDResponse, error) {
	if s.allocRegionID == nil {
		return nil, toStatus(errors.New("this store allocates no region ids"))
	}
	id, err := s.allocRegionID(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvpb.AllocRegionIDResponse{RegionId: id}, nil
}
