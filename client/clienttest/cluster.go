// Package clienttest is an in-process fake of a hedgekv cluster for tests
// of the client and of code built on it (the CLI, the bench binding). Its
// stores speak the real KV and Admin gRPC services on localhost TCP, share
// one key-value map, and answer region errors the way real stores do, from
// regions, leaders and faults the test sets. It has no Raft: leadership,
// splits and staleness are whatever the test says they are.
package clienttest

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"sort"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/region"
)

// Hook runs before a store handles an RPC (method is e.g. "Get", "Regions").
// A non-nil error is returned to the client instead; a hook may also block
// (to fake a stalled store) until ctx ends.
type Hook func(ctx context.Context, storeID uint64, method string) error

// Request is one KV request a store received, for tests to assert routing.
type Request struct {
	StoreID        uint64
	Method         string
	RegionID       uint64
	ReplicaRead    bool
	MaxStalenessMs uint64
	// BusyThresholdMs and Hedge are what the read's context carried.
	BusyThresholdMs uint64
	Hedge           bool
}

// Cluster is the fake cluster.
type Cluster struct {
	mu       sync.Mutex
	stores   map[uint64]*Store
	regions  []*regionState
	data     map[string][]byte
	hook     Hook
	nextID   uint64 // for regions and peers made by Admin calls
	requests []Request
	notReady map[uint64]bool // stores that refuse stale reads with DataIsNotReady
	removing map[uint64]bool // stores RemoveStore was called for
}

type regionState struct {
	r      region.Region
	leader uint64 // store id; 0: no leader
	// reported overrides the leader Admin.Regions reports, to fake a
	// store whose view of the leader is stale. 0: report the true one.
	reported uint64
	// size is what the leader reports as the region's approximate size
	// (SetSize); nil: not counted.
	size *[2]uint64
}

// Store is one fake store.
type Store struct {
	ID   uint64
	Zone string
	addr string
	srv  *grpc.Server
	c    *Cluster
	mu   sync.Mutex
	down bool
	// zoneAddrs is what the store advertises as its address per zone.
	zoneAddrs map[string]string
}

// Addr is the store's gRPC address.
func (s *Store) Addr() string { return s.addr }

// SetZoneAddrs makes the store advertise za (zone -> address) in its
// Status and in every store's Stores answer, as a server started with
// --advertise-zone-addrs does.
func (s *Store) SetZoneAddrs(za map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.zoneAddrs = maps.Clone(za)
}

func (s *Store) zoneAddresses() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.zoneAddrs)
}

// Stop kills the store: its listener and connections close, so clients get
// Unavailable (connection refused).
func (s *Store) Stop() {
	s.mu.Lock()
	s.down = true
	s.mu.Unlock()
	s.srv.Stop()
}

// NewCluster starts one store per zone given (ids 1, 2, ...) hosting one
// region (id 1, the whole key space, epoch 1/1, peer i has id i on store i)
// led by store 1. Everything stops when the test ends.
func NewCluster(t testing.TB, zones ...string) *Cluster {
	t.Helper()
	c := &Cluster{stores: make(map[uint64]*Store), data: make(map[string][]byte), notReady: make(map[uint64]bool), removing: make(map[uint64]bool), nextID: 1000}
	r := region.Region{ID: 1, Epoch: region.Epoch{ConfVer: 1, Version: 1}}
	for i, z := range zones {
		id := uint64(i + 1)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		s := &Store{ID: id, Zone: z, addr: lis.Addr().String(), srv: grpc.NewServer(), c: c}
		kvpb.RegisterKVServer(s.srv, &kvServer{s: s})
		kvpb.RegisterAdminServer(s.srv, &adminServer{s: s})
		go func() { _ = s.srv.Serve(lis) }()
		t.Cleanup(s.srv.Stop)
		c.stores[id] = s
		r.Peers = append(r.Peers, region.Peer{ID: id, StoreID: id})
	}
	c.regions = []*regionState{{r: r, leader: 1}}
	return c
}

// Endpoints returns the stores' addresses in id order.
func (c *Cluster) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for id := uint64(1); id <= uint64(len(c.stores)); id++ {
		out = append(out, c.stores[id].addr)
	}
	return out
}

