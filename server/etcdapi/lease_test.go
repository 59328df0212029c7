package etcdapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// etcdRegionEndpoints is the region holding the etcd keyspace, and the endpoint of
// its leader and of a follower.
func etcdRegionEndpoints(t *testing.T, c *cluster.Local) (regionID uint64, leaderEP, followerEP string) {
	t.Helper()
	ids := c.StoreIDs()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, st := range c.Server(ids[0]).Store().Regions() {
			if st.Region.Contains([]byte(etcdapi.Prefix)) {
				regionID = st.Region.ID
			}
		}
		if regionID != 0 {
			if leader := c.LeaderStore(regionID); leader != 0 {
				for i, id := range ids {
					if id == leader {
						leaderEP = c.Endpoints[i]
					} else if followerEP == "" {
						followerEP = c.Endpoints[i]
					}
				}
				return regionID, leaderEP, followerEP
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no leader of the etcd region")
	return 0, "", ""
}

func startLeaseCluster(t *testing.T, balancing bool) *cluster.Local {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := cluster.StartLocal(ctx, cluster.LocalConfig{NoSync: true, DisableSplit: true, DisableBalancing: !balancing})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

func keysOf(t *testing.T, ctx context.Context, cli *clientv3.Client, prefix string, opts ...clientv3.OpOption) []string {
	t.Helper()
	g, err := cli.Get(ctx, prefix, append([]clientv3.OpOption{clientv3.WithPrefix()}, opts...)...)
	if err != nil {
		t.Fatalf("get %s: %v", prefix, err)
	}
	var out []string
	for _, kv := range g.Kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

// TestLeaseGrantRevoke, through a follower (every call forwarded): a grant
// makes no revision, takes the minimum TTL, refuses a TTL too large and an
// ID in use; a revoke deletes the lease's keys (and only those) at one
// revision, makes none for a lease without keys, and refuses an unknown
// lease; a put with an unknown lease is refused, in a Txn too.
func TestLeaseGrantRevoke(t *testing.T) {
	t.Parallel()
	c := startLeaseCluster(t, true)
	_, _, followerEP := etcdRegionEndpoints(t, c)
	ctx := ctxFor(t, 60*time.Second)
	cli := client(t, followerEP)

	p, err := cli.Put(ctx, "other", "x")
	if err != nil {
		t.Fatal(err)
	}
	g, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if g.ID <= 0 || g.TTL != 60 || g.Revision != p.Header.Revision {
		t.Fatalf("grant = id %d ttl %d revision %d (last put at %d)", g.ID, g.TTL, g.Revision, p.Header.Revision)
	}
	short, err := cli.Grant(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	// etcd's minimum: 3/2 election timeouts (15 ticks of 50ms), in whole
	// seconds rounded up.
	if short.TTL != 1 || short.ID == g.ID {
		t.Fatalf("grant with TTL 0 = id %d ttl %d", short.ID, short.TTL)
	}
	// clientv3 grants with ID 0 only: the raw client chooses one.
	raw := pb.NewLeaseClient(cli.ActiveConnection())
	if r, err := raw.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: 424242, TTL: 30}); err != nil || r.ID != 424242 || r.TTL != 30 {
		t.Fatalf("grant with an ID: %+v, %v", r, err)
	}
	if _, err := raw.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: 424242, TTL: 30}); rpctypes.Error(err) != rpctypes.ErrLeaseExist {
		t.Fatalf("grant of an ID in use: %v, want ErrLeaseExist", err)
	}
	if _, err := cli.Grant(ctx, 9000000001); !errors.Is(err, rpctypes.ErrLeaseTTLTooLarge) {
		t.Fatalf("grant of a TTL too large: %v, want ErrLeaseTTLTooLarge", err)
	}

	for _, k := range []string{"leased/a", "leased/b", "leased/c", "leased/d"} {
		if _, err := cli.Put(ctx, k, "v", clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
	}
	// d leaves the lease: a put without one.
	last, err := cli.Put(ctx, "leased/d", "v2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "nolease", "v", clientv3.WithLease(clientv3.LeaseID(777))); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("put with an unknown lease: %v, want ErrLeaseNotFound", err)
	}
	if _, err := cli.Txn(ctx).Then(clientv3.OpPut("nolease", "v", clientv3.WithLease(clientv3.LeaseID(777)))).Commit(); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("txn put with an unknown lease: %v, want ErrLeaseNotFound", err)
	}

	r, err := cli.Revoke(ctx, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	rev := r.Header.Revision
	if rev != last.Header.Revision+1 {
		t.Fatalf("revoke at revision %d, want %d (one after the last put)", rev, last.Header.Revision+1)
	}
	if got := keysOf(t, ctx, cli, "leased/"); !slices.Equal(got, []string{"leased/d"}) {
		t.Fatalf("after the revoke: %v", got)
	}
	if got := keysOf(t, ctx, cli, "leased/", clientv3.WithRev(rev-1)); len(got) != 4 {
		t.Fatalf("before the revoke: %v", got)
	}
	if got := keysOf(t, ctx, cli, "", clientv3.WithRev(rev)); !slices.Equal(got, []string{"leased/d", "other"}) {
		t.Fatalf("at the revoke's revision: %v", got)
	}
	// A lease without keys: no revision.
	r2, err := cli.Revoke(ctx, short.ID)
	if err != nil || r2.Header.Revision != rev {
		t.Fatalf("revoke of a lease without keys: revision %v (want %d), %v", r2, rev, err)
	}
	if _, err := cli.Revoke(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("second revoke: %v, want ErrLeaseNotFound", err)
	}
	if ttl, err := cli.TimeToLive(ctx, g.ID); err != nil || ttl.TTL != -1 {
		t.Fatalf("time to live of a revoked lease: %+v, %v", ttl, err)
	}
	if _, err := cli.Put(ctx, "nolease", "v", clientv3.WithLease(g.ID)); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("put with a revoked lease: %v, want ErrLeaseNotFound", err)
	}
}

// TestLeaseTimeToLiveAndLeases: TimeToLive, with keys, answered by the
// leader whichever store is asked; Leases lists every lease.
func TestLeaseTimeToLiveAndLeases(t *testing.T) {
	t.Parallel()
	c := startLeaseCluster(t, true)
	ctx := ctxFor(t, 60*time.Second)
	var ids []clientv3.LeaseID
	for i, ep := range c.Endpoints {
		g, err := client(t, ep).Grant(ctx, int64(30+i))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, g.ID)
	}
	cli := client(t, c.Endpoints[0])
	for _, k := range []string{"t/b", "t/a", "t/c"} {
		if _, err := cli.Put(ctx, k, "v", clientv3.WithLease(ids[1])); err != nil {
			t.Fatal(err)
		}
	}
	for _, ep := range c.Endpoints {
		cli := client(t, ep)
		ttl, err := cli.TimeToLive(ctx, ids[1], clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, k := range ttl.Keys {
			keys = append(keys, string(k))
		}
		if ttl.ID != ids[1] || ttl.GrantedTTL != 31 || ttl.TTL <= 25 || ttl.TTL > 31 || !slices.Equal(keys, []string{"t/a", "t/b", "t/c"}) {
			t.Fatalf("%s: time to live = %+v (keys %v)", ep, ttl, keys)
		}
		if ttl, err := cli.TimeToLive(ctx, ids[0]); err != nil || ttl.GrantedTTL != 30 || len(ttl.Keys) != 0 {
			t.Fatalf("%s: time to live without keys = %+v, %v", ep, ttl, err)
		}
		ls, err := cli.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []clientv3.LeaseID
		for _, l := range ls.Leases {
			got = append(got, l.ID)
		}
		want := slices.Clone(ids)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: leases %v, want %v", ep, got, want)
		}
	}
	if _, err := cli.Revoke(ctx, ids[2]); err != nil {
		t.Fatal(err)
	}
	ls, err := client(t, c.Endpoints[2]).Leases(ctx)
	if err != nil || len(ls.Leases) != 2 {
		t.Fatalf("leases after a revoke: %+v, %v", ls, err)
	}
}

