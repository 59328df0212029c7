// Package placement decides where a region's replicas and leadership
// should be, as pure functions of a cluster snapshot: the regions a store
// leads and every store's state and counts. No I/O, no clock: the caller
// (raftstore's balance loop) gathers the snapshot, judges which stores are
// down for good, carries the decision out and paces the decisions.
//
// The decisions, in order of urgency:
//
//  1. Repair: a voter on a store down longer than the caller's limit
//     (Store.Dead), or on a store being removed, is moved to a live store
//     without a replica (a leader on a store being removed first hands its
//     leadership to another voter: the store is drained); a region short
//     of MaxReplicas voters gains one; a region with too many loses one.
//  2. SpreadReplicas: a region moves its replica from the most loaded of
//     its stores to the least loaded store without one, when the two
//     differ by two or more regions (a new store fills up this way).
//  3. SpreadLeaders: a leader hands one region to a voter's store that
//     leads two or more fewer regions than this one.
//
// A leadership is never handed to a store that is down, being removed, or
// holds only a learner (TransferTarget).
package placement

import (
	"sort"

	"github.com/hedgekv/hedgekv/region"
)

// Store is one store as the snapshot sees it.
type Store struct {
	ID          uint64
	Up          bool
	LeaderCount int
	RegionCount int
	// Removing: the store is being removed from the cluster; its
	// replicas and leaderships move off and none are put on it.
	Removing bool
	// Dead: down for longer than the caller waits before replacing a
	// store's replicas.
	Dead bool
}

// Snapshot is what the decisions are made from: the regions store Self
// leads and every store's state, as the cluster view last saw them.
type Snapshot struct {
	Self        uint64
	Led         []region.Region
	Stores      []Store
	MaxReplicas int
}

// Kind is what an Action does.
type Kind string

// The kinds of Action.
const (
	AddPeer        Kind = "add-peer"
	RemovePeer     Kind = "remove-peer"
	MovePeer       Kind = "move-peer"
	TransferLeader Kind = "transfer-leader"
)

// Action is one step: add a replica of Region on store To, remove the one
// on From, move the one on From to To, or hand the leadership from From
// to To. Why is for the log.
type Action struct {
	Kind     Kind
	Region   uint64
	From, To uint64
	Why      string
}

// info indexes a snapshot's stores by id.
func (s Snapshot) info() map[uint64]Store {
	m := make(map[uint64]Store, len(s.Stores))
	for _, st := range s.Stores {
		m[st.ID] = st
	}
	return m
}

// Repair finishes an interrupted add; moves a voter off a store down too
// long or being removed (a learner there is dropped; a leader there hands
// over first); adds a voter to a region short of MaxReplicas; removes one
// from a region with too many.
func Repair(s Snapshot) (Action, bool) {
	info := s.info()
	for _, r := range s.Led {
		members := map[uint64]bool{}
		voters := 0
		for _, p := range r.Peers {
			members[p.StoreID] = true
			if !p.IsLearner {
				voters++
			}
		}
		for _, p := range r.Peers {
			dead, removing := info[p.StoreID].Dead, info[p.StoreID].Removing
			if !dead && !removing {
				if p.IsLearner {
					return Action{Kind: AddPeer, Region: r.ID, To: p.StoreID, Why: "finish an interrupted add"}, true
				}
				continue
			}
			where := "a down store"
			if !dead {
				where = "a store being removed"
			}
			if p.IsLearner {
				return Action{Kind: RemovePeer, Region: r.ID, From: p.StoreID, Why: "learner on " + where}, true
			}
			if p.StoreID == s.Self {
				// A leader cannot move its own replica: it hands over
				// first, and the new leader moves it.
				if to, ok := TransferTarget(s, r); ok {
					return Action{Kind: TransferLeader, Region: r.ID, From: s.Self, To: to, Why: "leader on " + where}, true
				}
				continue
			}
			if to, ok := leastLoaded(s.Stores, members); ok {
				return Action{Kind: MovePeer, Region: r.ID, From: p.StoreID, To: to, Why: "replica on " + where}, true
			}
		}
		if voters < s.MaxReplicas {
			if to, ok := leastLoaded(s.Stores, members); ok {
				return Action{Kind: AddPeer, Region: r.ID, To: to, Why: "missing replica"}, true
			}
		}
		if voters > s.MaxReplicas {
			if from, ok := mostLoaded(r.Peers, info, s.Self); ok {
				return Action{Kind: RemovePeer, Region: r.ID, From: from, Why: "too many replicas"}, true
			}
		}
	}
	return Action{}, false
}

// SpreadReplicas moves a replica from the most loaded of a region's stores
// to the least loaded store without one when they differ by two or more
// regions; only while every store is up (a move while a voter is down
// leaves the region one failure from unavailable).
func SpreadReplicas(s Snapshot) (Action, bool) {
	if !allUp(s.Stores) {
		return Action{}, false
	}
	info := s.info()
	for _, r := range s.Led {
		members := map[uint64]bool{}
		for _, p := range r.Peers {
			members[p.StoreID] = true
		}
		from, ok := mostLoaded(r.Peers, info, s.Self)
		if !ok {
			continue
		}
		to, ok := leastLoaded(s.Stores, members)
		if ok && info[from].RegionCount-info[to].RegionCount >= 2 {
			return Action{Kind: MovePeer, Region: r.ID, From: from, To: to, Why: "spread regions"}, true
		}
	}
	return Action{}, false
}

// SpreadLeaders hands one region's leadership to a voter's store that
// leads two or more fewer regions than this one; only while every store is
// up, as replicas spread.
func SpreadLeaders(s Snapshot) (Action, bool) {
	if !allUp(s.Stores) {
		return Action{}, false
	}
	info := s.info()
	me := info[s.Self]
	for _, r := range s.Led {
		for _, p := range r.Peers {
			o, ok := info[p.StoreID]
			if p.IsLearner || p.StoreID == s.Self || !ok || !o.Up || o.Removing {
				continue
			}
			if me.LeaderCount-o.LeaderCount >= 2 {
				return Action{Kind: TransferLeader, Region: r.ID, From: s.Self, To: p.StoreID, Why: "spread leaders"}, true
			}
		}
	}
	return Action{}, false
}

// TransferTarget picks the voter of r, other than Self's, on a store that
// is up and not being removed and leads the fewest regions.
func TransferTarget(s Snapshot, r region.Region) (uint64, bool) {
	info := s.info()
	var best uint64
	found := false
	for _, p := range r.Peers {
		o, ok := info[p.StoreID]
		if p.IsLearner || p.StoreID == s.Self || !ok || !o.Up || o.Removing {
			continue
		}
		if !found || o.LeaderCount < info[best].LeaderCount {
			best, found = p.StoreID, true
		}
	}
	return best, found
}

// allUp reports whether every store is up, leaving out the stores being
// removed: one stopped for good once emptied must not freeze balancing.
func allUp(stores []Store) bool {
	for _, st := range stores {
		if !st.Up && !st.Removing {
			return false
		}
	}
	return true
}

// leastLoaded picks the live store, outside exclude and not being
// removed, with the fewest regions.
func leastLoaded(stores []Store, exclude map[uint64]bool) (uint64, bool) {
	cands := make([]Store, 0, len(stores))
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
func mostLoaded(peers []region.Peer, info map[uint64]Store, self uint64) (uint64, bool) {
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
