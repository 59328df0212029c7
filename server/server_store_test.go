package server

// The tests in this file run real servers over the real raftstore (they
// are named TestWithStore*): a cluster of in-process stores, each on
// 127.0.0.1:0, talking through the gRPC transport.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type testCluster struct {
	servers []*Server
	peers   map[uint64]string
}

// startCluster starts stores 1..n bootstrapping region 1 together; extra
// adds peer addresses of stores that are not started (to look down).
func startCluster(t *testing.T, n int, extra map[uint64]string) *testCluster {
	t.Helper()
	c := newCluster(t, n, extra, nil)
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	c.waitLeader(t)
	return c
}

// newCluster builds (but does not start) stores 1..n; tune, if not nil,
// adjusts each store's config.
func newCluster(t *testing.T, n int, extra map[uint64]string, tune func(*raftstore.Config)) *testCluster {
	t.Helper()
	return newClusterWith(t, n, extra, tune, nil)
}

// newClusterWith is newCluster with tuneServer, if not nil, adjusting each
// server's config too.
func newClusterWith(t *testing.T, n int, extra map[uint64]string, tune func(*raftstore.Config), tuneServer func(*Config)) *testCluster {
	t.Helper()
	c := &testCluster{peers: map[uint64]string{}}
	var lis, statusLis []net.Listener
	var initial []uint64
	for i := range n {
		id := uint64(i + 1)
		l := listen(t)
		lis = append(lis, l)
		statusLis = append(statusLis, listen(t))
		c.peers[id] = l.Addr().String()
		initial = append(initial, id)
	}
	for id, addr := range extra {
		c.peers[id] = addr
	}
	logger := testLogger(t)
	for i := range n {
		id := uint64(i + 1)
		cfg := raftstore.Config{
			StoreID:       id,
			Zone:          fmt.Sprintf("dc-%c", 'a'+i),
			InitialStores: initial,
			DataDir:       t.TempDir(),
			NoSync:        true,
			TickInterval:  10 * time.Millisecond,
			Logger:        logger,
		}
		if n > 1 {
			// A 100ms election timeout is too tight for -race on 2 cores:
			// a slow Ready round would cost leadership and flake the test.
			cfg.ElectionTicks = 40
		}
		if tune != nil {
			tune(&cfg)
		}
		scfg := Config{Store: cfg, Listener: lis[i], StatusListener: statusLis[i], Peers: c.peers}
		if tuneServer != nil {
			tuneServer(&scfg)
		}
		s, err := New(scfg)
		if err != nil {
			t.Fatalf("new server %d: %v", id, err)
		}
		c.servers = append(c.servers, s)
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, s := range c.servers {
			wg.Go(s.Stop)
		}
		wg.Wait()
	})
	return c
}

// waitLeader waits until every store knows the leader of each region and
// the leader itself says so.
func (c *testCluster) waitLeader(t *testing.T) uint64 {
	t.Helper()
	var leader uint64
	waitFor(t, 15*time.Second, "a region leader known to every store", func() bool {
		leader = 0
		for _, s := range c.servers {
			rs := s.Store().Regions()
			if len(rs) == 0 || rs[0].LeaderStoreID == 0 || (leader != 0 && rs[0].LeaderStoreID != leader) {
				return false
			}
			leader = rs[0].LeaderStoreID
		}
		st := c.server(leader).Store().Regions()
		return st[0].IsLeader
	})
	return leader
}

func (c *testCluster) server(id uint64) *Server { return c.servers[id-1] }

func (c *testCluster) kv(t *testing.T, id uint64) kvpb.KVClient {
	return kvpb.NewKVClient(dial(t, c.server(id).Addr()))
}

func (c *testCluster) admin(t *testing.T, id uint64) kvpb.AdminClient {
	return kvpb.NewAdminClient(dial(t, c.server(id).Addr()))
}

