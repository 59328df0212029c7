package raftstore

import (
	"context"
	"sort"
	"time"

	"github.com/hedgekv/hedgekv/region"
)

// The balancer. There is no placement driver: every store balances the
// regions it leads, using the ClusterView for everyone's counts, and does
// at most one thing per round so that stores acting at once converge
// instead of overshooting. In order of urgency:
//
//  1. repair: a voter on a store down longer than MaxStoreDownTime, or on
//     a store being removed, is moved to a live store without a replica
//     (a leader on a store being removed first hands its leadership to
//     another voter); a region short of MaxReplicas voters gains one; a
//     region with too many loses one.
//  2. replicas: a region moves its replica from the most loaded of its
//     stores to the least loaded store without one, when the two differ by
//     two or more regions (a new store fills up this way).
//  3. leaders: a leader hands one region to a voter's store that leads two
//     or more fewer regions than this one.

func (c *Config) balanceDefaults() {
	if c.BalanceInterval == 0 {
		c.BalanceInterval = 5 * time.Second
	}
	if c.MaxStoreDownTime <= 0 {
		c.MaxStoreDownTime = 30 * time.Second
	}
	if c.MaxReplicas <= 0 {
		c.MaxReplicas = 3
	}
}

func (s *Store) balanceLoop() {
	t := time.NewTicker(s.cfg.BalanceInterval)
	defer t.Stop()
	downSince := map[uint64]time.Time{}
	for {
		select {
		case <-s.stopc:
			return
		case <-t.C:
		}
		if s.view == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*s.cfg.BalanceInterval+10*time.Second)
		stores := s.view.Stores(ctx)
		now := time.Now()
		for _, st := range stores {
			if st.Up {
				delete(downSince, st.ID)
			} else if _, ok := downSince[st.ID]; !ok {
				downSince[st.ID] = now
			}
		}
		if err := s.balanceOnce(ctx, stores, downSince, now); err != nil {
			s.log.Debug("balance step failed", "err", err)
		}
		cancel()
	}
}

// balanceOnce does at most one balancing step: the first of the three
// decisions (repair, replica spread, leader spread) that finds something
// to do, carried out.
func (s *Store) balanceOnce(ctx context.Context, stores []StoreInfo, downSince map[uint64]time.Time, now time.Time) error {
	in := balanceInput{
		self:        s.cfg.StoreID,
		stores:      stores,
		info:        make(map[uint64]StoreInfo, len(stores)),
		maxReplicas: s.cfg.MaxReplicas,
		dead: func(id uint64) bool {
			t, ok := downSince[id]
			return ok && now.Sub(t) >= s.cfg.MaxStoreDownTime
		},
	}
	for _, st := range stores {
		in.info[st.ID] = st
	}
	for _, st := range s.Regions() {
		if st.IsLeader {
			in.led = append(in.led, st.Region)
		}
	}
	a, ok := decideRepair(in)
	if !ok && now.Sub(s.lastMove) >= s.settleTime() {
		// Spreading waits after a move: region counts reach us through a
		// cached view and lag a move by a second or two, and acting on
		// them again at once makes replicas ping-pong between two stores.
		if a, ok = decideReplicaSpread(in); !ok {
			a, ok = decideLeaderSpread(in)
		}
		if ok {
			s.lastMove = now
		}
	}
	if !ok {
		return nil
	}
	s.log.Info("balancing", "action", a.kind, "region", a.region, "from", a.from, "to", a.to, "why", a.why)
	switch a.kind {
	case balanceAdd:
		return s.AddPeer(ctx, a.region, a.to)
	case balanceRemove:
		return s.RemovePeer(ctx, a.region, a.from)
	case balanceMove:
		return s.MovePeer(ctx, a.region, a.from, a.to)
	case balanceTransfer:
		return s.TransferLeader(ctx, a.region, a.to)
	}
	return nil
}

// balanceInput is what the balancer decides from: the regions this store
// leads and everyone's counts, as the cluster view last saw them.
type balanceInput struct {
	self        uint64
	led         []region.Region
	stores      []StoreInfo
	info        map[uint64]StoreInfo
	dead        func(storeID uint64) bool // down longer than MaxStoreDownTime
	maxReplicas int
}

type balanceKind string

const (
	balanceAdd      balanceKind = "add-peer"
	balanceRemove   balanceKind = "remove-peer"
	balanceMove     balanceKind = "move-peer"
	balanceTransfer balanceKind = "transfer-leader"
)

// balanceAction is one step the balancer takes.
type balanceAction struct {
	kind     balanceKind
	region   uint64
	from, to uint64
	why      string
}

