package server

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/replica"
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
	return kvpb.FromDigest(d), nil
}

func (s *adminService) RegionDump(ctx context.Context, req *kvpb.RegionDumpRequest) (*kvpb.RegionDumpResponse, error) {
	if req.GetRegionId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "region dump: region id must be non-zero")
	}
	applied, kvs, err := s.srv.store.RegionDump(req.GetRegionId())
	if err != nil {
		return nil, replicaStatus(err)
	}
	return &kvpb.RegionDumpResponse{AppliedIndex: applied, Pairs: fromDumpKVs(kvs)}, nil
}

func replicaStatus(err error) error {
	if raftstore.IsReplicaNotFound(err) {
		return status.Error(codes.NotFound, err.Error())
	}
	return toStatus(err)
}

// fromDumpKVs puts a region dump's pairs on the wire.
func fromDumpKVs(kvs []replica.KV) []*kvpb.KvPair {
	out := make([]*kvpb.KvPair, len(kvs))
	for i, kv := range kvs {
		out[i] = &kvpb.KvPair{Key: kv.Key, Value: kv.Value}
	}
	return out
}
