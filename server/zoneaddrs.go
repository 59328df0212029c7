package server

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hedgekv/hedgekv/server/pb"
)

// Addresses per zone. In the simulated WAN every (zone, store) link has a
// proxy of its own: to reach store S from zone Z one dials the proxy
// A(Z, S). Each store is told its own A(Z, S) for every zone
// (Config.ZoneAddrs, the --advertise-zone-addrs flag), advertises them in
// its Status, its Join and the Stores listing, and every store keeps the
// others' in its address book. A store in zone Z then dials each peer, for
// raft messages and every store-to-store call, at the peer's address for
// Z when it advertises one, else at its plain address (dialAddr); so raft
// traffic and follower reads' ReadIndex round trips cross the simulated
// WAN as client traffic does. A store learns a peer's zone addresses from
// the peer itself: from its Join, from its Status answers in the cluster
// view's listings, and, until every peer has answered once, from a
// learning loop that asks them (below).

const (
	// maxZoneAddrs bounds how many zones one store may advertise.
	maxZoneAddrs = 64
	// zoneLearnMinBackoff and zoneLearnMaxBackoff space out the learning
	// loop's rounds while some peer has not answered yet.
	zoneLearnMinBackoff = 100 * time.Millisecond
	zoneLearnMaxBackoff = 2 * time.Second
)

// checkZoneAddrs checks a store's zone addresses: a bounded number of
// non-empty zones, each with a HOST:PORT address.
func checkZoneAddrs(za map[string]string) error {
	if len(za) > maxZoneAddrs {
		return fmt.Errorf("%d zones, over the limit of %d", len(za), maxZoneAddrs)
	}
	for _, zone := range slices.Sorted(maps.Keys(za)) {
		addr := za[zone]
		switch {
		case zone == "":
			return fmt.Errorf("empty zone (address %q)", addr)
		case len(zone) > maxZoneLen:
			return fmt.Errorf("zone is %d bytes, over the %d byte limit", len(zone), maxZoneLen)
		case len(addr) > maxAddrLen:
			return fmt.Errorf("zone %s: address is %d bytes, over the %d byte limit", zone, len(addr), maxAddrLen)
		}
		if err := checkHostPort(addr); err != nil {
			return fmt.Errorf("zone %s: %w", zone, err)
		}
	}
	return nil
}

// checkHostPort checks that addr is HOST:PORT with a port in 1..65535.
func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("address %q is not HOST:PORT", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("address %q: port %q is not a number in 1..65535", addr, port)
	}
	return nil
}

// peerDialAddrs is the address book as this store dials it: every store
// at its address for this store's zone, or at its plain address.
func (s *Server) peerDialAddrs() map[uint64]string {
	out := make(map[uint64]string)
	for _, id := range s.book.ids() {
		if a, ok := s.book.dialAddr(id, s.cfg.Store.Zone); ok {
			out[id] = a
		}
	}
	return out
}

// updateDialAddr points the transport (raft messages and every
// store-to-store call) at store id's current dial address.
func (s *Server) updateDialAddr(id uint64) {
	if id == s.cfg.Store.StoreID {
		return
	}
	if a, ok := s.book.dialAddr(id, s.cfg.Store.Zone); ok {
		s.trans.SetAddr(id, a)
	}
}

// setZoneAddrs records stores' zone addresses (an empty map: the store
// advertises none) in the address book and redirects the transport where
// that changes this store's way to them. Entries for this store are
// ignored: its own come from its configuration only.
func (s *Server) setZoneAddrs(entries map[uint64]map[string]string) error {
	if _, ok := entries[s.cfg.Store.StoreID]; ok {
		entries = maps.Clone(entries)
		delete(entries, s.cfg.Store.StoreID)
	}
	if len(entries) == 0 {
		return nil
	}
	changed, err := s.book.updateZones(entries)
	if err != nil {
		return fmt.Errorf("store %d: record zone addresses of stores %v: %w", s.store.ID(), slices.Sorted(maps.Keys(entries)), err)
	}
	for _, id := range changed {
		za := s.book.zoneAddrs(id)
		s.logger.Info("store zone addresses set", "to_store", id, "zone_addrs", za)
		s.updateDialAddr(id)
	}
	if len(changed) > 0 {
		s.view.invalidate()
	}
	return nil
}

