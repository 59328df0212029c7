package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hedgekv/hedgekv/netsim"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/server"
	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// LocalConfig configures an in-process hedgekv cluster.
type LocalConfig struct {
	// Dir holds the stores' data; "" makes a temporary directory that Stop
	// removes.
	Dir string
	// Zones, one per store (default dc-a, dc-b, dc-c: three stores).
	Zones []string
	// NoSync skips fsync on the stores' bbolt commits.
	NoSync bool
	// Logger for the stores (nil: warnings and errors of slog.Default's
	// handler only, so the servers stay quiet during a benchmark).
	Logger *slog.Logger
	// ReadyTimeout bounds the wait for every region to have a leader
	// (default 30s).
	ReadyTimeout time.Duration

	// Topology, if set, runs the stores behind a simulated WAN (package
	// netsim, free ports): one store per store of the topology, in its
	// zone, each advertising the topology's address of every zone
	// (server.Config.ZoneAddrs), and each told its peers' addresses for
	// its own zone, so raft traffic and ReadIndex round trips cross the
	// WAN from the first message on. Zones is ignored. Clients reach the
	// stores through ZoneEndpoints.
	Topology *netsim.Topology
	// DisableBalancing pauses the balancer (raftstore BalanceInterval < 0)
	// so that leaders stay where a scenario puts them.
	DisableBalancing bool
	// DisableSplit turns automatic splits off: region 1 keeps every key.
	DisableSplit bool
	// StatusHTTP serves each store's status endpoint (/metrics, /status)
	// on a free port (see StatusAddr).
	StatusHTTP bool
	// AllowFaults lets clients inject faults into the stores (Admin
	// Fault; server.Config.AllowFaults).
	AllowFaults bool
	// StoreKnobs, if set, gives each store its testing knobs (tests only).
	StoreKnobs func(storeID uint64) raftstore.TestingKnobs
	// EtcdKnobs, if set, are every store's etcd API testing knobs (tests
	// only): their hooks must be safe to call from every store at once.
	EtcdKnobs *etcdapi.TestingKnobs
	// FollowerLeases turns follower read leases on in every store
	// (raftstore.Config.FollowerLeases, the server's --follower-leases):
	// all stores of a cluster must agree, so it is per cluster, and a
	// scenario comparing leases on and off starts one cluster for each.
	FollowerLeases bool
	// FollowerLeaseDuration, if > 0, is every store's longest follower
	// lease (raftstore.Config.FollowerLeaseDuration; default the leader
	// lease).
	FollowerLeaseDuration time.Duration
}

// Local is a hedgekv cluster of in-process servers on loopback ports.
type Local struct {
	// Endpoints are the stores' own listen addresses, in store id order
	// (behind a WAN they bypass it; see ZoneEndpoints).
	Endpoints []string
	ids       []uint64
	zones     []string
	servers   []*server.Server
	net       *netsim.Network
	dir       string
	ownDir    bool
	// clusterID is this cluster's own (see clusterToken).
	clusterID uint64
}

// clusterToken is a cluster token no other cluster started here has: the
// in-process clusters of one test run (and process clusters beside them)
// bind free ports that one stopped a moment ago, and their stores share
// IDs, regions and peer IDs; only the token tells them apart.
func clusterToken() string {
	return fmt.Sprintf("hedgekv-%016x", rand.Uint64())
}