// Store returns store id.
func (c *Cluster) Store(id uint64) *Store {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stores[id]
}

// SetHook installs h (nil removes it).
func (c *Cluster) SetHook(h Hook) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hook = h
}

// SetLeader makes storeID (0: none) the region's leader.
func (c *Cluster) SetLeader(regionID, storeID uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rs := c.regionByIDLocked(regionID); rs != nil {
		rs.leader = storeID
	}
}

// Leader returns the region's leader store.
func (c *Cluster) Leader(regionID uint64) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rs := c.regionByIDLocked(regionID); rs != nil {
		return rs.leader
	}
	return 0
}

// SetReportedLeader makes Admin.Regions report storeID as the region's
// leader (a stale view); 0 reports the true leader again.
func (c *Cluster) SetReportedLeader(regionID, storeID uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rs := c.regionByIDLocked(regionID); rs != nil {
		rs.reported = storeID
	}
}

// SetNotReady makes a store refuse stale reads with DataIsNotReady.
func (c *Cluster) SetNotReady(storeID uint64, notReady bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.notReady[storeID] = notReady
}

// Split splits the region holding key at key; the right half gets newID and
// the same leader. Both halves' versions are bumped, as in a real split.
func (c *Cluster) Split(key []byte, newID uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _, err := c.splitLocked(key, newID)
	return err
}

func (c *Cluster) splitLocked(key []byte, newID uint64) (left, right region.Region, err error) {
	for i, rs := range c.regions {
		if !rs.r.Contains(key) {
			continue
		}
		ids := make([]uint64, len(rs.r.Peers))
		for j := range ids {
			ids[j] = newID*100 + uint64(j) + 1
		}
		left, right, err := region.Split(rs.r, key, newID, ids)
		if err != nil {
			return left, right, fmt.Errorf("split: %w", err)
		}
		c.regions = slices.Insert(c.regions, i+1, &regionState{r: right, leader: rs.leader})
		rs.r = left
		return left.Clone(), right.Clone(), nil
	}
	return left, right, fmt.Errorf("split: no region holds %q", key)
}

// SetLearner marks the region's peer on storeID a learner (or a voter
// again), as a replica being added is until it has caught up.
func (c *Cluster) SetLearner(regionID, storeID uint64, learner bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rs := c.regionByIDLocked(regionID)
	if rs == nil {
		return
	}
	for i := range rs.r.Peers {
		if rs.r.Peers[i].StoreID == storeID {
			rs.r.Peers[i].IsLearner = learner
		}
	}
}

// SetSize makes the region's leader report keys and bytes as the
// region's approximate size, as a real leader does once it has counted it.
func (c *Cluster) SetSize(regionID, keys, bytes uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rs := c.regionByIDLocked(regionID); rs != nil {
		rs.size = &[2]uint64{keys, bytes}
	}
}

// Regions returns the current regions in key order.
func (c *Cluster) Regions() []region.Region {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]region.Region, len(c.regions))
	for i, rs := range c.regions {
		out[i] = rs.r.Clone()
	}
	return out
}

// Put writes directly into the shared data, bypassing routing.
func (c *Cluster) Put(key, value string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.data[key] = []byte(value)
}

// Value reads directly from the shared data.
func (c *Cluster) Value(key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.data[key]
	return v, ok
}

// Requests returns the KV requests received so far.
func (c *Cluster) Requests() []Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.requests)
}

// ResetRequests forgets the requests received so far.
func (c *Cluster) ResetRequests() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests = nil
}

func (c *Cluster) regionByIDLocked(id uint64) *regionState {
	for _, rs := range c.regions {
		if rs.r.ID == id {
			return rs
		}
	}
	return nil
}

func (c *Cluster) regionByKeyLocked(key []byte) *regionState {
	for _, rs := range c.regions {
		if rs.r.Contains(key) {
			return rs
		}
	}
	return nil
}

func (c *Cluster) runHook(ctx context.Context, storeID uint64, method string) error {
	c.mu.Lock()
	h := c.hook
	c.mu.Unlock()
	if h == nil {
		return nil
	}
	return h(ctx, storeID, method)
}

// ---- region errors ----------------------------------------------------------

