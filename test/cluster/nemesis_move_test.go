package cluster_test

// move-interrupted: a replica move whose first add is abandoned and
// re-driven under a new peer ID, so that messages for the old and the new
// peer ID of one region reach the target store in any order, one for the
// old ID landing as the new ID's placeholder finishes its snapshot.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
)

// moveInterruptedEvery: the nemesis runs move-interrupted on its second
// fault and every this many after (at most moveInterruptedMax times a
// run), so even make test's four-second runs have one.
const (
	moveInterruptedEvery = 8
	moveInterruptedMax   = 10
)

// staleIDFilter is move-interrupted's network between the region's stores
// and the target store. Phase 1 (the abandoned add): the learner's
// snapshot is held in flight past the add's deadline, and some of its
// heartbeats are held back (captured) to be delivered later. Phase 2 (the
// re-driven add): stragglers for the old peer ID and the new ID's
// messages land in any order.
type staleIDFilter struct {
	regionID, target uint64
	phase            atomic.Int32
	snapDelay        time.Duration // phase 1's hold on the learner's snapshot
	oldID            atomic.Uint64 // the abandoned add's peer ID, once known
	newSnapAt        atomic.Int64  // when the re-driven add's first snapshot lands (unix ns)

	mu       sync.Mutex
	captured []*raftstore.Message // phase 1's held-back heartbeats
}

func (f *staleIDFilter) Apply(m *raftstore.Message) (bool, time.Duration) {
	if m.ToStore != f.target || m.RegionID != f.regionID {
		return false, 0
	}
	raftMsg := m.Notice == nil
	isSnap := raftMsg && m.Msg.Type == raftpb.MsgSnap
	if f.phase.Load() == 1 {
		if isSnap {
			return false, f.snapDelay + rand.N(f.snapDelay)
		}
		if raftMsg && m.Msg.Type == raftpb.MsgHeartbeat {
			// The first three, then one in two: at 50ms ticks a
			// heartbeat goes out every 100ms.
			f.mu.Lock()
			take := len(f.captured) < 3 || (len(f.captured) < 8 && rand.N(2) == 0)
			if take {
				f.captured = append(f.captured, m)
			}
			f.mu.Unlock()
			if take {
				return true, 0 // lost here; delivered by the nemesis later
			}
		}
		return false, rand.N(200 * time.Millisecond)
	}
	switch {
	case m.ToPeer() == f.oldID.Load():
		return false, rand.N(200 * time.Millisecond)
	case isSnap:
		d := rand.N(100 * time.Millisecond)
		f.newSnapAt.CompareAndSwap(0, time.Now().Add(d).UnixNano())
		return false, d
	}
	return false, rand.N(20 * time.Millisecond)
}

// heldFor returns the captured messages addressed to peer id.
func (f *staleIDFilter) heldFor(id uint64) []*raftstore.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*raftstore.Message
	for _, m := range f.captured {
		if m.ToPeer() == id {
			out = append(out, m)
		}
	}
	return out
}

// moveInterrupted moves a follower's replica of r to a free store T, but
// the first add is abandoned: its learner (peer ID Y) gets its snapshot
// late, past the add's deadline; leadership may move away; the learner is
// removed and the move re-driven, which adds the replica again under a new
// peer ID X. Stragglers for Y (its delayed snapshot, heartbeats, the
// tombstone) and X's messages reach T in any order. Heartbeats for Y held
// back in the first add are delivered the moment T's store persists a
// snapshot after X's has landed: the window in which X's round has
// decided to ack its snapshot and not yet sent the ack. A placeholder a
// message for Y superseded there would leave the leader counting on X's
// log while the next message for X creates an empty one (raft panics:
// `tocommit(N) is out of range [lastIndex(0)]`, issue 18).
func (n *nemesis) moveInterrupted(f faultPick) {
	c := n.c
	r := f.r
	to, free := n.freeStore(r)
	ts, tUp := c.Store(to)
	if !f.hasLeader || len(f.followers) == 0 || !free || !tUp {
		return
	}
	abandonAfter := time.Duration(100+n.rng.IntN(200)) * time.Millisecond
	flt := &staleIDFilter{regionID: r.ID, target: to, snapDelay: abandonAfter + 50*time.Millisecond}
	flt.phase.Store(1)
	heal := c.Net.AddFilter(flt)
	defer heal()
	oldID, leader, how := n.abandonedAdd(r.ID, f.leader, to, abandonAfter, f.followers[0])
	if oldID == 0 {
		n.log.add("move-interrupted", "region %d to store %d: the first add did not commit within %v (%s)", r.ID, to, abandonAfter, how)
		return
	}
	flt.oldID.Store(oldID)
	flt.phase.Store(2)
	held := flt.heldFor(oldID)
	var hit atomic.Bool
	deadline := time.Now().Add(3 * time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		hit.Store(n.deliverInWindow(ts, flt, held, deadline))
	}()
	newID, moved := n.redriveMove(r.ID, leader, to, deadline)
	<-done
	n.log.add("move-interrupted", "region %d to store %d: peer %d's add abandoned after %v, %s; re-driven as peer %d (%s); %d held heartbeat(s) for peer %d delivered in a snapshot round of store %d: %v",
		r.ID, to, oldID, abandonAfter, how, newID, moved, len(held), oldID, to, hit.Load())
}