// TestLeaseKeepAliveKeepsKeys: a lease kept alive (one stream to the
// leader, one to a follower, forwarded) keeps its keys for two TTLs; once
// the keep-alive stops they vanish within a bounded time. (clientv3 sends
// a keep-alive a third of the TTL after the last answer, on a 500ms tick:
// a TTL of 5s leaves room for a slow machine.)
func TestLeaseKeepAliveKeepsKeys(t *testing.T) {
	t.Parallel()
	c := startLeaseCluster(t, false)
	_, leaderEP, followerEP := etcdRegionEndpoints(t, c)
	ctx := ctxFor(t, 60*time.Second)
	reader := client(t, c.Endpoints[0])
	const ttl = 5
	type kept struct {
		key    string
		cancel context.CancelFunc
	}
	var ks []kept
	for i, ep := range []string{leaderEP, followerEP} {
		cli := client(t, ep)
		g, err := cli.Grant(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("alive/%d", i)
		if _, err := cli.Put(ctx, key, "v", clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		kctx, cancel := context.WithCancel(ctx)
		ch, err := cli.KeepAlive(kctx, g.ID)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for range ch {
			}
		}()
		ks = append(ks, kept{key, cancel})
	}
	end := time.Now().Add(2 * ttl * time.Second)
	for time.Now().Before(end) {
		if got := keysOf(t, ctx, reader, "alive/"); len(got) != len(ks) {
			t.Fatalf("kept alive, yet %v", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, k := range ks {
		k.cancel()
	}
	stopped := time.Now()
	for len(keysOf(t, ctx, reader, "alive/")) > 0 {
		if time.Since(stopped) > (ttl+5)*time.Second {
			t.Fatalf("keys still there %v after the keep-alive stopped", time.Since(stopped))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLeaseExpires: a lease nobody keeps alive takes its keys with it
// after its TTL (not before: they are there until TTL after the grant was
// sent), all at one revision; then it is gone.
func TestLeaseExpires(t *testing.T) {
	t.Parallel()
	c := startLeaseCluster(t, true)
	_, _, followerEP := etcdRegionEndpoints(t, c)
	ctx := ctxFor(t, 60*time.Second)
	cli := client(t, followerEP)
	// Let the leader's lessor take office (and load the leases: none), so
	// that the lease's TTL runs from its grant.
	if _, err := cli.TimeToLive(ctx, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	const ttl = 2
	sent := time.Now()
	g, err := cli.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"exp/a", "exp/b", "exp/c"} {
		if _, err := cli.Put(ctx, k, "v", clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
	}
	for {
		got := keysOf(t, ctx, cli, "exp/")
		if len(got) == 0 {
			break
		}
		if len(got) != 3 {
			t.Fatalf("keys of one lease deleted apart: %v", got)
		}
		if time.Since(sent) > (ttl+5)*time.Second {
			t.Fatalf("keys still there %v after the grant", time.Since(sent))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if gone := time.Since(sent); gone < ttl*time.Second {
		t.Fatalf("lease of TTL %ds expired %v after its grant was sent", ttl, gone)
	}
	r, err := cli.Get(ctx, "exp/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	rev := r.Header.Revision // nothing else writes: the revoke's
	if got := keysOf(t, ctx, cli, "exp/", clientv3.WithRev(rev-1)); len(got) != 3 {
		t.Fatalf("one revision before the expiry: %v", got)
	}
	if ttl, err := cli.TimeToLive(ctx, g.ID); err != nil || ttl.TTL != -1 {
		t.Fatalf("time to live of an expired lease: %+v, %v", ttl, err)
	}
	if ka, err := cli.KeepAliveOnce(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("keep-alive of an expired lease: %+v, %v, want ErrLeaseNotFound", ka, err)
	}
}

// TestLeaseLeaderChange: while the region's leadership moves from store to
// store, a lease kept alive keeps its key, and a lease nobody keeps alive
// keeps its key at least its TTL after its grant (a new leader gives every
// lease a full TTL: never an early expiry), then loses it.
func TestLeaseLeaderChange(t *testing.T) {
	t.Parallel()
	c := startLeaseCluster(t, false)
	regionID, _, _ := etcdRegionEndpoints(t, c)
	ctx := ctxFor(t, 90*time.Second)
	ids := c.StoreIDs()
	keeper := client(t, c.Endpoints[0])
	reader := client(t, c.Endpoints[1])

	alive, err := keeper.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keeper.Put(ctx, "lc/alive", "v", clientv3.WithLease(alive.ID)); err != nil {
		t.Fatal(err)
	}
	ch, err := keeper.KeepAlive(ctx, alive.ID)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range ch {
		}
	}()
	const unkeptTTL = 4
	sent := time.Now()
	unkept, err := reader.Grant(ctx, unkeptTTL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Put(ctx, "lc/unkept", "v", clientv3.WithLease(unkept.ID)); err != nil {
		t.Fatal(err)
	}

	check := func() (unkeptThere bool) {
		got := keysOf(t, ctx, reader, "lc/")
		if !slices.Contains(got, "lc/alive") {
			t.Fatalf("the lease kept alive lost its key: %v", got)
		}
		there := slices.Contains(got, "lc/unkept")
		if !there && time.Since(sent) < unkeptTTL*time.Second {
			t.Fatalf("lease of TTL %ds expired %v after its grant was sent", unkeptTTL, time.Since(sent))
		}
		return there
	}
	// Move the leadership round the stores, twice, checking between moves.
	for round := range 2 * len(ids) {
		to := ids[(round+1)%len(ids)]
		mctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := c.MoveLeader(mctx, regionID, to)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for range 8 {
			check()
			time.Sleep(100 * time.Millisecond)
		}
	}
	// The unkept lease expires (each promotion gave it TTL plus an
	// election timeout, at most; the moves are over).
	deadline := time.Now().Add((unkeptTTL + 6) * time.Second)
	for check() {
		if time.Now().After(deadline) {
			t.Fatalf("the lease nobody keeps alive is still there %v after its grant", time.Since(sent))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The lease kept alive is known to the last leader, through any store.
	for _, ep := range c.Endpoints {
		ttl, err := client(t, ep).TimeToLive(ctx, alive.ID, clientv3.WithAttachedKeys())
		if err != nil || ttl.TTL <= 0 || ttl.GrantedTTL != 5 || len(ttl.Keys) != 1 || !bytes.Equal(ttl.Keys[0], []byte("lc/alive")) {
			t.Fatalf("%s: time to live of the lease kept alive: %+v, %v", ep, ttl, err)
		}
	}
}

// TestLessorStopsWithServer: when the stores stop, nothing of the etcd
// API's keeps running (the lessor, its revokes, KeepAlive streams and
// their forwarding). Not parallel: it reads every goroutine's stack, and
// Go runs the parallel tests only after the others (a paused parallel
// test of package etcdapi itself would show in the stacks: so the
// internal tests are not parallel either).
func TestLessorStopsWithServer(t *testing.T) {
	c := startLeaseCluster(t, true)
	_, _, followerEP := etcdRegionEndpoints(t, c)
	ctx := ctxFor(t, 30*time.Second)
	cli := client(t, followerEP)
	g, err := cli.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := cli.KeepAlive(ctx, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatal("no keep-alive answer")
	}
	if _, err := cli.Grant(ctx, 1); err != nil { // one to expire while stopping
		t.Fatal(err)
	}
	c.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		buf := make([]byte, 1<<22)
		stacks := string(buf[:runtime.Stack(buf, true)])
		var ours []string
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "hedgekv/server/etcdapi.") {
				ours = append(ours, g)
			}
		}
		if len(ours) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of the etcd API outlive the servers:\n%s", len(ours), strings.Join(ours, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
