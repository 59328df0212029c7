package cluster_test

// The nemesis of the linearizability spec: the faults it injects (leader
// transfers unheard or abandoned, restarts within a lease, lost acks across
// a split, retries past the dedup window, replica moves re-driven under a
// new peer ID, merges racing the splits, ...) and the probes of stale
// reads.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/hedgekv/hedgekv/clock"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/vfs"
	"github.com/hedgekv/hedgekv/test/kvmodel"
)

// nemesisKeys are the clients' keys; the nemesis splits between them
// (splitKeys) and merges neighbours back, so the key space keeps being cut
// into new regions and joined again for the whole run.
var (
	nemesisKeys = []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"}
	splitKeys   = nemesisKeys[1:]
)

// faultLog counts and lists the faults the nemesis injected.
type faultLog struct {
	mu     sync.Mutex
	list   []string
	byKind map[string]int
	// now, if set, stamps each fault with the history's clock (ms), so a
	// failing history's operations can be set beside the faults.
	now func() int64
}

func (f *faultLog) add(kind, format string, a ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byKind == nil {
		f.byKind = map[string]int{}
	}
	f.byKind[kind]++
	if len(f.list) < 300 {
		at := ""
		if f.now != nil {
			at = fmt.Sprintf("@%dms ", f.now()/int64(time.Millisecond))
		}
		f.list = append(f.list, at+kind+": "+fmt.Sprintf(format, a...))
	}
}

func (f *faultLog) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	kinds := make([]string, 0, len(f.byKind))
	n := 0
	for k, c := range f.byKind {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, c))
		n += c
	}
	sort.Strings(kinds)
	return fmt.Sprintf("%d faults (%s)", n, strings.Join(kinds, " "))
}

// nemesisRun is one seed's configuration.
type nemesisRun struct {
	seed uint64
	tick time.Duration // raft tick; 50ms gives leases long enough to race
	// dedupWindow > 0 makes retried writes outlive the dedup window: then
	// a retry may legitimately apply twice, so lost-ack writes are
	// recorded as two puts of unknown outcome, and replica agreement (data
	// and dedup tables) is the oracle for how replicas decided them.
	dedupWindow uint64
	// followerLeases: followers hold read leases, so the follower reads
	// below are mostly served locally with no round trip.
	followerLeases bool
	// powerLoss runs the stores on modelled disks (raftstoretest.Options.
	// PowerLoss) and adds the power-loss fault.
	powerLoss bool
	// trueClocks: the stores share the real clock. The skewed clocks drift
	// apart by up to 6% of the time elapsed, past MaxClockOffset within a
	// second or two: fine for a nemesis run of a few seconds, but a spec
	// that preloads and then reads stale for longer would see a faster
	// leader's safe points refused (rightly) and never serve one.
	trueClocks bool
}

// nemesis injects faults, one at a time, chosen by rng, until stop closes.
type nemesis struct {
	c      *raftstoretest.Cluster
	run    nemesisRun
	rng    *rand.Rand
	stop   <-chan struct{}
	log    *faultLog
	h      *kvmodel.History
	clocks map[uint64]clock.Clock // each store's (skewed) clock
	probes int                    // operations the nemesis itself recorded
	// staleViolations counts bounded-staleness reads that answered older
	// than their bound allows (staleReadsAcrossRebuild).
	staleViolations, staleChecked int
	seq                           int
	// shortLeaseRuns: how often a follower-lease run has moved a
	// leadership to shortLeaseStore past an unhearing holder
	// (transferUnheardToShortLease), and how often it tried.
	shortLeaseRuns, shortLeaseTries int
	// picks counts the faults picked; moveInterruptedRuns how often
	// move-interrupted ran (moveInterruptedEvery).
	picks, moveInterruptedRuns int
	// reopenErrs: stores that failed to restart after a power loss.
	reopenErrs []string
}