// abandonedAdd adds a replica of regionID on store to, giving up after
// abandonAfter (its snapshot is held longer), then, half the time, moves
// the leadership to follower, and removes the learner. It returns the
// abandoned peer's ID (0: the add never committed), the region's leader
// now, and what happened.
func (n *nemesis) abandonedAdd(regionID, leader, to uint64, abandonAfter time.Duration, follower uint64) (uint64, uint64, string) {
	c := n.c
	s, up := c.Store(leader)
	if !up {
		return 0, leader, "leader down"
	}
	ctx, cancel := context.WithTimeout(context.Background(), abandonAfter)
	err := s.AddPeer(ctx, regionID, to)
	cancel()
	var oldID uint64
	for range 20 { // the add's entry may still commit after its deadline
		if pr, ok := n.peerOn(leader, regionID, to); ok {
			oldID = pr.ID
			break
		}
		if !n.sleep(25 * time.Millisecond) {
			return 0, leader, "stopped"
		}
	}
	if oldID == 0 {
		return 0, leader, fmt.Sprintf("add: %v", err)
	}
	how := fmt.Sprintf("add: %v", err)
	if n.rng.IntN(2) == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		terr := s.TransferLeader(ctx, regionID, follower)
		cancel()
		how += fmt.Sprintf(", transfer %d -> %d: %v", leader, follower, terr)
	}
	var rerr error
	removeBy := time.Now().Add(2 * time.Second)
	for range 10 {
		if l, ok := c.Leader(regionID); ok {
			leader = l
		}
		if ls, up := c.Store(leader); up {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			rerr = ls.RemovePeer(ctx, regionID, to)
			cancel()
			if _, still := n.peerOn(leader, regionID, to); rerr == nil && !still {
				break
			}
		}
		if time.Now().After(removeBy) || !n.sleep(50*time.Millisecond) {
			break
		}
	}
	return oldID, leader, how + fmt.Sprintf(", remove on %d: %v", leader, rerr)
}

// peerOn returns regionID's peer on store, as store leader sees it.
func (n *nemesis) peerOn(leader, regionID, store uint64) (region.Peer, bool) {
	st, ok := n.c.Status(leader, regionID)
	if !ok {
		return region.Peer{}, false
	}
	return st.Region.PeerOnStore(store)
}

// redriveMove moves a voter of regionID other than the leader's to store
// to (a new add, under a new peer ID) until deadline, and returns the new
// peer's ID (0: none) and the move's outcome.
func (n *nemesis) redriveMove(regionID, leader, to uint64, deadline time.Time) (uint64, string) {
	if l, ok := n.c.Leader(regionID); ok {
		leader = l
	}
	st, ok := n.c.Status(leader, regionID)
	s, up := n.c.Store(leader)
	if !ok || !up {
		return 0, "no leader"
	}
	var from uint64
	for _, pr := range st.Region.Peers {
		if pr.StoreID != leader && pr.StoreID != to && !pr.IsLearner {
			from = pr.StoreID
		}
	}
	if from == 0 {
		return 0, "no voter to move"
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	err := s.MovePeer(ctx, regionID, from, to)
	cancel()
	pr, _ := n.peerOn(leader, regionID, to)
	return pr.ID, fmt.Sprintf("move %d -> %d on %d: %v", from, to, leader, err)
}

// deliverInWindow waits for the re-driven add's snapshot to land on
// store s, then for s to persist a snapshot (its SnapshotsApplied counts
// it inside the round's write, before the round publishes and acks), and
// delivers held, messages for the abandoned peer ID, at once: a network
// that kept them back until then. It reports whether it did.
func (n *nemesis) deliverInWindow(s *raftstore.Store, flt *staleIDFilter, held []*raftstore.Message, deadline time.Time) bool {
	if len(held) == 0 {
		return false
	}
	for flt.newSnapAt.Load() == 0 {
		if time.Now().After(deadline) || !n.sleep(time.Millisecond) {
			return false
		}
	}
	base := s.Stats().SnapshotsApplied
	time.Sleep(time.Until(time.Unix(0, flt.newSnapAt.Load())))
	for s.Stats().SnapshotsApplied == base {
		if time.Now().After(deadline) {
			return false
		}
		runtime.Gosched()
	}
	for _, m := range held {
		_ = s.HandleRaftMessage(m) // refused once the placeholder has the snapshot
	}
	return true
}
