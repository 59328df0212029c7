package client

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/region"
)

// adminTargets lists the addresses admin calls may go to: the user's
// endpoints first (the ones known to work first of all; each at its
// store's address for the client's zone once known, see
// regionCache.adminAddr), then every other store the client learned of.
func (c *Client) adminTargets() []string {
	c.mu.Lock()
	eps := append([]string(nil), c.endpoints...)
	c.mu.Unlock()
	out := make([]string, 0, len(eps))
	seen := make(map[string]bool, len(eps))
	for _, e := range eps {
		if a := c.cache.adminAddr(e); !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, s := range c.cache.storeAddrs() {
		if !seen[s.addr] {
			seen[s.addr] = true
			out = append(out, s.addr)
		}
	}
	return out
}

// finalError is an answer to an admin call that another store would give
// too (a refusal): adminCall ends with it instead of asking the next.
type finalError struct{ err error }

func (f finalError) Error() string { return f.err.Error() }
func (f finalError) Unwrap() error { return f.err }

// preferEndpoint moves the endpoint addr stands for (itself, or the one
// whose store is dialled at addr) to the front of the endpoint list.
func (c *Client) preferEndpoint(addr string) {
	c.mu.Lock()
	eps := append([]string(nil), c.endpoints...)
	c.mu.Unlock()
	ep := ""
	for _, e := range eps {
		if e == addr || c.cache.adminAddr(e) == addr {
			ep = e
			break
		}
	}
	if ep == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.endpoints, ep); i > 0 {
		c.endpoints = slices.Insert(slices.Delete(c.endpoints, i, i+1), 0, ep)
	}
}

// loadRegionByKey is the cache's loader for a key: a hedged call (see
// metadata.go). A store that hosts no region holding the key (NotFound:
// its replica was moved, or it has not applied a split yet), or answers
// with a region older than the cache already holds for that range (it has
// not applied a split or conf change another store told the client of),
// gave no answer: another store is asked at once, and when none knows the
// region, the error wraps errNoRegion so the request retries.
func (c *Client) loadRegionByKey(ctx context.Context, key []byte) ([]*kvpb.RegionInfo, error) {
	return adminCall(c, ctx, "regions by key", true, func(ctx context.Context, a kvpb.AdminClient) ([]*kvpb.RegionInfo, error) {
		resp, err := a.Regions(ctx, &kvpb.RegionsRequest{Key: key, ByKey: true})
		switch {
		case status.Code(err) == codes.NotFound:
			return nil, noAnswer{err}
		case err != nil:
			return nil, err
		case len(resp.GetRegions()) == 0:
			return nil, noAnswer{status.Error(codes.NotFound, "no region holding the key")}
		case c.cache.olderThanCached(resp.GetRegions()):
			// A store behind the cache (a split or conf change it has
			// not applied yet): its answer would be refused.
			return nil, noAnswer{status.Error(codes.NotFound, "answered a region older than the cached one")}
		}
		return resp.GetRegions(), nil
	})
}

// loadAllRegions is the cache's loader by region id. It merges every
// store's answer (see gatherRegions): one store only lists the regions it
// hosts, and after a replica was moved off it, the region asked for may
// not be among them.
func (c *Client) loadAllRegions(ctx context.Context) ([]*kvpb.RegionInfo, error) {
	return c.gatherRegions(ctx)
}

// loadStores is the cache's loader for the store list: a hedged call,
// answered from the stores' cached views.
func (c *Client) loadStores(ctx context.Context) ([]*kvpb.Store, error) {
	return c.storeList(ctx, false)
}

// storeList asks for the store list; fresh makes the answering store
// gather it anew instead of answering from its view, which may be up to a
// second old (a store that just restarted still listed down).
func (c *Client) storeList(ctx context.Context, fresh bool) ([]*kvpb.Store, error) {
	return adminCall(c, ctx, "stores", true, func(ctx context.Context, a kvpb.AdminClient) ([]*kvpb.Store, error) {
		resp, err := a.Stores(ctx, &kvpb.StoresRequest{Fresh: fresh})
		if err != nil {
			return nil, err
		}
		return resp.GetStores(), nil
	})
}