// quietKey is a key no client writes, in a region of its own (split off
// at quietSplit when the run starts): a probe there races the lease
// against an election whose candidate's log is as long as everyone's.
const (
	quietSplit = "m"
	quietKey   = "n"
)

// probeClient is the ClientId of the nemesis' own recorded operations.
const probeClient = 1000

func (n *nemesis) sleep(d time.Duration) bool {
	select {
	case <-n.stop:
		return false
	case <-time.After(d):
		return true
	}
}

// keyIn returns a client key region r holds, if any.
func (n *nemesis) keyIn(r region.Region) (string, bool) {
	var in []string
	for _, k := range nemesisKeys {
		if r.Contains([]byte(k)) {
			in = append(in, k)
		}
	}
	if len(in) == 0 {
		return "", false
	}
	return in[n.rng.IntN(len(in))], true
}

// newLeaderOf waits until regionID is led by a store other than old.
func (n *nemesis) newLeaderOf(regionID, old uint64, within time.Duration) (uint64, bool) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if l, ok := n.c.Leader(regionID); ok && l != old {
			return l, true
		}
		if !n.sleep(5 * time.Millisecond) {
			return 0, false
		}
	}
	return 0, false
}

// probeStale writes key through the current leader, then reads it on
// the old leader's store as a leader read, both recorded: an old leader
// that still believes its lease answers the overwritten value.
func (n *nemesis) probeStale(old uint64, key string) {
	n.probeOn(old, key, raftstore.ReadOptions{}, "old-leader")
}

// probeOn writes key through the current leader, then reads it on store
// with opts, both recorded.
func (n *nemesis) probeOn(store uint64, key string, opts raftstore.ReadOptions, mode string) {
	n.seq++
	val := fmt.Sprintf("probe.%d", n.seq)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	call := n.h.Now()
	err := n.c.Put(ctx, []byte(key), []byte(val))
	cancel()
	in := kvInput{Put: true, Key: key, Value: val}
	if err != nil {
		n.h.Add(porcupine.Operation{ClientId: probeClient, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
		return
	}
	n.h.Add(porcupine.Operation{ClientId: probeClient, Input: in, Call: call, Output: kvOutput{}, Return: n.h.Now()})
	s, ok := n.c.Store(store)
	if !ok {
		return
	}
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		call := n.h.Now()
		v, found, _, err := s.Get(ctx, opts, []byte(key))
		cancel()
		if err == nil {
			n.h.Add(porcupine.Operation{ClientId: probeClient, Input: kvInput{Key: key, Mode: mode}, Call: call, Output: kvOutput{Value: string(v), Found: found}, Return: n.h.Now()})
		}
		n.probes++
	}
}

// renewLease reads on the leader until its lease was just renewed (a
// ReadIndex round: no new entry, so every follower's log stays as long).
func (n *nemesis) renewLease(leader, regionID uint64, key string) {
	s, ok := n.c.Store(leader)
	if !ok {
		return
	}
	ticks := 10 // election ticks; shortLeaseStore runs with 6
	if leader == shortLeaseStore {
		ticks = 6
	}
	lease := time.Duration(float64(time.Duration(ticks-2)*n.run.tick) * 0.9)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, _, _, _ = s.Get(ctx, raftstore.ReadOptions{}, []byte(key))
		cancel()
		// LeaseExpiry is on the leader's clock, not ours.
		if st, ok := n.c.Status(leader, regionID); ok && st.LeaseExpiry.Sub(n.clocks[leader].Now()) > lease*3/4 {
			return
		}
	}
}