// RegionError returns the gRPC error a store answers a region error with:
// a status of code carrying re as its detail. Hooks use it to inject region
// errors.
func RegionError(code codes.Code, re *kvpb.RegionError) error {
	return regionErr(code, re)
}

func regionErr(code codes.Code, re *kvpb.RegionError) error {
	st, err := status.New(code, re.GetMessage()).WithDetails(re)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return st.Err()
}

func (c *Cluster) notLeaderLocked(rs *regionState) error {
	nl := &kvpb.NotLeader{RegionId: rs.r.ID}
	if p, ok := rs.r.PeerOnStore(rs.leader); ok && rs.leader != 0 {
		nl.Leader = &kvpb.Peer{Id: p.ID, StoreId: p.StoreID}
	}
	return regionErr(codes.FailedPrecondition, &kvpb.RegionError{Message: "not leader", NotLeader: nl})
}

// routeLocked finds the region a request addressed and checks what a real
// store checks: hosted here, epoch current, keys inside.
func (c *Cluster) routeLocked(storeID, regionID uint64, epoch *kvpb.Epoch, keys ...[]byte) (*regionState, error) {
	var rs *regionState
	if regionID == 0 && len(keys) > 0 {
		rs = c.regionByKeyLocked(keys[0])
	} else {
		rs = c.regionByIDLocked(regionID)
	}
	if rs == nil {
		return nil, regionErr(codes.NotFound, &kvpb.RegionError{Message: "region not found", RegionNotFound: &kvpb.RegionNotFound{RegionId: regionID}})
	}
	if _, ok := rs.r.PeerOnStore(storeID); !ok {
		return nil, regionErr(codes.NotFound, &kvpb.RegionError{Message: "region not found", RegionNotFound: &kvpb.RegionNotFound{RegionId: regionID}})
	}
	if epoch != nil && (epoch.GetVersion() != rs.r.Epoch.Version || epoch.GetConfVer() != rs.r.Epoch.ConfVer) {
		en := &kvpb.EpochNotMatch{RegionId: rs.r.ID}
		for _, o := range c.regions {
			en.CurrentRegions = append(en.CurrentRegions, kvpb.FromRegion(o.r))
		}
		return nil, regionErr(codes.FailedPrecondition, &kvpb.RegionError{Message: "epoch not match", EpochNotMatch: en})
	}
	for _, k := range keys {
		if !rs.r.Contains(k) {
			return nil, regionErr(codes.FailedPrecondition, &kvpb.RegionError{Message: "key not in region", KeyNotInRegion: &kvpb.KeyNotInRegion{
				Key: k, RegionId: rs.r.ID, StartKey: rs.r.StartKey, EndKey: rs.r.EndKey,
			}})
		}
	}
	return rs, nil
}

// readLocked decides how this store may serve a read on rs, as a real store
// would: the leader from its lease; a follower through ReadIndex when
// replica_read is set and there is a leader; any replica from local state
// when staleness is permitted and it is ready.
func (c *Cluster) readLocked(storeID uint64, method string, rs *regionState, rc *kvpb.ReadContext) (*kvpb.ReadInfo, error) {
	c.requests = append(c.requests, Request{
		StoreID: storeID, Method: method, RegionID: rc.GetRegionId(), ReplicaRead: rc.GetReplicaRead(),
		MaxStalenessMs: rc.GetMaxStalenessMs(), BusyThresholdMs: rc.GetBusyThresholdMs(), Hedge: rc.GetHedge(),
	})
	peer, _ := rs.r.PeerOnStore(storeID)
	info := &kvpb.ReadInfo{StoreId: storeID, PeerId: peer.ID}
	switch {
	case rs.leader == storeID:
		info.Mode = kvpb.ReadMode_READ_MODE_LEASE
	case rc.GetMaxStalenessMs() > 0:
		if c.notReady[storeID] {
			return nil, regionErr(codes.Unavailable, &kvpb.RegionError{Message: "data is not ready", DataIsNotReady: &kvpb.DataIsNotReady{RegionId: rs.r.ID, PeerId: peer.ID}})
		}
		info.Mode = kvpb.ReadMode_READ_MODE_STALE
		info.StalenessBoundMs = rc.GetMaxStalenessMs()
		info.LeaderStoreId = rs.leader
	case rc.GetReplicaRead() && rs.leader != 0:
		info.Mode = kvpb.ReadMode_READ_MODE_READ_INDEX
	default:
		return nil, c.notLeaderLocked(rs)
	}
	return info, nil
}

