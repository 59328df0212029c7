package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Stores joining and being removed: what Admin.Join and Admin.RemoveStore
// do (package server answers them), forwarding them to the other stores,
// and a starting store's own join. This file validates the requests and
// keeps the address book every store shares.

const (
	// MaxStoreID is the largest store id raftstore accepts.
	MaxStoreID = 0xffff
	// maxAddrLen and maxZoneLen bound what a Join may make every store
	// remember.
	maxAddrLen = 1024
	maxZoneLen = 256
	// joinForwardTimeout bounds forwarding one Join to one other store.
	joinForwardTimeout = 2 * time.Second
	// joinAttemptTimeout bounds one Join call of a starting store: the
	// store contacted forwards it to the others before it answers.
	joinAttemptTimeout = joinForwardTimeout + 3*time.Second
	// DefaultJoinTimeout bounds the whole join of a starting store when
	// Config.JoinTimeout is 0.
	DefaultJoinTimeout = 30 * time.Second
)

// Join records a store in the address book (Admin.Join). The store first
// contacted (forwarded unset) forwards the request to every other store it
// knows and answers with the whole book, which the newcomer adopts. Its
// refusals are gRPC status errors; any other error is the book's.
func (p *Plane) Join(ctx context.Context, req *kvpb.JoinRequest) (*kvpb.JoinResponse, error) {
	if err := ValidateJoin(req); err != nil {
		return nil, err
	}
	self := p.cfg.StoreID
	id, addr := req.GetStoreId(), req.GetAddress()
	if id == self {
		return nil, status.Errorf(codes.AlreadyExists, "store id %d is the id of the store at %s", id, p.AdvertiseAddr())
	}
	if p.book.isRemoving(id) {
		return nil, status.Errorf(codes.FailedPrecondition, "store %d was removed from the cluster and its id is not reused: start the store with another --id", id)
	}
	if old, known := p.book.get(id); known && old != addr && !req.GetForwarded() && p.answersAs(ctx, id) {
		return nil, status.Errorf(codes.AlreadyExists, "store %d is up at %s; a store cannot join with its id", id, old)
	}
	if err := p.SetPeers(map[uint64]string{id: addr}, true); err != nil {
		return nil, err
	}
	// The newcomer speaks for itself: what it advertises (nothing, too)
	// replaces what the book remembered of a store with its id.
	if err := p.setZoneAddrs(map[uint64]map[string]string{id: req.GetZoneAddresses()}); err != nil {
		return nil, err
	}
	p.view.noteZone(id, req.GetZone())
	p.logger.Info("store joined", "joined_store", id, "addr", addr, "zone", req.GetZone(), "zone_addrs", req.GetZoneAddresses(), "forwarded", req.GetForwarded())
	if !req.GetForwarded() {
		p.forwardJoin(ctx, req)
	}
	peers := p.book.all()
	if _, ok := peers[self]; !ok {
		peers[self] = p.AdvertiseAddr()
	}
	return &kvpb.JoinResponse{Peers: peers, ZoneAddresses: kvpb.FromZoneAddrs(p.book.allZoneAddrs())}, nil
}

// RemoveStore starts removing a store (Admin.RemoveStore) from the cluster: it is marked
// removing in this store's address book (persisted), the store first
// contacted (forwarded unset) tells every other store, and from then on
// the balancers move the store's replicas and leaderships to other stores
// and put none on it (raftstore's balancer, StoreInfo.Removing). The
// cluster view reports the store removed once no region has a replica on
// it: it may then be stopped and its data deleted. A store that misses the
// call learns of it from another store's Status.
//
// The first store refuses with FailedPrecondition when fewer than
// MaxReplicas stores would be left up to hold the replicas: removing a
// store must not cost a region its full replica set.
//
// Its refusals are gRPC status errors; any other error is the book's, or
// ctx's.
func (p *Plane) RemoveStore(ctx context.Context, req *kvpb.RemoveStoreRequest) (*kvpb.RemoveStoreResponse, error) {
	id := req.GetStoreId()
	switch {
	case id == 0:
		return nil, status.Error(codes.InvalidArgument, "store id is 0")
	case id > MaxStoreID:
		return nil, status.Errorf(codes.InvalidArgument, "store id %d over the maximum %d", id, MaxStoreID)
	}
	self := p.cfg.StoreID
	if _, known := p.book.get(id); !known && id != self {
		return nil, status.Errorf(codes.NotFound, "store %d is unknown to store %d (ctl stores lists the stores)", id, self)
	}
	already := p.book.isRemoving(id)
	if req.GetForwarded() {
		if err := p.markRemoving(id); err != nil {
			return nil, err
		}
		return &kvpb.RemoveStoreResponse{Already: already}, nil
	}
	stores, err := p.view.stores(ctx)
	if err != nil {
		return nil, fmt.Errorf("list stores: %w", err)
	}
	if !already {
		if err := p.checkRemovable(stores, id); err != nil {
			return nil, err
		}
	}
	if err := p.markRemoving(id); err != nil {
		return nil, err
	}
	// Also when it was already marked here: a store that missed the first
	// call hears of it now rather than on its next Status poll.
	p.forwardRemoveStore(ctx, id, stores)
	return &kvpb.RemoveStoreResponse{Already: already}, nil
}