func (n *nemesis) loop() {
	for {
		if !n.sleep(time.Duration(100+n.rng.IntN(200)) * time.Millisecond) {
			return
		}
		f := n.pick()
		n.picks++
		if n.picks%moveInterruptedEvery == 2 && n.moveInterruptedRuns < moveInterruptedMax {
			n.moveInterruptedRuns++
			n.moveInterrupted(f)
			continue
		}
		if n.run.powerLoss && n.picks%powerLossEvery == 1 {
			// The first fault and every powerLossEvery after, besides its
			// place in the menu: make test's four-second runs have some.
			n.powerLoss(f)
			continue
		}
		if n.run.followerLeases && n.shortLeaseRuns < 3 && n.shortLeaseTries < 20 && f.hasLeader && len(f.followers) >= 2 {
			// Every follower-lease run, however short, moves a leadership
			// to the store with the shorter leases past a holder that hears
			// nothing of it, three times: whether the holder's grant
			// outlasts the target's own longest one is a matter of when it
			// was last renewed. At most 20 tries: the nemesis must not
			// stall if no region keeps a replica on that store.
			n.shortLeaseTries++
			if n.transferUnheardToShortLease(f.r, f.leader, f.followers, f.hold) {
				n.shortLeaseRuns++
			}
			continue
		}
		r, leader, hasLeader, followers, hold := f.r, f.leader, f.hasLeader, f.followers, f.hold
		kinds := 19
		if n.run.powerLoss {
			kinds = 20
		}
		switch kind := n.rng.IntN(kinds); kind {
		case 0, 1, 2, 3, 4, 5, 6, 7, 8:
			n.plainFault(kind, f)
		case 9:
			n.abandonedTransfer(r, leader, hasLeader, followers, hold)
		case 10:
			n.restartInLease(hold)
		case 11:
			n.lostAckAcrossSplit()
		case 12:
			if n.run.dedupWindow > 0 {
				n.retryPastWindow()
			}
		case 13:
			n.transferUnheard(r, leader, hasLeader, followers, hold)
		case 14:
			n.moveWhileDown(r, leader, hasLeader, followers, hold)
		case 15:
			if n.run.followerLeases && hasLeader && len(followers) > 0 {
				n.restartHolderLateGrant(r, leader, followers[0])
			}
		case 16:
			n.diskFail(f.victim, hold)
		case 17:
			n.merge(f)
		case 18:
			n.splitChain(f)
		case 19:
			n.powerLoss(f)
		}
	}
}

// faultPick is what one fault acts on: a region, its leader and voting
// followers (shuffled), a store, and how long to hold the fault.
type faultPick struct {
	r         region.Region
	leader    uint64
	hasLeader bool
	victim    uint64
	followers []uint64
	hold      time.Duration
}

func (n *nemesis) pick() faultPick {
	regions := n.c.Regions()
	f := faultPick{r: regions[n.rng.IntN(len(regions))]}
	f.leader, f.hasLeader = n.c.Leader(f.r.ID)
	ids := n.c.IDs()
	f.victim = ids[n.rng.IntN(len(ids))]
	for _, pr := range f.r.Peers {
		if pr.StoreID != f.leader && !pr.IsLearner {
			f.followers = append(f.followers, pr.StoreID)
		}
	}
	n.rng.Shuffle(len(f.followers), func(i, j int) { f.followers[i], f.followers[j] = f.followers[j], f.followers[i] })
	f.hold = time.Duration(200+n.rng.IntN(400)) * time.Millisecond
	return f
}

// moveWhileDown moves a follower's replica away while the follower's store
// is down, then restarts the store: the leader's tombstone for the removed
// peer went nowhere, so the peer comes back not knowing it was removed, and
// must learn it from the members it contacts (and serve nothing meanwhile).
func (n *nemesis) moveWhileDown(r region.Region, leader uint64, hasLeader bool, followers []uint64, hold time.Duration) {
	if !hasLeader || len(followers) == 0 {
		return
	}
	victim := followers[0]
	to, ok := n.freeStore(r)
	if !ok {
		return
	}
	n.log.add("move-while-down", "region %d %d -> %d while store %d is down for %v", r.ID, victim, to, victim, hold)
	if n.c.StopStore(victim) != nil {
		return
	}
	n.move(leader, r.ID, victim, to)
	n.sleep(hold)
	_ = n.c.StartStore(victim)
}

