package raftstore

import (
	"context"
	"github.com/hedgekv/hedgekv/region"
	"sort"
	"time"
)

// The balancer. There is no placement driver: every store balances the
// regions it leads, using the ClusterView for everyone's counts, and does
// at most one thing per round so that stores acting at once converge
// instead of overshooting. In order of urgency:
//
//  1. repair: a voter on a store down longer than MaxStoreDownTime is
//     moved to a live store without a replica; a region short of
//     MaxReplicas voters gains one; a region with too many loses one.
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

// balanceOnce does at most one balancing step.
func (s *Store) balanceOnce(ctx context.Context, stores []StoreInfo, downSince map[uint64]time.Time, now time.Time) error {
	info := make(map[uint64]StoreInfo, len(stores))
	for _, st := range stores {
		info[st.ID] = st
	}
	me := info[s.cfg.StoreID]
	var led []RegionStatus
	for _, st := range s.Regions() {
		if st.IsLeader {
			led = append(led, st)
		}
	}
	dead := func(id uint64) bool {
		t, ok := downSince[id]
		return ok && now.Sub(t) >= s.cfg.MaxStoreDownTime
	}

	// 1. Repair.
	for _, st := range led {
		r := st.Region
		members := map[uint64]bool{}
		voters := 0
		for _, p := range r.Peers {
			members[p.StoreID] = true
			if !p.IsLearner {
				voters++
			}
		}
		for _, p := range r.Peers {
			if p.IsLearner && !dead(p.StoreID) {
				// An add that was interrupted: finish it.
				return s.AddPeer(ctx, r.ID, p.StoreID)
			}
			if dead(p.StoreID) {
				if to, ok := leastLoaded(stores, members); ok {
					s.log.Info("replacing replica on down store", "region", r.ID, "from", p.StoreID, "to", to)
					if p.IsLearner {
						return s.RemovePeer(ctx, r.ID, p.StoreID)
					}
					return s.MovePeer(ctx, r.ID, p.StoreID, to)
				}
			}
		}
		if voters < s.cfg.MaxReplicas {
			if to, ok := leastLoaded(stores, members); ok {
				s.log.Info("adding missing replica", "region", r.ID, "to", to)
				return s.AddPeer(ctx, r.ID, to)
			}
		}
		if voters > s.cfg.MaxReplicas {
			if from, ok := mostLoaded(r.Peers, info, s.cfg.StoreID); ok {
				return s.RemovePeer(ctx, r.ID, from)
			}
		}
	}

	// 2. Replica spread, only when every store is up (a move while a voter
	// is down leaves the region one failure from unavailable) and not right
	// after another move: region counts reach us through a cached view and
	// lag a move by a second or two, and acting on them again at once makes
	// replicas ping-pong between two stores.
	allUp := true
	for _, st := range stores {
		allUp = allUp && st.Up
	}
	if !allUp || now.Sub(s.lastMove) < s.settleTime() {
		return nil
	}
	for _, st := range led {
		r := st.Region
		members := map[uint64]bool{}
		for _, p := range r.Peers {
			members[p.StoreID] = true
		}
		from, ok := mostLoaded(r.Peers, info, s.cfg.StoreID)
		if !ok {
			continue
		}
		to, ok := leastLoaded(stores, members)
		if ok && info[from].RegionCount-info[to].RegionCount >= 2 {
			s.log.Info("moving replica to spread regions", "region", r.ID, "from", from, "to", to)
			s.lastMove = now
			return s.MovePeer(ctx, r.ID, from, to)
		}
	}

	// 3. Leader spread.
	for _, st := range led {
		for _, p := range st.Region.Peers {
			o, ok := info[p.StoreID]
			if p.IsLearner || p.StoreID == s.cfg.StoreID || !ok || !o.Up {
				continue
			}
			if me.LeaderCount-o.LeaderCount >= 2 {
				s.lastMove = now
				s.log.Info("transferring leader to spread leaders", "region", st.Region.ID, "to", p.StoreID, "mine", me.LeaderCount, "theirs", o.LeaderCount)
				return s.TransferLeader(ctx, st.Region.ID, p.StoreID)
			}
		}
	}
	return nil
}

// settleTime is how long the balancer waits after a move before judging
// the spread again.
func (s *Store) settleTime() time.Duration {
	return max(3*s.cfg.BalanceInterval, 2*time.Second)
}

// leastLoaded picks the live store, outside exclude, with the fewest regions.
func leastLoaded(stores []StoreInfo, exclude map[uint64]bool) (uint64, bool) {
	cands := make([]StoreInfo, 0, len(stores))
	for _, st := range stores {
		if st.Up && !exclude[st.ID] {
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
