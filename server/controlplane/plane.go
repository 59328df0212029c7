// Package controlplane is a store's part in keeping the cluster together:
// the address book every store shares (addrbook.go), stores joining and
// being removed (membership.go), the cluster view the balancer and
// Admin.Stores see (cluster_view.go), and the addresses per zone a store
// dials its peers at in the simulated WAN (zoneaddrs.go).
//
// The gRPC services stay in package server, which owns a Plane and calls
// it from its handlers. The Plane reaches back only through the small
// seam its Deps name: the transport (a Transport: the connection raft
// uses to a store, and where to point it), this store's own Status, who
// leads its regions, and its listen address. It never imports server.
package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"google.golang.org/grpc"
)

// Transport is the store-to-store transport as the control plane uses it.
type Transport interface {
	// SetAddr points raft messages and every store-to-store call at addr
	// for store id.
	SetAddr(id uint64, addr string)
	// Conn is the transport's connection to store id.
	Conn(id uint64) (*grpc.ClientConn, error)
}

// Config is what the control plane is told of its store at Open.
type Config struct {
	StoreID uint64
	// Zone is this store's zone.
	Zone string
	// DataDir keeps the address book (peers.json); "" keeps it in memory.
	DataDir string
	// Peers are the addresses the operator configured (they win over the
	// book's for the stores they name).
	Peers map[uint64]string
	// Join, JoinTimeout: see server.Config.
	Join        []string
	JoinTimeout time.Duration
	// ZoneAddrs are this store's own addresses per zone.
	ZoneAddrs map[string]string
	// DialOptions dial another store at its plain address (Join, and
	// the calls that keep the address book); MaxRecvMsgSize bounds the
	// answers the latter read.
	DialOptions    []grpc.DialOption
	MaxRecvMsgSize int
	Logger         *slog.Logger
}

// Deps is what the control plane needs of the server once the transport
// and the store exist.
type Deps struct {
	Transport Transport
	// Local answers this store's own Status, as a summary (no regions).
	Local func() *kvpb.StatusResponse
	// Leaders is a digest of who leads each region this store hosts.
	Leaders func() string
	// MaxReplicas is how many voters the balancer keeps per region.
	MaxReplicas func() int
	// ListenAddr is the address the server listens at.
	ListenAddr func() string
	// Context ends when the server stops: it bounds background work.
	Context context.Context
}

// Plane is one store's control plane. Open it, then Attach it.
type Plane struct {
	cfg    Config
	logger *slog.Logger
	book   *addressBook
	view   *clusterView
	deps   Deps
	// zones tracks which peers have told this store their zone addresses
	// (see zoneaddrs.go); background waits for its learning loop.
	zones      zoneLearner
	background sync.WaitGroup
}

// Open opens the address book in cfg.DataDir (laying cfg.Peers over it)
// and records this store's own zone addresses in it, as its configuration
// says now: started without them, it stops advertising the ones it
// remembers.
func Open(cfg Config) (*Plane, error) {
	cfg.ZoneAddrs = maps.Clone(cfg.ZoneAddrs)
	book, err := openAddressBook(cfg.DataDir, cfg.Peers)
	if err != nil {
		return nil, err
	}
	if _, err := book.updateZones(map[uint64]map[string]string{cfg.StoreID: cfg.ZoneAddrs}); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	p := &Plane{cfg: cfg, logger: logger, book: book}
	p.zones.init()
	return p, nil
}

// Attach gives the plane what it needs of the server and builds the
// cluster view.
func (p *Plane) Attach(d Deps) {
	p.deps = d
	p.view = &clusterView{
		selfID:        p.cfg.StoreID,
		book:          p.book,
		trans:         d.Transport,
		local:         d.Local,
		learn:         p.LearnPeers,
		learnRemoving: p.learnRemoving,
		heard:         p.heardFrom,
		leaders:       d.Leaders,
		base:          d.Context,
		ttl:           clusterViewTTL,
		timeout:       StoreStatusTimeout,
		logger:        p.logger,
	}
}