// checkRemovable refuses to remove store id when fewer than MaxReplicas
// of stores, up and not being removed, would be left.
func (p *Plane) checkRemovable(stores []*kvpb.Store, id uint64) error {
	left := 0
	for _, st := range stores {
		if st.GetId() != id && st.GetUp() && !st.GetRemoving() {
			left++
		}
	}
	if want := p.deps.MaxReplicas(); left < want {
		return status.Errorf(codes.FailedPrecondition, "removing store %d would leave %d stores up to hold the %d replicas of each region: add a store first (server --join)", id, left, want)
	}
	return nil
}

// markRemoving records stores as being removed; the view's next listing
// shows it, and the balancer acts on it.
func (p *Plane) markRemoving(ids ...uint64) error {
	added, err := p.book.markRemoving(ids...)
	if err != nil {
		return fmt.Errorf("store %d: record stores %v as removing: %w", p.cfg.StoreID, ids, err)
	}
	if len(added) > 0 {
		p.view.invalidate()
		p.logger.Info("stores being removed from the cluster", "stores", added)
	}
	return nil
}

// learnRemoving records the removals another store's Status names.
func (p *Plane) learnRemoving(ids []uint64) {
	if err := p.markRemoving(ids...); err != nil {
		p.logger.Warn("could not record stores learned to be removed", "err", err)
	}
}

// forwardRemoveStore tells every other store the listing shows up that
// store id is being removed, in parallel and bounded, as forwardJoin does.
// A store that is down is not waited for (removing a dead store is the
// common case): it learns of the removal from the others' Status when it
// is back.
func (p *Plane) forwardRemoveStore(ctx context.Context, id uint64, stores []*kvpb.Store) {
	fwd := &kvpb.RemoveStoreRequest{StoreId: id, Forwarded: true}
	var to []uint64
	for _, st := range stores {
		if st.GetId() != p.cfg.StoreID && st.GetUp() {
			to = append(to, st.GetId())
		}
	}
	p.forward(ctx, to, func(ctx context.Context, a kvpb.AdminClient) error {
		_, err := a.RemoveStore(ctx, fwd)
		return err
	}, "could not forward a store removal", "removed_store", id)
}

// ValidateJoin checks an Admin.Join request; its errors are InvalidArgument
// statuses.
func ValidateJoin(req *kvpb.JoinRequest) error {
	switch id := req.GetStoreId(); {
	case id == 0:
		return status.Error(codes.InvalidArgument, "store id is 0")
	case id > MaxStoreID:
		return status.Errorf(codes.InvalidArgument, "store id %d over the maximum %d", id, MaxStoreID)
	}
	addr := req.GetAddress()
	if addr == "" {
		return status.Error(codes.InvalidArgument, "address is empty")
	}
	if len(addr) > maxAddrLen {
		return status.Errorf(codes.InvalidArgument, "address is %d bytes, over the %d byte limit", len(addr), maxAddrLen)
	}
	if host, port, err := net.SplitHostPort(addr); err != nil || host == "" || port == "" {
		return status.Errorf(codes.InvalidArgument, "address %q is not HOST:PORT", addr)
	}
	if len(req.GetZone()) > maxZoneLen {
		return status.Errorf(codes.InvalidArgument, "zone is %d bytes, over the %d byte limit", len(req.GetZone()), maxZoneLen)
	}
	if err := CheckZoneAddrs(req.GetZoneAddresses()); err != nil {
		return status.Errorf(codes.InvalidArgument, "zone addresses: %v", err)
	}
	return nil
}

// answersAs reports whether store id's recorded (plain) address answers
// Status as that store: the store is up there, so nobody else may take its
// id. It asks at the plain address (callDirect), not through the zone
// address this store may remember stale, or see cut by a partition.
func (p *Plane) answersAs(ctx context.Context, id uint64) bool {
	var st *kvpb.StatusResponse
	err := p.callDirect(ctx, id, StoreStatusTimeout, func(ctx context.Context, a kvpb.AdminClient) error {
		var err error
		st, err = a.Status(ctx, &kvpb.StatusRequest{Summary: true})
		return err
	})
	return err == nil && st.GetStoreId() == id
}