// freeStore returns a store holding no replica of r.
func (n *nemesis) freeStore(r region.Region) (uint64, bool) {
	for _, id := range n.c.IDs() {
		if _, has := r.PeerOnStore(id); !has {
			return id, true
		}
	}
	return 0, false
}

func (n *nemesis) move(leader, regionID, from, to uint64) {
	s, up := n.c.Store(leader)
	if !up {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = s.MovePeer(ctx, regionID, from, to)
	cancel()
}

// abandonedTransfer: a transfer whose caller gives up at once while its
// target lags. Raft keeps the transfer live and sends MsgTimeoutNow once
// the target catches up; the old leader is cut off at that moment, the
// target is elected, and the probe checks the old leader's lease reads.
func (n *nemesis) abandonedTransfer(r region.Region, leader uint64, hasLeader bool, followers []uint64, hold time.Duration) {
	c := n.c
	s, up := c.Store(leader)
	key, hasKey := n.keyIn(r)
	if !hasLeader || !up || !hasKey || len(followers) == 0 {
		return
	}
	target := followers[0]
	n.log.add("abandoned-transfer", "region %d %d -> %d, probe %q", r.ID, leader, target, key)
	lag := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		return m.ToStore == target && m.Msg.Type == raftpb.MsgApp, 0
	}))
	// An entry the target does not have, so that raft holds the transfer
	// until it catches up. (Not a client key: it is not in the history.)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_ = c.Put(ctx, []byte(key+"~"), []byte("nemesis"))
	cancel()
	var cut atomic.Bool
	isolate := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		if cut.Load() {
			return m.FromStore == leader || m.ToStore == leader, 0
		}
		if m.FromStore == leader && m.Msg.Type == raftpb.MsgTimeoutNow {
			cut.Store(true)
		}
		return false, 0
	}))
	defer isolate()
	tctx, tcancel := context.WithTimeout(context.Background(), time.Duration(1+n.rng.IntN(20))*time.Millisecond)
	_ = s.TransferLeader(tctx, r.ID, target)
	tcancel()
	// A ReadIndex round while raft still holds the transferee.
	rctx, rcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, _, _, _ = s.Get(rctx, raftstore.ReadOptions{}, []byte(key))
	rcancel()
	n.sleep(time.Duration(n.rng.IntN(30)) * time.Millisecond)
	lag()
	deadline := time.Now().Add(time.Second)
	for !cut.Load() && time.Now().Before(deadline) {
		if !n.sleep(2 * time.Millisecond) {
			return
		}
	}
	if cut.Load() {
		if _, ok := n.newLeaderOf(r.ID, leader, time.Second); ok {
			n.probeStale(leader, key)
		}
	}
	n.sleep(hold)
}