// StoreInfo is one store as the cluster view reports it.
type StoreInfo struct {
	ID      uint64
	Address string // the store's own (direct) gRPC address
	Zone    string
	// Up is false for a store that did not answer the reporting store's
	// last status poll (about a second old at most).
	Up          bool
	LeaderCount uint64
	RegionCount uint64
	// ZoneAddresses is the store's address per zone (zone -> HOST:PORT,
	// server --advertise-zone-addrs); nil when it advertises none.
	ZoneAddresses map[string]string
	// Removing: the store is being removed (Client.RemoveStore); its
	// replicas are moving to other stores. Removed: removing, and no
	// region has a replica on it any more: it may be stopped for good.
	Removing, Removed bool
}

// RegionInfo is one region as the stores that host it report it, merged
// (see Client.Regions).
type RegionInfo struct {
	Region region.Region
	// LeaderStoreID and LeaderPeerID name the leader; 0 when no store
	// reported one.
	LeaderStoreID uint64
	LeaderPeerID  uint64
	// Term is the raft term the leader was reported under; CommitIndex and
	// AppliedIndex are those of the replica whose metadata won the merge.
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	// SizeKnown is set when the region's leader has counted it since its
	// last split: ApproximateKeys keys and ApproximateBytes bytes of keys
	// and values, counted at most a split-check interval ago (10s by
	// default). RegionDigest counts exactly, at the cost of a full read.
	SizeKnown        bool
	ApproximateKeys  uint64
	ApproximateBytes uint64
}

// Voters returns the region's voting peers (learners left out).
func (r RegionInfo) Voters() []region.Peer { return r.Region.Voters() }

func storeInfoFromPB(s *kvpb.Store) StoreInfo {
	return StoreInfo{
		ID: s.GetId(), Address: s.GetAddress(), Zone: s.GetZone(), Up: s.GetUp(),
		LeaderCount: s.GetLeaderCount(), RegionCount: s.GetRegionCount(),
		ZoneAddresses: maps.Clone(s.GetZoneAddresses()),
		Removing:      s.GetRemoving(), Removed: s.GetRemoved(),
	}
}

func regionInfoFromPB(info *kvpb.RegionInfo) RegionInfo {
	return RegionInfo{
		Region:           info.GetRegion().ToRegion(),
		LeaderStoreID:    info.GetLeaderStoreId(),
		LeaderPeerID:     info.GetLeader().GetId(),
		Term:             info.GetTerm(),
		CommitIndex:      info.GetCommitIndex(),
		AppliedIndex:     info.GetAppliedIndex(),
		SizeKnown:        info.GetSizeKnown(),
		ApproximateKeys:  info.GetApproximateKeys(),
		ApproximateBytes: info.GetApproximateSize(),
	}
}

// Stores returns the cluster's stores, sorted by id, as the first store to
// answer reports them from its view (at most about a second old).
func (c *Client) Stores(ctx context.Context) ([]StoreInfo, error) {
	return c.stores(ctx, false)
}

// StoresFresh is Stores gathered anew by the answering store for this call:
// what an operator's listing wants (a store that just came back must not
// show as down), at the price of asking every store, and waiting up to the
// view's timeout for one that is cut off.
func (c *Client) StoresFresh(ctx context.Context) ([]StoreInfo, error) {
	return c.stores(ctx, true)
}

