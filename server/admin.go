package server

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/server/controlplane"
	"github.com/hedgekv/hedgekv/server/etcdapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// adminService is the Admin gRPC service: this store's view of the cluster
// and the operator's levers (split, membership, leadership, joins).
type adminService struct {
	kvpb.UnimplementedAdminServer
	srv *Server
}

func (s *adminService) Status(ctx context.Context, req *kvpb.StatusRequest) (*kvpb.StatusResponse, error) {
	if req.GetSummary() {
		return s.localSummary(), nil
	}
	return s.localStatus(), nil
}

// localSummary is Status without the regions: what the cluster view asks
// of every store every second (kvpb.StatusRequest.summary).
func (s *adminService) localSummary() *kvpb.StatusResponse {
	out := s.statusHead()
	sum := s.srv.store.Summary()
	out.RegionCount, out.LeaderCount = uint64(sum.Regions), uint64(sum.Leaders)
	out.ReplicaStores = sum.ReplicaStores
	return out
}

func (s *adminService) localStatus() *kvpb.StatusResponse {
	out := s.statusHead()
	stores := map[uint64]bool{}
	for _, rs := range s.srv.store.Regions() {
		out.Regions = append(out.Regions, fromRegionStatus(rs))
		if rs.IsLeader {
			out.LeaderCount++
		}
		for _, p := range rs.Region.Peers {
			stores[p.StoreID] = true
		}
	}
	out.RegionCount = uint64(len(out.Regions))
	out.ReplicaStores = slices.Sorted(maps.Keys(stores))
	return out
}

// statusHead is what Status answers besides the regions.
func (s *adminService) statusHead() *kvpb.StatusResponse {
	store := s.srv.store
	out := &kvpb.StatusResponse{
		StoreId:        store.ID(),
		Address:        s.srv.advertiseAddr(),
		Zone:           store.Zone(),
		Peers:          s.srv.cp.Peers(),
		ZoneAddresses:  maps.Clone(s.srv.cfg.ZoneAddrs),
		RemovingStores: s.srv.cp.RemovingIDs(),
	}
	if _, ok := out.Peers[store.ID()]; !ok {
		out.Peers[store.ID()] = out.Address
	}
	return out
}

// Stores lists every store in the address book, as the cluster view last
// saw them (at most about a second ago). A store that did not answer its
// Status within controlplane.StoreStatusTimeout is listed with up=false.
func (s *adminService) Stores(ctx context.Context, req *kvpb.StoresRequest) (*kvpb.StoresResponse, error) {
	stores, err := s.srv.cp.Stores(ctx, req.GetFresh())
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvpb.StoresResponse{Stores: stores}, nil
}

// Regions lists this store's view of its regions in key order; with by_key,
// only the region holding key (NotFound if this store hosts none); with a
// limit, a page of them from the one holding start_key.
func (s *adminService) Regions(ctx context.Context, req *kvpb.RegionsRequest) (*kvpb.RegionsResponse, error) {
	start, limit := req.GetStartKey(), int(req.GetLimit())
	if req.GetByKey() {
		start, limit = req.GetKey(), 1
	}
	var page []raftstore.RegionStatus
	var more bool
	if limit == 0 && len(start) == 0 {
		page = s.srv.store.Regions()
	} else {
		page, more = s.srv.store.RegionsFrom(start, limit)
	}
	out := &kvpb.RegionsResponse{More: more && !req.GetByKey()}
	for _, rs := range page {
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

func (s *adminService) TransferLeader(ctx context.Context, req *kvpb.TransferLeaderRequest) (*kvpb.TransferLeaderResponse, error) {
	if req.GetRegionId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "region id is 0")
	}
	if req.GetToStoreId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "target store id is 0")
	}
	if err := s.checkTransferTarget(ctx, req.GetRegionId(), req.GetToStoreId()); err != nil {
		return nil, err
	}
	if err := s.srv.store.TransferLeader(ctx, req.GetRegionId(), req.GetToStoreId()); err != nil {
		return nil, toStatus(err)
	}
	return &kvpb.TransferLeaderResponse{}, nil
}

// checkTransferTarget refuses at once a leadership transfer that cannot
// succeed, rather than letting raft try it until the caller's deadline
// (raft abandons a transfer to a peer that does not answer after an
// election timeout, and the leader tries again): the target store does
// not exist (NotFound, worded as ctl add-peer words it), holds no voter of
// the region, is being removed, or is down (FailedPrecondition). These
// answers carry no region error, so a client returns them as they are
// instead of retrying. Any store hosting the region answers them, leader
// or not: they need no leadership, only the region's peers as this
// replica knows them and the target's state.
//
// Down is asked of the target itself, as the cluster view would (a Status
// over the raft transport within controlplane.StoreStatusTimeout), rather than read
// from the view's listing, which lags a kill or a restart by up to a
// second.
func (s *adminService) checkTransferTarget(ctx context.Context, regionID, toStore uint64) error {
	self := s.srv.store.ID()
	if _, ok := s.srv.cp.Address(toStore); !ok && toStore != self {
		return status.Errorf(codes.NotFound, "store %d does not exist (ctl stores lists them)", toStore)
	}
	hosted := s.srv.store.Regions()
	i := slices.IndexFunc(hosted, func(rs raftstore.RegionStatus) bool { return rs.Region.ID == regionID })
	if i < 0 {
		// Not hosted here: raftstore answers RegionNotFound, which sends
		// the client to the region's other stores.
		return nil
	}
	rs := hosted[i].Region
	p, ok := rs.PeerOnStore(toStore)
	switch {
	case !ok:
		return status.Errorf(codes.FailedPrecondition, "store %d has no replica of region %d (its replicas are on %s): add one first (ctl add-peer)",
			toStore, regionID, replicaStores(rs))
	case p.IsLearner:
		return status.Errorf(codes.FailedPrecondition, "store %d has only a learner of region %d, which cannot lead until it is promoted to a voter", toStore, regionID)
	case toStore == self:
		return nil
	case s.srv.cp.IsRemoving(toStore):
		return status.Errorf(codes.FailedPrecondition, "store %d is being removed: its leaderships are moving off it", toStore)
	}
	if !s.answers(ctx, toStore) {
		if err := ctx.Err(); err != nil {
			return toStatus(fmt.Errorf("transfer leader of region %d to store %d: %w", regionID, toStore, err))
		}
		return status.Errorf(codes.FailedPrecondition, "store %d is down (it did not answer store %d within %v): a leader can only be handed to a live voter",
			toStore, self, controlplane.StoreStatusTimeout)
	}
	return nil
}

