package controlplane

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// StoreStatusTimeout bounds how long a listing waits for one store's
// Status: a store that cannot answer that quickly is reported down rather
// than holding up the whole listing.
const StoreStatusTimeout = 500 * time.Millisecond

// clusterViewTTL is how long one listing of the stores is reused, so the
// balancer and Admin.Stores together ask each store at most about once a
// second.
const clusterViewTTL = time.Second

// clusterView is this store's picture of every store in its address book:
// up (answered Status in time) or down, zone, leader and region counts. It
// backs Admin.Stores and is the raftstore.ClusterView the balancer uses.
// Listings are cached for ttl and shared: callers arriving while one is
// being gathered wait for it instead of asking every store again.
type clusterView struct {
	selfID uint64
	book   *addressBook
	trans  Transport
	local  func() *kvpb.StatusResponse   // this store's own Status, answered locally
	learn  func(peers map[uint64]string) // stores named in an answer, for the address book
	// learnRemoving gets the stores answers name as being removed.
	learnRemoving func(ids []uint64)
	base          context.Context // ends when the server stops
	ttl           time.Duration
	timeout       time.Duration
	logger        *slog.Logger
	// heard, if set, gets every other store's Status answer, or nil for a
	// store that did not answer: what a store says of itself (its zone
	// addresses) goes to the address book, and a store that could not be
	// reached is asked again at its plain address (zoneaddrs.go).
	heard func(id uint64, st *kvpb.StatusResponse)
	// leaders, if set, is a digest of who leads each region this store
	// hosts, as it knows it: a listing gathered under another digest
	// predates a leadership change (a transfer, an election) and is not
	// reused, so counts read right after a transfer are current.
	leaders func() string

	mu        sync.Mutex
	cached    []*kvpb.Store
	at        time.Time
	cachedSig string // leaders() when the cached listing was asked for
	flight    *viewFlight
	zones     map[uint64]string // last zone each store reported (or joined with)
}

type viewFlight struct {
	done   chan struct{}
	stores []*kvpb.Store
	sig    string
}

var _ raftstore.ClusterView = (*clusterView)(nil)

// Stores implements raftstore.ClusterView. It always includes this store.
// If ctx ends before a listing is ready it returns the last one (or this
// store alone): better a stale view than claiming everyone is down.
func (v *clusterView) Stores(ctx context.Context) []raftstore.StoreInfo {
	stores, err := v.stores(ctx)
	if err != nil {
		stores = v.fallback()
	}
	out := make([]raftstore.StoreInfo, 0, len(stores))
	for _, s := range stores {
		out = append(out, raftstore.StoreInfo{
			ID:          s.GetId(),
			Zone:        s.GetZone(),
			Up:          s.GetUp(),
			LeaderCount: int(s.GetLeaderCount()),
			RegionCount: int(s.GetRegionCount()),
			Removing:    s.GetRemoving(),
		})
	}
	return out
}