// decideRepair: finish an interrupted add; move a voter off a store down
// too long or being removed (a learner there is dropped; a leader there
// hands over first); add a voter to a region short of maxReplicas; remove
// one from a region with too many.
func decideRepair(in balanceInput) (balanceAction, bool) {
	for _, r := range in.led {
		members := map[uint64]bool{}
		voters := 0
		for _, p := range r.Peers {
			members[p.StoreID] = true
			if !p.IsLearner {
				voters++
			}
		}
		for _, p := range r.Peers {
			dead, removing := in.dead(p.StoreID), in.info[p.StoreID].Removing
			if !dead && !removing {
				if p.IsLearner {
					return balanceAction{kind: balanceAdd, region: r.ID, to: p.StoreID, why: "finish an interrupted add"}, true
				}
				continue
			}
			where := "a down store"
			if !dead {
				where = "a store being removed"
			}
			if p.IsLearner {
				return balanceAction{kind: balanceRemove, region: r.ID, from: p.StoreID, why: "learner on " + where}, true
			}
			if p.StoreID == in.self {
				// A leader cannot move its own replica: it hands over
				// first, and the new leader moves it.
				if to, ok := transferTarget(in, r); ok {
					return balanceAction{kind: balanceTransfer, region: r.ID, from: in.self, to: to, why: "leader on " + where}, true
				}
				continue
			}
			if to, ok := leastLoaded(in.stores, members); ok {
				return balanceAction{kind: balanceMove, region: r.ID, from: p.StoreID, to: to, why: "replica on " + where}, true
			}
		}
		if voters < in.maxReplicas {
			if to, ok := leastLoaded(in.stores, members); ok {
				return balanceAction{kind: balanceAdd, region: r.ID, to: to, why: "missing replica"}, true
			}
		}
		if voters > in.maxReplicas {
			if from, ok := mostLoaded(r.Peers, in.info, in.self); ok {
				return balanceAction{kind: balanceRemove, region: r.ID, from: from, why: "too many replicas"}, true
			}
		}
	}
	return balanceAction{}, false
}

// decideReplicaSpread moves a replica from the most loaded of a region's
// stores to the least loaded store without one when they differ by two or
// more regions; only while every store is up (a move while a voter is down
// leaves the region one failure from unavailable).
func decideReplicaSpread(in balanceInput) (balanceAction, bool) {
	if !allUp(in.stores) {
		return balanceAction{}, false
	}
	for _, r := range in.led {
		members := map[uint64]bool{}
		for _, p := range r.Peers {
			members[p.StoreID] = true
		}
		from, ok := mostLoaded(r.Peers, in.info, in.self)
		if !ok {
			continue
		}
		to, ok := leastLoaded(in.stores, members)
		if ok && in.info[from].RegionCount-in.info[to].RegionCount >= 2 {
			return balanceAction{kind: balanceMove, region: r.ID, from: from, to: to, why: "spread regions"}, true
		}
	}
	return balanceAction{}, false
}

// decideLeaderSpread hands one region's leadership to a voter's store that
// leads two or more fewer regions than this one; only while every store is
// up, as replicas spread.
func decideLeaderSpread(in balanceInput) (balanceAction, bool) {
	if !allUp(in.stores) {
		return balanceAction{}, false
	}
	me := in.info[in.self]
	for _, r := range in.led {
		for _, p := range r.Peers {
			o, ok := in.info[p.StoreID]
			if p.IsLearner || p.StoreID == in.self || !ok || !o.Up || o.Removing {
				continue
			}
			if me.LeaderCount-o.LeaderCount >= 2 {
				return balanceAction{kind: balanceTransfer, region: r.ID, from: in.self, to: p.StoreID, why: "spread leaders"}, true
			}
		}
	}
	return balanceAction{}, false
}

// allUp reports whether every store is up, leaving out the stores being
// removed: one stopped for good once emptied must not freeze balancing.
func allUp(stores []StoreInfo) bool {
	for _, st := range stores {
		if !st.Up && !st.Removing {
			return false
		}
	}
	return true
}

// transferTarget picks the voter of r, other than this store's, on a
// store that is up and not being removed and leads the fewest regions.
func transferTarget(in balanceInput, r region.Region) (uint64, bool) {
	var best uint64
	found := false
	for _, p := range r.Peers {
		o, ok := in.info[p.StoreID]
		if p.IsLearner || p.StoreID == in.self || !ok || !o.Up || o.Removing {
			continue
		}
		if !found || o.LeaderCount < in.info[best].LeaderCount {
			best, found = p.StoreID, true
		}
	}
	return best, found
}

// settleTime is how long the balancer waits after a move before judging
// the spread again.
func (s *Store) settleTime() time.Duration {
	return max(3*s.cfg.BalanceInterval, 2*time.Second)
}

// leastLoaded picks the live store, outside exclude and not being
// removed, with the fewest regions.
func leastLoaded(stores []StoreInfo, exclude map[uint64]bool) (uint64, bool) {
	cands := make([]StoreInfo, 0, len(stores))
	for _, st := range stores {
		if st.Up && !st.Removing && !exclude[st.ID] {
			cands = append(cands, st)
		}
	}
	if len(cands) == 0 {
		return 0, false
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].RegionCount != cands[j].RegionCount {
			return cands[i].RegionCount < cands[j].RegionCount
		}
		return cands[i].ID < cands[j].ID
	})
	return cands[0].ID, true
}

// mostLoaded picks, among a region's voters other than self (the leader,
// which must not remove itself), the one on the store with most regions.
func mostLoaded(peers []region.Peer, info map[uint64]StoreInfo, self uint64) (uint64, bool) {
	var best uint64
	found := false
	for _, p := range peers {
		if p.StoreID == self || p.IsLearner {
			continue
		}
		if !found || info[p.StoreID].RegionCount > info[best].RegionCount {
			best, found = p.StoreID, true
		}
	}
	return best, found
}
