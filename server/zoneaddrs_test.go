package server

// Addresses per zone (the dial rule and the address book keeping them are
// tested in package controlplane): (TestWithStoreZoneAddresses) real stores and a client
// reaching each other through per-(zone, store) forwarders that stand in
// for the simulated WAN's proxies, and (TestWithStoreZoneAddressesRestart)
// such stores restarted on their data without forwarders, or behind new
// ones.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/client/clienttest"
	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestBadZoneAddrs: a server does not start with a bad zone address of its
// own.
func TestBadZoneAddrs(t *testing.T) {
	if _, err := New(Config{Store: raftstore.Config{StoreID: 1}, ListenAddr: "127.0.0.1:0", ZoneAddrs: map[string]string{"dc-a": "nope"}}); err == nil {
		t.Error("a server started with a bad zone address")
	}
}

// zoneForwarders puts a counting forwarder in front of every (zone, store)
// pair: fwd[zone][id] forwards to store id's listen address.
type zoneForwarders map[string]map[uint64]*clienttest.Forwarder

var testZones = []string{"dc-a", "dc-b", "dc-c"}

// add starts store id's forwarders, one per zone, to target and returns
// them as the store's zone addresses.
func (f zoneForwarders) add(t *testing.T, id uint64, target string) map[string]string {
	za := map[string]string{}
	for _, zone := range testZones {
		if f[zone] == nil {
			f[zone] = map[uint64]*clienttest.Forwarder{}
		}
		fw := clienttest.NewForwarder(t, target)
		f[zone][id] = fw
		za[zone] = fw.Addr()
	}
	return za
}

// tune gives each server of a test cluster its forwarders as its zone
// addresses, and no balancing.
func (f zoneForwarders) tune(t *testing.T) func(*Config) {
	return func(cfg *Config) {
		cfg.ZoneAddrs = f.add(t, cfg.Store.StoreID, cfg.Peers[cfg.Store.StoreID])
		cfg.DisableBalancing = true
	}
}

// startBehindForwarders starts three stores, each advertising its
// forwarders as its zone addresses, and waits for a leader.
func startBehindForwarders(t *testing.T) (*testCluster, zoneForwarders) {
	t.Helper()
	fwd := zoneForwarders{}
	c := newClusterWith(t, 3, nil, nil, fwd.tune(t))
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	c.waitLeader(t)
	return c, fwd
}

// transportAddr is where s's transport dials store id.
func transportAddr(s *Server, id uint64) string {
	s.trans.mu.Lock()
	defer s.trans.mu.Unlock()
	return s.trans.peers[id]
}

