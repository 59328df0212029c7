package client

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/region"
)

// cachedRegion is a region as the client last learned it, with the store it
// believes holds the leader (0: unknown).
type cachedRegion struct {
	region.Region
	leaderStoreID uint64
}

// storeInfo is what the client knows of a store: where to dial it (see
// regionCache.dialAddrLocked) and its zone (for ReplicaClosest).
type storeInfo struct {
	id   uint64
	addr string
	zone string
	// zoneAddr is the store's advertised address for the client's zone,
	// "" if it advertises none (or the client has no zone).
	zoneAddr string
}

// regionCache maps keys to regions and region leaders, and store ids to
// addresses. It is filled lazily from stores' Admin service (through the
// loader funcs) and corrected by the region errors requests meet; its
// entries are hints, never trusted over what a store answers.
type regionCache struct {
	// loadByKey asks some store for the region holding key.
	loadByKey func(ctx context.Context, key []byte) ([]*kvpb.RegionInfo, error)
	// loadAll asks some store for every region it knows.
	loadAll func(ctx context.Context) ([]*kvpb.RegionInfo, error)
	// loadStores asks some store for the cluster's stores.
	loadStores func(ctx context.Context) ([]*kvpb.Store, error)

	// zone is the client's zone (Config.Zone), set before first use.
	zone string

	mu      sync.RWMutex
	tree    region.Tree
	leaders map[uint64]uint64 // region id -> leader store id; an entry exists for every region in tree
	stores  map[uint64]storeInfo
	// dialOverride maps a store id to the endpoint address the user gave
	// for it. The user's address wins over the one the store advertises,
	// because the user may reach stores through a proxy that the store
	// does not know about; only the store's own address for the client's
	// zone wins over it (see dialAddrLocked).
	dialOverride map[uint64]string
}

func newRegionCache() *regionCache {
	return &regionCache{
		leaders:      make(map[uint64]uint64),
		stores:       make(map[uint64]storeInfo),
		dialOverride: make(map[uint64]string),
	}
}

// ---- regions ------------------------------------------------------------

// locateKey returns the cached region holding key, loading it on a miss.
func (c *regionCache) locateKey(ctx context.Context, key []byte) (cachedRegion, error) {
	if r, ok := c.lookupKey(key); ok {
		return r, nil
	}
	infos, err := c.loadByKey(ctx, key)
	if err != nil {
		return cachedRegion{}, fmt.Errorf("load region for key %q: %w", key, err)
	}
	c.insertInfos(infos)
	if r, ok := c.lookupKey(key); ok {
		return r, nil
	}
	return cachedRegion{}, fmt.Errorf("load region for key %q: %w", key, errNoRegion)
}

// locateID returns the cached region with id, loading every region on a
// miss (ids are only looked up by admin operations, which are rare).
func (c *regionCache) locateID(ctx context.Context, id uint64) (cachedRegion, error) {
	if r, ok := c.lookupID(id); ok {
		return r, nil
	}
	infos, err := c.loadAll(ctx)
	if err != nil {
		return cachedRegion{}, fmt.Errorf("load region %d: %w", id, err)
	}
	c.insertInfos(infos)
	if r, ok := c.lookupID(id); ok {
		return r, nil
	}
	return cachedRegion{}, fmt.Errorf("region %d: %w", id, errNoRegion)
}

func (c *regionCache) lookupKey(key []byte) (cachedRegion, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.tree.Lookup(key)
	if !ok {
		return cachedRegion{}, false
	}
	return cachedRegion{Region: r, leaderStoreID: c.leaders[r.ID]}, true
}

func (c *regionCache) lookupID(id uint64) (cachedRegion, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.lookupIDRLocked(id)
}

func (c *regionCache) lookupIDRLocked(id uint64) (cachedRegion, bool) {
	if _, ok := c.leaders[id]; !ok {
		return cachedRegion{}, false
	}
	for _, r := range c.tree.All() {
		if r.ID == id {
			return cachedRegion{Region: r, leaderStoreID: c.leaders[id]}, true
		}
	}
	return cachedRegion{}, false
}

// all returns every cached region in key order.
func (c *regionCache) all() []cachedRegion {
	c.mu.RLock()
	defer c.mu.RUnlock()
	rs := c.tree.All()
	out := make([]cachedRegion, len(rs))
	for i, r := range rs {
		out[i] = cachedRegion{Region: r, leaderStoreID: c.leaders[r.ID]}
	}
	return out
}

