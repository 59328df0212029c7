package controlplane

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"google.golang.org/grpc"
)

// Addresses per zone. In the simulated WAN every (zone, store) link has a
// proxy of its own: to reach store S from zone Z one dials the proxy
// A(Z, S). Each store is told its own A(Z, S) for every zone
// (Config.ZoneAddrs, the --advertise-zone-addrs flag), advertises them in
// its Status, its Join and the Stores listing, and every store keeps the
// others' in its address book (and in <data-dir>/peers.json).
//
// Which address a store dials a peer at (dialZone, dialAddr):
//
//   - A store with zone addresses of its own is in the simulated WAN. In
//     zone Z it dials each peer, for raft messages and the cluster view's
//     Status calls, at the peer's address for Z when the peer advertises
//     one, else at its plain address; so raft traffic and follower reads'
//     ReadIndex round trips cross the simulated WAN as client traffic
//     does, and a partition (which cuts proxies only) cuts them. A zone
//     address that fails is never replaced by the plain address.
//   - A store without zone addresses is not in a simulated WAN: it dials
//     every peer at its plain address, whatever the peers advertise. It
//     still records what they advertise (the book, peers.json), since it
//     passes that on in its Join answers and its listing of stores that
//     are down; it just never dials it. So data last run behind a netsim
//     restarts without one.
//
// A store learns its peers' zone addresses from the peers themselves, and
// always at their plain addresses, which stay directly reachable by
// design: a store restarted behind a netsim on other ports (its peers'
// remembered proxies dead) learns the new ones at once. The learning loop
// below asks every peer that has not answered since this store started,
// since the peer's raft stream last (re)connected, or since the cluster
// view last failed to reach it at its zone address. The cluster view's own
// Status calls (whose answers are recorded too) keep to the zone address:
// they tell whether the peer is reachable the way raft reaches it, which
// the balancer and the hibernation wake-up act on. A Join's id check and
// its forwarding to the other stores also go to plain addresses: they keep
// the address book, as learning does. See also client/doc.go for clients.

const (
	// maxZoneAddrs bounds how many zones one store may advertise.
	maxZoneAddrs = 64
	// zoneLearnMinBackoff and zoneLearnMaxBackoff space out the learning
	// loop's rounds while some peer has not answered yet.
	zoneLearnMinBackoff = 100 * time.Millisecond
	zoneLearnMaxBackoff = 2 * time.Second
)