// restartInLease: one follower (cf) is cut off from the leader and keeps
// campaigning; the leader's lease is renewed; the other follower (b)
// restarts and no longer hears from the leader. If b forgot the leader it
// acked, cf is elected inside the leader's lease; the probe checks.
func (n *nemesis) restartInLease(hold time.Duration) {
	c := n.c
	r, ok := c.RegionOf([]byte(quietKey))
	if !ok {
		return
	}
	leader, hasLeader := c.Leader(r.ID)
	if !hasLeader {
		return
	}
	var followers []uint64
	for _, pr := range r.Peers {
		if pr.StoreID != leader && !pr.IsLearner {
			followers = append(followers, pr.StoreID)
		}
	}
	if len(followers) < 2 {
		return
	}
	// Store 3 campaigns soonest: it should be the cut-off follower, not
	// the leader (its lease is the shortest).
	if leader == 3 {
		if s, up := c.Store(3); up {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = s.TransferLeader(ctx, r.ID, followers[0])
			cancel()
		}
		if leader, hasLeader = n.newLeaderOf(r.ID, 3, 20*n.run.tick); !hasLeader {
			return
		}
		followers = followers[:0]
		for _, pr := range r.Peers {
			if pr.StoreID != leader && !pr.IsLearner {
				followers = append(followers, pr.StoreID)
			}
		}
		if len(followers) < 2 {
			return
		}
	}
	b, cf := followers[0], followers[1]
	if b == 3 {
		b, cf = cf, b
	}
	n.log.add("restart-in-lease", "region %d leader %d, cut %d, restart %d", r.ID, leader, cf, b)
	link := func(x, y uint64) raftstore.Filter {
		return raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
			return (m.FromStore == x && m.ToStore == y) || (m.FromStore == y && m.ToStore == x), 0
		})
	}
	cutLC := c.Net.AddFilter(link(leader, cf))
	defer cutLC()
	// Let cf's election clock run out so it is campaigning.
	if !n.sleep(15 * n.run.tick) {
		return
	}
	n.renewLease(leader, r.ID, quietKey)
	cutLB := c.Net.AddFilter(link(leader, b))
	defer cutLB()
	if c.StopStore(b) == nil {
		_ = c.StartStore(b)
	}
	if _, ok := n.newLeaderOf(r.ID, leader, 20*n.run.tick); ok {
		n.probeStale(leader, quietKey)
	}
	n.sleep(hold)
}

// restartHolderLateGrant restarts a follower-lease holder twice in quick
// succession while every lease grant to its store is delayed by about a
// lease and it gets no appends: the grant the leader made for the second
// instance's request lands on the third, whose request numbers start
// over. Were grants matched by number alone, the third instance would
// time a lease from its own later request while the leader's record of it
// runs out first, and a write committed after that would be missing from
// what it serves. A write through the leader and reads on the holder are
// recorded.
func (n *nemesis) restartHolderLateGrant(r region.Region, leader, h uint64) {
	c := n.c
	key, ok := n.keyIn(r)
	if !ok {
		return
	}
	lease := time.Duration(float64(8*n.run.tick) * 0.9) // (ElectionTicks-2) ticks, less the drift margin
	delay := lease/2 + time.Duration(n.rng.Int64N(int64(lease)))
	n.log.add("restart-holder-late-grant", "region %d holder %d, grants delayed %v", r.ID, h, delay)
	// Once the second instance has asked, the holder's store gets no
	// appends and its lease requests are lost: only the delayed grant
	// reaches it, and the leader's record of it runs out unrenewed.
	var phase atomic.Int32 // 1: the second instance is up; 2: it has asked
	asked := make(chan time.Time, 1)
	heal := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		switch {
		case m.ToStore == h && isLeaseGrant(m):
			return false, delay
		case m.FromStore == h && isLeaseRequest(m):
			if phase.CompareAndSwap(1, 2) {
				asked <- time.Now()
				return false, 0
			}
			return phase.Load() == 2, 0
		case phase.Load() == 2 && m.ToStore == h && (m.Msg.Type == raftpb.MsgApp || m.Msg.Type == raftpb.MsgSnap):
			return true, 0
		}
		return false, 0
	}))
	defer heal()
	if c.StopStore(h) != nil {
		return
	}
	phase.Store(1)
	if c.StartStore(h) != nil {
		return
	}
	var at time.Time
	select {
	case at = <-asked:
	case <-time.After(20 * n.run.tick):
		return
	case <-n.stop:
		return
	}
	if c.StopStore(h) != nil {
		return
	}
	if c.StartStore(h) != nil {
		return
	}
	// Write and read on the holder once the grant has landed: the write
	// commits when the leader's record of the second instance runs out.
	n.sleep(time.Until(at.Add(delay + n.run.tick)))
	for range 3 {
		n.probeOn(h, key, raftstore.ReadOptions{ReplicaRead: true}, "follower")
		if !n.sleep(n.run.tick) {
			return
		}
	}
}