func (c *Client) stores(ctx context.Context, fresh bool) ([]StoreInfo, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	stores, err := c.storeList(ctx, fresh)
	if err != nil {
		return nil, err
	}
	c.cache.setStores(stores)
	out := make([]StoreInfo, 0, len(stores))
	for _, s := range stores {
		out = append(out, storeInfoFromPB(s))
	}
	slices.SortFunc(out, func(a, b StoreInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// Regions returns every region in key order, merged from all stores that
// answer: a store only knows the regions it hosts, and a follower may lag.
// For each region the newest epoch wins, and the leader is the one reported
// under the highest term, so one lagging or dead store does not distort the
// picture.
func (c *Client) Regions(ctx context.Context) ([]RegionInfo, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	merged, err := c.gatherRegions(ctx)
	if err != nil {
		return nil, err
	}
	c.cache.insertInfos(merged)
	out := make([]RegionInfo, 0, len(merged))
	for _, info := range merged {
		out = append(out, regionInfoFromPB(info))
	}
	return out, nil
}

// RegionsPage is Regions a page at a time: at most about limit regions in
// key order from the one holding start (the stores' pages are merged, and
// cut where the first of them ends), and next, the start of the next page
// (nil after the last). Each store reads only its page, so a listing of a
// cluster of many regions costs no store a scan of them all.
func (c *Client) RegionsPage(ctx context.Context, start []byte, limit int) (_ []RegionInfo, next []byte, _ error) {
	if limit <= 0 {
		return nil, nil, fmt.Errorf("regions page: limit %d, want at least 1", limit)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	merged, next, err := c.gatherRegionsPage(ctx, start, limit)
	if err != nil {
		return nil, nil, err
	}
	c.cache.insertInfos(merged)
	out := make([]RegionInfo, 0, len(merged))
	for _, info := range merged {
		out = append(out, regionInfoFromPB(info))
	}
	return out, next, nil
}

// gatherRegions asks every known store for its regions, in parallel, and
// merges the answers (see mergeRegionInfos). Once one store has answered,
// the others get gatherGrace (or twice what the first took, if longer):
// a store cut off or stalled does not hold the answer up for DialTimeout,
// and is asked last by the next metadata call.
func (c *Client) gatherRegions(ctx context.Context) ([]*kvpb.RegionInfo, error) {
	infos, _, err := c.gatherRegionsPage(ctx, nil, 0)
	return infos, err
}

// gatherRegionsPage is gatherRegions for a page: every store is asked for
// at most limit regions from start (0: all). A store that had more ends
// its page at its last region's end key; the merged page ends at the
// first such end (next; nil when no store had more), since past it the
// stores that stopped earlier said nothing.
func (c *Client) gatherRegionsPage(ctx context.Context, start []byte, limit int) (_ []*kvpb.RegionInfo, next []byte, _ error) {
	if len(c.cache.storeAddrs()) == 0 {
		if err := c.cache.refreshStores(ctx); err != nil {
			c.log.Debug("refresh stores", "err", err)
		}
	}
	targets := c.adminTargets()
	if len(targets) == 0 {
		return nil, nil, fmt.Errorf("regions: %w", errNoStore)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		addr  string
		infos []*kvpb.RegionInfo
		more  bool
		err   error
	}
	ch := make(chan answer, len(targets))
	pending := make(map[string]bool, len(targets))
	// optional are the targets in their back-off (a store that failed
	// lately, an endpoint silent when the client started): asked too, but
	// not waited for once the answers had cover every key, since then they
	// could only add a fresher view of regions the others reported.
	optional := make(map[string]bool)
	for _, addr := range targets {
		if c.avoided(addr) {
			optional[addr] = true
		}
	}
	if len(optional) == len(targets) {
		clear(optional)
	}
	begin := time.Now()
	for _, addr := range targets {
		stub, err := c.conns.admin(addr)
		if err != nil {
			return nil, nil, fmt.Errorf("regions: %w", err)
		}
		pending[addr] = true
		st := c.meta.get(addr)
		go func() {
			actx, acancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
			defer acancel()
			done := st.start()
			resp, err := stub.Regions(actx, &kvpb.RegionsRequest{StartKey: start, Limit: uint32(limit)})
			done(err == nil, nil)
			ch <- answer{addr, resp.GetRegions(), resp.GetMore(), err}
		}()
	}
	var (
		answers [][]*kvpb.RegionInfo
		errs    []error
		grace   <-chan time.Time
	)
collect:
	for len(pending) > 0 {
		select {
		case a := <-ch:
			delete(pending, a.addr)
			if a.err != nil {
				if isUnreachable(ctx, a.err) {
					c.markUnreachable(a.addr)
				}
				errs = append(errs, &storeError{addr: a.addr, err: a.err})
			} else {
				answers = append(answers, a.infos)
				if n := len(a.infos); a.more && n > 0 {
					if end := a.infos[n-1].GetRegion().GetEndKey(); next == nil || bytes.Compare(end, next) < 0 {
						next = end
					}
				}
				if grace == nil {
					grace = time.After(max(gatherGrace, 2*time.Since(begin)))
				}
			}
			if len(pending) > 0 && limit == 0 && onlyOptional(pending, optional) && coverEveryKey(answers) {
				for addr := range pending {
					errs = append(errs, &storeError{addr: addr, err: errors.New("in its back-off, not waited for")})
				}
				break collect
			}
		case <-grace:
			for addr := range pending {
				c.meta.get(addr).markFailure()
				errs = append(errs, &storeError{addr: addr, err: errors.New("no answer within the grace after the first")})
			}
			break collect
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
			break collect
		}
	}
	if len(answers) == 0 {
		return nil, nil, fmt.Errorf("regions: no store answered: %w", errors.Join(errs...))
	}
	if len(errs) > 0 {
		c.log.Debug("regions merged without some stores", "answered", len(answers), "err", errors.Join(errs...))
	}
	merged := mergeRegionInfos(answers)
	if next != nil {
		merged = slices.DeleteFunc(merged, func(info *kvpb.RegionInfo) bool {
			return bytes.Compare(info.GetRegion().GetStartKey(), next) >= 0
		})
	}
	return merged, next, nil
}

// onlyOptional reports whether every pending target is optional.
func onlyOptional(pending, optional map[string]bool) bool {
	for addr := range pending {
		if !optional[addr] {
			return false
		}
	}
	return true
}

// coverEveryKey reports whether the regions in the answers leave no key
// out, from the empty key to the end of the key space.
func coverEveryKey(answers [][]*kvpb.RegionInfo) bool {
	var rs []*kvpb.Region
	for _, infos := range answers {
		for _, info := range infos {
			if r := info.GetRegion(); r != nil {
				rs = append(rs, r)
			}
		}
	}
	slices.SortFunc(rs, func(a, b *kvpb.Region) int { return bytes.Compare(a.GetStartKey(), b.GetStartKey()) })
	var covered []byte // every key below it is in some region
	for _, r := range rs {
		if bytes.Compare(r.GetStartKey(), covered) > 0 {
			return false // a gap before r
		}
		end := r.GetEndKey()
		if len(end) == 0 {
			return true
		}
		if bytes.Compare(end, covered) > 0 {
			covered = end
		}
	}
	return false
}

// mergeRegionInfos combines several stores' views of the regions; see
// Regions.
func mergeRegionInfos(answers [][]*kvpb.RegionInfo) []*kvpb.RegionInfo {
	byID := make(map[uint64]*kvpb.RegionInfo)
	leaderTerm := make(map[uint64]uint64)
	leaderOf := make(map[uint64]*kvpb.RegionInfo)
	sizeOf := make(map[uint64]*kvpb.RegionInfo) // the counted size reported under the highest term
	for _, infos := range answers {
		for _, info := range infos {
			r := info.GetRegion()
			if r == nil {
				continue
			}
			id := r.GetId()
			if cur, ok := byID[id]; !ok || newerEpoch(r.GetEpoch(), cur.GetRegion().GetEpoch()) {
				byID[id] = info
			}
			if info.GetLeaderStoreId() != 0 && (leaderOf[id] == nil || info.GetTerm() > leaderTerm[id]) {
				leaderOf[id], leaderTerm[id] = info, info.GetTerm()
			}
			if info.GetSizeKnown() && (sizeOf[id] == nil || info.GetTerm() > sizeOf[id].GetTerm()) {
				sizeOf[id] = info
			}
		}
	}
	out := make([]*kvpb.RegionInfo, 0, len(byID))
	for id, info := range byID {
		m := &kvpb.RegionInfo{
			Region:        info.GetRegion(),
			LeaderStoreId: info.GetLeaderStoreId(),
			Leader:        info.GetLeader(),
			Term:          info.GetTerm(),
			CommitIndex:   info.GetCommitIndex(),
			AppliedIndex:  info.GetAppliedIndex(),
		}
		if l := leaderOf[id]; l != nil && hostsStore(info.GetRegion(), l.GetLeaderStoreId()) {
			m.LeaderStoreId, m.Leader, m.Term = l.GetLeaderStoreId(), l.GetLeader(), l.GetTerm()
		}
		// A count made before the region's last split describes other
		// bounds: it is kept only for the winning epoch's version.
		if sz := sizeOf[id]; sz != nil && sz.GetRegion().GetEpoch().GetVersion() == info.GetRegion().GetEpoch().GetVersion() {
			m.SizeKnown, m.ApproximateKeys, m.ApproximateSize = true, sz.GetApproximateKeys(), sz.GetApproximateSize()
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *kvpb.RegionInfo) int {
		return bytes.Compare(a.GetRegion().GetStartKey(), b.GetRegion().GetStartKey())
	})
	return out
}

func newerEpoch(a, b *kvpb.Epoch) bool {
	if a.GetVersion() != b.GetVersion() {
		return a.GetVersion() > b.GetVersion()
	}
	return a.GetConfVer() > b.GetConfVer()
}

func hostsStore(r *kvpb.Region, storeID uint64) bool {
	for _, p := range r.GetPeers() {
		if p.GetStoreId() == storeID {
			return true
		}
	}
	return false
}

// TransferLeader asks the region's leader to hand leadership to the peer on
// toStoreID. It is routed like a write, so a stale leader in the cache is
// corrected by NotLeader answers on the way.
func (c *Client) TransferLeader(ctx context.Context, regionID, toStoreID uint64) error {
	if regionID == 0 || toStoreID == 0 {
		return fmt.Errorf("transfer leader: region and store ids must be non-zero")
	}
	_, err := c.send(ctx, &regionRequest{
		op:       fmt.Sprintf("transfer leader of region %d to store %d", regionID, toStoreID),
		byID:     true,
		regionID: regionID,
		write:    true,
		rpc: func(ctx context.Context, cc grpc.ClientConnInterface, _ *attempt) (*kvpb.Load, error) {
			_, err := kvpb.NewAdminClient(cc).TransferLeader(ctx, &kvpb.TransferLeaderRequest{RegionId: regionID, ToStoreId: toStoreID})
			return nil, err
		},
	})
	return err
}

// Split splits the region holding key at key, on that region's leader,
// and returns the two halves: left keeps the region's id and ends at key,
// right is a new region starting at key. Routed like a write, it follows
// NotLeader hints within ctx's deadline. Splitting at a key that already
// starts a region fails with InvalidArgument, unless an earlier attempt
// of this call was sent: that attempt may have split the region before
// its answer was lost (its leader stepped down, it timed out), so the
// key being a boundary now is this call's success, and the halves are
// looked up.
func (c *Client) Split(ctx context.Context, key []byte) (left, right region.Region, err error) {
	if len(key) == 0 {
		return left, right, fmt.Errorf("split: %w", errEmptyKey)
	}
	var (
		resp     *kvpb.SplitResponse
		sent     atomic.Bool // an attempt reached a store
		boundary atomic.Bool // a retry found the key already a boundary
	)
	res, err := c.send(ctx, &regionRequest{
		op:    fmt.Sprintf("split at %q", key),
		key:   key,
		write: true,
		rpc: func(ctx context.Context, cc grpc.ClientConnInterface, _ *attempt) (*kvpb.Load, error) {
			again := sent.Swap(true)
			r, err := kvpb.NewAdminClient(cc).Split(ctx, &kvpb.SplitRequest{Key: key})
			switch {
			case err == nil:
				resp = r
			case again && isBoundaryRefusal(err):
				boundary.Store(true)
				return nil, nil
			}
			return nil, err
		},
	})
	if err != nil {
		return left, right, err
	}
	if boundary.Load() {
		return c.halvesAt(ctx, key)
	}
	left, right = resp.GetLeft().ToRegion(), resp.GetRight().ToRegion()
	// The store that split leads the left half and (campaigning at once)
	// most likely the right one; the cache corrects itself if not.
	var leader uint64
	if res.final != nil {
		leader = res.final.storeID
	}
	c.cache.insert(left, leader)
	c.cache.insert(right, leader)
	return left, right, nil
}

// Merge merges regionID with its right neighbour, on regionID's leader
// (any store with replicas of both could coordinate it; the leader is
// one), and returns the merged region: regionID over both ranges. Regions
// whose replicas are not on the same stores are refused with
// InvalidArgument. The cache forgets the absorbed region.
func (c *Client) Merge(ctx context.Context, regionID uint64) (region.Region, error) {
	if regionID == 0 {
		return region.Region{}, errors.New("merge: region id must be non-zero")
	}
	var resp *kvpb.MergeResponse
	res, err := c.send(ctx, &regionRequest{
		op:       fmt.Sprintf("merge region %d with its right neighbour", regionID),
		byID:     true,
		regionID: regionID,
		write:    true,
		rpc: func(ctx context.Context, cc grpc.ClientConnInterface, _ *attempt) (*kvpb.Load, error) {
			r, err := kvpb.NewAdminClient(cc).Merge(ctx, &kvpb.MergeRequest{RegionId: regionID})
			if err == nil {
				resp = r
			}
			return nil, err
		},
	})
	if err != nil {
		return region.Region{}, err
	}
	merged := resp.GetMerged().ToRegion()
	var leader uint64
	if res.final != nil {
		leader = res.final.storeID
	}
	c.cache.insert(merged, leader) // replaces both halves' entries
	return merged, nil
}

// splitBoundaryRefusal is what a store's refusal of a split at a key that
// already starts a region says (raftstore's Split).
const splitBoundaryRefusal = "is already a region boundary"

// isBoundaryRefusal reports whether err is a store's refusal of a split
// at a key that already starts a region.
func isBoundaryRefusal(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.InvalidArgument && strings.Contains(st.Message(), splitBoundaryRefusal)
}

// halvesAt returns the regions either side of key, a region boundary, as
// the stores list them now, and puts them in the cache.
func (c *Client) halvesAt(ctx context.Context, key []byte) (left, right region.Region, err error) {
	regions, err := c.gatherRegions(ctx)
	if err != nil {
		return left, right, fmt.Errorf("split at %q: applied; look up its halves: %w", key, err)
	}
	var halves [2]*kvpb.RegionInfo
	for _, ri := range regions {
		switch r := ri.GetRegion(); {
		case r == nil:
		case bytes.Equal(r.GetEndKey(), key):
			halves[0] = ri
		case bytes.Equal(r.GetStartKey(), key):
			halves[1] = ri
		}
	}
	if halves[0] == nil || halves[1] == nil {
		return left, right, fmt.Errorf("split at %q: applied, but the stores list no regions either side of it", key)
	}
	c.cache.insertInfos(halves[:])
	return halves[0].GetRegion().ToRegion(), halves[1].GetRegion().ToRegion(), nil
}

// AddPeer adds a replica of regionID on storeID: the region's leader adds
// it as a learner, waits until it has caught up, then makes it a voter.
// The store must have joined the cluster. It may take as long as a
// snapshot of the region takes to send, bounded by ctx.
func (c *Client) AddPeer(ctx context.Context, regionID, storeID uint64) error {
	if regionID == 0 || storeID == 0 {
		return errors.New("add peer: region and store ids must be non-zero")
	}
	_, err := c.send(ctx, &regionRequest{
		op:          fmt.Sprintf("add peer of region %d on store %d", regionID, storeID),
		byID:        true,
		regionID:    regionID,
		write:       true,
		longRunning: true,
		rpc: func(ctx context.Context, cc grpc.ClientConnInterface, _ *attempt) (*kvpb.Load, error) {
			_, err := kvpb.NewAdminClient(cc).AddPeer(ctx, &kvpb.AddPeerRequest{RegionId: regionID, StoreId: storeID})
			return nil, err
		},
	})
	// The region's peers changed (or may have): reload it on next use.
	c.cache.drop(regionID)
	return err
}

// RemoveStore starts removing store storeID from the cluster: the stores'
// balancers move its replicas and leaderships to the other stores and put
// none on it. It returns at once; Stores reports the store Removed when
// nothing is left on it, and it may then be stopped and its data deleted.
// The id is not reused. already is true when the store was being removed
// before. It fails with FailedPrecondition when too few stores would be
// left up for a full replica set of each region.
func (c *Client) RemoveStore(ctx context.Context, storeID uint64) (already bool, err error) {
	if storeID == 0 {
		return false, errors.New("remove store: store id must be non-zero")
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	// Not hedged: the first store to get it marks the store removing, and
	// a hedge landing after it would answer "already".
	resp, err := adminCall(c, ctx, fmt.Sprintf("remove store %d", storeID), false, func(ctx context.Context, a kvpb.AdminClient) (*kvpb.RemoveStoreResponse, error) {
		resp, err := a.RemoveStore(ctx, &kvpb.RemoveStoreRequest{StoreId: storeID})
		switch status.Code(err) {
		case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated:
			return nil, finalError{err}
		}
		return resp, err
	})
	if err != nil {
		return false, err
	}
	return resp.GetAlready(), nil
}

// RemovePeer removes the replica of regionID on storeID. If that replica
// is the leader's, the leader first hands leadership to another voter and
// the request follows it there. Removing a replica the region does not
// have succeeds.
func (c *Client) RemovePeer(ctx context.Context, regionID, storeID uint64) error {
	if regionID == 0 || storeID == 0 {
		return errors.New("remove peer: region and store ids must be non-zero")
	}
	_, err := c.send(ctx, &regionRequest{
		op:       fmt.Sprintf("remove peer of region %d on store %d", regionID, storeID),
		byID:     true,
		regionID: regionID,
		write:    true,
		rpc: func(ctx context.Context, cc grpc.ClientConnInterface, _ *attempt) (*kvpb.Load, error) {
			_, err := kvpb.NewAdminClient(cc).RemovePeer(ctx, &kvpb.RemovePeerRequest{RegionId: regionID, StoreId: storeID})
			return nil, err
		},
	})
	c.cache.drop(regionID)
	return err
}
