package etcdapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/server/etcdapi"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A store with no replica of the keyspace's region (four stores, three
// replicas) serves the etcd API as any etcd member does: its writes,
// reads and Txns go to the region's leader, found on the other stores,
// and what it writes is read back everywhere.
func TestStoreWithoutAReplicaServesTheKeyspace(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 90*time.Second)
	c := outsiderCluster(t, ctx, nil)
	first := client(t, c.Endpoints[0])
	cli := client(t, c.Endpoints[outsider-1])
	start := time.Now()
	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatalf("put through store %d, which holds no replica: %v", outsider, err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a put through store %d took %v: it waited instead of forwarding", outsider, took)
	}
	txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("k"), "=", "v1")).Then(clientv3.OpPut("k", "v2")).Commit()
	if err != nil || !txn.Succeeded {
		t.Fatalf("txn through store %d: %+v, %v", outsider, txn, err)
	}
	g, err := cli.Get(ctx, "k")
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "v2" {
		t.Fatalf("get through store %d: %+v, %v", outsider, g, err)
	}
	if _, err := cli.Delete(ctx, "seed"); err != nil {
		t.Fatalf("delete through store %d: %v", outsider, err)
	}
	g, err = first.Get(ctx, "", clientv3.WithFromKey())
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Key) != "k" || string(g.Kvs[0].Value) != "v2" {
		t.Fatalf("store 1 reads %+v, %v; want only k=v2", g, err)
	}
}

// outsider is the store outsiderCluster leaves without a replica of the
// keyspace's region.
const outsider = uint64(4)

// outsiderCluster starts four stores (every store's etcd API with knobs,
// nil: none), writes a key through store 1 so the keyspace becomes its
// own region, and takes store outsider's replica of it off.
func outsiderCluster(t *testing.T, ctx context.Context, knobs *etcdapi.TestingKnobs) *cluster.Local {
	t.Helper()
	c, err := cluster.StartLocal(ctx, cluster.LocalConfig{NoSync: true, Zones: []string{"dc-a", "dc-b", "dc-c", "dc-d"}, EtcdKnobs: knobs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	if _, err := client(t, c.Endpoints[0]).Put(ctx, "seed", "0"); err != nil {
		t.Fatal(err)
	}

	// Wait for the keyspace's own region, then take one replica off it.
	var rid uint64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := etcdRegion(t, c)
		if string(r.StartKey) == etcdapi.Prefix && string(r.EndKey) == etcdapi.End {
			rid = r.ID
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the etcd keyspace is still in %v", r)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); holds(c, outsider, rid); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("store %d still holds region %d", outsider, rid)
		}
		for _, id := range c.StoreIDs() {
			st := c.Server(id).Store()
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = st.RemovePeer(rctx, rid, outsider) // only the leader's succeeds
			cancel()
		}
	}
	return c
}

// holds reports whether store id has a replica of region rid.
func holds(c *cluster.Local, id, rid uint64) bool {
	for _, st := range c.Server(id).Store().Regions() {
		if st.Region.ID == rid {
			return true
		}
	}
	return false
}
