package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/keyspace"
	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWithStoreEtcdKeyspaceIsNotTheKVAPIs: the KV API refuses every key of
// the etcd API's keyspace and no scan shows one, raw or through the Go
// client's scan across regions, whether the keyspace shares a region with
// other keys or is a region of its own (EnsureBoundaries). ctl split
// cannot cut it.
func TestWithStoreEtcdKeyspaceIsNotTheKVAPIs(t *testing.T) {
	const p, pe = keyspace.EtcdPrefix, keyspace.EtcdEnd
	start, end := keyspace.EtcdRange()
	c := newCluster(t, 1, nil, func(cfg *raftstore.Config) {
		cfg.KeepWhole = []raftstore.KeepRange{{Start: start, End: end}}
	})
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	c.waitLeader(t)
	ctx := testCtx(t)
	st := c.server(1).Store()
	kv, admin := c.kv(t, 1), c.admin(t, 1)

	// The etcd layer's records, written beneath the KV API.
	etcdKeys := []string{p, p + "a", p + "b", p + "\xff\xff"}
	for _, k := range etcdKeys {
		if err := st.Put(ctx, raftstore.WriteOptions{}, []byte(k), []byte("etcd")); err != nil {
			t.Fatal(err)
		}
	}
	user := []string{"a", "\xffetcd", "\xffetcd.", pe, pe + "x", "\xff\xff"}
	for _, k := range user {
		if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte(k), Value: []byte("kv")}); err != nil {
			t.Fatalf("put %q: %v", k, err)
		}
	}

	refused := func(what string, err error) {
		t.Helper()
		s, _ := status.FromError(err)
		if s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), `\xffetcd/`) || !strings.Contains(s.Message(), "etcd API") {
			t.Fatalf("%s: %v, want InvalidArgument naming the prefix and the etcd API", what, err)
		}
	}
	for _, k := range []string{p, p + "a", p + "new"} {
		_, err := kv.Get(ctx, &kvpb.GetRequest{Key: []byte(k)})
		refused("get "+k, err)
		_, err = kv.Put(ctx, &kvpb.PutRequest{Key: []byte(k), Value: []byte("x")})
		refused("put "+k, err)
		_, err = kv.Delete(ctx, &kvpb.DeleteRequest{Key: []byte(k)})
		refused("delete "+k, err)
		_, err = kv.BatchGet(ctx, &kvpb.BatchGetRequest{Keys: [][]byte{[]byte("a"), []byte(k)}})
		refused("batch get "+k, err)
	}

	// Raw scans: up to the keyspace, inside it, after it.
	scan := func(from, to string, wantKeys []string, wantEnd string) {
		t.Helper()
		resp, err := kv.Scan(ctx, &kvpb.ScanRequest{StartKey: []byte(from), EndKey: []byte(to), Limit: 100})
		if err != nil {
			t.Fatalf("scan [%q, %q): %v", from, to, err)
		}
		var got []string
		for _, kv := range resp.GetPairs() {
			got = append(got, string(kv.GetKey()))
		}
		if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", wantKeys) || string(resp.GetRegionEndKey()) != wantEnd {
			t.Fatalf("scan [%q, %q) = %q, region end %q; want %q, %q", from, to, got, resp.GetRegionEndKey(), wantKeys, wantEnd)
		}
	}
	scan("", "", []string{"a", "\xffetcd", "\xffetcd."}, p)
	scan(p, "", nil, pe)
	scan(p+"a", p+"c", nil, pe)
	scan(pe, "", []string{pe, pe + "x", "\xff\xff"}, "")

	cli, err := client.New(ctx, client.Config{Endpoints: []string{c.server(1).Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	clientScan := func(from, to string, limit int, want []string) {
		t.Helper()
		kvs, err := cli.Scan(ctx, []byte(from), []byte(to), limit)
		if err != nil {
			t.Fatalf("client scan [%q, %q) limit %d: %v", from, to, limit, err)
		}
		var got []string
		for _, kv := range kvs {
			got = append(got, string(kv.Key))
		}
		if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", want) {
			t.Fatalf("client scan [%q, %q) limit %d = %q, want %q", from, to, limit, got, want)
		}
	}
	for _, phase := range []string{"in one region", "in a region of its own"} {
		if phase == "in a region of its own" {
			if err := st.EnsureBoundaries(ctx, start, end); err != nil {
				t.Fatalf("EnsureBoundaries: %v", err)
			}
			var shapes []string
			for _, rs := range st.Regions() {
				shapes = append(shapes, fmt.Sprintf("[%q, %q)", rs.Region.StartKey, rs.Region.EndKey))
			}
			if want := fmt.Sprintf("[%q, %q) [%q, %q) [%q, %q)", "", p, p, pe, pe, ""); strings.Join(shapes, " ") != want {
				t.Fatalf("regions %s, want %s", strings.Join(shapes, " "), want)
			}
		}
		t.Logf("the etcd keyspace %s", phase)
		clientScan("", "", 0, user) // ctl kv scan with no end
		clientScan("", "", 4, user[:4])
		clientScan("\xffetcd", "", 3, user[1:4])
		clientScan(p+"a", "", 0, user[3:])
		clientScan("", p+"z", 0, user[:3])
		clientScan(p, pe, 0, nil)
		for _, k := range user {
			if v, err := cli.Get(ctx, []byte(k)); err != nil || string(v) != "kv" {
				t.Fatalf("client get %q: %q, %v", k, v, err)
			}
		}
		if err := cli.Put(ctx, []byte(p+"x"), []byte("x")); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "etcd API") {
			t.Fatalf("client put into the etcd keyspace: %v", err)
		}
	}

	// ctl split cannot cut the kept range; its ends are boundaries already.
	_, err = admin.Split(ctx, &kvpb.SplitRequest{Key: []byte(p + "m")})
	if s, _ := status.FromError(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), "KeepWhole") {
		t.Fatalf("split inside the etcd keyspace: %v", err)
	}
	// The etcd layer's records are all there, untouched.
	kvs, r, _, err := st.Scan(ctx, raftstore.ReadOptions{}, start, end, 100)
	if err != nil || len(kvs) != len(etcdKeys) || string(r.StartKey) != p {
		t.Fatalf("the etcd keyspace holds %d keys (region %s), %v", len(kvs), r.String(), err)
	}
	for _, kv := range kvs {
		if string(kv.Value) != "etcd" {
			t.Fatalf("%q = %q", kv.Key, kv.Value)
		}
	}
}