// StartLocal starts one server per zone (per store of the
// topology, when cfg.Topology is set), stores 1..N bootstrapping region 1
// together, each listening on a free 127.0.0.1 port, and waits until every
// region has a leader. Behind a topology whose stores sit in several
// zones it also checks that the election's raft traffic crossed the WAN.
func StartLocal(ctx context.Context, cfg LocalConfig) (_ *Local, err error) {
	if len(cfg.Zones) == 0 {
		cfg.Zones = []string{"dc-a", "dc-b", "dc-c"}
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	logger := cfg.Logger
	if logger == nil {
		logger = MinLevel(nil, slog.LevelWarn)
	}
	c := &Local{dir: cfg.Dir, clusterID: server.ClusterIDOf(clusterToken())}
	if err := c.placeStores(cfg); err != nil {
		return nil, err
	}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "hedgekv-bench-cluster-*"); err != nil {
			return nil, fmt.Errorf("local cluster: %w", err)
		}
		c.ownDir = true
	}
	n := len(c.ids)
	lis := make([]net.Listener, 0, n)
	statusLis := make([]net.Listener, 0, n)
	closeUnused := func() {
		// Listeners not yet handed to a server are still ours.
		for _, l := range lis[len(c.servers):] {
			_ = l.Close()
		}
		for _, l := range statusLis[min(len(c.servers), len(statusLis)):] {
			_ = l.Close()
		}
	}
	defer func() {
		if err != nil {
			closeUnused()
			c.Stop()
		}
	}()

	// The listen ports come first: the WAN's proxies need them as
	// upstreams, and the stores need the proxies' addresses.
	upstream := make(map[uint64]string, n)
	for _, id := range c.ids {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("local cluster: listen: %w", err)
		}
		lis = append(lis, l)
		upstream[id] = l.Addr().String()
		c.Endpoints = append(c.Endpoints, l.Addr().String())
		if cfg.StatusHTTP {
			sl, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, fmt.Errorf("local cluster: listen: %w", err)
			}
			statusLis = append(statusLis, sl)
		}
	}
	if cfg.Topology != nil {
		if c.net, err = netsim.Start(cfg.Topology, upstream, netsim.Options{}); err != nil {
			return nil, fmt.Errorf("local cluster: %w", err)
		}
	}
	for i, id := range c.ids {
		scfg := c.serverConfig(cfg, i, logger, upstream)
		scfg.Listener = lis[i]
		if cfg.StatusHTTP {
			scfg.StatusListener = statusLis[i]
		}
		srv, err := server.New(scfg)
		if err != nil {
			return nil, fmt.Errorf("local cluster: store %d: %w", id, err)
		}
		c.servers = append(c.servers, srv)
	}
	for i, srv := range c.servers {
		if err := srv.Start(); err != nil {
			return nil, fmt.Errorf("local cluster: start store %d: %w", c.ids[i], err)
		}
	}
	if err := c.waitLeaders(ctx, cfg.ReadyTimeout); err != nil {
		return nil, err
	}
	if c.net != nil && len(slices.Compact(slices.Sorted(slices.Values(c.zones)))) > 1 && c.net.WANBytes() == 0 {
		return nil, errors.New("local cluster: regions elected leaders without a byte crossing the simulated WAN (stores dialled each other directly)")
	}
	return c, nil
}

// placeStores gives the cluster its stores and their zones: the
// topology's, or stores 1..N one per zone of cfg.Zones.
func (c *Local) placeStores(cfg LocalConfig) error {
	if cfg.Topology != nil {
		if err := cfg.Topology.Validate(); err != nil {
			return fmt.Errorf("local cluster: %w", err)
		}
		c.ids = cfg.Topology.Stores()
		for _, id := range c.ids {
			z, _ := cfg.Topology.ZoneOf(id)
			c.zones = append(c.zones, z)
		}
		if len(c.ids) == 0 {
			return errors.New("local cluster: the topology has no store")
		}
	} else {
		for i, z := range cfg.Zones {
			c.ids = append(c.ids, uint64(i+1))
			c.zones = append(c.zones, z)
		}
	}
	return nil
}

// serverConfig is the configuration of the i-th store (its listeners still
// to be set): its peers at upstream, or behind the WAN through the links
// from its zone.
func (c *Local) serverConfig(cfg LocalConfig, i int, logger *slog.Logger, upstream map[uint64]string) server.Config {
	id := c.ids[i]
	sc := raftstore.Config{
		StoreID:       id,
		Zone:          c.zones[i],
		DataDir:       filepath.Join(c.dir, fmt.Sprintf("store%d", id)),
		InitialStores: c.ids,
		ClusterID:     c.clusterID,
		NoSync:        cfg.NoSync,
		Logger:        logger,

		FollowerLeases:        cfg.FollowerLeases,
		FollowerLeaseDuration: cfg.FollowerLeaseDuration,
	}
	if cfg.StoreKnobs != nil {
		sc.Knobs = cfg.StoreKnobs(id)
	}
	if cfg.DisableBalancing {
		sc.BalanceInterval = -1
	}
	if cfg.DisableSplit {
		sc.SplitCheckInterval = -1
	}
	peers := make(map[uint64]string, len(c.ids))
	for _, p := range c.ids {
		peers[p] = upstream[p]
		if c.net != nil && p != id {
			peers[p] = c.net.Addr(c.zones[i], p)
		}
	}
	scfg := server.Config{Store: sc, Peers: peers, AllowFaults: cfg.AllowFaults, EtcdKnobs: cfg.EtcdKnobs}
	if c.net != nil {
		scfg.ZoneAddrs = c.net.ZoneAddrs(id)
	}
	return scfg
}