// insertInfos caches regions answered by an Admin call.
func (c *regionCache) insertInfos(infos []*kvpb.RegionInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, info := range infos {
		if info.GetRegion() == nil {
			continue
		}
		leader := info.GetLeaderStoreId()
		if leader == 0 && info.GetLeader() != nil {
			leader = info.GetLeader().GetStoreId()
		}
		c.insertLocked(info.GetRegion().ToRegion(), leader)
	}
}

// insert caches r with its leader store (0: unknown).
func (c *regionCache) insert(r region.Region, leaderStoreID uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.insertLocked(r, leaderStoreID)
}

// insertLocked adds r unless the cache already holds newer metadata for any
// part of its range: an answer from a lagging replica must not undo a split
// the cache has already seen. Splits bump the version of both halves, so
// among overlapping regions the higher version is the newer one; for the
// same region, a higher conf version is newer too.
func (c *regionCache) insertLocked(r region.Region, leaderStoreID uint64) {
	if len(r.Peers) == 0 {
		return
	}
	if leaderStoreID != 0 {
		if _, ok := r.PeerOnStore(leaderStoreID); !ok {
			leaderStoreID = 0
		}
	}
	for _, old := range c.tree.All() {
		if !old.Overlaps(r) {
			continue
		}
		if old.Epoch.Version > r.Epoch.Version ||
			(old.ID == r.ID && old.Epoch.Version == r.Epoch.Version && old.Epoch.ConfVer > r.Epoch.ConfVer) {
			return
		}
		// Same metadata again: keep a known leader rather than forgetting it
		// because this answer did not know one.
		if old.ID == r.ID && old.Epoch == r.Epoch && leaderStoreID == 0 {
			leaderStoreID = c.leaders[old.ID]
		}
	}
	for _, removed := range c.tree.Insert(r) {
		delete(c.leaders, removed.ID)
	}
	c.leaders[r.ID] = leaderStoreID
}

// updateLeader records a NotLeader hint. It reports false if the hint does
// not fit the cached region (unknown region, or the store hosts no peer of
// it), which means the cached peers are stale.
func (c *regionCache) updateLeader(regionID, storeID uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.lookupIDRLocked(regionID)
	if !ok {
		return false
	}
	if _, ok := r.PeerOnStore(storeID); !ok {
		return false
	}
	c.leaders[regionID] = storeID
	return true
}

// switchLeaderFrom moves the region's presumed leader from failedStore to the
// next peer in order, so that a request whose leader did not answer (store
// down, or "not leader" with no hint during an election) tries the others in
// turn. It does nothing if another request already moved it.
func (c *regionCache) switchLeaderFrom(regionID, failedStore uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.lookupIDRLocked(regionID)
	if !ok || len(r.Peers) == 0 {
		return
	}
	cur := c.leaders[regionID]
	if cur != 0 && cur != failedStore {
		return
	}
	next := r.Peers[0].StoreID
	for i, p := range r.Peers {
		if p.StoreID == failedStore {
			next = r.Peers[(i+1)%len(r.Peers)].StoreID
			break
		}
	}
	c.leaders[regionID] = next
}

// drop forgets a region so that the next request reloads it.
func (c *regionCache) drop(regionID uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tree.Remove(regionID) {
		delete(c.leaders, regionID)
	}
}

// onEpochNotMatch replaces a stale region with the regions the store says
// now cover its range. With no current regions (the store knows nothing
// newer) the region is dropped and reloaded. The store that answered hosts
// the new regions and, for a write, was most likely their leader, so it is
// the leader guess unless the cache knew the region's leader already.
//
// It reports behind when the store's own copy of the region is older than
// the one the request carried (sent): the store has not applied a split or
// conf change yet that the cache learned from another store. Nothing is
// changed then; the caller backs off and asks the same store again, as
// TiKV's client does, since the store will catch up.
func (c *regionCache) onEpochNotMatch(sent cachedRegion, current []region.Region, answeredBy uint64) (behind bool) {
	staleID := sent.ID
	for _, r := range current {
		if r.ID == staleID && epochOlder(r.Epoch, sent.Epoch) {
			return true
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(current) == 0 {
		if c.tree.Remove(staleID) {
			delete(c.leaders, staleID)
		}
		return
	}
	oldLeader := c.leaders[staleID]
	for _, r := range current {
		leader := answeredBy
		if r.ID == staleID && oldLeader != 0 {
			leader = oldLeader
		}
		c.insertLocked(r, leader)
	}
	return false
}

// epochOlder reports whether epoch a is older than b: a lower version (a
// split not applied yet), or the same version and a lower conf version.
func epochOlder(a, b region.Epoch) bool {
	return a.Version < b.Version || (a.Version == b.Version && a.ConfVer < b.ConfVer)
}

// olderThanCached reports whether any region among infos is older than what
// the cache holds for its range (insertLocked would refuse it): an answer
// from a store that has not applied a split or conf change the cache has
// already seen elsewhere.
func (c *regionCache) olderThanCached(infos []*kvpb.RegionInfo) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, info := range infos {
		if info.GetRegion() == nil {
			continue
		}
		r := info.GetRegion().ToRegion()
		for _, old := range c.tree.All() {
			if old.Overlaps(r) && (old.Epoch.Version > r.Epoch.Version ||
				(old.ID == r.ID && old.Epoch.Version == r.Epoch.Version && old.Epoch.ConfVer > r.Epoch.ConfVer)) {
				return true
			}
		}
	}
	return false
}

// ---- stores -------------------------------------------------------------

// store returns what the cache knows of a store.
func (c *regionCache) store(id uint64) (storeInfo, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	s, ok := c.stores[id]
	return s, ok && s.addr != ""
}

// zoneOf returns a store's zone, "" if unknown.
func (c *regionCache) zoneOf(id uint64) string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.stores[id].zone
}