// TestWithStoreValidation: every bad input gets its code and writes nothing.
func TestWithStoreValidation(t *testing.T) {
	c := startCluster(t, 1, nil)
	kv := c.kv(t, 1)
	admin := c.admin(t, 1)
	ctx := testCtx(t)
	if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte("k0"), Value: []byte("v0")}); err != nil {
		t.Fatalf("put: %v", err)
	}
	want := map[string]string{"k0": "v0"}

	bigKey := bytes.Repeat([]byte("k"), MaxKeySize+1)
	bigValue := make([]byte, MaxValueSize+1)
	manyKeys := make([][]byte, MaxBatchGetKeys+1)
	for i := range manyKeys {
		manyKeys[i] = []byte("k0")
	}
	cases := []badRequest{
		{"get empty key", func() error { _, err := kv.Get(ctx, &kvpb.GetRequest{}); return err }, codes.InvalidArgument, false},
		{"get big key", func() error { _, err := kv.Get(ctx, &kvpb.GetRequest{Key: bigKey}); return err }, codes.InvalidArgument, false},
		{"put empty key", func() error { _, err := kv.Put(ctx, &kvpb.PutRequest{Value: []byte("v")}); return err }, codes.InvalidArgument, false},
		{"put big key", func() error { _, err := kv.Put(ctx, &kvpb.PutRequest{Key: bigKey, Value: []byte("v")}); return err }, codes.InvalidArgument, false},
		{"put big value", func() error {
			_, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte("k1"), Value: bigValue})
			return err
		}, codes.InvalidArgument, false},
		{"delete empty key", func() error { _, err := kv.Delete(ctx, &kvpb.DeleteRequest{}); return err }, codes.InvalidArgument, false},
		{"delete big key", func() error { _, err := kv.Delete(ctx, &kvpb.DeleteRequest{Key: bigKey}); return err }, codes.InvalidArgument, false},
		{"scan limit over max", func() error {
			_, err := kv.Scan(ctx, &kvpb.ScanRequest{Limit: MaxScanLimit + 1})
			return err
		}, codes.InvalidArgument, false},
		{"scan end before start", func() error {
			_, err := kv.Scan(ctx, &kvpb.ScanRequest{StartKey: []byte("b"), EndKey: []byte("a")})
			return err
		}, codes.InvalidArgument, false},
		{"batch get too many keys", func() error { _, err := kv.BatchGet(ctx, &kvpb.BatchGetRequest{Keys: manyKeys}); return err }, codes.InvalidArgument, false},
		{"batch get empty key", func() error {
			_, err := kv.BatchGet(ctx, &kvpb.BatchGetRequest{Keys: [][]byte{[]byte("k0"), {}}})
			return err
		}, codes.InvalidArgument, false},
		{"get unknown region", func() error {
			_, err := kv.Get(ctx, &kvpb.GetRequest{Context: &kvpb.ReadContext{RegionId: 999}, Key: []byte("k0")})
			return err
		}, codes.NotFound, true},
		{"put unknown region", func() error {
			_, err := kv.Put(ctx, &kvpb.PutRequest{Context: &kvpb.WriteContext{RegionId: 999}, Key: []byte("k0"), Value: []byte("x")})
			return err
		}, codes.NotFound, true},
		{"delete unknown region", func() error {
			_, err := kv.Delete(ctx, &kvpb.DeleteRequest{Context: &kvpb.WriteContext{RegionId: 999}, Key: []byte("k0")})
			return err
		}, codes.NotFound, true},
		{"put stale epoch", func() error {
			_, err := kv.Put(ctx, &kvpb.PutRequest{Context: &kvpb.WriteContext{RegionId: 1, RegionEpoch: &kvpb.Epoch{ConfVer: 1000, Version: 1000}},
				Key: []byte("k0"), Value: []byte("x")})
			return err
		}, codes.FailedPrecondition, true},
		{"transfer leader region 0", func() error {
			_, err := admin.TransferLeader(ctx, &kvpb.TransferLeaderRequest{ToStoreId: 1})
			return err
		}, codes.InvalidArgument, false},
		{"transfer leader to a store that does not exist", func() error {
			_, err := admin.TransferLeader(ctx, &kvpb.TransferLeaderRequest{RegionId: 1, ToStoreId: 9})
			return err
		}, codes.NotFound, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.refused(t)
			if got := scanAll(ctx, t, kv); !maps.Equal(got, want) {
				t.Fatalf("data changed to %v", got)
			}
		})
	}
}