// forwardJoin tells every other known store about the newcomer, in
// parallel, at their plain addresses (callDirect: this keeps the address
// book, as learning does), and waits (bounded) so that when the newcomer
// hears back the whole cluster can reach it. A store that cannot be told
// learns of the newcomer later from another store's Status.
func (p *Plane) forwardJoin(ctx context.Context, req *kvpb.JoinRequest) {
	fwd := &kvpb.JoinRequest{StoreId: req.GetStoreId(), Address: req.GetAddress(), Zone: req.GetZone(), ZoneAddresses: req.GetZoneAddresses(), Forwarded: true}
	var to []uint64
	for _, id := range p.book.ids() {
		if id != p.cfg.StoreID && id != req.GetStoreId() {
			to = append(to, id)
		}
	}
	p.forward(ctx, to, func(ctx context.Context, a kvpb.AdminClient) error {
		_, err := a.Join(ctx, fwd)
		return err
	}, "could not forward a join", "joined_store", req.GetStoreId())
}

// forward makes call on each of the stores to, in parallel, at their plain
// addresses (callDirect: the address book's own, as learning uses), each
// bounded by joinForwardTimeout, and waits for all. A store that cannot be
// told is logged (warn, with attrs) and learns later from another store's
// Status.
func (p *Plane) forward(ctx context.Context, to []uint64, call func(context.Context, kvpb.AdminClient) error, warn string, attrs ...any) {
	var wg sync.WaitGroup
	for _, id := range to {
		wg.Go(func() {
			if err := p.callDirect(ctx, id, joinForwardTimeout, call); err != nil {
				p.logger.Warn(warn, slices.Concat(attrs, []any{"to_store", id, "err", err})...)
			}
		})
	}
	wg.Wait()
}

// NeedsJoin reports whether this server should join through
// Config.Join when it starts: it was given join addresses and knows no
// store but itself (a restarted store that joined before just starts).
func (p *Plane) NeedsJoin() bool {
	if len(p.cfg.Join) == 0 {
		return false
	}
	for _, id := range p.book.ids() {
		if id != p.cfg.StoreID {
			return false
		}
	}
	return true
}

// JoinCluster announces this store to the cluster through one of Config.Join and
// adopts the address book it answers with. It tries the addresses in turn,
// round after round, until one answers, ctx ends or JoinTimeout passes; a
// refusal (id taken, bad request) ends it at once.
func (p *Plane) JoinCluster(ctx context.Context) error {
	timeout := p.cfg.JoinTimeout
	if timeout <= 0 {
		timeout = DefaultJoinTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	self := p.cfg.StoreID
	req := &kvpb.JoinRequest{StoreId: self, Address: p.AdvertiseAddr(), Zone: p.cfg.Zone, ZoneAddresses: p.cfg.ZoneAddrs}
	backoff := 100 * time.Millisecond
	var errs []error
	for {
		errs = errs[:0]
		for _, addr := range p.cfg.Join {
			resp, err := joinVia(ctx, addr, p.cfg.DialOptions, req)
			if err == nil {
				peers := resp.GetPeers()
				delete(peers, self)
				peers[self] = req.GetAddress()
				if err := p.SetPeers(peers, true); err != nil {
					return err
				}
				// How to reach the others from this store's zone, as the
				// store contacted knows it; each store's own Status
				// confirms it later (zoneaddrs.go).
				zones := kvpb.ToZoneAddrs(resp.GetZoneAddresses())
				delete(zones, self)
				if err := p.setZoneAddrs(zones); err != nil {
					return err
				}
				p.logger.Info("joined the cluster", "via", addr, "stores", len(peers))
				return nil
			}
			switch status.Code(err) {
			case codes.InvalidArgument, codes.AlreadyExists, codes.FailedPrecondition, codes.PermissionDenied, codes.Unimplemented, codes.Unauthenticated:
				return fmt.Errorf("join via %s refused: %w", addr, err)
			}
			errs = append(errs, fmt.Errorf("join via %s: %w", addr, err))
			p.logger.Warn("join attempt failed", "via", addr, "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("could not join the cluster: %w (%w)", ctx.Err(), errors.Join(errs...))
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// joinVia calls Admin.Join on addr over a connection of its own: the
// store behind addr has no id in this store's book yet.
func joinVia(ctx context.Context, addr string, dialOpts []grpc.DialOption, req *kvpb.JoinRequest) (*kvpb.JoinResponse, error) {
	conn, err := grpc.NewClient(addr, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, joinAttemptTimeout)
	defer cancel()
	resp, err := kvpb.NewAdminClient(conn).Join(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}