// zoneAddr picks, from a store's advertised addresses per zone, the one
// for the client's zone ("" if none).
func (c *regionCache) zoneAddr(zoneAddrs map[string]string) string {
	if c.zone == "" {
		return ""
	}
	return zoneAddrs[c.zone]
}

// dialAddrLocked is the rule for where the client dials store id: its
// address for the client's zone when it advertises one (so a client in
// zone Z reaches every store through zone Z's links of the simulated WAN,
// whatever endpoints it was started with); else the endpoint the user
// gave for that store; else the address the store advertises.
func (c *regionCache) dialAddrLocked(id uint64, zoneAddr, advertised string) string {
	if zoneAddr != "" {
		return zoneAddr
	}
	if o, ok := c.dialOverride[id]; ok {
		return o
	}
	return advertised
}

// setStores records the cluster's stores as a store reported them.
func (c *regionCache) setStores(stores []*kvpb.Store) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range stores {
		if s.GetId() == 0 {
			continue
		}
		za := c.zoneAddr(s.GetZoneAddresses())
		c.stores[s.GetId()] = storeInfo{
			id:       s.GetId(),
			addr:     c.dialAddrLocked(s.GetId(), za, s.GetAddress()),
			zone:     s.GetZone(),
			zoneAddr: za,
		}
	}
}

// setEndpoint records that the user-given endpoint addr is store id, which
// said (in its Status) that it sits in zone and has zoneAddrs.
func (c *regionCache) setEndpoint(id uint64, addr, zone string, zoneAddrs map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dialOverride[id] = addr
	s := c.stores[id]
	s.id = id
	s.zoneAddr = c.zoneAddr(zoneAddrs)
	s.addr = c.dialAddrLocked(id, s.zoneAddr, addr)
	if zone != "" {
		s.zone = zone
	}
	c.stores[id] = s
}

// adminAddr is where the client sends an admin call meant for the
// user-given endpoint ep: once ep is known to be a store that advertises
// an address for the client's zone, that address (endpoints only
// bootstrap); otherwise ep itself.
func (c *regionCache) adminAddr(ep string) string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for id, o := range c.dialOverride {
		if o == ep {
			if s := c.stores[id]; s.zoneAddr != "" {
				return s.zoneAddr
			}
		}
	}
	return ep
}

// storeAt returns the id of the store the client dials at addr, or that
// the user-given endpoint addr stands for.
func (c *regionCache) storeAt(addr string) (uint64, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for id, s := range c.stores {
		if s.addr == addr || s.zoneAddr == addr {
			return id, true
		}
	}
	for id, o := range c.dialOverride {
		if o == addr {
			return id, true
		}
	}
	return 0, false
}

// storeAddrs returns the dial address of every known store, sorted by id.
func (c *regionCache) storeAddrs() []storeInfo {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]storeInfo, 0, len(c.stores))
	for _, s := range c.stores {
		if s.addr != "" {
			out = append(out, s)
		}
	}
	sortStores(out)
	return out
}

// refreshStores reloads the store list; used when a region names a store
// the cache has never heard of (a store added after the client started).
func (c *regionCache) refreshStores(ctx context.Context) error {
	stores, err := c.loadStores(ctx)
	if err != nil {
		return fmt.Errorf("load stores: %w", err)
	}
	c.setStores(stores)
	return nil
}

func sortStores(s []storeInfo) {
	slices.SortFunc(s, func(a, b storeInfo) int { return cmp.Compare(a.id, b.id) })
}
