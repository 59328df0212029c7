package server

import (
	"context"

	"github.com/hedgekv/hedgekv/kvpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Admin calls that change the cluster's shape: splits, replicas, stores
// joining and being removed. The region work is the store's (raftstore);
// the address book every store shares, joins and removals are the control
// plane's (package controlplane). This file validates requests and hands
// them on.

// Split splits the region holding req.key at that key. It must reach the
// region's leader; elsewhere it fails with NotLeader (or RegionNotFound).
func (s *adminService) Split(ctx context.Context, req *kvpb.SplitRequest) (*kvpb.SplitResponse, error) {
	if err := validateKey("split key", req.GetKey()); err != nil {
		return nil, err
	}
	left, right, err := s.srv.store.Split(ctx, req.GetKey())
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvpb.SplitResponse{Left: kvpb.FromRegion(left), Right: kvpb.FromRegion(right)}, nil
}

// Merge merges a region with its right neighbour (raftstore's Merge): the
// store reached must host replicas of both; it need lead neither.
func (s *adminService) Merge(ctx context.Context, req *kvpb.MergeRequest) (*kvpb.MergeResponse, error) {
	if req.GetRegionId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "merge: region id must be non-zero")
	}
	merged, err := s.srv.store.Merge(ctx, req.GetRegionId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvpb.MergeResponse{Merged: kvpb.FromRegion(merged)}, nil
}

// AddPeer adds a replica of a region on a store this store knows.
func (s *adminService) AddPeer(ctx context.Context, req *kvpb.AddPeerRequest) (*kvpb.AddPeerResponse, error) {
	if err := validateMembership(req.GetRegionId(), req.GetStoreId()); err != nil {
		return nil, err
	}
	if _, ok := s.srv.cp.Address(req.GetStoreId()); !ok && req.GetStoreId() != s.srv.store.ID() {
		return nil, status.Errorf(codes.InvalidArgument, "store %d is unknown to store %d (start it with --join first)", req.GetStoreId(), s.srv.store.ID())
	}
	if err := s.srv.store.AddPeer(ctx, req.GetRegionId(), req.GetStoreId()); err != nil {
		return nil, toStatus(err)
	}
	return &kvpb.AddPeerResponse{}, nil
}

// RemovePeer removes a region's replica from a store. Removing a replica
// the region does not have succeeds.
func (s *adminService) RemovePeer(ctx context.Context, req *kvpb.RemovePeerRequest) (*kvpb.RemovePeerResponse, error) {
	if err := validateMembership(req.GetRegionId(), req.GetStoreId()); err != nil {
		return nil, err
	}
	if err := s.srv.store.RemovePeer(ctx, req.GetRegionId(), req.GetStoreId()); err != nil {
		return nil, toStatus(err)
	}
	return &kvpb.RemovePeerResponse{}, nil
}

func validateMembership(regionID, storeID uint64) error {
	if regionID == 0 {
		return status.Error(codes.InvalidArgument, "region id is 0")
	}
	if storeID == 0 {
		return status.Error(codes.InvalidArgument, "store id is 0")
	}
	return nil
}

// Join records a store in the address book (controlplane.Plane.Join).
func (s *adminService) Join(ctx context.Context, req *kvpb.JoinRequest) (*kvpb.JoinResponse, error) {
	resp, err := s.srv.cp.Join(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// RemoveStore starts removing a store from the cluster
// (controlplane.Plane.RemoveStore).
func (s *adminService) RemoveStore(ctx context.Context, req *kvpb.RemoveStoreRequest) (*kvpb.RemoveStoreResponse, error) {
	resp, err := s.srv.cp.RemoveStore(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}
