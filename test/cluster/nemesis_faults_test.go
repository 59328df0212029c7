package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/region"
)

// plainFault is one of the nemesis' network, leadership, restart, move and
// split faults (kinds 0-8), held for f.hold where it lasts.
func (n *nemesis) plainFault(kind int, f faultPick) {
	c, rng := n.c, n.rng
	r, leader, hasLeader, victim, followers, hold := f.r, f.leader, f.hasLeader, f.victim, f.followers, f.hold
	switch kind {
	case 0:
		if !hasLeader {
			return
		}
		n.log.add("partition-leader", "store %d (region %d) for %v", leader, r.ID, hold)
		heal := c.Net.AddFilter(raftstore.IsolateFilter(leader))
		n.sleep(hold)
		heal()
	case 1:
		if victim == leader {
			return
		}
		n.log.add("isolate-follower", "store %d for %v", victim, hold)
		heal := c.Net.AddFilter(raftstore.IsolateFilter(victim))
		n.sleep(hold)
		heal()
	case 2:
		if !hasLeader || len(followers) == 0 {
			return
		}
		if s, ok := c.Store(leader); ok {
			n.log.add("transfer", "region %d %d -> %d", r.ID, leader, followers[0])
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = s.TransferLeader(ctx, r.ID, followers[0])
			cancel()
		}
	case 3:
		n.log.add("restart", "store %d", victim)
		if c.StopStore(victim) == nil {
			n.sleep(hold)
			_ = c.StartStore(victim)
		}
	case 4:
		n.log.add("delay", "all messages for %v", hold)
		heal := c.Net.AddFilter(raftstore.DelayFilter(2*time.Millisecond, 8*time.Millisecond))
		n.sleep(hold)
		heal()
	case 5:
		n.log.add("drop", "20%% of messages for %v", hold)
		heal := c.Net.AddFilter(raftstore.DropFilter(0.2))
		n.sleep(hold)
		heal()
	case 6:
		// Move a follower's replica to a store without one: a learner
		// catches up by snapshot, is promoted, and the old replica is
		// removed and its data deleted while reads may still reach it.
		if to, ok := n.freeStore(r); ok && hasLeader && len(followers) > 0 {
			n.log.add("move-replica", "region %d %d -> %d", r.ID, followers[0], to)
			n.move(leader, r.ID, followers[0], to)
		}
	case 7:
		key := splitKeys[rng.IntN(len(splitKeys))]
		n.log.add("split", "at %q", key)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.Split(ctx, []byte(key))
		cancel()
	case 8:
		// A follower lags (no entries, heartbeats only) while the
		// region splits under it: clients holding the old epoch read
		// from it, it learns of the split while their reads wait.
		if len(followers) == 0 {
			return
		}
		f := followers[0]
		key := splitKeys[rng.IntN(len(splitKeys))]
		n.log.add("split-while-lagging", "store %d lags, split at %q, for %v", f, key, hold)
		heal := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
			return m.ToStore == f && (m.Msg.Type == raftpb.MsgApp || m.Msg.Type == raftpb.MsgSnap), 0
		}))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.Split(ctx, []byte(key))
		cancel()
		n.sleep(hold)
		heal()
	}
}

// transferUnheard moves a region's leadership while one follower (with
// follower leases on, a lease holder) hears neither the old leader's
// revoke notice nor anything of the target's new term: only the new
// leader holding its first commits back for a lease keeps that follower
// from answering from a lease that no longer covers every commit. A write
// through the new leader and reads on the follower are recorded.
func (n *nemesis) transferUnheard(r region.Region, leader uint64, hasLeader bool, followers []uint64, hold time.Duration) {
	if !hasLeader || len(followers) < 2 {
		return
	}
	key, ok := n.keyIn(r)
	s, up := n.c.Store(leader)
	if !ok || !up {
		return
	}
	holder, target := followers[0], followers[1]
	if holder == shortLeaseStore {
		// The target with the shorter leases: its own longest grant is
		// shorter than the old leader's, so only the horizon the old
		// leader sends with MsgTimeoutNow keeps its deferral long enough.
		holder, target = target, holder
	}
	n.log.add("transfer-unheard", "region %d %d -> %d, store %d hears nothing of it for %v", r.ID, leader, target, holder, hold)
	heal := n.c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		between := (m.FromStore == holder && m.ToStore == target) || (m.FromStore == target && m.ToStore == holder)
		return between || (m.ToStore == holder && isLeaseRevoke(m)), 0
	}))
	defer heal()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err := s.TransferLeader(ctx, r.ID, target)
	cancel()
	if err != nil {
		return
	}
	n.probeOn(holder, key, raftstore.ReadOptions{ReplicaRead: true}, "unheard-follower")
	n.sleep(hold)
}