// TestWithStoreLimits: a key of exactly 8 KiB and a value of exactly 8 MiB
// are accepted and read back.
func TestWithStoreLimits(t *testing.T) {
	c := startCluster(t, 1, nil)
	kv := c.kv(t, 1)
	ctx := testCtx(t)
	key := bytes.Repeat([]byte("k"), MaxKeySize)
	value := bytes.Repeat([]byte("v"), MaxValueSize)
	if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: key, Value: value}); err != nil {
		t.Fatalf("put 8 KiB key, 8 MiB value: %v", err)
	}
	resp, err := kv.Get(ctx, &kvpb.GetRequest{Key: key})
	if err != nil || resp.GetNotFound() || !bytes.Equal(resp.GetValue(), value) {
		t.Fatalf("get back: not_found=%v len=%d err=%v", resp.GetNotFound(), len(resp.GetValue()), err)
	}
}

// TestWithStoreMalformedProtobuf: bytes that are not a valid request are
// refused by gRPC's decoder before any handler, and change nothing.
func TestWithStoreMalformedProtobuf(t *testing.T) {
	c := startCluster(t, 1, nil)
	conn := dial(t, c.server(1).Addr())
	kv := kvpb.NewKVClient(conn)
	ctx := testCtx(t)
	if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte("k0"), Value: []byte("v0")}); err != nil {
		t.Fatalf("put: %v", err)
	}
	garbage := [][]byte{
		{0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, // key length varint overflows
		{0x12, 0x05, 'a'},      // key shorter than its length
		{0x1a, 0x10, 'v', 'v'}, // value truncated
		{0x0f},                 // field 1, wire type 7 (invalid)
	}
	for _, method := range []string{"/hedgekv.KV/Put", "/hedgekv.KV/Delete", "/hedgekv.KV/Get", "/hedgekv.Admin/TransferLeader"} {
		for _, g := range garbage {
			var out []byte
			err := conn.Invoke(ctx, method, g, &out, grpc.ForceCodec(rawCodec{}))
			if code := status.Code(err); code == codes.OK || code == codes.Unknown {
				t.Fatalf("%s with garbage %x: code %v (%v), want a clear refusal", method, g, code, err)
			}
		}
	}
	if got := scanAll(ctx, t, kv); !maps.Equal(got, map[string]string{"k0": "v0"}) {
		t.Fatalf("data changed to %v", got)
	}
}

// TestWithStoreKV: the happy paths, with read info, load and the scan's
// region end.
func TestWithStoreKV(t *testing.T) {
	c := startCluster(t, 1, nil)
	kv := c.kv(t, 1)
	ctx := testCtx(t)
	for i := range 5 {
		k, v := fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)
		if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte(k), Value: []byte(v)}); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	g, err := kv.Get(ctx, &kvpb.GetRequest{Key: []byte("k2")})
	if err != nil || string(g.GetValue()) != "v2" || g.GetNotFound() {
		t.Fatalf("get k2 = %v, %v", g, err)
	}
	if ri := g.GetReadInfo(); ri.GetStoreId() != 1 || ri.GetPeerId() == 0 || ri.GetMode() == kvpb.ReadMode_READ_MODE_UNSPECIFIED {
		t.Fatalf("read info %v", ri)
	}
	if g.GetLoad() == nil {
		t.Fatal("no load in the answer")
	}
	if g, err := kv.Get(ctx, &kvpb.GetRequest{Key: []byte("nope")}); err != nil || !g.GetNotFound() {
		t.Fatalf("get missing = %v, %v", g, err)
	}
	bg, err := kv.BatchGet(ctx, &kvpb.BatchGetRequest{Keys: [][]byte{[]byte("k3"), []byte("nope"), []byte("k1")}})
	if err != nil || len(bg.GetPairs()) != 2 {
		t.Fatalf("batch get = %v, %v", bg, err)
	}
	sc, err := kv.Scan(ctx, &kvpb.ScanRequest{StartKey: []byte("k1"), EndKey: []byte("k4"), Limit: 2})
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	if len(sc.GetPairs()) != 2 || string(sc.GetPairs()[0].GetKey()) != "k1" || string(sc.GetPairs()[1].GetKey()) != "k2" {
		t.Fatalf("scan pairs %v", sc.GetPairs())
	}
	if len(sc.GetRegionEndKey()) != 0 {
		t.Fatalf("region end key %q, want +inf", sc.GetRegionEndKey())
	}
	if _, err := kv.Delete(ctx, &kvpb.DeleteRequest{Key: []byte("k2")}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if g, err := kv.Get(ctx, &kvpb.GetRequest{Key: []byte("k2")}); err != nil || !g.GetNotFound() {
		t.Fatalf("get deleted = %v, %v", g, err)
	}
	if got := scanAll(ctx, t, kv); len(got) != 4 {
		t.Fatalf("after delete: %v", got)
	}
}