// CheckZoneAddrs checks a store's zone addresses: a bounded number of
// non-empty zones, each with a HOST:PORT address.
func CheckZoneAddrs(za map[string]string) error {
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

// dialZone is the zone whose addresses this store dials its peers at:
// its own zone if it is in the simulated WAN (it has zone addresses of its
// own), else "" (plain addresses only).
func (p *Plane) dialZone() string {
	if len(p.cfg.ZoneAddrs) == 0 {
		return ""
	}
	return p.cfg.Zone
}

// updateDialAddr points the transport (raft messages and every
// store-to-store call) at store id's current dial address.
func (p *Plane) updateDialAddr(id uint64) {
	if id == p.cfg.StoreID {
		return
	}
	if a, ok := p.book.dialAddr(id, p.dialZone()); ok {
		p.deps.Transport.SetAddr(id, a)
	}
}

// setZoneAddrs records stores' zone addresses (an empty map: the store
// advertises none) in the address book and redirects the transport where
// that changes this store's way to them. Entries for this store are
// ignored: its own come from its configuration only.
func (p *Plane) setZoneAddrs(entries map[uint64]map[string]string) error {
	if _, ok := entries[p.cfg.StoreID]; ok {
		entries = maps.Clone(entries)
		delete(entries, p.cfg.StoreID)
	}
	if len(entries) == 0 {
		return nil
	}
	changed, err := p.book.updateZones(entries)
	if err != nil {
		return fmt.Errorf("store %d: record zone addresses of stores %v: %w", p.cfg.StoreID, slices.Sorted(maps.Keys(entries)), err)
	}
	for _, id := range changed {
		za := p.book.zoneAddrs(id)
		p.logger.Info("store zone addresses set", "to_store", id, "zone_addrs", za)
		p.updateDialAddr(id)
	}
	if len(changed) > 0 {
		p.view.invalidate()
	}
	return nil
}

// heardFrom records what store id said of itself in a Status answer: its
// zone addresses. The cluster view calls it for every other store it
// asked, with st nil for one that did not answer (at this store's way to
// it): if that store had answered before, the learning loop asks it again
// at its plain address, in case it moved to other zone addresses.
func (p *Plane) heardFrom(id uint64, st *kvpb.StatusResponse) {
	if id == p.cfg.StoreID {
		return
	}
	if st == nil {
		if p.dialZone() != "" && p.zones.forget(id) {
			p.zones.kick()
		}
		return
	}
	if err := p.setZoneAddrs(map[uint64]map[string]string{id: st.GetZoneAddresses()}); err != nil {
		p.logger.Warn("could not record a store's zone addresses", "to_store", id, "err", err)
		return
	}
	p.zones.heard(id)
}

// peerConnected is told of every new raft stream from a peer: the peer
// may have restarted with other zone addresses, so the learning loop asks
// it again.
func (p *Plane) peerConnected(id uint64) {
	if id == 0 || id == p.cfg.StoreID {
		return
	}
	if p.zones.forget(id) {
		p.zones.kick()
	}
}

// zoneLearner remembers which peers have answered this store's Status
// since it started, or since they were last forgotten (their raft stream
// reconnected, or the cluster view could not reach them), so that the
// learning loop asks only the others.
type zoneLearner struct {
	wake chan struct{} // capacity 1: the book gained a store, or a peer was forgotten

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

// StartZoneLearning starts, for a store in the simulated WAN (see
// dialZone), the loop that asks every peer that has not answered since
// this store started (or since it was last forgotten, see zoneLearner) for
// its Status at its plain address, so that raft traffic goes through the
// peers' current addresses for this zone from the first seconds on,
// whether or not anything lists the stores and whatever zone addresses the
// book remembered. Rounds repeat with backoff while some peer stays
// silent, and start again when the book gains a store or a peer is
// forgotten. A store outside the WAN dials plain addresses only and needs
// none of this.
func (p *Plane) StartZoneLearning() {
	if p.dialZone() == "" {
		return
	}
	p.background.Go(func() {
		backoff := zoneLearnMinBackoff
		for {
			pending := p.zones.unheard(p.book.ids(), p.cfg.StoreID)
			var retry <-chan time.Time
			if len(pending) > 0 {
				p.askStatus(pending)
				if len(p.zones.unheard(pending, p.cfg.StoreID)) > 0 {
					retry = time.After(backoff)
					backoff = min(2*backoff, zoneLearnMaxBackoff)
				}
			}
			if retry == nil {
				backoff = zoneLearnMinBackoff
			}
			select {
			case <-p.deps.Context.Done():
				return
			case <-p.zones.wake:
			case <-retry:
			}
		}
	})
}

// askStatus asks the given stores for their Status at their plain
// addresses, in parallel, each within StoreStatusTimeout, and records what
// they say of themselves, and the stores they name that this one does not
// know.
func (p *Plane) askStatus(ids []uint64) {
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			var st *kvpb.StatusResponse
			err := p.callDirect(p.deps.Context, id, StoreStatusTimeout, func(ctx context.Context, a kvpb.AdminClient) error {
				var err error
				st, err = a.Status(ctx, &kvpb.StatusRequest{Summary: true})
				return err
			})
			if err != nil || st.GetStoreId() != id {
				if err != nil && p.deps.Context.Err() == nil {
					p.logger.Debug("could not ask a store for its zone addresses", "to_store", id, "err", err)
				}
				return
			}
			p.heardFrom(id, st)
			if peers := st.GetPeers(); len(peers) > 0 {
				p.LearnPeers(peers)
			}
		})
	}
	wg.Wait()
}

// callDirect makes one Admin call to store id at its plain address (not
// its address for this store's zone), over a connection of its own, within
// timeout. For keeping the address book (learning zone addresses,
// forwarding and checking joins): the plain address stays reachable when
// the zone addresses this store remembers are stale, so these calls never
// depend on them. Raft traffic never takes this way.
func (p *Plane) callDirect(ctx context.Context, id uint64, timeout time.Duration, call func(context.Context, kvpb.AdminClient) error) error {
	addr, ok := p.book.get(id)
	if !ok || addr == "" {
		return fmt.Errorf("store %d: no address known", id)
	}
	conn, err := grpc.NewClient(addr, append(slices.Clone(p.cfg.DialOptions),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(p.cfg.MaxRecvMsgSize)),
	)...)
	if err != nil {
		return fmt.Errorf("dial store %d at %s: %w", id, addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return call(ctx, kvpb.NewAdminClient(conn))
}