// transferUnheardToShortLease is transferUnheard with shortLeaseStore as
// the target and a holder that has just been granted a lease: the old
// leader's grant can outlast the target's own longest one. If
// shortLeaseStore leads r, leadership moves away from it first. It
// reports whether it ran.
func (n *nemesis) transferUnheardToShortLease(r region.Region, leader uint64, followers []uint64, hold time.Duration) bool {
	if leader == shortLeaseStore {
		s, up := n.c.Store(leader)
		if !up {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := s.TransferLeader(ctx, r.ID, followers[0])
		cancel()
		if err != nil {
			return false
		}
		leader, followers = followers[0], []uint64{followers[1], shortLeaseStore}
	}
	holder := followers[0]
	if holder == shortLeaseStore {
		holder = followers[1]
	}
	if _, ok := r.PeerOnStore(shortLeaseStore); !ok || holder == shortLeaseStore {
		return false
	}
	key, ok := n.keyIn(r)
	hs, up := n.c.Store(holder)
	if !ok || !up {
		return false
	}
	// Until the holder reads from a lease (not recorded: a read is a read).
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, _, info, err := hs.Get(ctx, raftstore.ReadOptions{ReplicaRead: true}, []byte(key))
		cancel()
		if err == nil && info.Mode == readmode.FollowerLease {
			break
		}
		n.sleep(10 * time.Millisecond)
	}
	n.transferUnheard(r, leader, true, []uint64{holder, shortLeaseStore}, hold)
	return true
}

// diskFail fails every disk write of a store for hold: its next writing
// round fails after it wrote into the open batch, which is lost with
// every round since the last commit; the store freezes, and once writes
// succeed again it rebuilds them from its WAL, then its peers (the
// stores' write path keeps applied rounds in one batch per checkpoint).
func (n *nemesis) diskFail(victim uint64, hold time.Duration) {
	s, ok := n.c.Store(victim)
	if !ok {
		return
	}
	n.log.add("disk-fail", "store %d for %v", victim, hold)
	// A write of the quiet key just before: the victim applies it into
	// its open batch, which the failure then loses, and the frozen victim
	// keeps serving it stale (its overlay, its safe points).
	w, wrote := n.quietWrite()
	s.InjectDiskFailure(errors.New("nemesis: injected disk write failure"))
	// A replica digest (ctl check) commits the store's open batch outside
	// its Ready loop: the failure may strike that commit rather than a
	// round, and lose the batch with no round to notice.
	if rs := s.Regions(); len(rs) > 0 {
		_, _ = s.RegionDigest(rs[n.rng.IntN(len(rs))].Region.ID)
	}
	n.sleep(hold)
	s.InjectDiskFailure(nil)
	if wrote {
		n.staleReadsAcrossRebuild(s, victim, w)
	}
}

// quietPut is a write of the quiet key the nemesis made, acknowledged by
// leader in term at leaderAck (on leader's clock, read after the ack).
type quietPut struct {
	seq       int
	regionID  uint64
	leader    uint64
	term      uint64
	leaderAck time.Time
}