// ---- KV ---------------------------------------------------------------------

type kvServer struct {
	kvpb.UnimplementedKVServer
	s *Store
}

func (k *kvServer) Get(ctx context.Context, req *kvpb.GetRequest) (*kvpb.GetResponse, error) {
	c := k.s.c
	if err := c.runHook(ctx, k.s.ID, "Get"); err != nil {
		return nil, err
	}
	if len(req.GetKey()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "empty key")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rs, err := c.routeLocked(k.s.ID, req.GetContext().GetRegionId(), req.GetContext().GetRegionEpoch(), req.GetKey())
	if err != nil {
		return nil, err
	}
	info, err := c.readLocked(k.s.ID, "Get", rs, req.GetContext())
	if err != nil {
		return nil, err
	}
	v, ok := c.data[string(req.GetKey())]
	return &kvpb.GetResponse{Value: v, NotFound: !ok, ReadInfo: info, Load: &kvpb.Load{}}, nil
}

func (k *kvServer) BatchGet(ctx context.Context, req *kvpb.BatchGetRequest) (*kvpb.BatchGetResponse, error) {
	c := k.s.c
	if err := c.runHook(ctx, k.s.ID, "BatchGet"); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rs, err := c.routeLocked(k.s.ID, req.GetContext().GetRegionId(), req.GetContext().GetRegionEpoch(), req.GetKeys()...)
	if err != nil {
		return nil, err
	}
	info, err := c.readLocked(k.s.ID, "BatchGet", rs, req.GetContext())
	if err != nil {
		return nil, err
	}
	resp := &kvpb.BatchGetResponse{ReadInfo: info}
	for _, key := range req.GetKeys() {
		if v, ok := c.data[string(key)]; ok {
			resp.Pairs = append(resp.Pairs, &kvpb.KvPair{Key: key, Value: v})
		}
	}
	return resp, nil
}