// heardFrom records what store id said of itself in a Status answer: its
// zone addresses. The cluster view calls it for every store that answered.
func (s *Server) heardFrom(id uint64, st *pb.StatusResponse) {
	if id == s.cfg.Store.StoreID {
		return
	}
	if err := s.setZoneAddrs(map[uint64]map[string]string{id: st.GetZoneAddresses()}); err != nil {
		s.logger.Warn("could not record a store's zone addresses", "to_store", id, "err", err)
		return
	}
	s.zones.heard(id)
}

// peerConnected is told of every new raft stream from a peer: the peer
// may have restarted with other zone addresses, so the learning loop asks
// it again.
func (s *Server) peerConnected(id uint64) {
	if id == 0 || id == s.cfg.Store.StoreID {
		return
	}
	if s.zones.forget(id) {
		s.zones.kick()
	}
}

// zoneLearner remembers which peers have answered this store's Status
// since it started (or since they last reconnected), so that the learning
// loop asks only the others.
type zoneLearner struct {
	wake chan struct{} // capacity 1: the book gained a store

	mu    sync.Mutex
	known map[uint64]bool
}

func (z *zoneLearner) init() {
	z.wake = make(chan struct{}, 1)
	z.known = make(map[uint64]bool)
}

func (z *zoneLearner) heard(id uint64) {
	z.mu.Lock()
	z.known[id] = true
	z.mu.Unlock()
}

// forget makes id unheard again; it reports whether it was heard.
func (z *zoneLearner) forget(id uint64) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	was := z.known[id]
	delete(z.known, id)
	return was
}

func (z *zoneLearner) unheard(ids []uint64, self uint64) []uint64 {
	z.mu.Lock()
	defer z.mu.Unlock()
	var out []uint64
	for _, id := range ids {
		if id != self && !z.known[id] {
			out = append(out, id)
		}
	}
	return out
}

func (z *zoneLearner) kick() {
	select {
	case z.wake <- struct{}{}:
	default:
	}
}

// startZoneLearning starts, for a store with a zone, the loop that asks
// every peer that has not answered since this store started for its
// Status, so that raft traffic goes through the peers' addresses for this
// zone from the first seconds on, whether or not anything lists the
// stores. Rounds repeat with backoff while some peer stays silent, and
// start again when the book gains a store. A store without a zone dials
// plain addresses only and needs none of this.
func (s *Server) startZoneLearning() {
	if s.cfg.Store.Zone == "" {
		return
	}
	s.background.Go(func() {
		backoff := zoneLearnMinBackoff
		for {
			pending := s.zones.unheard(s.book.ids(), s.cfg.Store.StoreID)
			var retry <-chan time.Time
			if len(pending) > 0 {
				s.askStatus(pending)
				if len(s.zones.unheard(pending, s.cfg.Store.StoreID)) > 0 {
					retry = time.After(backoff)
					backoff = min(2*backoff, zoneLearnMaxBackoff)
				}
			}
			if retry == nil {
				backoff = zoneLearnMinBackoff
			}
			select {
			case <-s.ctx.Done():
				return
			case <-s.zones.wake:
			case <-retry:
			}
		}
	})
}

// askStatus asks the given stores for their Status, in parallel, each
// within storeStatusTimeout, and records what they say of themselves.
func (s *Server) askStatus(ids []uint64) {
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			conn, err := s.trans.conn(id)
			if err != nil {
				return
			}
			ctx, cancel := context.WithTimeout(s.ctx, storeStatusTimeout)
			defer cancel()
			st, err := pb.NewAdminClient(conn).Status(ctx, &pb.StatusRequest{})
			if err != nil || st.GetStoreId() != id {
				return
			}
			s.heardFrom(id, st)
		})
	}
	wg.Wait()
}
