package raftstore

import (
	"context"
	"time"

	"github.com/hedgekv/hedgekv/clock"
	"github.com/hedgekv/hedgekv/placement"
)

// The balancer. There is no placement driver: every store balances the
// regions it leads, using the ClusterView for everyone's counts, and does
// at most one thing per round so that stores acting at once converge
// instead of overshooting. The decisions are package placement's, in order
// of urgency: repair (a store down longer than MaxStoreDownTime, or being
// removed, a region short of or over MaxReplicas), replica spread, leader
// spread. This file is the loop: it gathers the snapshot (the regions this
// store leads, the cluster view, which stores are down for good), paces
// the spreading and carries out the one action decided.

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

func (s *Store) balanceLoop(t clock.Ticker) {
	defer t.Stop()
	downSince := map[uint64]time.Time{}
	for {
		select {
		case <-s.stopc:
			return
		case <-t.C():
		}
		if s.view == nil {
			continue
		}
		s.balanceTick(downSince)
	}
}

// maxRepairsPerTick bounds the repairs one tick carries out back to back.
const maxRepairsPerTick = 256

// balanceTick runs one balancing step, and while that step was a repair
// that succeeded, the next one at once: a repair (a store being removed
// or down for good) is urgent, it only touches regions this store leads
// (so stores repairing at once do not collide), and each move waits for
// its snapshot anyway. One step per tick made a removal take a balance
// interval per region on each leader (2,000,000 records, 51 regions: two
// replicas moved every 5 s, 127 s in all, 17.5 MB/s, with the snapshots
// themselves taking under a second). Spreading stays one step per tick.
func (s *Store) balanceTick(downSince map[uint64]time.Time) {
	for range maxRepairsPerTick {
		select {
		case <-s.stopc:
			return
		default:
		}
		if !s.balanceStep(downSince) {
			return
		}
	}
}

// balanceStep is one step of balanceTick, with its own deadline; it
// reports whether it was a repair that succeeded.
func (s *Store) balanceStep(downSince map[uint64]time.Time) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*s.cfg.BalanceInterval+10*time.Second)
	defer cancel()
	stores := s.view.Stores(ctx)
	now := s.now()
	for _, st := range stores {
		if st.Up {
			delete(downSince, st.ID)
		} else if _, ok := downSince[st.ID]; !ok {
			downSince[st.ID] = now
		}
	}
	repaired, err := s.balanceOnce(ctx, stores, downSince, now)
	if err != nil {
		s.log.Debug("balance step failed", "err", err)
	}
	return repaired && err == nil
}

// balanceOnce does at most one balancing step: the first of placement's
// three decisions (repair, replica spread, leader spread) that finds
// something to do, carried out. repaired: it was a repair.
func (s *Store) balanceOnce(ctx context.Context, stores []StoreInfo, downSince map[uint64]time.Time, now time.Time) (repaired bool, err error) {
	in := placement.Snapshot{
		Self:        s.cfg.StoreID,
		Stores:      make([]placement.Store, 0, len(stores)),
		MaxReplicas: s.cfg.MaxReplicas,
	}
	for _, st := range stores {
		t, down := downSince[st.ID]
		in.Stores = append(in.Stores, placement.Store{
			ID:          st.ID,
			Up:          st.Up,
			LeaderCount: st.LeaderCount,
			RegionCount: st.RegionCount,
			Removing:    st.Removing,
			Dead:        down && now.Sub(t) >= s.cfg.MaxStoreDownTime,
		})
	}
	for _, lr := range s.ledRegions() {
		in.Led = append(in.Led, lr.region)
	}
	a, ok := placement.Repair(in)
	repair := ok
	if !ok && now.Sub(s.lastMove) >= s.settleTime() {
		// Spreading waits after a move: region counts reach us through a
		// cached view and lag a move by a second or two, and acting on
		// them again at once makes replicas ping-pong between two stores.
		if a, ok = placement.SpreadReplicas(in); !ok {
			a, ok = placement.SpreadLeaders(in)
		}
		if ok {
			s.lastMove = now
		}
	}
	if !ok {
		return false, nil
	}
	s.log.Info("balancing", "action", a.Kind, "region", a.Region, "from", a.From, "to", a.To, "why", a.Why)
	return repair, s.act(ctx, a)
}

func (s *Store) act(ctx context.Context, a placement.Action) error {
	switch a.Kind {
	case placement.AddPeer:
		return s.AddPeer(ctx, a.Region, a.To)
	case placement.RemovePeer:
		return s.RemovePeer(ctx, a.Region, a.From)
	case placement.MovePeer:
		return s.MovePeer(ctx, a.Region, a.From, a.To)
	case placement.TransferLeader:
		return s.TransferLeader(ctx, a.Region, a.To)
	}
	return nil
}

// settleTime is how long the balancer waits after a move before judging
// the spread again.
func (s *Store) settleTime() time.Duration {
	return max(3*s.cfg.BalanceInterval, 2*time.Second)
}