// lostAckAcrossSplit: a write whose acknowledgement is lost, then its key
// is split off into a new region that gains a replica by snapshot on a
// store that never saw the write, then the client retries with the same
// request ID. Every replica must decide the retry alike.
func (n *nemesis) lostAckAcrossSplit() {
	c, rng := n.c, n.rng
	n.seq++
	// A fresh key, so the split at it always makes a new region.
	key := fmt.Sprintf("%s~s%d", nemesisKeys[rng.IntN(len(nemesisKeys))], n.seq)
	val := fmt.Sprintf("lost.%d", n.seq)
	id := rng.Uint64() | 1
	call := n.h.Now()
	first, cancel := context.WithTimeout(context.Background(), time.Duration(1+rng.IntN(3))*time.Millisecond)
	_ = c.PutWithID(first, id, []byte(key), []byte(val))
	cancel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = c.Split(ctx, []byte(key))
	cancel()
	moved := "no move"
	if r, ok := c.RegionOf([]byte(key)); ok {
		leader, err := c.WaitLeader(r.ID, time.Second)
		to, free := n.freeStore(r)
		for _, pr := range r.Peers {
			if err == nil && free && pr.StoreID != leader && !pr.IsLearner {
				n.move(leader, r.ID, pr.StoreID, to)
				moved = fmt.Sprintf("region %d %d -> %d", r.ID, pr.StoreID, to)
				break
			}
		}
	}
	n.log.add("lost-ack-across-split", "put(%q) id %x, split at it, move %s, retry", key, id, moved)
	retry, cancel := context.WithTimeout(context.Background(), time.Second)
	err := c.PutWithID(retry, id, []byte(key), []byte(val))
	cancel()
	recordRetried(n.h, probeClient, key, val, call, err, n.run.dedupWindow > 0)
}