// Network is the simulated WAN the stores run behind, nil without one.
func (c *Local) Network() *netsim.Network { return c.net }

// StoreIDs are the stores' ids, ascending.
func (c *Local) StoreIDs() []uint64 { return slices.Clone(c.ids) }

// Zone is a store's zone, "" for an unknown store.
func (c *Local) Zone(store uint64) string {
	if i := slices.Index(c.ids, store); i >= 0 {
		return c.zones[i]
	}
	return ""
}

// Server is the server of a store, nil for an unknown store.
func (c *Local) Server(store uint64) *server.Server {
	if i := slices.Index(c.ids, store); i >= 0 && i < len(c.servers) {
		return c.servers[i]
	}
	return nil
}

// ZoneEndpoints are the addresses a client in zone dials to reach every
// store: through the WAN's links from that zone, or the stores' own
// addresses when there is no WAN (or the zone is not in it).
func (c *Local) ZoneEndpoints(zone string) []string {
	if c.net == nil || c.net.Topology().ZoneIndex(zone) == 0 {
		return slices.Clone(c.Endpoints)
	}
	out := make([]string, 0, len(c.ids))
	for _, id := range c.ids {
		out = append(out, c.net.Addr(zone, id))
	}
	return out
}

// StatusAddr is a store's status HTTP address ("" without StatusHTTP).
func (c *Local) StatusAddr(store uint64) string {
	if srv := c.Server(store); srv != nil {
		return srv.StatusAddr()
	}
	return ""
}

// Stats are every store's counters, by store id.
func (c *Local) Stats() map[uint64]raftstore.Stats {
	out := make(map[uint64]raftstore.Stats, len(c.servers))
	for i, srv := range c.servers {
		out[c.ids[i]] = srv.Store().Stats()
	}
	return out
}

// LeaderStore is the store whose peer of regionID believes it leads, 0 if
// none does (an election, or a transfer under way).
func (c *Local) LeaderStore(regionID uint64) uint64 {
	for i, srv := range c.servers {
		for _, r := range srv.Store().Regions() {
			if r.Region.ID == regionID && r.IsLeader && !r.Transferring {
				return c.ids[i]
			}
		}
	}
	return 0
}

// MoveLeader makes store the leader of regionID: it asks the current
// leader to transfer leadership, again until it has moved (a transfer can
// lose to an election) or ctx ends, then waits until every store knows the
// new leader. With the balancer paused (DisableBalancing) the leader then
// stays there unless the store fails.
func (c *Local) MoveLeader(ctx context.Context, regionID, store uint64) error {
	if c.Server(store) == nil {
		return fmt.Errorf("local cluster: no store %d", store)
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		cur := c.LeaderStore(regionID)
		if cur == store && c.everyoneKnowsLeader(regionID, store) {
			return nil
		}
		if cur != 0 && cur != store {
			tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = c.Server(cur).Store().TransferLeader(tctx, regionID, store)
			cancel()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("local cluster: move the leader of region %d to store %d (now on store %d): %w",
				regionID, store, c.LeaderStore(regionID), ctx.Err())
		case <-t.C:
		}
	}
}

func (c *Local) everyoneKnowsLeader(regionID, store uint64) bool {
	for _, srv := range c.servers {
		for _, r := range srv.Store().Regions() {
			if r.Region.ID == regionID && r.LeaderStoreID != store {
				return false
			}
		}
	}
	return true
}

func (c *Local) waitLeaders(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		ready := false
		for _, srv := range c.servers {
			regions := srv.Store().Regions()
			if len(regions) == 0 {
				ready = false
				break
			}
			ready = true
			for _, r := range regions {
				if r.LeaderStoreID == 0 {
					ready = false
				}
			}
			if !ready {
				break
			}
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("local cluster: regions without a leader after %v: %w", timeout, ctx.Err())
		case <-t.C:
		}
	}
}

// Stop stops every server and the WAN, and removes a temporary data
// directory.
func (c *Local) Stop() {
	var wg sync.WaitGroup
	for _, srv := range c.servers {
		wg.Go(srv.Stop)
	}
	wg.Wait()
	c.servers = nil
	if c.net != nil {
		_ = c.net.Close()
		c.net = nil
	}
	if c.ownDir && c.dir != "" {
		_ = os.RemoveAll(c.dir)
		c.dir = ""
	}
}
