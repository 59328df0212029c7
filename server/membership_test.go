package server

// Splits, replicas and joins over real stores (TestWithStore*: in-process
// servers on 127.0.0.1:0 over the real raftstore), plus a damaged address
// book, the transport's address changes and the cluster view.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// noBalancing keeps the stores from moving replicas and leaders by
// themselves, so the tests below see only the changes they make.
func noBalancing(cfg *Config) { cfg.DisableBalancing = true }

// startQuietCluster starts n stores that do not balance.
func startQuietCluster(t *testing.T, n int) *testCluster {
	t.Helper()
	c := newClusterWith(t, n, nil, nil, noBalancing)
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	c.waitLeader(t)
	return c
}

// regionOn returns server s's view of region id.
func regionOn(s *Server, id uint64) (raftstore.RegionStatus, bool) {
	for _, rs := range s.Store().Regions() {
		if rs.Region.ID == id {
			return rs, true
		}
	}
	return raftstore.RegionStatus{}, false
}

// leaderOf waits until some running server leads region id.
func (c *testCluster) leaderOf(t *testing.T, id uint64) uint64 {
	t.Helper()
	var leader uint64
	waitFor(t, 15*time.Second, fmt.Sprintf("a leader of region %d", id), func() bool {
		for i, s := range c.servers {
			if rs, ok := regionOn(s, id); ok && rs.IsLeader {
				leader = uint64(i + 1)
				return true
			}
		}
		return false
	})
	return leader
}