// retryPastWindow: a write's retry arrives after the dedup window has
// passed, while one follower lags and then catches up in one apply round.
// Whether the retry is a duplicate must not depend on that: the leader
// applies it again, so must the follower. The key is the nemesis' own, so
// nothing overwrites a divergence before the reads and the replica check.
func (n *nemesis) retryPastWindow() {
	c, rng := n.c, n.rng
	n.seq++
	key := fmt.Sprintf("%s~w%d", nemesisKeys[rng.IntN(len(nemesisKeys))], n.seq)
	v1, v2 := fmt.Sprintf("w1.%d", n.seq), fmt.Sprintf("w2.%d", n.seq)
	id := rng.Uint64() | 1
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	call := n.h.Now()
	if err := c.PutWithID(ctx, id, []byte(key), []byte(v1)); err != nil {
		n.h.Add(porcupine.Operation{ClientId: probeClient, Input: kvInput{Put: true, Key: key, Value: v1}, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
		return
	}
	n.h.Add(porcupine.Operation{ClientId: probeClient, Input: kvInput{Put: true, Key: key, Value: v1}, Call: call, Output: kvOutput{}, Return: n.h.Now()})
	r, ok := c.RegionOf([]byte(key))
	leader, hasLeader := c.Leader(r.ID)
	if !ok || !hasLeader {
		return
	}
	var f uint64
	for _, pr := range r.Peers {
		if pr.StoreID != leader && !pr.IsLearner {
			f = pr.StoreID
		}
	}
	if f == 0 {
		return
	}
	n.log.add("retry-past-window", "put(%q) id %x, store %d lags, %d writes, retry", key, id, f, n.run.dedupWindow+3)
	lst, _ := c.Status(leader, r.ID)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if st, ok := c.Status(f, r.ID); ok && st.AppliedIndex >= lst.CommitIndex {
			break
		}
		n.sleep(2 * time.Millisecond)
	}
	lag := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		return m.ToStore == f && m.RegionID == r.ID && (m.Msg.Type == raftpb.MsgApp || m.Msg.Type == raftpb.MsgSnap), 0
	}))
	put := func(k, v string) bool {
		call := n.h.Now()
		err := c.Put(ctx, []byte(k), []byte(v))
		if k == key {
			out := kvOutput{}
			ret := n.h.Now()
			if err != nil {
				out, ret = kvOutput{Unknown: true}, -1
			}
			n.h.Add(porcupine.Operation{ClientId: probeClient, Input: kvInput{Put: true, Key: k, Value: v}, Call: call, Output: out, Return: ret})
		}
		return err == nil
	}
	if !put(key, v2) {
		lag()
		return
	}
	for i := uint64(0); i < n.run.dedupWindow+3; i++ {
		if !put(key+"~", fmt.Sprint(i)) {
			break
		}
	}
	// The retry, past the window: it may apply again (recorded as unknown).
	call = n.h.Now()
	_ = c.PutWithID(ctx, id, []byte(key), []byte(v1))
	n.h.Add(porcupine.Operation{ClientId: probeClient, Input: kvInput{Put: true, Key: key, Value: v1}, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
	lag()
	// Read on the leader and on the follower once it has caught up.
	for _, sid := range []uint64{leader, f} {
		s, up := c.Store(sid)
		if !up {
			continue
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		call := n.h.Now()
		v, found, _, err := s.Get(rctx, raftstore.ReadOptions{ReplicaRead: true}, []byte(key))
		rcancel()
		if err == nil {
			n.h.Add(porcupine.Operation{ClientId: probeClient, Input: kvInput{Key: key, Mode: fmt.Sprintf("store %d", sid)}, Call: call, Output: kvOutput{Value: string(v), Found: found}, Return: n.h.Now()})
			n.probes++
		}
	}
}

// recordRetried records a write that was sent twice under one request ID.
// With the dedup window at its default the two are one operation; with a
// tiny window the retry may legitimately apply again, so they are two
// writes of unknown outcome.
func recordRetried(h *kvmodel.History, client int, key, val string, call int64, err error, twice bool) {
	in := kvInput{Put: true, Key: key, Value: val}
	switch {
	case twice:
		h.Add(porcupine.Operation{ClientId: client, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
		h.Add(porcupine.Operation{ClientId: client, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
	case err != nil:
		h.Add(porcupine.Operation{ClientId: client, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
	default:
		h.Add(porcupine.Operation{ClientId: client, Input: in, Call: call, Output: kvOutput{}, Return: h.Now()})
	}
}

// powerLossEvery: with nemesisRun.powerLoss, the first fault and every
// this many after is a power loss.
const powerLossEvery = 4

// powerLoss cuts a store's power (a third of the time the store leading
// the picked region): it stops as kill -9 would, its disk loses what was
// never synced (its round log, checkpoint and snapshot files as a random
// crash mode says, bbolt's file page by page), and it restarts after the
// hold on what its disk kept. Everything it acknowledged was synced on a
// majority, so the history and the replica check see no difference.
func (n *nemesis) powerLoss(f faultPick) {
	victim := f.victim
	if f.hasLeader && n.rng.IntN(3) == 0 {
		victim = f.leader
	}
	mode := vfs.CrashMode(n.rng.IntN(3))
	if err := n.c.CutPower(victim, mode, n.rng); err != nil {
		n.reopenErrs = append(n.reopenErrs, fmt.Sprintf("cut store %d (%s): %v", victim, mode, err))
		return
	}
	n.log.add("power-loss", "store %d (%s; leader of region %d: %v) for %v", victim, mode, f.r.ID, victim == f.leader && f.hasLeader, f.hold)
	n.sleep(f.hold)
	if err := n.c.StartStore(victim); err != nil {
		n.reopenErrs = append(n.reopenErrs, fmt.Sprintf("store %d after a power loss (%s): %v", victim, mode, err))
	}
}
