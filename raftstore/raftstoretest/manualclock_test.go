package raftstoretest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/raft/v3/raftpb"
)

// These tests step the stores' time themselves (Options.ManualClock): a
// tick, a lease's end, a staleness bound and hibernation happen when the
// test moves the clock, and at no other moment.

const (
	tick           = 10 * time.Millisecond // the harness's default
	electionTicks  = 10                    // the harness's default
	heartbeatTicks = 2                     // raftstore's default
	// leaderLease is raftstore's: (ElectionTicks-2) ticks less the 10%
	// drift margin.
	leaderLease = 72 * time.Millisecond
)

func newManualCluster(t *testing.T, opts Options) *Cluster {
	t.Helper()
	opts.Dir, opts.ManualClock = t.TempDir(), true
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)
	return c
}

func (c *Cluster) mustTick(t *testing.T, n int) {
	t.Helper()
	if err := c.Tick(n); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) mustAdvance(t *testing.T, d time.Duration) {
	t.Helper()
	if err := c.Advance(d); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) mustStore(t *testing.T, id uint64) *raftstore.Store {
	t.Helper()
	s, ok := c.Store(id)
	if !ok {
		t.Fatalf("store %d is not running", id)
	}
	return s
}

// read reads key on store id with opts; a read that cannot be served
// gives up after a short real wait (time stands still, so waiting longer
// changes nothing).
func read(c *Cluster, id uint64, opts raftstore.ReadOptions, key string) (string, raftstore.ReadInfo, error) {
	s, ok := c.Store(id)
	if !ok {
		return "", raftstore.ReadInfo{}, raftstore.ErrStopped
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	v, _, info, err := s.Get(ctx, opts, []byte(key))
	return string(v), info, err
}

func put(t *testing.T, c *Cluster, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Put(ctx, []byte(key), []byte(value)); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// follower returns a running store that does not lead region 1.
func follower(t *testing.T, c *Cluster, leader uint64) uint64 {
	t.Helper()
	for _, id := range c.IDs() {
		if _, ok := c.Store(id); ok && id != leader {
			return id
		}
	}
	t.Fatal("no follower")
	return 0
}

// TestManualClockElectionComesFromTicks stops the leader and counts the
// ticks until the first campaign. Raft's promise: a follower campaigns
// once it has counted its randomized election timeout, in [E, 2E), of
// ticks since it last heard from the leader, which was at most
// HeartbeatTicks before the stop. Real time passing changes nothing.
func TestManualClockElectionComesFromTicks(t *testing.T) {
	c := newManualCluster(t, Options{})
	leader, err := c.WaitLeader(1, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := c.Status(leader, 1)
	var mu sync.Mutex
	var firstPreVote time.Time
	c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
		if m.Notice == nil && m.Msg.Type == raftpb.MsgPreVote {
			mu.Lock()
			if firstPreVote.IsZero() {
				// Sent in the round of the tick that started the
				// campaign: the clock reads that tick's time.
				firstPreVote = c.Clock().Now()
			}
			mu.Unlock()
		}
		return false, 0
	}))
	if err := c.StopStore(leader); err != nil {
		t.Fatal(err)
	}
	stopped := c.Clock().Now()
	campaigned := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return firstPreVote
	}

	// A pace: three election timeouts of real time, which must change
	// nothing, for the stores' time stands still.
	time.Sleep(3 * electionTicks * tick)
	if at := campaigned(); !at.IsZero() {
		t.Fatalf("a follower campaigned at %v with the clock standing still", at)
	}
	c.mustTick(t, electionTicks-heartbeatTicks-1)
	if at := campaigned(); !at.IsZero() {
		t.Fatalf("a follower campaigned %v after the leader stopped: sooner than E-H ticks", at.Sub(stopped))
	}
	if _, err := c.WaitLeader(1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	at := campaigned()
	if at.IsZero() {
		t.Fatal("a leader was elected with no pre-vote sent")
	}
	if d := at.Sub(stopped); d < (electionTicks-heartbeatTicks)*tick || d >= 2*electionTicks*tick {
		t.Fatalf("first campaign %v (%d ticks) after the leader stopped, want within [E-H, 2E) ticks", d, d/tick)
	}
	if nl, _ := c.Leader(1); nl == leader {
		t.Fatalf("store %d still leads", nl)
	} else if st2, _ := c.Status(nl, 1); st2.Term <= st.Term {
		t.Fatalf("new leader's term %d, want above %d", st2.Term, st.Term)
	}
}