func (k *kvServer) Scan(ctx context.Context, req *kvpb.ScanRequest) (*kvpb.ScanResponse, error) {
	c := k.s.c
	if err := c.runHook(ctx, k.s.ID, "Scan"); err != nil {
		return nil, err
	}
	if req.GetLimit() == 0 || req.GetLimit() > 10000 {
		return nil, status.Errorf(codes.InvalidArgument, "scan limit %d not in 1..10000", req.GetLimit())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rs, err := c.routeLocked(k.s.ID, req.GetContext().GetRegionId(), req.GetContext().GetRegionEpoch(), req.GetStartKey())
	if err != nil {
		return nil, err
	}
	info, err := c.readLocked(k.s.ID, "Scan", rs, req.GetContext())
	if err != nil {
		return nil, err
	}
	start, end, ok := rs.r.ClampRange(req.GetStartKey(), req.GetEndKey())
	resp := &kvpb.ScanResponse{ReadInfo: info, RegionEndKey: rs.r.EndKey}
	if !ok {
		return resp, nil
	}
	keys := make([]string, 0, len(c.data))
	for key := range c.data {
		if bytes.Compare([]byte(key), start) >= 0 && (len(end) == 0 || bytes.Compare([]byte(key), end) < 0) {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	for _, key := range keys {
		if len(resp.Pairs) >= int(req.GetLimit()) {
			break
		}
		resp.Pairs = append(resp.Pairs, &kvpb.KvPair{Key: []byte(key), Value: c.data[key]})
	}
	return resp, nil
}

func (k *kvServer) write(ctx context.Context, method string, wc *kvpb.WriteContext, key []byte, apply func()) error {
	c := k.s.c
	if err := c.runHook(ctx, k.s.ID, method); err != nil {
		return err
	}
	if len(key) == 0 {
		return status.Error(codes.InvalidArgument, "empty key")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rs, err := c.routeLocked(k.s.ID, wc.GetRegionId(), wc.GetRegionEpoch(), key)
	if err != nil {
		return err
	}
	c.requests = append(c.requests, Request{StoreID: k.s.ID, Method: method, RegionID: wc.GetRegionId()})
	if rs.leader != k.s.ID {
		return c.notLeaderLocked(rs)
	}
	apply()
	return nil
}

func (k *kvServer) Put(ctx context.Context, req *kvpb.PutRequest) (*kvpb.PutResponse, error) {
	err := k.write(ctx, "Put", req.GetContext(), req.GetKey(), func() {
		k.s.c.data[string(req.GetKey())] = slices.Clone(req.GetValue())
	})
	if err != nil {
		return nil, err
	}
	return &kvpb.PutResponse{}, nil
}

func (k *kvServer) Delete(ctx context.Context, req *kvpb.DeleteRequest) (*kvpb.DeleteResponse, error) {
	err := k.write(ctx, "Delete", req.GetContext(), req.GetKey(), func() {
		delete(k.s.c.data, string(req.GetKey()))
	})
	if err != nil {
		return nil, err
	}
	return &kvpb.DeleteResponse{}, nil
}

// ---- Admin ------------------------------------------------------------------

type adminServer struct {
	kvpb.UnimplementedAdminServer
	s *Store
}

func (a *adminServer) Status(ctx context.Context, _ *kvpb.StatusRequest) (*kvpb.StatusResponse, error) {
	if err := a.s.c.runHook(ctx, a.s.ID, "Status"); err != nil {
		return nil, err
	}
	return &kvpb.StatusResponse{StoreId: a.s.ID, Address: a.s.addr, Zone: a.s.Zone, ZoneAddresses: a.s.zoneAddresses()}, nil
}

func (a *adminServer) Stores(ctx context.Context, _ *kvpb.StoresRequest) (*kvpb.StoresResponse, error) {
	c := a.s.c
	if err := c.runHook(ctx, a.s.ID, "Stores"); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	resp := &kvpb.StoresResponse{}
	for id := uint64(1); id <= uint64(len(c.stores)); id++ {
		s := c.stores[id]
		s.mu.Lock()
		up := !s.down
		za := maps.Clone(s.zoneAddrs)
		s.mu.Unlock()
		st := &kvpb.Store{Id: id, Address: s.addr, Zone: s.Zone, Up: up, ZoneAddresses: za, Removing: c.removing[id]}
		for _, rs := range c.regions {
			if _, ok := rs.r.PeerOnStore(id); ok {
				st.RegionCount++
			}
			if rs.leader == id {
				st.LeaderCount++
			}
		}
		st.Removed = st.Removing && st.RegionCount == 0
		resp.Stores = append(resp.Stores, st)
	}
	return resp, nil
}

func (a *adminServer) Regions(ctx context.Context, req *kvpb.RegionsRequest) (*kvpb.RegionsResponse, error) {
	c := a.s.c
	if err := c.runHook(ctx, a.s.ID, "Regions"); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	resp := &kvpb.RegionsResponse{}
	for _, rs := range c.regions {
		if _, ok := rs.r.PeerOnStore(a.s.ID); !ok {
			continue
		}
		if req.GetByKey() && !rs.r.Contains(req.GetKey()) {
			continue
		}
		leader := rs.leader
		if rs.reported != 0 {
			leader = rs.reported
		}
		info := &kvpb.RegionInfo{Region: kvpb.FromRegion(rs.r), LeaderStoreId: leader, Term: 1}
		if rs.size != nil && a.s.ID == rs.leader {
			info.SizeKnown, info.ApproximateKeys, info.ApproximateSize = true, rs.size[0], rs.size[1]
		}
		if p, ok := rs.r.PeerOnStore(leader); ok {
			info.Leader = &kvpb.Peer{Id: p.ID, StoreId: p.StoreID}
		}
		resp.Regions = append(resp.Regions, info)
	}
	return resp, nil
}

// RemoveStore marks the store removing, refusing as the server does when
// fewer than three stores would be left up. The fake has no balancer:
// the store is reported removed once no region has a replica on it (move
// them with AddPeer/RemovePeer).
func (a *adminServer) RemoveStore(ctx context.Context, req *kvpb.RemoveStoreRequest) (*kvpb.RemoveStoreResponse, error) {
	c := a.s.c
	if err := c.runHook(ctx, a.s.ID, "RemoveStore"); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id := req.GetStoreId()
	if _, ok := c.stores[id]; !ok {
		return nil, status.Errorf(codes.NotFound, "store %d is unknown to store %d", id, a.s.ID)
	}
	if c.removing[id] {
		return &kvpb.RemoveStoreResponse{Already: true}, nil
	}
	left := 0
	for sid, s := range c.stores {
		s.mu.Lock()
		if sid != id && !s.down && !c.removing[sid] {
			left++
		}
		s.mu.Unlock()
	}
	if left < 3 {
		return nil, status.Errorf(codes.FailedPrecondition, "removing store %d would leave %d stores up to hold the 3 replicas of each region", id, left)
	}
	c.removing[id] = true
	return &kvpb.RemoveStoreResponse{}, nil
}

func (a *adminServer) TransferLeader(ctx context.Context, req *kvpb.TransferLeaderRequest) (*kvpb.TransferLeaderResponse, error) {
	c := a.s.c
	if err := c.runHook(ctx, a.s.ID, "TransferLeader"); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rs := c.regionByIDLocked(req.GetRegionId())
	if rs == nil {
		return nil, status.Errorf(codes.NotFound, "region %d not found", req.GetRegionId())
	}
	if rs.leader != a.s.ID {
		return nil, c.notLeaderLocked(rs)
	}
	if _, ok := rs.r.PeerOnStore(req.GetToStoreId()); !ok {
		return nil, status.Errorf(codes.InvalidArgument, "store %d hosts no peer of region %d", req.GetToStoreId(), rs.r.ID)
	}
	rs.leader = req.GetToStoreId()
	return &kvpb.TransferLeaderResponse{}, nil
}

// leaderOnLocked finds region id and checks that storeID leads it, as a
// real store's Admin calls do.
func (c *Cluster) leaderOnLocked(storeID, regionID uint64) (*regionState, error) {
	rs := c.regionByIDLocked(regionID)
	if rs == nil {
		return nil, regionErr(codes.NotFound, &kvpb.RegionError{Message: "region not found", RegionNotFound: &kvpb.RegionNotFound{RegionId: regionID}})
	}
	if _, ok := rs.r.PeerOnStore(storeID); !ok {
		return nil, regionErr(codes.NotFound, &kvpb.RegionError{Message: "region not found", RegionNotFound: &kvpb.RegionNotFound{RegionId: regionID}})
	}
	if rs.leader != storeID {
		return nil, c.notLeaderLocked(rs)
	}
	return rs, nil
}

func (a *adminServer) Split(ctx context.Context, req *kvpb.SplitRequest) (*kvpb.SplitResponse, error) {
	c := a.s.c
	if err := c.runHook(ctx, a.s.ID, "Split"); err != nil {
		return nil, err
	}
	if len(req.GetKey()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "split key is empty")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rs := c.regionByKeyLocked(req.GetKey())
	if rs == nil {
		return nil, regionErr(codes.NotFound, &kvpb.RegionError{Message: "region not found", RegionNotFound: &kvpb.RegionNotFound{}})
	}
	if _, err := c.leaderOnLocked(a.s.ID, rs.r.ID); err != nil {
		return nil, err
	}
	if bytes.Equal(rs.r.StartKey, req.GetKey()) {
		return nil, status.Errorf(codes.InvalidArgument, "split key %q is already a region boundary", req.GetKey())
	}
	c.nextID++
	left, right, err := c.splitLocked(req.GetKey(), c.nextID)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &kvpb.SplitResponse{Left: kvpb.FromRegion(left), Right: kvpb.FromRegion(right)}, nil
}

// Merge merges a region with its right neighbour as raftstore does: on
// the left region's leader, refused unless both have replicas on the same
// stores.
func (a *adminServer) Merge(ctx context.Context, req *kvpb.MergeRequest) (*kvpb.MergeResponse, error) {
	c := a.s.c
	if err := c.runHook(ctx, a.s.ID, "Merge"); err != nil {
		return nil, err
	}
	if req.GetRegionId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "merge: region id must be non-zero")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ls, err := c.leaderOnLocked(a.s.ID, req.GetRegionId())
	if err != nil {
		return nil, err
	}
	if len(ls.r.EndKey) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "merge of region %d refused: it is the last region: it has no right neighbour", ls.r.ID)
	}
	merged, err := c.mergeLocked(ls)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "merge of region %d refused: %v", ls.r.ID, err)
	}
	return &kvpb.MergeResponse{Merged: kvpb.FromRegion(merged)}, nil
}