// TestWithStoreAdminAndStatus: Status, Stores (with a store that is down),
// Regions, and the status HTTP endpoint.
func TestWithStoreAdminAndStatus(t *testing.T) {
	c := startCluster(t, 1, map[uint64]string{2: deadAddr(t)})
	admin := c.admin(t, 1)
	kv := c.kv(t, 1)
	ctx := testCtx(t)
	if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte("a"), Value: []byte("1")}); err != nil {
		t.Fatalf("put: %v", err)
	}
	if _, err := kv.Get(ctx, &kvpb.GetRequest{Key: []byte("a")}); err != nil {
		t.Fatalf("get: %v", err)
	}

	st, err := admin.Status(ctx, &kvpb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetStoreId() != 1 || st.GetZone() != "dc-a" || st.GetAddress() != c.peers[1] || len(st.GetRegions()) != 1 || st.GetLeaderCount() != 1 {
		t.Fatalf("status %v", st)
	}

	start := time.Now()
	stores, err := admin.Stores(ctx, &kvpb.StoresRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Stores took %v with a store down", d)
	}
	if len(stores.GetStores()) != 2 {
		t.Fatalf("stores %v", stores)
	}
	s1, s2 := stores.GetStores()[0], stores.GetStores()[1]
	if s1.GetId() != 1 || !s1.GetUp() || s1.GetLeaderCount() != 1 || s1.GetRegionCount() != 1 || s1.GetZone() != "dc-a" {
		t.Fatalf("store 1: %v", s1)
	}
	if s2.GetId() != 2 || s2.GetUp() || s2.GetAddress() != c.peers[2] {
		t.Fatalf("store 2: %v", s2)
	}

	regions, err := admin.Regions(ctx, &kvpb.RegionsRequest{ByKey: true, Key: []byte("zzz")})
	if err != nil || len(regions.GetRegions()) != 1 {
		t.Fatalf("regions by key = %v, %v", regions, err)
	}
	ri := regions.GetRegions()[0]
	if ri.GetRegion().GetId() != 1 || ri.GetLeaderStoreId() != 1 || ri.GetLeader().GetStoreId() != 1 || ri.GetAppliedIndex() == 0 {
		t.Fatalf("region info %v", ri)
	}

	base := "http://" + c.server(1).StatusAddr()
	body := httpGet(t, base+"/metrics")
	for _, want := range []string{
		`hedgekv_server_requests_total{code="OK",method="KV.Put"} 1`,
		`hedgekv_server_request_duration_seconds_bucket{method="KV.Get"`,
		`hedgekv_server_reads_total{mode="lease"}`,
		`hedgekv_raft_messages_sent_total`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	var js map[string]any
	if err := json.Unmarshal([]byte(httpGet(t, base+"/status")), &js); err != nil {
		t.Fatalf("/status is not JSON: %v", err)
	}
	if js["store_id"] != "1" || js["zone"] != "dc-a" { // protojson writes uint64 as a string
		t.Fatalf("/status = %v", js)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

// TestWithStoreThreeStores: raft over the gRPC transport. Writes on the
// leader replicate, followers serve replica reads by ReadIndex and refuse
// plain reads with a NotLeader hint, and leadership moves on request.
func TestWithStoreThreeStores(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := testCtx(t)
	leader := c.waitLeader(t)
	follower := leader%3 + 1

	if _, err := c.kv(t, leader).Put(ctx, &kvpb.PutRequest{Key: []byte("x"), Value: []byte("1")}); err != nil {
		t.Fatalf("put on leader: %v", err)
	}
	fkv := c.kv(t, follower)
	g, err := fkv.Get(ctx, &kvpb.GetRequest{Context: &kvpb.ReadContext{ReplicaRead: true}, Key: []byte("x")})
	if err != nil || string(g.GetValue()) != "1" {
		t.Fatalf("follower read = %v, %v", g, err)
	}
	if ri := g.GetReadInfo(); ri.GetStoreId() != follower || ri.GetMode() != kvpb.ReadMode_READ_MODE_READ_INDEX {
		t.Fatalf("follower read info %v", ri)
	}

	_, err = fkv.Get(ctx, &kvpb.GetRequest{Key: []byte("x")})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("plain read on a follower: %v, want FailedPrecondition", err)
	}
	var nl *region.NotLeaderError
	if e := kvpb.RegionErrorFromStatus(err).ToError(); !errors.As(e, &nl) || nl.Leader == nil || nl.Leader.StoreID != leader {
		t.Fatalf("region error %v, want NotLeader pointing at store %d", e, leader)
	}
	if _, err := fkv.Put(ctx, &kvpb.PutRequest{Key: []byte("y"), Value: []byte("2")}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("write on a follower: %v, want FailedPrecondition", err)
	}

	// The Stores answer comes from a view refreshed about once a second,
	// which may predate the election: poll it, bounded.
	var leaders uint64
	var stores *kvpb.StoresResponse
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		stores, err = c.admin(t, follower).Stores(ctx, &kvpb.StoresRequest{})
		if err != nil {
			t.Fatal(err)
		}
		leaders = 0
		for _, s := range stores.GetStores() {
			leaders += s.GetLeaderCount()
		}
		if leaders == 1 || time.Now().After(deadline) {
			break
		}
	}
	for _, s := range stores.GetStores() {
		if !s.GetUp() || s.GetRegionCount() != 1 {
			t.Fatalf("store %v", s)
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders across stores", leaders)
	}

	// Asked of its own target (a caller with a stale view of the leader),
	// a store answers NotLeader with the hint, so the caller retries there.
	_, err = c.admin(t, follower).TransferLeader(ctx, &kvpb.TransferLeaderRequest{RegionId: 1, ToStoreId: follower})
	nl = nil
	if e := kvpb.RegionErrorFromStatus(err).ToError(); !errors.As(e, &nl) || nl.Leader == nil || nl.Leader.StoreID != leader {
		t.Fatalf("transfer asked of its target: %v, want NotLeader pointing at store %d", err, leader)
	}

	if _, err := c.admin(t, leader).TransferLeader(ctx, &kvpb.TransferLeaderRequest{RegionId: 1, ToStoreId: follower}); err != nil {
		// raftstore may answer NotLeader(leader unknown) when it sees the
		// very election its transfer started; the transfer still lands.
		nl = nil
		if e := kvpb.RegionErrorFromStatus(err).ToError(); !errors.As(e, &nl) || nl.Leader != nil {
			t.Fatalf("transfer leader: %v", err)
		}
	}
	waitFor(t, 10*time.Second, "leadership on the target store", func() bool {
		for _, s := range c.servers {
			rs := s.Store().Regions()
			if len(rs) == 0 || rs[0].LeaderStoreID != follower {
				return false
			}
		}
		return c.server(follower).Store().Regions()[0].IsLeader
	})
	if _, err := c.kv(t, follower).Put(ctx, &kvpb.PutRequest{Key: []byte("y"), Value: []byte("2")}); err != nil {
		t.Fatalf("put on the new leader: %v", err)
	}
	g, err = c.kv(t, leader).Get(ctx, &kvpb.GetRequest{Context: &kvpb.ReadContext{ReplicaRead: true}, Key: []byte("y")})
	if err != nil || string(g.GetValue()) != "2" {
		t.Fatalf("read on the old leader = %v, %v", g, err)
	}

	// One store stopping neither takes long nor stops the other two.
	start := time.Now()
	c.server(leader).Stop()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Stop took %v", d)
	}
	waitFor(t, 10*time.Second, "a write with one store down", func() bool {
		_, err := c.kv(t, follower).Put(ctx, &kvpb.PutRequest{Key: []byte("z"), Value: []byte("3")})
		return err == nil
	})
}

// TestWithStoreSnapshot: a store that joins after the log was compacted
// catches up through a snapshot sent over Raft.Snapshot.
func TestWithStoreSnapshot(t *testing.T) {
	c := newCluster(t, 3, nil, func(cfg *raftstore.Config) { cfg.LogGCThreshold = 5 })
	for _, id := range []uint64{1, 2} {
		if err := c.server(id).Start(); err != nil {
			t.Fatal(err)
		}
	}
	ctx := testCtx(t)
	var leader uint64
	waitFor(t, 15*time.Second, "a leader among stores 1 and 2", func() bool {
		for _, id := range []uint64{1, 2} {
			if rs := c.server(id).Store().Regions(); len(rs) > 0 && rs[0].IsLeader {
				leader = id
				return true
			}
		}
		return false
	})
	kvs := map[uint64]kvpb.KVClient{1: c.kv(t, 1), 2: c.kv(t, 2)}
	value := bytes.Repeat([]byte("v"), 64<<10) // 64 KiB × 40: a multi-chunk snapshot
	for i := range 40 {
		key := fmt.Appendf(nil, "k%02d", i)
		// Follow the leader if it moves: this test is about the snapshot.
		waitFor(t, 10*time.Second, fmt.Sprintf("put %d", i), func() bool {
			_, err := kvs[leader].Put(ctx, &kvpb.PutRequest{Key: key, Value: value})
			var nl *region.NotLeaderError
			if errors.As(kvpb.RegionErrorFromStatus(err).ToError(), &nl) && nl.Leader != nil && kvs[nl.Leader.StoreID] != nil {
				leader = nl.Leader.StoreID
			}
			return err == nil
		})
	}
	if err := c.server(3).Start(); err != nil {
		t.Fatal(err)
	}
	kv3 := c.kv(t, 3)
	waitFor(t, 15*time.Second, "store 3 caught up", func() bool {
		resp, err := kv3.Scan(ctx, &kvpb.ScanRequest{Context: &kvpb.ReadContext{ReplicaRead: true}, Limit: 100})
		return err == nil && len(resp.GetPairs()) == 40
	})
	sent := testutilCounter(c.server(1).metrics.snapshots.WithLabelValues("ok")) + testutilCounter(c.server(2).metrics.snapshots.WithLabelValues("ok"))
	if sent == 0 {
		t.Fatal("store 3 caught up without a snapshot; raise the write count or lower LogGCThreshold")
	}
}

// TestWithStoreLifecycle: Stop is idempotent and works without Start.
func TestWithStoreLifecycle(t *testing.T) {
	lis := listen(t)
	s, err := New(Config{
		Store:    raftstore.Config{StoreID: 1, InitialStores: []uint64{1}, DataDir: t.TempDir(), NoSync: true, TickInterval: 10 * time.Millisecond, Logger: testLogger(t)},
		Listener: lis,
		Peers:    map[uint64]string{1: lis.Addr().String()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr() != lis.Addr().String() || s.StatusAddr() != "" {
		t.Fatalf("addr %q status %q", s.Addr(), s.StatusAddr())
	}
	s.Stop()
	s.Stop()
	if err := s.Start(); err == nil {
		t.Fatal("Start after Stop succeeded")
	}
	if _, err := New(Config{Store: raftstore.Config{StoreID: 1}}); err == nil {
		t.Fatal("New without a listen address succeeded")
	}
}