// TestManualClockLeaderLeaseEndsOnTime cuts the leader off and moves the
// clock to just before its lease's end, where it still reads from the
// lease with no quorum, then past it, where it must not: the read falls
// back to ReadIndex, which a leader cut off cannot complete.
func TestManualClockLeaderLeaseEndsOnTime(t *testing.T) {
	c := newManualCluster(t, Options{})
	put(t, c, "k", "v1") // a commit of its term: the lease starts now
	leader, _ := c.Leader(1)
	if v, info, err := read(c, leader, raftstore.ReadOptions{}, "k"); err != nil || v != "v1" || info.Mode != readmode.Lease {
		t.Fatalf("read on the leader = %q %s %v, want v1 from the lease", v, info.Mode, err)
	}
	st, _ := c.Status(leader, 1)
	left := st.LeaseExpiry.Sub(c.Clock().Now())
	if left <= leaderLease-time.Microsecond || left > leaderLease {
		t.Fatalf("lease left %v, want %v: the clock has not moved since the write", left, leaderLease)
	}

	heal := c.Net.AddFilter(raftstore.IsolateFilter(leader))
	c.mustAdvance(t, left-time.Millisecond)
	if v, info, err := read(c, leader, raftstore.ReadOptions{}, "k"); err != nil || v != "v1" || info.Mode != readmode.Lease {
		t.Fatalf("1ms before the lease ends, a read on the cut-off leader = %q %s %v, want v1 from the lease", v, info.Mode, err)
	}
	c.mustAdvance(t, time.Millisecond)
	if v, info, err := read(c, leader, raftstore.ReadOptions{}, "k"); err == nil {
		t.Fatalf("at the lease's end, the cut-off leader read %q (%s): it must not serve without a quorum", v, info.Mode)
	}
	// Healed, the leader proves it leads with a ReadIndex round, which
	// renews the lease.
	heal()
	if v, info, err := read(c, leader, raftstore.ReadOptions{}, "k"); err != nil || v != "v1" || info.Mode != readmode.ReadIndex {
		t.Fatalf("healed, a read on the leader = %q %s %v, want v1 after a ReadIndex round", v, info.Mode, err)
	}
	if _, info, err := read(c, leader, raftstore.ReadOptions{}, "k"); err != nil || info.Mode != readmode.Lease {
		t.Fatalf("after the round, a read on the leader = %s %v, want the renewed lease", info.Mode, err)
	}
}

// TestManualClockFollowerLeaseEnds gives a follower a read lease, cuts it
// off, and moves the clock past the longest lease a grant gives: it must
// stop serving from the lease and find no other way to serve.
func TestManualClockFollowerLeaseEnds(t *testing.T) {
	c := newManualCluster(t, Options{FollowerLeases: true})
	// A new leader holds its first commits back for about a follower lease
	// (followerlease.go): let that time pass.
	c.mustTick(t, electionTicks)
	put(t, c, "k", "v1") // renews the leader's lease, from which grants are carved
	leader, _ := c.Leader(1)
	f := follower(t, c, leader)
	c.mustTick(t, 1) // followers ask for a grant on every tick
	replica := raftstore.ReadOptions{ReplicaRead: true}
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, info, err := read(c, f, replica, "k")
		if err == nil && v == "v1" && info.Mode == readmode.FollowerLease {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower %d never read from a lease: last %q %s %v", f, v, info.Mode, err)
		}
		// A bounded poll: the grant's answer is on its way; time stands still.
		time.Sleep(tick)
	}

	c.Net.AddFilter(raftstore.IsolateFilter(f))
	if v, info, err := read(c, f, replica, "k"); err != nil || v != "v1" || info.Mode != readmode.FollowerLease {
		t.Fatalf("cut off, with the clock where it was, follower %d read %q %s %v, want v1 from its lease", f, v, info.Mode, err)
	}
	c.mustAdvance(t, leaderLease) // the default follower lease, and its longest
	if v, info, err := read(c, f, replica, "k"); err == nil {
		t.Fatalf("after its lease ended, cut-off follower %d read %q (%s)", f, v, info.Mode)
	}
	if n := c.FollowerLeaseViolations(); n != 0 {
		t.Fatalf("%d follower-lease commit violations", n)
	}
}