// Merge makes region leftID absorb its right neighbour, behind every
// client's back.
func (c *Cluster) Merge(leftID uint64) (region.Region, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ls := range c.regions {
		if ls.r.ID == leftID {
			return c.mergeLocked(ls)
		}
	}
	return region.Region{}, fmt.Errorf("merge: no region %d", leftID)
}

func (c *Cluster) mergeLocked(ls *regionState) (region.Region, error) {
	ri := slices.IndexFunc(c.regions, func(rs *regionState) bool { return bytes.Equal(rs.r.StartKey, ls.r.EndKey) })
	if len(ls.r.EndKey) == 0 || ri < 0 {
		return region.Region{}, fmt.Errorf("region %d has no right neighbour", ls.r.ID)
	}
	merged, err := region.Merge(ls.r, c.regions[ri].r)
	if err != nil {
		return region.Region{}, err
	}
	ls.r = merged
	c.regions = slices.Delete(c.regions, ri, ri+1)
	return merged.Clone(), nil
}

func (a *adminServer) AddPeer(ctx context.Context, req *kvpb.AddPeerRequest) (*kvpb.AddPeerResponse, error) {
	c := a.s.c
	if err := c.runHook(ctx, a.s.ID, "AddPeer"); err != nil {
		return nil, err
	}
	if req.GetRegionId() == 0 || req.GetStoreId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "region id and store id must be non-zero")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stores[req.GetStoreId()] == nil {
		return nil, status.Errorf(codes.InvalidArgument, "store %d is unknown", req.GetStoreId())
	}
	rs, err := c.leaderOnLocked(a.s.ID, req.GetRegionId())
	if err != nil {
		return nil, err
	}
	if p, ok := rs.r.PeerOnStore(req.GetStoreId()); ok && !p.IsLearner {
		return &kvpb.AddPeerResponse{}, nil
	}
	c.nextID++
	r := rs.r.Clone()
	r.Peers = slices.DeleteFunc(r.Peers, func(p region.Peer) bool { return p.StoreID == req.GetStoreId() })
	r.Peers = append(r.Peers, region.Peer{ID: c.nextID, StoreID: req.GetStoreId()})
	r.Epoch.ConfVer++
	rs.r = r
	return &kvpb.AddPeerResponse{}, nil
}