// stores returns the current listing, sorted by id, gathering a new one if
// the cached one is older than ttl or this store has seen a leadership
// change since it was gathered (peerUp and invalidate drop it too). The
// result is shared: do not modify it.
func (v *clusterView) stores(ctx context.Context) ([]*kvpb.Store, error) {
	sig := ""
	if v.leaders != nil {
		sig = v.leaders()
	}
	v.mu.Lock()
	if v.cached != nil && time.Since(v.at) < v.ttl && sig == v.cachedSig {
		out := v.cached
		v.mu.Unlock()
		return out, nil
	}
	f := v.flight
	if f != nil && f.sig != sig {
		// Gathering began before the change: start another (the old one
		// still answers those waiting for it).
		f = nil
	}
	if f == nil {
		f = &viewFlight{done: make(chan struct{}), sig: sig}
		v.flight = f
		go v.refresh(f)
	}
	v.mu.Unlock()
	select {
	case <-f.done:
		return f.stores, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// refresh gathers a listing for f on a context of its own, so that one
// impatient caller cannot spoil it for the others waiting.
func (v *clusterView) refresh(f *viewFlight) {
	ctx, cancel := context.WithTimeout(v.base, 2*v.timeout)
	defer cancel()
	stores := v.collect(ctx)
	v.mu.Lock()
	if v.flight == f {
		// Not invalidated meanwhile: this listing is current.
		v.cached, v.at, v.cachedSig = stores, time.Now(), f.sig
		v.flight = nil
	}
	v.mu.Unlock()
	f.stores = stores
	close(f.done)
}

// invalidate drops the cached listing, so the next one asks again; called
// when the address book changes.
func (v *clusterView) invalidate() {
	v.mu.Lock()
	v.cached, v.flight = nil, nil
	v.mu.Unlock()
}

// peerUp is told of every new raft stream from store id: if the cached
// listing has it down, the listing is dropped, so a store that restarted
// shows up as soon as it talks to this one. Its connection's reconnect
// back-off is reset too, so that the next Status reaches it at once.
func (v *clusterView) peerUp(id uint64) {
	v.mu.Lock()
	stale := v.cached == nil // a listing being gathered may have asked too early
	for _, s := range v.cached {
		if s.GetId() == id && !s.GetUp() {
			stale = true
		}
	}
	if stale {
		v.cached, v.flight = nil, nil
	}
	v.mu.Unlock()
	if conn, err := v.trans.Conn(id); err == nil {
		kvpb.ResetBackoff(conn)
	}
}

// noteZone records a store's zone before it has answered (from its Join).
func (v *clusterView) noteZone(id uint64, zone string) {
	if zone == "" {
		return
	}
	v.mu.Lock()
	if v.zones == nil {
		v.zones = make(map[uint64]string)
	}
	v.zones[id] = zone
	v.mu.Unlock()
}

// fallback is the last listing, or this store alone if there is none.
func (v *clusterView) fallback() []*kvpb.Store {
	v.mu.Lock()
	last := v.cached
	v.mu.Unlock()
	if last != nil {
		return last
	}
	return []*kvpb.Store{v.fromStatus(&kvpb.Store{Id: v.selfID}, v.local())}
}

// collect asks every store in the address book (and this one) for its
// Status, in parallel, each within the view's timeout. It asks them the
// way raft reaches them (the transport: at their address for this store's
// zone, in the simulated WAN), so that up means reachable for raft: a store
// cut off by a partition is listed down, which the balancer and the
// hibernation wake-up rely on. Learning their addresses does not depend on
// it (zoneaddrs.go).
func (v *clusterView) collect(ctx context.Context) []*kvpb.Store {
	ids := v.book.ids()
	if !slices.Contains(ids, v.selfID) {
		ids = append(ids, v.selfID)
		slices.Sort(ids)
	}
	out := make([]*kvpb.Store, len(ids))
	answers := make([]*kvpb.StatusResponse, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			out[i], answers[i] = v.storeInfo(ctx, id)
		})
	}
	wg.Wait()
	learned := make(map[uint64]string)
	var removing []uint64
	hosted := make(map[uint64]bool) // stores some answering store's regions name as replicas
	v.mu.Lock()
	if v.zones == nil {
		v.zones = make(map[uint64]string)
	}
	for i, st := range answers {
		if st != nil {
			if z := st.GetZone(); z != "" {
				v.zones[out[i].GetId()] = z
			}
			for id, addr := range st.GetPeers() {
				if _, ok := learned[id]; !ok {
					learned[id] = addr
				}
			}
			removing = append(removing, st.GetRemovingStores()...)
			for _, id := range st.GetReplicaStores() {
				hosted[id] = true
			}
			// A store of an earlier version lists its regions instead.
			for _, r := range st.GetRegions() {
				for _, p := range r.GetRegion().GetPeers() {
					hosted[p.GetStoreId()] = true
				}
			}
		} else if out[i].GetZone() == "" {
			out[i].Zone = v.zones[out[i].GetId()]
		}
	}
	v.mu.Unlock()
	if len(learned) > 0 && v.learn != nil {
		v.learn(learned)
	}
	if len(removing) > 0 && v.learnRemoving != nil {
		v.learnRemoving(removing)
	}
	for _, s := range out {
		if v.book.isRemoving(s.GetId()) {
			s.Removing = true
			// Removed: nothing left on it, as far as the stores that
			// answered know (a store down with replicas still counts as
			// holding them: the regions that name it say so).
			s.Removed = !hosted[s.GetId()] && (!s.GetUp() || s.GetRegionCount() == 0)
		}
	}
	if v.heard != nil {
		for i, st := range answers {
			if out[i].GetId() != v.selfID {
				v.heard(out[i].GetId(), st)
			}
		}
	}
	return out
}

// storeInfo asks one store for its Status (this store answers locally).
// A store that does not answer is listed down, with its Status nil.
func (v *clusterView) storeInfo(ctx context.Context, id uint64) (*kvpb.Store, *kvpb.StatusResponse) {
	addr, _ := v.book.get(id)
	// Until (unless) the store answers, list the zone addresses the book
	// remembers for it.
	info := &kvpb.Store{Id: id, Address: addr, ZoneAddresses: maps.Clone(v.book.zoneAddrs(id))}
	if id == v.selfID {
		st := v.local()
		return v.fromStatus(info, st), st
	}
	conn, err := v.trans.Conn(id)
	if err != nil {
		return info, nil
	}
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	// A summary: every store's whole region list every second would cost
	// more than the rest of an idle store's work with thousands of regions.
	req := &kvpb.StatusRequest{Summary: true}
	st, err := kvpb.NewAdminClient(conn).Status(ctx, req)
	if cs := conn.GetState(); status.Code(err) == codes.Unavailable && (cs == connectivity.TransientFailure || cs == connectivity.Idle) {
		// Refused at once because the connection is waiting out its
		// reconnect back-off (up to 2 s after the store went away) or
		// was closed by the store's shutdown: the store may be back
		// (restarted). Ask again on a fresh attempt; a store still down
		// refuses it as fast.
		kvpb.ResetBackoff(conn)
		conn.Connect()
		if conn.WaitForStateChange(ctx, cs) {
			st, err = kvpb.NewAdminClient(conn).Status(ctx, req)
		}
	}
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			v.logger.Debug("store status", "to_store", id, "err", err)
		}
		return info, nil
	}
	if st.GetStoreId() != 0 && st.GetStoreId() != id {
		// Something else answers at that address now: store id is not up.
		v.logger.Warn("address answers as another store", "to_store", id, "addr", addr, "answered_as", st.GetStoreId())
		return info, nil
	}
	return v.fromStatus(info, st), st
}

func (v *clusterView) fromStatus(info *kvpb.Store, st *kvpb.StatusResponse) *kvpb.Store {
	if info.Address == "" {
		info.Address = st.GetAddress()
	}
	info.Up = true
	info.Zone = st.GetZone()
	info.ZoneAddresses = maps.Clone(st.GetZoneAddresses())
	info.LeaderCount = st.GetLeaderCount()
	// A store of an earlier version sets no region_count.
	info.RegionCount = max(st.GetRegionCount(), uint64(len(st.GetRegions())))
	return info
}

// cloneStores deep-copies a shared listing for an RPC answer.
func cloneStores(in []*kvpb.Store) []*kvpb.Store {
	out := make([]*kvpb.Store, len(in))
	for i, s := range in {
		out[i] = proto.Clone(s).(*kvpb.Store)
	}
	return out
}