// TestWithStoreZoneAddresses: three stores in dc-a, dc-b and dc-c, each
// advertising a forwarder per zone. Every store learns the others' and
// dials each peer at the peer's address for its own zone, so raft
// traffic from the dc-a leader flows through the followers' dc-a
// forwarders; a client in dc-b, given the stores' direct addresses, reads
// through the dc-b forwarders; a store joining later is reached, and
// reaches the others, the same way.
func TestWithStoreZoneAddresses(t *testing.T) {
	c, fwd := startBehindForwarders(t)
	ctx := testCtx(t)

	// Every store learns the others' zone addresses from them, without
	// any listing of the stores (balancing is off), and dials them there.
	waitFor(t, 10*time.Second, "every store dialling its peers at their address for its zone", func() bool {
		for i, s := range c.servers {
			zone := testZones[i]
			for peer := uint64(1); peer <= 3; peer++ {
				if peer != uint64(i+1) && transportAddr(s, peer) != fwd[zone][peer].Addr() {
					return false
				}
			}
		}
		return true
	})

	// Lead from store 1 (dc-a), then replicate a large value: it reaches
	// the followers through their dc-a forwarders.
	c.leadFromStore1(ctx, t)
	value := bytes.Repeat([]byte("x"), 64<<10)
	up2, up3 := fwd["dc-a"][2].BytesUp(), fwd["dc-a"][3].BytesUp()
	put(ctx, t, c, 1, "big", string(value))
	waitFor(t, 10*time.Second, "the value replicated through the followers' dc-a forwarders", func() bool {
		return fwd["dc-a"][2].BytesUp()-up2 >= int64(len(value)) && fwd["dc-a"][3].BytesUp()-up3 >= int64(len(value))
	})
	// Nobody else sits in dc-a: store 1's own dc-a forwarder is unused.
	if n := fwd["dc-a"][1].Conns(); n != 0 {
		t.Errorf("store 1's dc-a forwarder accepted %d connections; no other store or client is in dc-a", n)
	}

	// The listing shows every store's zone addresses.
	stores, err := c.admin(t, 2).Stores(ctx, &kvpb.StoresRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stores.GetStores() {
		id := s.GetId()
		if s.GetAddress() != c.peers[id] || s.GetZoneAddresses()["dc-b"] != fwd["dc-b"][id].Addr() || len(s.GetZoneAddresses()) != 3 {
			t.Errorf("store %d listed as %v", id, s)
		}
	}

	readFromDCB(ctx, t, c, fwd, value)
	joinStore4InDCB(t, c, fwd)
	restartStore3Elsewhere(t, c, fwd)

	// A join with a bad zone address is refused.
	_, err = c.admin(t, 1).Join(ctx, &kvpb.JoinRequest{StoreId: 5, Address: deadAddr(t), ZoneAddresses: map[string]string{"dc-a": "nohostport"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("join with a bad zone address: %v, want InvalidArgument", err)
	}
}

// leadFromStore1 moves region 1's leadership to store 1 and waits until
// store 1 leads it.
func (c *testCluster) leadFromStore1(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := c.onLeader(t, 1, func(a kvpb.AdminClient) error {
		_, err := a.TransferLeader(ctx, &kvpb.TransferLeaderRequest{RegionId: 1, ToStoreId: 1})
		return err
	}); err != nil {
		t.Fatalf("transfer leader to store 1: %v", err)
	}
	waitFor(t, 15*time.Second, "store 1 leading region 1", func() bool {
		rs, ok := regionOn(c.server(1), 1)
		return ok && rs.IsLeader
	})
}

// readFromDCB: a client in dc-b, given the stores' direct addresses,
// reads key "big" (value) through the dc-b forwarders: leader reads from
// store 1, follower reads (whose ReadIndex round trip to store 1 crosses
// the WAN as well).
func readFromDCB(ctx context.Context, t *testing.T, c *testCluster, fwd zoneForwarders, value []byte) {
	t.Helper()
	cli, err := client.New(ctx, client.Config{Endpoints: []string{c.peers[1], c.peers[2], c.peers[3]}, Zone: "dc-b", DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	down1 := fwd["dc-b"][1].BytesDown()
	if v, err := cli.Get(ctx, []byte("big")); err != nil || !bytes.Equal(v, value) {
		t.Fatalf("leader read: %d bytes, %v", len(v), err)
	}
	if got := fwd["dc-b"][1].BytesDown() - down1; got < int64(len(value)) {
		t.Errorf("the leader read brought %d bytes through store 1's dc-b forwarder, want the %d byte value", got, len(value))
	}
	followerDown := func() int64 { return fwd["dc-b"][2].BytesDown() + fwd["dc-b"][3].BytesDown() }
	readIndexUp := func() int64 { return fwd["dc-b"][1].BytesUp() + fwd["dc-c"][1].BytesUp() }
	before, riBefore := followerDown(), readIndexUp()
	follower := cli.Session(client.ReadPolicy{Replica: client.ReplicaFollower})
	for range 2 {
		v, info, err := follower.GetWithInfo(ctx, []byte("big"))
		if err != nil || !bytes.Equal(v, value) || info.StoreID == 1 {
			t.Fatalf("follower read: %d bytes from store %d, %v", len(v), info.StoreID, err)
		}
	}
	if got := followerDown() - before; got < 2*int64(len(value)) {
		t.Errorf("two follower reads brought %d bytes through the followers' dc-b forwarders, want %d", got, 2*len(value))
	}
	if readIndexUp() == riBefore {
		t.Error("no raft traffic to the leader through its dc-b/dc-c forwarders during follower reads")
	}
	for _, peer := range []uint64{2, 3} {
		if got := transportAddr(c.server(peer), 1); got != fwd[testZones[peer-1]][1].Addr() {
			t.Errorf("store %d reaches the leader at %s, not through its %s forwarder", peer, got, testZones[peer-1])
		}
	}
}

// joinStore4InDCB: store 4 joins in dc-b with zone addresses of its own:
// the stores reach it at its address for their zone, it reaches them at
// theirs for dc-b, from the moment it has joined.
func joinStore4InDCB(t *testing.T, c *testCluster, fwd zoneForwarders) {
	t.Helper()
	lis4 := listen(t)
	cfg4 := Config{
		Store:            raftstore.Config{StoreID: 4, Zone: "dc-b", DataDir: t.TempDir(), NoSync: true, TickInterval: 10 * time.Millisecond, ElectionTicks: 40, Logger: testLogger(t)},
		Listener:         lis4,
		Join:             []string{c.peers[3]},
		ZoneAddrs:        fwd.add(t, 4, lis4.Addr().String()),
		DisableBalancing: true,
	}
	s4, err := New(cfg4)
	if err != nil {
		t.Fatal(err)
	}
	// Stopped by the cluster's cleanup too, but that one was registered
	// before s4's directory, which would be removed under the running
	// store (cleanups run last in, first out).
	c.servers = append(c.servers, s4)
	t.Cleanup(s4.Stop)
	if err := s4.Start(); err != nil {
		t.Fatalf("start joining store: %v", err)
	}
	for peer := uint64(1); peer <= 3; peer++ {
		if got := transportAddr(s4, peer); got != fwd["dc-b"][peer].Addr() {
			t.Errorf("joined store 4 dials store %d at %s, want its dc-b forwarder", peer, got)
		}
		if got, want := transportAddr(c.server(peer), 4), fwd[testZones[peer-1]][4].Addr(); got != want {
			t.Errorf("store %d dials joined store 4 at %s, want its %s forwarder %s", peer, got, testZones[peer-1], want)
		}
	}
}

// restartStore3Elsewhere restarts store 3 with other zone addresses. It
// dials the others through the addresses its book remembers from the
// start, and the leader, seeing its raft stream come back, asks it again
// and moves to its new dc-a address.
func restartStore3Elsewhere(t *testing.T, c *testCluster, fwd zoneForwarders) {
	t.Helper()
	cfg3 := c.server(3).cfg
	c.server(3).Stop()
	var lis3 net.Listener
	waitFor(t, 5*time.Second, "store 3's port free again", func() bool {
		var err error
		lis3, err = net.Listen("tcp", c.peers[3])
		return err == nil
	})
	oldA3 := fwd["dc-a"][3].Addr()
	cfg3.Listener, cfg3.StatusListener = lis3, nil
	cfg3.ZoneAddrs = fwd.add(t, 3, c.peers[3])
	s3, err := New(cfg3)
	if err != nil {
		t.Fatal(err)
	}
	c.servers[2] = s3
	if got := transportAddr(s3, 1); got != fwd["dc-c"][1].Addr() {
		t.Errorf("restarted store 3 dials store 1 at %s, not at the dc-c forwarder its book remembers", got)
	}
	if err := s3.Start(); err != nil {
		t.Fatalf("restart store 3: %v", err)
	}
	waitFor(t, 10*time.Second, "store 1 dialling restarted store 3 at its new dc-a address", func() bool {
		return transportAddr(c.server(1), 3) == fwd["dc-a"][3].Addr()
	})
	if fwd["dc-a"][3].Addr() == oldA3 {
		t.Fatal("store 3's new dc-a forwarder has the old one's address")
	}
}

// close closes every forwarder: the simulated WAN is gone.
func (f zoneForwarders) close() {
	for _, byStore := range f {
		for _, fw := range byStore {
			fw.Close()
		}
	}
}

// addrs is the set of the forwarders' addresses.
func (f zoneForwarders) addrs() map[string]bool {
	out := map[string]bool{}
	for _, byStore := range f {
		for _, fw := range byStore {
			out[fw.Addr()] = true
		}
	}
	return out
}

// bytesUp is what every forwarder has carried towards its store so far.
func (f zoneForwarders) bytesUp() int64 {
	var n int64
	for _, byStore := range f {
		for _, fw := range byStore {
			n += fw.BytesUp()
		}
	}
	return n
}

// addAvoiding is add on addresses none of avoid's forwarders had, so
// that a store's remembered (dead) address cannot come back to life as
// another store's forwarder.
func (f zoneForwarders) addAvoiding(t *testing.T, id uint64, target string, avoid map[string]bool) map[string]string {
	za := map[string]string{}
	for _, zone := range testZones {
		if f[zone] == nil {
			f[zone] = map[uint64]*clienttest.Forwarder{}
		}
		fw := clienttest.NewForwarder(t, target)
		for avoid[fw.Addr()] {
			fw.Close()
			fw = clienttest.NewForwarder(t, target)
		}
		f[zone][id] = fw
		za[zone] = fw.Addr()
	}
	return za
}

// stopAll stops every server of c.
func (c *testCluster) stopAll() {
	var wg sync.WaitGroup
	for _, s := range c.servers {
		wg.Go(s.Stop)
	}
	wg.Wait()
}

// reopenAll builds (but does not start) new servers in place of c's
// stopped ones, on the same data directories and listen addresses, each
// with the zone addresses zoneAddrs gives it (nil: none).
func (c *testCluster) reopenAll(t *testing.T, zoneAddrs func(id uint64) map[string]string) {
	t.Helper()
	for i, old := range c.servers {
		id := uint64(i + 1)
		cfg := old.cfg
		var lis net.Listener
		waitFor(t, 5*time.Second, fmt.Sprintf("store %d's port free again", id), func() bool {
			var err error
			lis, err = net.Listen("tcp", c.peers[id])
			return err == nil
		})
		cfg.Listener, cfg.StatusListener = lis, nil
		cfg.ZoneAddrs = zoneAddrs(id)
		s, err := New(cfg)
		if err != nil {
			_ = lis.Close()
			t.Fatalf("restart store %d: %v", id, err)
		}
		c.servers[i] = s // stopped by the cluster's cleanup
	}
}

// startAll starts every server of c.
func (c *testCluster) startAll(t *testing.T) {
	t.Helper()
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatalf("start store %d: %v", s.cfg.Store.StoreID, err)
		}
	}
}

// dialsAll reports whether every store of c dials each peer at
// want(its own id, the peer's id).
func (c *testCluster) dialsAll(want func(self, peer uint64) string) bool {
	for i, s := range c.servers {
		for peer := uint64(1); peer <= uint64(len(c.servers)); peer++ {
			if self := uint64(i + 1); peer != self && transportAddr(s, peer) != want(self, peer) {
				return false
			}
		}
	}
	return true
}

// writeWithin waits (at most d) for a leader of region 1 known to every
// store, then for a put of key on it to succeed, and returns the leader.
func (c *testCluster) writeWithin(t *testing.T, d time.Duration, key string, value []byte) uint64 {
	t.Helper()
	deadline := time.Now().Add(d)
	var leader uint64
	var lastErr error
	for {
		leader = 0
		for i, s := range c.servers {
			if rs, ok := regionOn(s, 1); ok && rs.IsLeader {
				leader = uint64(i + 1)
			}
		}
		if leader != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			lastErr = c.server(leader).Store().Put(ctx, raftstore.WriteOptions{}, []byte(key), value)
			cancel()
			if lastErr == nil {
				return leader
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write within %v (leader %d, last error %v)", d, leader, lastErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readOn reads key on store id's leader replica (a linearizable read).
func (c *testCluster) readOn(t *testing.T, id uint64, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, found, _, err := c.server(id).Store().Get(ctx, raftstore.ReadOptions{}, []byte(key))
	if err != nil || !found {
		t.Fatalf("get %s on store %d: found %v, %v", key, id, found, err)
	}
	return string(v)
}

// TestWithStoreZoneAddressesRestart: three stores run behind forwarders
// (the simulated WAN) and remember each other's forwarders. Restarted on
// the same data (a) without zone addresses, they ignore the remembered
// ones and reach each other directly; (b) behind new forwarders, they
// learn the new ones from each other's listen addresses at once and send
// raft traffic through them. Cutting a store's forwarders then still cuts
// it off: raft never falls back to the listen address.
func TestWithStoreZoneAddressesRestart(t *testing.T) {
	c, fwd := startBehindForwarders(t)
	first := func(self, peer uint64) string { return fwd[testZones[self-1]][peer].Addr() }
	waitFor(t, 10*time.Second, "every store dialling its peers at their forwarder for its zone", func() bool {
		return c.dialsAll(first)
	})
	c.writeWithin(t, restartBudget, "k0", []byte("v0"))

	dead := fwd.addrs()
	restartWithoutZoneAddrs(t, c, fwd, dead)
	fwd2 := restartBehindNewForwarders(t, c, first, dead)
	cutStore3(t, c, fwd2)
}

// restartBudget bounds the time from starting restarted stores to a write.
const restartBudget = 20 * time.Second

// restartWithoutZoneAddrs: (a) the WAN is gone: the stores restart
// without zone addresses. They remember the first forwarders (dead, their
// addresses), ignore them and reach each other directly.
func restartWithoutZoneAddrs(t *testing.T, c *testCluster, fwd zoneForwarders, dead map[string]bool) {
	t.Helper()
	c.stopAll()
	fwd.close()
	c.reopenAll(t, func(uint64) map[string]string { return nil })
	for _, s := range c.servers {
		if n := len(s.cp.AllZoneAddrs()); n != 2 {
			t.Fatalf("store %d's book remembers the zone addresses of %d stores, want its 2 peers'", s.cfg.Store.StoreID, n)
		}
		for peer, za := range s.cp.AllZoneAddrs() {
			if peer != s.cfg.Store.StoreID && !dead[za["dc-a"]] {
				t.Fatalf("store %d's book lost store %d's first forwarders: %v", s.cfg.Store.StoreID, peer, za)
			}
		}
	}
	direct := func(_, peer uint64) string { return c.peers[peer] }
	if !c.dialsAll(direct) {
		t.Error("(a) a store restarted without zone addresses dials a peer at a remembered zone address")
	}
	c.startAll(t)
	start := time.Now()
	leader := c.writeWithin(t, restartBudget, "k1", []byte("v1"))
	t.Logf("(a) without zone addresses: a write %v after the restart", time.Since(start).Round(time.Millisecond))
	if got := c.readOn(t, leader, "k0"); got != "v0" {
		t.Errorf("(a) k0 = %q, want v0", got)
	}
	if !c.dialsAll(direct) {
		t.Error("(a) a store without zone addresses dials a peer at a zone address")
	}
}

// restartBehindNewForwarders: (b) the stores restart behind new
// forwarders, on addresses no store has seen: each store starts dialling
// the dead ones its book remembers (first), and learns the new ones at
// its peers' listen addresses. It returns the new forwarders.
func restartBehindNewForwarders(t *testing.T, c *testCluster, first func(self, peer uint64) string, dead map[string]bool) zoneForwarders {
	t.Helper()
	fwd2 := zoneForwarders{}
	c.stopAll()
	c.reopenAll(t, func(id uint64) map[string]string {
		return fwd2.addAvoiding(t, id, c.peers[id], dead)
	})
	if !c.dialsAll(first) {
		t.Error("(b) the restarted stores do not start from the (dead) forwarders their books remember")
	}
	c.startAll(t)
	start := time.Now()
	leader := c.writeWithin(t, restartBudget, "k2", []byte("v2"))
	t.Logf("(b) behind new forwarders: a write %v after the restart", time.Since(start).Round(time.Millisecond))
	if got := c.readOn(t, leader, "k1"); got != "v1" {
		t.Errorf("(b) k1 = %q, want v1", got)
	}
	waitFor(t, 10*time.Second, "every store dialling its peers at their new forwarder for its zone", func() bool {
		return c.dialsAll(func(self, peer uint64) string { return fwd2[testZones[self-1]][peer].Addr() })
	})
	// A large value reaches both followers through the new forwarders.
	value := bytes.Repeat([]byte("y"), 64<<10)
	up := fwd2.bytesUp()
	c.writeWithin(t, restartBudget, "big", value)
	waitFor(t, 10*time.Second, "the value replicated through the new forwarders", func() bool {
		return fwd2.bytesUp()-up >= 2*int64(len(value))
	})
	return fwd2
}

// cutStore3: a partition cuts store 3's links (its forwarders and the
// ones it dials the others through), not its listen address: store 3
// gets no more raft traffic, and nobody dials it anywhere else.
func cutStore3(t *testing.T, c *testCluster, fwd zoneForwarders) {
	t.Helper()
	c.leadFromStore1(testCtx(t), t)
	for _, zone := range testZones {
		fwd[zone][3].Close()
	}
	fwd["dc-c"][1].Close()
	fwd["dc-c"][2].Close()
	time.Sleep(300 * time.Millisecond) // what was in flight lands
	rs3, _ := regionOn(c.server(3), 1)
	c.writeWithin(t, restartBudget, "cut", []byte("off"))
	// Nothing may arrive: a window, not a wait for something to happen.
	time.Sleep(time.Second)
	if rs, _ := regionOn(c.server(3), 1); rs.AppliedIndex != rs3.AppliedIndex {
		t.Errorf("store 3 applied up to %d, from %d, while cut off", rs.AppliedIndex, rs3.AppliedIndex)
	}
	for peer := uint64(1); peer <= 2; peer++ {
		if got, want := transportAddr(c.server(peer), 3), fwd[testZones[peer-1]][3].Addr(); got != want {
			t.Errorf("store %d dials cut-off store 3 at %s, not at its (cut) forwarder %s", peer, got, want)
		}
	}
}