// answers reports whether store id answers a Status within
// controlplane.StoreStatusTimeout, asked over the raft transport's connection to it (so
// up means reachable for raft, as in the cluster view). The connection's
// reconnect backoff (up to 2s after the store was last unreachable) is
// cut short and the call waits for the connection, so a store that has
// just come back counts as up; one that is down costs the timeout.
func (s *adminService) answers(ctx context.Context, id uint64) bool {
	conn, err := s.srv.trans.conn(id)
	if err != nil {
		return false
	}
	kvpb.ResetBackoff(conn)
	ctx, cancel := context.WithTimeout(ctx, controlplane.StoreStatusTimeout)
	defer cancel()
	st, err := kvpb.NewAdminClient(conn).Status(ctx, &kvpb.StatusRequest{Summary: true}, grpc.WaitForReady(true))
	if err != nil {
		s.srv.logger.Debug("transfer target did not answer", "to_store", id, "err", err)
		return false
	}
	// Something else answering at the store's address is not the store.
	return st.GetStoreId() == 0 || st.GetStoreId() == id
}

// replicaStores lists the stores a region's replicas are on: "stores 1, 2, 3".
func replicaStores(r region.Region) string {
	ids := make([]string, 0, len(r.Peers))
	for _, p := range r.Peers {
		ids = append(ids, strconv.FormatUint(p.StoreID, 10))
	}
	if len(ids) == 0 {
		return "no store"
	}
	return "stores " + strings.Join(ids, ", ")
}

// adminOpen lists the Admin calls a server started with DisableAdmin still
// answers: those that change nothing. Clients route with Status, Stores and
// Regions, and ctl check compares replicas with RegionDigest and
// RegionDump. A call missing here is refused, so a mutating call added
// later is refused by default.
var adminOpen = map[string]bool{
	kvpb.Admin_Status_FullMethodName:       true,
	kvpb.Admin_Stores_FullMethodName:       true,
	kvpb.Admin_Regions_FullMethodName:      true,
	kvpb.Admin_RegionDigest_FullMethodName: true,
	kvpb.Admin_RegionDump_FullMethodName:   true,
}

// adminGuard refuses, when disabled is set, the Admin calls adminOpen does
// not list (split, transfer, add/remove peer, fault, ...) and the etcd
// keyspace's restore (etcdapi.RestoreServiceName) with PermissionDenied.
// Join, RemoveStore and the restore are the exceptions for stores: stores
// call them on each other (a newcomer, and forwarding), so they stay open
// to a caller whose TLS certificate proves it is a store (callerIsStore);
// without TLS nobody can prove that, and no store joins a cluster whose
// stores run with DisableAdmin.
func adminGuard(disabled bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		restore := strings.HasPrefix(info.FullMethod, "/"+etcdapi.RestoreServiceName+"/")
		if !disabled || (!restore && (!strings.HasPrefix(info.FullMethod, "/"+kvpb.Admin_ServiceDesc.ServiceName+"/") || adminOpen[info.FullMethod])) {
			return handler(ctx, req)
		}
		if (restore || info.FullMethod == kvpb.Admin_Join_FullMethodName || info.FullMethod == kvpb.Admin_RemoveStore_FullMethodName) && callerIsStore(ctx) {
			return handler(ctx, req)
		}
		return nil, status.Errorf(codes.PermissionDenied, "%s: admin calls are disabled on this store (server --disable-admin)", info.FullMethod)
	}
}

func fromRegionStatus(rs raftstore.RegionStatus) *kvpb.RegionInfo {
	out := &kvpb.RegionInfo{
		Region:        kvpb.FromRegion(rs.Region),
		LeaderStoreId: rs.LeaderStoreID,
		Term:          rs.Term,
		CommitIndex:   rs.CommitIndex,
		AppliedIndex:  rs.AppliedIndex,
	}
	if rs.SizeKnown {
		out.SizeKnown, out.ApproximateKeys, out.ApproximateSize = true, rs.ApproximateKeys, rs.ApproximateBytes
	}
	if rs.LeaderPeerID != 0 {
		out.Leader = &kvpb.Peer{Id: rs.LeaderPeerID, StoreId: rs.LeaderStoreID}
	}
	return out
}
