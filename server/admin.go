package server

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/server/pb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// adminService is the Admin gRPC service: this store's view of the cluster
// and the operator's levers (split, membership, leadership, joins).
type adminService struct {
	pb.UnimplementedAdminServer
	srv *Server
}

func (s *adminService) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	return s.localStatus(), nil
}

func (s *adminService) localStatus() *pb.StatusResponse {
	store := s.srv.store
	out := &pb.StatusResponse{
		StoreId:        store.ID(),
		Address:        s.srv.advertiseAddr(),
		Zone:           store.Zone(),
		Peers:          s.srv.book.all(),
		ZoneAddresses:  maps.Clone(s.srv.cfg.ZoneAddrs),
		RemovingStores: s.srv.book.removingIDs(),
	}
	if _, ok := out.Peers[store.ID()]; !ok {
		out.Peers[store.ID()] = out.Address
	}
	for _, rs := range store.Regions() {
		out.Regions = append(out.Regions, fromRegionStatus(rs))
		if rs.IsLeader {
			out.LeaderCount++
		}
	}
	return out
}

// Stores lists every store in the address book, as the cluster view last
// saw them (at most about a second ago). A store that did not answer its
// Status within storeStatusTimeout is listed with up=false.
func (s *adminService) Stores(ctx context.Context, _ *pb.StoresRequest) (*pb.StoresResponse, error) {
	stores, err := s.srv.view.stores(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.StoresResponse{Stores: cloneStores(stores)}, nil
}

// Regions lists this store's view of its regions in key order; with by_key,
// only the region holding key (NotFound if this store hosts none).
func (s *adminService) Regions(ctx context.Context, req *pb.RegionsRequest) (*pb.RegionsResponse, error) {
	all := s.srv.store.Regions()
	slices.SortFunc(all, func(a, b raftstore.RegionStatus) int {
		return bytes.Compare(a.Region.StartKey, b.Region.StartKey)
	})
	out := &pb.RegionsResponse{}
	for _, rs := range all {
		if req.GetByKey() && !rs.Region.Contains(req.GetKey()) {
			continue
		}
		out.Regions = append(out.Regions, fromRegionStatus(rs))
	}
	if req.GetByKey() && len(out.Regions) == 0 {
		return nil, status.Errorf(codes.NotFound, "store %d hosts no region holding key %q", s.srv.store.ID(), req.GetKey())
	}
	return out, nil
}

func (s *adminService) TransferLeader(ctx context.Context, req *pb.TransferLeaderRequest) (*pb.TransferLeaderResponse, error) {
	if req.GetRegionId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "region id is 0")
	}
	if req.GetToStoreId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "target store id is 0")
	}
	if err := s.srv.store.TransferLeader(ctx, req.GetRegionId(), req.GetToStoreId()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.TransferLeaderResponse{}, nil
}

// adminOpen lists the Admin calls a server started with DisableAdmin still
// answers: those that change nothing. Clients route with Status, Stores and
// Regions, and ctl check compares replicas with RegionDigest and
// RegionDump. A call missing here is refused, so a mutating call added
// later is refused by default.
var adminOpen = map[string]bool{
	pb.Admin_Status_FullMethodName:       true,
	pb.Admin_Stores_FullMethodName:       true,
	pb.Admin_Regions_FullMethodName:      true,
	pb.Admin_RegionDigest_FullMethodName: true,
	pb.Admin_RegionDump_FullMethodName:   true,
}

// adminGuard refuses, when disabled is set, the Admin calls adminOpen does
// not list (split, transfer, add/remove peer, fault, ...) with
// PermissionDenied. Join and RemoveStore are the exceptions for stores:
// stores call them on each other (a newcomer, and forwarding), so they stay
// open to a caller
// whose TLS certificate proves it is a store (callerIsStore); without TLS
// nobody can prove that, and no store joins a cluster whose stores run
// with DisableAdmin.
func adminGuard(disabled bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !disabled || !strings.HasPrefix(info.FullMethod, "/"+pb.Admin_ServiceDesc.ServiceName+"/") || adminOpen[info.FullMethod] {
			return handler(ctx, req)
		}
		if (info.FullMethod == pb.Admin_Join_FullMethodName || info.FullMethod == pb.Admin_RemoveStore_FullMethodName) && callerIsStore(ctx) {
			return handler(ctx, req)
		}
		return nil, status.Errorf(codes.PermissionDenied, "%s: admin calls are disabled on this store (server --disable-admin)", info.FullMethod)
	}
}

func fromRegionStatus(rs raftstore.RegionStatus) *pb.RegionInfo {
	out := &pb.RegionInfo{
		Region:        pb.FromRegion(rs.Region),
		LeaderStoreId: rs.LeaderStoreID,
		Term:          rs.Term,
		CommitIndex:   rs.CommitIndex,
		AppliedIndex:  rs.AppliedIndex,
	}
	if rs.SizeKnown {
		out.SizeKnown, out.ApproximateKeys, out.ApproximateSize = true, rs.ApproximateKeys, rs.ApproximateBytes
	}
	if rs.LeaderPeerID != 0 {
		out.Leader = &pb.Peer{Id: rs.LeaderPeerID, StoreId: rs.LeaderStoreID}
	}
	return out
}
