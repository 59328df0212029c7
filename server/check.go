package server

import (
	"context"
	"crypto/sha256"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
)

// RegionDigest and RegionDump serve the replica-agreement check against
// live stores (hedgekv ctl check; package replicacheck): read-only, one
// bbolt read transaction each.

func (s *adminService) RegionDigest(ctx context.Context, req *kvpb.RegionDigestRequest) (*kvpb.RegionDigestResponse, error) {
	if req.GetRegionId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "region digest: region id must be non-zero")
	}
	d, err := s.srv.store.RegionDigest(req.GetRegionId())
	if err != nil {
		return nil, replicaStatus(err)
	}
	return FromDigest(d), nil
}

func (s *adminService) RegionDump(ctx context.Context, req *kvpb.RegionDumpRequest) (*kvpb.RegionDumpResponse, error) {
	if req.GetRegionId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "region dump: region id must be non-zero")
	}
	applied, kvs, err := s.srv.store.RegionDump(req.GetRegionId())
	if err != nil {
		return nil, replicaStatus(err)
	}
	return &kvpb.RegionDumpResponse{AppliedIndex: applied, Pairs: fromKVs(kvs)}, nil
}

func replicaStatus(err error) error {
	if raftstore.IsReplicaNotFound(err) {
		return status.Error(codes.NotFound, err.Error())
	}
	return toStatus(err)
}

// FromDigest and ToDigest convert a replica digest to and from the wire.
func FromDigest(d raftstore.ReplicaDigest) *kvpb.RegionDigestResponse {
	return &kvpb.RegionDigestResponse{
		StoreId: d.StoreID, PeerId: d.PeerID, Region: kvpb.FromRegion(d.Region),
		AppliedIndex: d.AppliedIndex, AppliedTerm: d.AppliedTerm, Keys: d.Keys, Bytes: d.Bytes,
		Hash: d.Hash[:], DedupRecords: d.DedupRecords, DedupHash: d.DedupHash[:],
	}
}

// ToDigest is FromDigest's inverse; a hash of the wrong length (a broken
// or foreign peer) is an error, not a digest that compares as different.
func ToDigest(r *kvpb.RegionDigestResponse) (raftstore.ReplicaDigest, error) {
	d := raftstore.ReplicaDigest{
		StoreID: r.GetStoreId(), PeerID: r.GetPeerId(), Region: r.GetRegion().ToRegion(),
		AppliedIndex: r.GetAppliedIndex(), AppliedTerm: r.GetAppliedTerm(), Keys: r.GetKeys(), Bytes: r.GetBytes(),
		DedupRecords: r.GetDedupRecords(),
	}
	if len(r.GetHash()) != sha256.Size || len(r.GetDedupHash()) != sha256.Size {
		return raftstore.ReplicaDigest{}, status.Errorf(codes.Internal, "store %d: region digest with a %d-byte hash", r.GetStoreId(), len(r.GetHash()))
	}
	copy(d.Hash[:], r.GetHash())
	copy(d.DedupHash[:], r.GetDedupHash())
	return d, nil
}