// quietWrite writes the quiet key through its region's leader, recorded
// (only the nemesis writes it, one write at a time, so its probe values
// rise with seq): ok if it was acknowledged with no leader change around
// it.
func (n *nemesis) quietWrite() (quietPut, bool) {
	r, ok := n.c.RegionOf([]byte(quietKey))
	if !ok {
		return quietPut{}, false
	}
	leader, ok := n.c.Leader(r.ID)
	st, up := n.c.Status(leader, r.ID)
	if !ok || !up || !st.IsLeader {
		return quietPut{}, false
	}
	n.seq++
	w := quietPut{seq: n.seq, regionID: r.ID, leader: leader, term: st.Term}
	val := fmt.Sprintf("probe.%d", w.seq)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	call := n.h.Now()
	err := n.c.Put(ctx, []byte(quietKey), []byte(val))
	cancel()
	in := kvInput{Put: true, Key: quietKey, Value: val}
	if err != nil {
		n.h.Add(porcupine.Operation{ClientId: probeClient, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
		return w, false
	}
	n.h.Add(porcupine.Operation{ClientId: probeClient, Input: in, Call: call, Output: kvOutput{}, Return: n.h.Now()})
	w.leaderAck = n.clocks[leader].Now()
	if st, up := n.c.Status(leader, r.ID); !up || !st.IsLeader || st.Term != w.term {
		return w, false
	}
	return w, true
}

// staleReadsAcrossRebuild reads the quiet key with a staleness bound on
// victim, in a loop, while it rebuilds its peers from disk after the
// failure (and a little after): no answer may be older than w once the
// bound says w's acknowledgement is covered. A bounded-staleness read is
// not linearizable and is not recorded; it is checked here: with the
// read's start t on the victim's clock and its bound B, the safe point
// it used was stamped at or after t - B + MaxClockOffset on its leader's
// clock. If w's leader led the term of w and still does, only it can have
// stamped a safe point that covers w (an earlier term's commit never
// reaches w's index), so t - B > w.leaderAck (both on that leader's
// clock, once the offset is dropped) means the safe point covers w.
// Before the peers were retired ahead of the engine's rollback, a read in
// between answered a value w overwrote (1,795 to 12,066 per heal).
func (n *nemesis) staleReadsAcrossRebuild(s *raftstore.Store, victim uint64, w quietPut) {
	deadline := time.Now().Add(3 * time.Second)
	var healedAt time.Time
	reads, checked := 0, 0
	for time.Now().Before(deadline) {
		if s.DiskError() == nil {
			if healedAt.IsZero() {
				healedAt = time.Now()
			} else if time.Since(healedAt) > 100*time.Millisecond {
				break
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		start := n.clocks[victim].Now()
		v, found, info, err := s.Get(ctx, raftstore.ReadOptions{RegionID: w.regionID, MaxStaleness: 5 * time.Second}, []byte(quietKey))
		cancel()
		reads++
		if err != nil || info.Mode != readmode.Stale || !start.Add(-info.StalenessBound).After(w.leaderAck) {
			continue
		}
		checked++
		n.staleChecked++
		var got int
		if found {
			_, _ = fmt.Sscanf(string(v), "probe.%d", &got)
		}
		if got < w.seq {
			if st, up := n.c.Status(w.leader, w.regionID); up && st.IsLeader && st.Term == w.term {
				n.staleViolations++
				n.log.add("stale-read-violation", "store %d answered %q (found %v) under bound %v after probe.%d was acknowledged before it", victim, v, found, info.StalenessBound, w.seq)
			}
		}
	}
	n.log.add("disk-fail-stale-reads", "store %d: %d reads, %d checked against probe.%d", victim, reads, checked, w.seq)
}

// merge merges the picked region with its right neighbour while the
// workload runs, through the left region's leader (a merge runs on any
// store holding both): the splits keep cutting the key space, so the
// merges and splits race, and clients holding either old epoch must find
// the merged region. A merge the two regions cannot make (replicas on
// other stores, a neighbour frozen by another merge) is refused and
// logged as such; one abandoned half-way rolls back. Half the time the
// right neighbour merges with its own right neighbour at once, from its
// leader: three adjacent regions, two coordinators, and the middle one
// may be absorbed while the third froze for it.
func (n *nemesis) merge(f faultPick) {
	if !f.hasLeader || len(f.r.EndKey) == 0 {
		return
	}
	s, ok := n.c.Store(f.leader)
	if !ok {
		return
	}
	var wg sync.WaitGroup
	if next, ok := n.c.RegionOf(f.r.EndKey); ok && len(next.EndKey) > 0 && n.rng.IntN(2) == 0 {
		if l, ok := n.c.Leader(next.ID); ok {
			if s2, ok := n.c.Store(l); ok {
				wg.Go(func() { n.mergeOn(s2, next.ID, "merge-racing") })
			}
		}
	}
	n.mergeOn(s, f.r.ID, "merge")
	wg.Wait()
}

// mergeOn merges region id with its right neighbour on s, logged as kind.
func (n *nemesis) mergeOn(s *raftstore.Store, id uint64, kind string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	merged, err := s.Merge(ctx, id)
	var refused *raftstore.MergeRefusedError
	switch {
	case err == nil:
		n.log.add(kind, "region %d absorbed its right neighbour: now %s", id, merged.String())
	case errors.As(err, &refused):
		n.log.add(kind+"-refused", "region %d: %v", id, err)
	default:
		n.log.add(kind+"-failed", "region %d: %v", id, err)
	}
}

// splitChain cuts a follower off while its region splits and takes enough
// writes to compact its log past the split, then heals it just as the new
// region splits again, twice: the follower catches up by snapshots taken
// while the chain goes on, one region's from before it split again, the
// next one's arriving while that one applies. Admitted side by side, the
// first region, whole, applied its split over the second's snapshot and
// the leader's next heartbeat panicked the store (found at 10,000
// regions; raftstore's snapshot claims refuse the second now).
func (n *nemesis) splitChain(f faultPick) {
	var keys []string
	for _, k := range splitKeys {
		if f.r.Contains([]byte(k)) && k != string(f.r.StartKey) {
			keys = append(keys, k)
		}
	}
	if len(keys) < 3 || len(f.followers) == 0 || !f.hasLeader {
		return
	}
	keys = keys[:3]
	victim := f.followers[0]
	n.log.add("split-chain", "store %d cut off, region %d split at %q, %q, %q", victim, f.r.ID, keys[0], keys[1], keys[2])
	split := func(key string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = n.c.Split(ctx, []byte(key))
		cancel()
	}
	heal := n.c.Net.AddFilter(raftstore.IsolateFilter(victim))
	split(keys[0])
	// Below keys[0], in the region that split, and no client's key: the
	// clients' history is not touched.
	filler := append(append([]byte(nil), f.r.StartKey...), 0, '~')
	for i := range chainFillerWrites {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_ = n.c.Put(ctx, filler, []byte(fmt.Sprint(i)))
		cancel()
	}
	heal()
	split(keys[1])
	split(keys[2])
}

// chainFillerWrites: past the nemesis cluster's log GC threshold (200).
const chainFillerWrites = 210