// onLeader runs call against region id's leader, following NotLeader
// answers and waiting out elections, until it succeeds with something
// else or the test's patience ends.
func (c *testCluster) onLeader(t *testing.T, id uint64, call func(kvpb.AdminClient) error) error {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := call(c.admin(t, c.leaderOf(t, id)))
		var nl *region.NotLeaderError
		retry := errors.As(kvpb.RegionErrorFromStatus(err).ToError(), &nl) || status.Code(err) == codes.Unavailable
		if !retry || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func peerStores(r region.Region) (voters, learners []uint64) {
	for _, p := range r.Peers {
		if p.IsLearner {
			learners = append(learners, p.StoreID)
		} else {
			voters = append(voters, p.StoreID)
		}
	}
	slices.Sort(voters)
	slices.Sort(learners)
	return voters, learners
}

func put(ctx context.Context, t *testing.T, c *testCluster, regionID uint64, key, value string) {
	t.Helper()
	waitFor(t, 15*time.Second, "put "+key, func() bool {
		_, err := c.kv(t, c.leaderOf(t, regionID)).Put(ctx, &kvpb.PutRequest{Key: []byte(key), Value: []byte(value)})
		return err == nil
	})
}

// replicaRead reads key from store id through ReadIndex (follower read).
func replicaRead(ctx context.Context, t *testing.T, c *testCluster, id uint64, key string) (string, error) {
	t.Helper()
	g, err := c.kv(t, id).Get(ctx, &kvpb.GetRequest{Context: &kvpb.ReadContext{ReplicaRead: true}, Key: []byte(key)})
	if err != nil {
		return "", err
	}
	if g.GetReadInfo().GetStoreId() != id {
		return "", fmt.Errorf("served by store %d, not %d", g.GetReadInfo().GetStoreId(), id)
	}
	if g.GetNotFound() {
		return "", errors.New("not found")
	}
	return string(g.GetValue()), nil
}

// TestWithStoreSplit: Admin.Split on a three-store cluster; both regions
// are then listed as `ctl regions` lists them (client.Regions), every
// store hosts both, and each serves its half.
func TestWithStoreSplit(t *testing.T) {
	c := startQuietCluster(t, 3)
	ctx := testCtx(t)
	for _, k := range []string{"a", "c", "m", "q", "z"} {
		put(ctx, t, c, 1, k, "v-"+k)
	}
	leader := c.leaderOf(t, 1)
	follower := leader%3 + 1

	// Not on a follower: NotLeader, pointing at the leader.
	_, err := c.admin(t, follower).Split(ctx, &kvpb.SplitRequest{Key: []byte("m")})
	var nl *region.NotLeaderError
	if status.Code(err) != codes.FailedPrecondition || !errors.As(kvpb.RegionErrorFromStatus(err).ToError(), &nl) || nl.Leader == nil || nl.Leader.StoreID != leader {
		t.Fatalf("split on a follower: %v, want NotLeader naming store %d", err, leader)
	}

	var resp *kvpb.SplitResponse
	if err := c.onLeader(t, 1, func(a kvpb.AdminClient) (err error) {
		resp, err = a.Split(ctx, &kvpb.SplitRequest{Key: []byte("m")})
		return err
	}); err != nil {
		t.Fatalf("split: %v", err)
	}
	left, right := resp.GetLeft().ToRegion(), resp.GetRight().ToRegion()
	if left.ID != 1 || len(left.StartKey) != 0 || string(left.EndKey) != "m" || left.Epoch.Version != 2 {
		t.Errorf("left %s", left.String())
	}
	// Region IDs read as a sequence: the cluster's first split makes 2.
	if right.ID != 2 || string(right.StartKey) != "m" || len(right.EndKey) != 0 || right.Epoch.Version != 2 {
		t.Errorf("right %s", right.String())
	}
	if v, _ := peerStores(right); !slices.Equal(v, []uint64{1, 2, 3}) {
		t.Errorf("right half's replicas on stores %v, want 1, 2, 3", v)
	}
	if err := c.onLeader(t, 1, func(a kvpb.AdminClient) error {
		_, err := a.Split(ctx, &kvpb.SplitRequest{Key: []byte("m")})
		return err
	}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("split at a region boundary: %v, want InvalidArgument", err)
	}

	// Every store hosts both halves.
	waitFor(t, 15*time.Second, "both regions on every store", func() bool {
		for _, s := range c.servers {
			l, ok1 := regionOn(s, left.ID)
			r, ok2 := regionOn(s, right.ID)
			if !ok1 || !ok2 || l.Region.Epoch != left.Epoch || r.Region.Epoch != right.Epoch {
				return false
			}
		}
		return true
	})

	// ctl regions' view: the client merges every store's answer.
	cli, err := client.New(ctx, client.Config{Endpoints: []string{c.server(1).Addr(), c.server(2).Addr(), c.server(3).Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	waitFor(t, 15*time.Second, "ctl regions listing both halves with leaders", func() bool {
		infos, err := cli.Regions(ctx)
		if err != nil || len(infos) != 2 {
			return false
		}
		l, r := infos[0].Region, infos[1].Region
		return l.ID == left.ID && string(l.EndKey) == "m" && r.ID == right.ID && string(r.StartKey) == "m" &&
			infos[0].LeaderStoreID != 0 && infos[1].LeaderStoreID != 0
	})

	// Each half serves its keys, old and new.
	put(ctx, t, c, right.ID, "x", "new-x")
	put(ctx, t, c, left.ID, "b", "new-b")
	for key, want := range map[string]string{"a": "v-a", "b": "new-b", "m": "v-m", "x": "new-x", "z": "v-z"} {
		if got, err := cli.Get(ctx, []byte(key)); err != nil || string(got) != want {
			t.Errorf("get %s = %q, %v; want %q", key, got, err, want)
		}
	}
	// A key of the right half is not the left half's.
	_, err = c.kv(t, c.leaderOf(t, left.ID)).Put(ctx, &kvpb.PutRequest{Context: &kvpb.WriteContext{RegionId: left.ID}, Key: []byte("x"), Value: []byte("no")})
	if kvpb.RegionErrorFromStatus(err) == nil {
		t.Errorf("put of a right-half key into the left region: %v, want a region error", err)
	}

	// The client splits too, at the leader of the key's region.
	l2, r2, err := cli.Split(ctx, []byte("t"))
	if err != nil {
		t.Fatalf("client split: %v", err)
	}
	if l2.ID != right.ID || string(l2.EndKey) != "t" || string(r2.StartKey) != "t" || len(r2.EndKey) != 0 {
		t.Errorf("client split: left %s right %s", l2.String(), r2.String())
	}
	if got, err := cli.Get(ctx, []byte("z")); err != nil || string(got) != "v-z" {
		t.Errorf("get z after the second split = %q, %v", got, err)
	}
}

// TestWithStoreJoinAndMembership: a fourth store joins with only a join
// address, gets a replica of region 1 by AddPeer and serves follower
// reads; replicas of the original stores are removed (a follower's, then
// the leader's own) and the region keeps serving; the joined store
// restarts from its remembered address book without joining again.
// TestWithStoreRegionIDFromAPeer: a store with no replica of the first
// region, which keeps the cluster's region ID counter, splits a region it
// leads with the next ID of the sequence, asked of a peer over gRPC
// (Raft.AllocRegionID).
func TestWithStoreRegionIDFromAPeer(t *testing.T) {
	c := startQuietCluster(t, 3)
	ctx := testCtx(t)
	split := func(admin kvpb.AdminClient, key string) (*kvpb.SplitResponse, error) {
		return admin.Split(ctx, &kvpb.SplitRequest{Key: []byte(key)})
	}
	if err := c.onLeader(t, 1, func(a kvpb.AdminClient) error { _, err := split(a, "m"); return err }); err != nil {
		t.Fatalf("split at m: %v", err)
	}
	joinStore4(ctx, t, c)
	if err := c.onLeader(t, 2, func(a kvpb.AdminClient) error {
		_, err := a.AddPeer(ctx, &kvpb.AddPeerRequest{RegionId: 2, StoreId: 4})
		return err
	}); err != nil {
		t.Fatalf("add region 2 on store 4: %v", err)
	}
	if err := c.onLeader(t, 2, func(a kvpb.AdminClient) error {
		_, err := a.TransferLeader(ctx, &kvpb.TransferLeaderRequest{RegionId: 2, ToStoreId: 4})
		return err
	}); err != nil {
		t.Fatalf("move region 2's leader to store 4: %v", err)
	}
	waitFor(t, 15*time.Second, "store 4 leading region 2", func() bool { return c.leaderOf(t, 2) == 4 })
	if _, ok := regionOn(c.server(4), 1); ok {
		t.Fatal("store 4 holds region 1")
	}
	resp, err := split(c.admin(t, 4), "p")
	if err != nil {
		t.Fatalf("split at p on store 4: %v", err)
	}
	if id := resp.GetRight().ToRegion().ID; id != 3 {
		t.Fatalf("store 4's split made region %d, want 3", id)
	}
}

func TestWithStoreJoinAndMembership(t *testing.T) {
	c := startQuietCluster(t, 3)
	ctx := testCtx(t)
	for i := range 20 {
		put(ctx, t, c, 1, fmt.Sprintf("k%02d", i), fmt.Sprintf("v%02d", i))
	}
	j := joinStore4(ctx, t, c)

	// Joining with a live store's id is refused, and changes nothing.
	if _, err := c.admin(t, 1).Join(ctx, &kvpb.JoinRequest{StoreId: 2, Address: deadAddr(t)}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("join as live store 2: %v, want AlreadyExists", err)
	}
	if got := c.server(1).Peers(); !maps.Equal(got, j.book) {
		t.Errorf("address book after a refused join %v", got)
	}

	addReplicaOn4(ctx, t, c)
	removeFollowerReplica(ctx, t, c)
	removeLeaderReplica(ctx, t, c)
	j.restart(ctx, t, c)
}

// joined is store 4, joined to a running cluster.
type joined struct {
	cfg  Config
	dir  string
	addr string
	book map[uint64]string // every store's address book once it joined
}

// joinStore4 starts store 4 knowing only store 2's address, and checks
// that every store knows it and that it holds no region yet.
func joinStore4(ctx context.Context, t *testing.T, c *testCluster) *joined {
	t.Helper()
	dir4 := t.TempDir()
	lis4 := listen(t)
	j := &joined{dir: dir4, addr: lis4.Addr().String()}
	j.cfg = Config{
		Store:            raftstore.Config{StoreID: 4, Zone: "dc-d", DataDir: dir4, NoSync: true, TickInterval: 10 * time.Millisecond, ElectionTicks: 40, Logger: testLogger(t)},
		Listener:         lis4,
		Join:             []string{c.server(2).Addr()},
		DisableBalancing: true,
	}
	s4, err := New(j.cfg)
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
	j.book = maps.Clone(c.peers)
	j.book[4] = j.addr
	for i, s := range c.servers {
		if got := s.Peers(); !maps.Equal(got, j.book) {
			t.Errorf("store %d's address book %v, want %v", i+1, got, j.book)
		}
	}
	if len(s4.Store().Regions()) != 0 {
		t.Errorf("the joined store bootstrapped regions: %v", s4.Store().Regions())
	}
	stores, err := c.admin(t, 1).Stores(ctx, &kvpb.StoresRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(stores.GetStores()); n != 4 {
		t.Fatalf("stores %v", stores)
	}
	if s := stores.GetStores()[3]; s.GetId() != 4 || !s.GetUp() || s.GetZone() != "dc-d" || s.GetAddress() != j.addr || s.GetRegionCount() != 0 {
		t.Errorf("store 4 as listed: %v", s)
	}
	return j
}

// addReplicaOn4: region 1 gains a voter on store 4, which then serves
// follower reads of old and new writes.
func addReplicaOn4(ctx context.Context, t *testing.T, c *testCluster) {
	t.Helper()
	if err := c.onLeader(t, 1, func(a kvpb.AdminClient) error {
		_, err := a.AddPeer(ctx, &kvpb.AddPeerRequest{RegionId: 1, StoreId: 4})
		return err
	}); err != nil {
		t.Fatalf("add peer on store 4: %v", err)
	}
	r, _ := regionOn(c.server(c.leaderOf(t, 1)), 1)
	if v, l := peerStores(r.Region); !slices.Equal(v, []uint64{1, 2, 3, 4}) || len(l) != 0 {
		t.Fatalf("region 1 after add peer: voters %v learners %v", v, l)
	}
	waitFor(t, 15*time.Second, "a follower read on store 4", func() bool {
		v, err := replicaRead(ctx, t, c, 4, "k07")
		return err == nil && v == "v07"
	})
	put(ctx, t, c, 1, "after-add", "yes")
	if v, err := replicaRead(ctx, t, c, 4, "after-add"); err != nil || v != "yes" {
		t.Errorf("follower read on store 4 of a later write = %q, %v", v, err)
	}
}

// removeFollowerReplica removes a follower's replica of region 1 (not
// store 4's): the store drops it, and the region keeps serving.
func removeFollowerReplica(ctx context.Context, t *testing.T, c *testCluster) {
	t.Helper()
	leader := c.leaderOf(t, 1)
	var victim uint64
	for _, id := range []uint64{1, 2, 3} {
		if id != leader {
			victim = id
			break
		}
	}
	if err := c.onLeader(t, 1, func(a kvpb.AdminClient) error {
		_, err := a.RemovePeer(ctx, &kvpb.RemovePeerRequest{RegionId: 1, StoreId: victim})
		return err
	}); err != nil {
		t.Fatalf("remove peer on store %d: %v", victim, err)
	}
	r, _ := regionOn(c.server(c.leaderOf(t, 1)), 1)
	if _, ok := r.Region.PeerOnStore(victim); ok || len(r.Region.Peers) != 3 {
		t.Fatalf("region 1 after removing store %d: %s", victim, r.Region.String())
	}
	waitFor(t, 15*time.Second, fmt.Sprintf("store %d to drop its replica", victim), func() bool {
		_, ok := regionOn(c.server(victim), 1)
		return !ok
	})
	put(ctx, t, c, 1, "after-remove", "still")
	if v, err := replicaRead(ctx, t, c, 4, "after-remove"); err != nil || v != "still" {
		t.Errorf("follower read on store 4 after the removal = %q, %v", v, err)
	}
}

// removeLeaderReplica removes the leader's own replica of region 1: it
// hands leadership away first and answers NotLeader naming the new
// leader, where the removal succeeds.
func removeLeaderReplica(ctx context.Context, t *testing.T, c *testCluster) {
	t.Helper()
	leader := c.leaderOf(t, 1)
	_, err := c.admin(t, leader).RemovePeer(ctx, &kvpb.RemovePeerRequest{RegionId: 1, StoreId: leader})
	var nl *region.NotLeaderError
	if !errors.As(kvpb.RegionErrorFromStatus(err).ToError(), &nl) {
		t.Fatalf("removing the leader's own replica: %v, want NotLeader", err)
	}
	if nl.Leader != nil && nl.Leader.StoreID == leader {
		t.Fatalf("NotLeader names the old leader %d", leader)
	}
	if err := c.onLeader(t, 1, func(a kvpb.AdminClient) error {
		_, err := a.RemovePeer(ctx, &kvpb.RemovePeerRequest{RegionId: 1, StoreId: leader})
		return err
	}); err != nil {
		t.Fatalf("remove the old leader's replica at the new leader: %v", err)
	}
	r, _ := regionOn(c.server(c.leaderOf(t, 1)), 1)
	if v, _ := peerStores(r.Region); len(v) != 2 || !slices.Contains(v, 4) || slices.Contains(v, leader) {
		t.Fatalf("region 1 after removing the old leader %d: %s", leader, r.Region.String())
	}
	put(ctx, t, c, 1, "two-left", "ok")
	if v, err := replicaRead(ctx, t, c, 4, "two-left"); err != nil || v != "ok" {
		t.Errorf("read on store 4 with two replicas left = %q, %v", v, err)
	}
}

// restart restarts store 4: its address book is on disk, so it starts at
// once even though its only join address is dead now.
func (j *joined) restart(ctx context.Context, t *testing.T, c *testCluster) {
	t.Helper()
	if data, err := os.ReadFile(filepath.Join(j.dir, "peers.json")); err != nil || !strings.Contains(string(data), j.addr) {
		t.Fatalf("peers.json: %q, %v", data, err)
	}
	c.servers[3].Stop()
	var lis net.Listener
	waitFor(t, 5*time.Second, "store 4's port free again", func() bool {
		var err error
		lis, err = net.Listen("tcp", j.addr)
		return err == nil
	})
	cfg := j.cfg
	cfg.Listener = lis
	cfg.Join = []string{deadAddr(t)}
	cfg.JoinTimeout = time.Second
	s4, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.servers[3] = s4
	start := time.Now()
	if err := s4.Start(); err != nil {
		t.Fatalf("restart store 4: %v", err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("restart took %v: it tried to join again", d)
	}
	if got := s4.Peers(); !maps.Equal(got, j.book) {
		t.Errorf("restarted store 4's address book %v, want %v", got, j.book)
	}
	waitFor(t, 15*time.Second, "store 4 serving again after its restart", func() bool {
		v, err := replicaRead(ctx, t, c, 4, "two-left")
		return err == nil && v == "ok"
	})
}

// TestWithStoreJoinFails: a store that cannot reach any join address, or
// is refused, fails to start with a clear error, in bounded time.
func TestWithStoreJoinFails(t *testing.T) {
	c := startQuietCluster(t, 1)
	for _, tc := range []struct {
		name string
		id   uint64
		join string
		want string
	}{
		{"nobody answers", 5, deadAddr(t), "could not join"},
		{"id taken", 1, c.server(1).Addr(), "AlreadyExists"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Config{
				Store:       raftstore.Config{StoreID: tc.id, DataDir: t.TempDir(), NoSync: true, TickInterval: 10 * time.Millisecond, Logger: testLogger(t)},
				Listener:    listen(t),
				Join:        []string{tc.join},
				JoinTimeout: time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			start := time.Now()
			err = s.Start()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("start: %v, want an error mentioning %q", err, tc.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("failing to join took %v", d)
			}
		})
	}
	if got := c.server(1).Peers(); len(got) != 1 {
		t.Errorf("store 1's address book after refused joins: %v", got)
	}
}

// badRequest is a request that must be refused with code, with a region
// error detail or not.
type badRequest struct {
	name         string
	call         func() error
	code         codes.Code
	regionDetail bool
}

// refused makes the request and fails t unless it is refused with the
// code, with a region error detail or not as tc says.
func (tc badRequest) refused(t *testing.T) {
	t.Helper()
	err := tc.call()
	if got := status.Code(err); got != tc.code {
		t.Fatalf("got %v (%v), want %v", got, err, tc.code)
	}
	if re := kvpb.RegionErrorFromStatus(err); (re != nil) != tc.regionDetail {
		t.Fatalf("region error detail %v, want present=%v", re, tc.regionDetail)
	}
}

// badMembershipRequests are Split, AddPeer, RemovePeer and Join requests
// that a one-store cluster holding region 1 must refuse.
func badMembershipRequests(ctx context.Context, admin kvpb.AdminClient) []badRequest {
	bigKey := bytes.Repeat([]byte("k"), MaxKeySize+1)
	return []badRequest{
		{"split empty key", func() error { _, err := admin.Split(ctx, &kvpb.SplitRequest{}); return err }, codes.InvalidArgument, false},
		{"split big key", func() error { _, err := admin.Split(ctx, &kvpb.SplitRequest{Key: bigKey}); return err }, codes.InvalidArgument, false},
		{"add peer region 0", func() error {
			_, err := admin.AddPeer(ctx, &kvpb.AddPeerRequest{StoreId: 1})
			return err
		}, codes.InvalidArgument, false},
		{"add peer store 0", func() error {
			_, err := admin.AddPeer(ctx, &kvpb.AddPeerRequest{RegionId: 1})
			return err
		}, codes.InvalidArgument, false},
		{"add peer unknown store", func() error {
			_, err := admin.AddPeer(ctx, &kvpb.AddPeerRequest{RegionId: 1, StoreId: 9})
			return err
		}, codes.InvalidArgument, false},
		{"add peer unknown region", func() error {
			_, err := admin.AddPeer(ctx, &kvpb.AddPeerRequest{RegionId: 999, StoreId: 1})
			return err
		}, codes.NotFound, true},
		{"remove peer region 0", func() error {
			_, err := admin.RemovePeer(ctx, &kvpb.RemovePeerRequest{StoreId: 1})
			return err
		}, codes.InvalidArgument, false},
		{"remove peer store 0", func() error {
			_, err := admin.RemovePeer(ctx, &kvpb.RemovePeerRequest{RegionId: 1})
			return err
		}, codes.InvalidArgument, false},
		{"remove peer unknown region", func() error {
			_, err := admin.RemovePeer(ctx, &kvpb.RemovePeerRequest{RegionId: 999, StoreId: 1})
			return err
		}, codes.NotFound, true},
		{"remove the last voter", func() error {
			_, err := admin.RemovePeer(ctx, &kvpb.RemovePeerRequest{RegionId: 1, StoreId: 1})
			return err
		}, codes.InvalidArgument, false},
		{"join store 0", func() error {
			_, err := admin.Join(ctx, &kvpb.JoinRequest{Address: "127.0.0.1:1"})
			return err
		}, codes.InvalidArgument, false},
		{"join store id too big", func() error {
			_, err := admin.Join(ctx, &kvpb.JoinRequest{StoreId: 1 << 16, Address: "127.0.0.1:1"})
			return err
		}, codes.InvalidArgument, false},
		{"join without address", func() error {
			_, err := admin.Join(ctx, &kvpb.JoinRequest{StoreId: 7})
			return err
		}, codes.InvalidArgument, false},
		{"join with a bad address", func() error {
			_, err := admin.Join(ctx, &kvpb.JoinRequest{StoreId: 7, Address: "no-port"})
			return err
		}, codes.InvalidArgument, false},
		{"join with a huge zone", func() error {
			_, err := admin.Join(ctx, &kvpb.JoinRequest{StoreId: 7, Address: "127.0.0.1:1", Zone: strings.Repeat("z", 1000)})
			return err
		}, codes.InvalidArgument, false},
		{"join as this store", func() error {
			_, err := admin.Join(ctx, &kvpb.JoinRequest{StoreId: 1, Address: "127.0.0.1:1"})
			return err
		}, codes.AlreadyExists, false},
	}
}

// TestWithStoreMembershipValidation: bad Split, AddPeer, RemovePeer and
// Join requests get their codes and change nothing.
func TestWithStoreMembershipValidation(t *testing.T) {
	c := startQuietCluster(t, 1)
	kv := c.kv(t, 1)
	admin := c.admin(t, 1)
	ctx := testCtx(t)
	if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte("k0"), Value: []byte("v0")}); err != nil {
		t.Fatalf("put: %v", err)
	}
	for _, tc := range badMembershipRequests(ctx, admin) {
		t.Run(tc.name, func(t *testing.T) {
			tc.refused(t)
			if got := scanAll(ctx, t, kv); !maps.Equal(got, map[string]string{"k0": "v0"}) {
				t.Fatalf("data changed to %v", got)
			}
			rs := c.server(1).Store().Regions()
			if len(rs) != 1 || len(rs[0].Region.Peers) != 1 || rs[0].Region.Epoch != (region.Epoch{ConfVer: 1, Version: 1}) {
				t.Fatalf("regions changed to %v", rs)
			}
			if got := c.server(1).Peers(); len(got) != 1 {
				t.Fatalf("address book changed to %v", got)
			}
		})
	}

	conn := dial(t, c.server(1).Addr())
	for _, method := range []string{"/hedgekv.Admin/Split", "/hedgekv.Admin/AddPeer", "/hedgekv.Admin/RemovePeer", "/hedgekv.Admin/Join"} {
		var out []byte
		err := conn.Invoke(ctx, method, []byte{0x0f}, &out, grpc.ForceCodec(rawCodec{}))
		if code := status.Code(err); code == codes.OK || code == codes.Unknown {
			t.Errorf("%s with garbage: code %v (%v), want a clear refusal", method, code, err)
		}
	}
}

// TestWithStoreLearnsPeers: a store that missed a join learns the
// newcomer from another store's Status when it lists the stores.
func TestWithStoreLearnsPeers(t *testing.T) {
	c := startQuietCluster(t, 2)
	ctx := testCtx(t)
	ghost := deadAddr(t)
	if err := c.server(1).cp.SetPeers(map[uint64]string{9: ghost}, true); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.server(2).Peers()[9]; ok {
		t.Fatal("store 2 knew store 9 already")
	}
	stores, err := c.admin(t, 2).Stores(ctx, &kvpb.StoresRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.server(2).Peers()[9]; got != ghost {
		t.Fatalf("store 2's address for store 9: %q, want %q (listing %v)", got, ghost, stores)
	}
	// The next listing (after the cache) includes it, down.
	waitFor(t, 5*time.Second, "store 9 listed by store 2", func() bool {
		stores, err := c.admin(t, 2).Stores(ctx, &kvpb.StoresRequest{})
		if err != nil || len(stores.GetStores()) != 3 {
			return false
		}
		s := stores.GetStores()[2]
		return s.GetId() == 9 && !s.GetUp() && s.GetAddress() == ghost
	})
	// Known stores keep their address: learning never overwrites.
	c.server(2).cp.LearnPeers(map[uint64]string{1: "127.0.0.1:1"})
	if got := c.server(2).Peers()[1]; got != c.peers[1] {
		t.Errorf("learning changed store 1's address to %q", got)
	}
}

// TestWithStoreClusterView: the view lists every store with its counts
// (this one included, down ones with the zone they joined with), shares
// one listing among callers for its TTL, and lists again after a change.
func TestWithStoreClusterView(t *testing.T) {
	dead := deadAddr(t)
	c := newClusterWith(t, 2, map[uint64]string{3: dead}, nil, noBalancing)
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
	}
	c.waitLeader(t)
	ctx := testCtx(t)
	cp := c.server(1).cp
	v := cp.ClusterView()
	cp.NoteZone(3, "dc-z")
	cp.InvalidateView()
	statusCalls := func() float64 {
		return testutilCounter(c.server(2).metrics.requests.WithLabelValues("Admin.Status", "OK"))
	}
	before := statusCalls()
	infos := v.Stores(ctx)
	if len(infos) != 3 {
		t.Fatalf("view %+v", infos)
	}
	leaders := 0
	for i, in := range infos {
		if in.ID != uint64(i+1) {
			t.Fatalf("view not sorted by id: %+v", infos)
		}
		leaders += in.LeaderCount
	}
	if !infos[0].Up || !infos[1].Up || infos[0].Zone != "dc-a" || infos[1].Zone != "dc-b" || infos[0].RegionCount != 1 || infos[1].RegionCount != 1 || leaders != 1 {
		t.Errorf("live stores in the view: %+v", infos)
	}
	if infos[2].Up || infos[2].Zone != "dc-z" {
		t.Errorf("down store in the view: %+v", infos[2])
	}
	for range 5 {
		v.Stores(ctx)
		if _, err := c.admin(t, 1).Stores(ctx, &kvpb.StoresRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := statusCalls() - before; n != 1 {
		t.Errorf("store 2 was asked for its status %v times within the TTL, want 1", n)
	}
	cp.InvalidateView()
	v.Stores(ctx)
	if n := statusCalls() - before; n != 2 {
		t.Errorf("after invalidate: %v status calls, want 2", n)
	}
	// A caller that cannot wait gets the last listing, not an empty one.
	cp.InvalidateView()
	done, cancel := context.WithCancel(ctx)
	cancel()
	if got := v.Stores(done); len(got) == 0 || !slices.ContainsFunc(got, func(s raftstore.StoreInfo) bool { return s.ID == 1 }) {
		t.Errorf("view with a cancelled context: %+v", got)
	}
}

// TestDamagedAddressBook: a damaged address book stops the server from
// starting rather than being silently replaced.
func TestDamagedAddressBook(t *testing.T) {
	for _, bad := range []string{"{", `{"peers":{"x":"h:1"}}`, `{"peers":{"0":"h:1"}}`, `{"peers":{"1":""}}`} {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, "peers.json"), []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := New(Config{Store: raftstore.Config{StoreID: 1, DataDir: d}, ListenAddr: "127.0.0.1:0"}); err == nil {
			t.Errorf("server started over address book %q", bad)
		}
	}
}

// TestTransportSetAddr: a store whose address was unknown (or wrong) is
// reached once SetAddr gives the right one.
func TestTransportSetAddr(t *testing.T) {
	h := &fakeHandler{}
	lis := listen(t)
	startRaftServer(t, lis, 2, h)
	self := &fakeHandler{}
	tr := newTestTransport(t, 1, map[uint64]string{2: deadAddr(t)}, fastTransportOptions(), self)
	tr.Send(appMsg(1, 1, 2, "lost"))
	tr.Flush()
	waitFor(t, 5*time.Second, "an unreachable report", func() bool { return len(self.unreachableReports()) > 0 })

	tr.SetAddr(2, lis.Addr().String())
	waitFor(t, 10*time.Second, "delivery at the new address", func() bool {
		tr.Send(appMsg(1, 1, 2, "found"))
		tr.Flush()
		for _, m := range h.received() {
			if m.Msg.Type == raftpb.MsgApp && len(m.Msg.Entries) > 0 && string(m.Msg.Entries[0].Data) == "found" {
				return true
			}
		}
		return false
	})
	// A store unknown until now.
	lis3 := listen(t)
	h3 := &fakeHandler{}
	startRaftServer(t, lis3, 3, h3)
	tr.SetAddr(3, lis3.Addr().String())
	waitFor(t, 10*time.Second, "delivery to a store added at runtime", func() bool {
		m := appMsg(1, 1, 3, "hello")
		m.ToStore = 3
		tr.Send(m)
		tr.Flush()
		return len(h3.received()) > 0
	})
}

// TestWithStoreMerge: Admin.Merge over real stores and gRPC: a client
// that cached both halves of a split reads and writes either half's keys
// after the merge, the merged region is listed over both ranges, and
// the last region has no neighbour to merge with (InvalidArgument).
func TestWithStoreMerge(t *testing.T) {
	c := startQuietCluster(t, 3)
	ctx := testCtx(t)
	for _, k := range []string{"a", "c", "m", "q", "z"} {
		put(ctx, t, c, 1, k, "v-"+k)
	}
	cli, err := client.New(ctx, client.Config{Endpoints: []string{c.server(1).Addr(), c.server(2).Addr(), c.server(3).Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	left, right, err := cli.Split(ctx, []byte("m"))
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	for _, k := range []string{"a", "z"} { // the cache holds both halves
		if _, err := cli.Get(ctx, []byte(k)); err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
	}
	var resp *kvpb.MergeResponse
	if err := c.onLeader(t, left.ID, func(a kvpb.AdminClient) (err error) {
		resp, err = a.Merge(ctx, &kvpb.MergeRequest{RegionId: left.ID})
		return err
	}); err != nil {
		t.Fatalf("merge: %v", err)
	}
	merged := resp.GetMerged().ToRegion()
	if merged.ID != left.ID || len(merged.StartKey) != 0 || len(merged.EndKey) != 0 || merged.Epoch.Version <= right.Epoch.Version {
		t.Fatalf("merged %s", merged.String())
	}
	for key, want := range map[string]string{"a": "v-a", "m": "v-m", "z": "v-z"} {
		if got, err := cli.Get(ctx, []byte(key)); err != nil || string(got) != want {
			t.Errorf("get %s after the merge = %q, %v; want %q", key, got, err, want)
		}
	}
	if err := cli.Put(ctx, []byte("x"), []byte("new-x")); err != nil {
		t.Fatalf("put into the absorbed range: %v", err)
	}
	waitFor(t, 15*time.Second, "every store hosting the merged region alone", func() bool {
		for _, s := range c.servers {
			if _, ok := regionOn(s, right.ID); ok {
				return false
			}
			if l, ok := regionOn(s, left.ID); !ok || len(l.Region.EndKey) != 0 {
				return false
			}
		}
		return true
	})
	if err := c.onLeader(t, left.ID, func(a kvpb.AdminClient) error {
		_, err := a.Merge(ctx, &kvpb.MergeRequest{RegionId: left.ID})
		return err
	}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("merge of the last region: %v, want InvalidArgument", err)
	}
	if _, err := cli.Merge(ctx, left.ID); err == nil || !strings.Contains(err.Error(), "no right neighbour") {
		t.Errorf("client merge of the last region: %v", err)
	}
}