func (a *adminServer) RemovePeer(ctx context.Context, req *kvpb.RemovePeerRequest) (*kvpb.RemovePeerResponse, error) {
	c := a.s.c
	if err := c.runHook(ctx, a.s.ID, "RemovePeer"); err != nil {
		return nil, err
	}
	if req.GetRegionId() == 0 || req.GetStoreId() == 0 {
		return nil, status.Error(codes.InvalidArgument, "region id and store id must be non-zero")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rs, err := c.leaderOnLocked(a.s.ID, req.GetRegionId())
	if err != nil {
		return nil, err
	}
	if _, ok := rs.r.PeerOnStore(req.GetStoreId()); !ok {
		return &kvpb.RemovePeerResponse{}, nil
	}
	if req.GetStoreId() == a.s.ID {
		// Like a real leader: hand leadership to another voter first and
		// send the caller there.
		for _, p := range rs.r.Peers {
			if p.StoreID != a.s.ID && !p.IsLearner {
				rs.leader = p.StoreID
				return nil, c.notLeaderLocked(rs)
			}
		}
		return nil, status.Errorf(codes.InvalidArgument, "region %d: cannot remove its last voter", rs.r.ID)
	}
	r := rs.r.Clone()
	r.Peers = slices.DeleteFunc(r.Peers, func(p region.Peer) bool { return p.StoreID == req.GetStoreId() })
	r.Epoch.ConfVer++
	rs.r = r
	return &kvpb.RemovePeerResponse{}, nil
}