// ClusterView is the raftstore.ClusterView the balancer uses.
func (p *Plane) ClusterView() raftstore.ClusterView { return p.view }

// Stores lists every store in the address book, as the cluster view last
// saw them (fresh: gathered anew), as a copy for an RPC answer.
func (p *Plane) Stores(ctx context.Context, fresh bool) ([]*kvpb.Store, error) {
	if fresh {
		p.view.invalidate()
	}
	stores, err := p.view.stores(ctx)
	if err != nil {
		return nil, err
	}
	return cloneStores(stores), nil
}

// NoteZone records a store's zone before it has answered.
func (p *Plane) NoteZone(id uint64, zone string) { p.view.noteZone(id, zone) }

// InvalidateView drops the cluster view's cached listing.
func (p *Plane) InvalidateView() { p.view.invalidate() }

// PeerConnected is told of every new raft stream from store id: the view
// drops a listing that has it down, and the learning loop asks it again
// for its zone addresses.
func (p *Plane) PeerConnected(id uint64) {
	p.peerConnected(id)
	p.view.peerUp(id)
}

// Address returns store id's (plain) address.
func (p *Plane) Address(id uint64) (string, bool) { return p.book.get(id) }

// Peers returns a copy of the address book.
func (p *Plane) Peers() map[uint64]string { return p.book.all() }

// Len is how many stores the address book names.
func (p *Plane) Len() int { return p.book.len() }

// IsRemoving reports whether store id is being removed.
func (p *Plane) IsRemoving(id uint64) bool { return p.book.isRemoving(id) }

// RemovingIDs lists the stores being removed.
func (p *Plane) RemovingIDs() []uint64 { return p.book.removingIDs() }

// AllZoneAddrs returns every store's addresses per zone.
func (p *Plane) AllZoneAddrs() map[uint64]map[string]string { return p.book.allZoneAddrs() }

// DialAddrs is the address book as this store dials it: every store at its
// address for this store's zone (see dialZone), or at its plain address.
func (p *Plane) DialAddrs() map[uint64]string {
	out := make(map[uint64]string)
	for _, id := range p.book.ids() {
		if a, ok := p.book.dialAddr(id, p.dialZone()); ok {
			out[id] = a
		}
	}
	return out
}

// AdvertiseAddr is the address other stores and clients reach this store
// at: the configured peer address if any (it may be a proxy's), else the
// listen address.
func (p *Plane) AdvertiseAddr() string {
	if a, ok := p.book.get(p.cfg.StoreID); ok {
		return a
	}
	return p.deps.ListenAddr()
}

// Wait waits for the plane's background work (the learning loop) to end,
// after Deps.Context has.
func (p *Plane) Wait() { p.background.Wait() }

// SetPeers records addresses in the address book (persisted) and the
// transport. With overwrite false, stores already known keep theirs.
func (p *Plane) SetPeers(entries map[uint64]string, overwrite bool) error {
	changed, err := p.book.update(entries, overwrite)
	if err != nil {
		return fmt.Errorf("store %d: record stores %v: %w", p.cfg.StoreID, slices.Sorted(maps.Keys(entries)), err)
	}
	for id := range changed {
		p.updateDialAddr(id)
	}
	if len(changed) > 0 {
		p.view.invalidate()
		// New stores: learn how to reach them from this store's zone.
		p.zones.kick()
	}
	return nil
}

// LearnPeers adds the stores another store's Status names and this one
// does not know: a store that missed a Join (down, or joined elsewhere at
// the same time) catches up this way.
func (p *Plane) LearnPeers(peers map[uint64]string) {
	delete(peers, p.cfg.StoreID)
	if err := p.SetPeers(peers, false); err != nil {
		p.logger.Warn("could not record stores learned from another store", "err", err)
	}
}