// TestManualClockStaleBound reads stale from a follower cut off from its
// leader while the clock moves: the bound a read reports is its safe
// point's age plus MaxClockOffset, served up to MaxStaleness and refused
// one millisecond past it.
func TestManualClockStaleBound(t *testing.T) {
	c := newManualCluster(t, Options{})
	put(t, c, "k", "v1")
	leader, _ := c.Leader(1)
	f := follower(t, c, leader)
	c.mustTick(t, heartbeatTicks) // a heartbeat round carries a safe point
	const maxStaleness = 200 * time.Millisecond
	stale := raftstore.ReadOptions{MaxStaleness: maxStaleness}
	deadline := time.Now().Add(5 * time.Second)
	var bound time.Duration
	for {
		v, info, err := read(c, f, stale, "k")
		if err == nil && v == "v1" && info.Mode == readmode.Stale {
			bound = info.StalenessBound
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower %d never read stale: last %q %s %v", f, v, info.Mode, err)
		}
		// A bounded poll: the follower applies the write on its own loop.
		time.Sleep(tick)
	}

	c.Net.AddFilter(raftstore.IsolateFilter(f)) // no newer safe point
	c.mustAdvance(t, maxStaleness-bound)
	if v, info, err := read(c, f, stale, "k"); err != nil || v != "v1" || info.Mode != readmode.Stale || info.StalenessBound != maxStaleness {
		t.Fatalf("at the bound, follower %d read %q %s (bound %v) %v, want v1 stale within exactly %v", f, v, info.Mode, info.StalenessBound, err, maxStaleness)
	}
	c.mustAdvance(t, time.Millisecond)
	_, info, err := read(c, f, stale, "k")
	if notReady := (*region.DataIsNotReadyError)(nil); !errors.As(err, &notReady) {
		t.Fatalf("1ms past the bound, follower %d read %s %v, want DataIsNotReady", f, info.Mode, err)
	}
}

// TestManualClockHibernation lets a region idle: its leader hibernates
// after HibernateAfter's ticks without traffic, not before, and takes its
// followers along; asleep, the region sits out any number of ticks
// without an election; a write wakes it.
func TestManualClockHibernation(t *testing.T) {
	const quietTicks = 5
	c := newManualCluster(t, Options{HibernateAfter: quietTicks * tick})
	put(t, c, "k", "v1") // traffic: the idle count starts here
	leader, _ := c.Leader(1)
	st, _ := c.Status(leader, 1)
	for n := 1; ; n++ {
		c.mustTick(t, 1)
		if now, _ := c.Status(leader, 1); !now.Hibernating {
			if n > 2*quietTicks {
				t.Fatalf("leader %d still awake %d quiet ticks after the last write", leader, n)
			}
			continue
		}
		// idleTicks reaches the limit on tick quietTicks; the next
		// decides to hibernate.
		if n <= quietTicks {
			t.Fatalf("leader %d hibernated %d ticks after the last write, want more than %d", leader, n, quietTicks)
		}
		break
	}
	for _, id := range c.IDs() {
		if s, _ := c.Status(id, 1); !s.Hibernating {
			t.Fatalf("store %d's peer is awake after its leader's hibernate notice", id)
		}
	}
	c.mustTick(t, 3*electionTicks)
	for _, id := range c.IDs() {
		if s, _ := c.Status(id, 1); !s.Hibernating || s.Term != st.Term || s.LeaderStoreID != leader {
			t.Fatalf("after 3 election timeouts asleep, store %d: hibernating %v term %d leader %d; want asleep in term %d under %d",
				id, s.Hibernating, s.Term, s.LeaderStoreID, st.Term, leader)
		}
	}
	put(t, c, "k", "v2")
	if s, _ := c.Status(leader, 1); s.Hibernating {
		t.Fatal("a write did not wake the leader")
	}
}
