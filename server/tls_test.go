package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/server/etcdapi"
	"github.com/hedgekv/hedgekv/tlsverdict"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// testCerts generates a CA with a store and a client certificate for
// 127.0.0.1 in a temporary directory.
func testCerts(t *testing.T) CertFiles {
	t.Helper()
	files, err := GenerateCerts(t.TempDir(), []string{"127.0.0.1", "localhost"}, false)
	if err != nil {
		t.Fatalf("generate certs: %v", err)
	}
	return files
}

func loadStoreTLS(t *testing.T, f CertFiles) *TLS {
	t.Helper()
	id, err := LoadTLS(f.Node, f.NodeKey, f.CA)
	if err != nil {
		t.Fatalf("load store TLS: %v", err)
	}
	return id
}

func clientTLS(t *testing.T, cert, key, ca string) *tls.Config {
	t.Helper()
	cfg, err := client.LoadTLS(cert, key, ca)
	if err != nil {
		t.Fatalf("load client TLS: %v", err)
	}
	return cfg
}

// dialTLS is dial over TLS with cfg, with the same error mapping as the
// client, so a refused handshake reads Unauthenticated here too.
func dialTLS(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(tlsverdict.Credentials(credentials.NewTLS(cfg))),
		grpc.WithChainUnaryInterceptor(tlsverdict.UnaryInterceptor),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)),
	)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func startTLSCluster(t *testing.T, n int, id *TLS, more ...func(*Config)) *testCluster {
	t.Helper()
	c := newClusterWith(t, n, nil, nil, func(cfg *Config) {
		cfg.TLS = id
		for _, f := range more {
			f(cfg)
		}
	})
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	c.waitLeader(t)
	return c
}

func (c *testCluster) endpoints() []string {
	var eps []string
	for _, s := range c.servers {
		eps = append(eps, s.Addr())
	}
	return eps
}

// TestLoadTLSRefusesBadFiles: each wrong set of files is refused with an
// error naming what is wrong.
func TestLoadTLSRefusesBadFiles(t *testing.T) {
	f := testCerts(t)
	other := testCerts(t)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	cases := []struct {
		name           string
		cert, key, ca  string
		wantSubstrings []string
	}{
		{"cert without key", f.Node, "", f.CA, []string{"all needed"}},
		{"no CA", f.Node, f.NodeKey, "", []string{"all needed"}},
		{"missing cert", missing, f.NodeKey, f.CA, []string{"missing.pem", "no such file"}},
		{"missing CA", f.Node, f.NodeKey, missing, []string{"read CA", "no such file"}},
		{"CA file not PEM", f.Node, f.NodeKey, garbage, []string{"no PEM certificate"}},
		{"key of another cert", f.Node, f.ClientKey, f.CA, []string{"private key does not match"}},
		{"cert of another CA", other.Node, other.NodeKey, f.CA, []string{"not a store certificate"}},
		{"client-only cert", f.Client, f.ClientKey, f.CA, []string{"not a store certificate"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadTLS(tc.cert, tc.key, tc.ca)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, s := range tc.wantSubstrings {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

// TestGenerateCertsRefusesOverwrite: a second run into the same directory
// fails unless told to overwrite, and then makes a new CA.
func TestGenerateCertsRefusesOverwrite(t *testing.T) {
	dir := t.TempDir()
	f, err := GenerateCerts(dir, []string{"127.0.0.1"}, false)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(f.CA)
	if _, err := GenerateCerts(dir, []string{"127.0.0.1"}, false); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("second run: %v, want an error saying the files exist", err)
	}
	if _, err := GenerateCerts(dir, nil, true); err == nil {
		t.Fatal("no hosts: no error")
	}
	if _, err := GenerateCerts(dir, []string{"127.0.0.1"}, true); err != nil {
		t.Fatalf("overwrite: %v", err)
	}
	after, _ := os.ReadFile(f.CA)
	if bytes.Equal(before, after) {
		t.Fatal("overwrite kept the old CA")
	}
	if st, err := os.Stat(f.NodeKey); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v, want 0600", st.Mode(), err)
	}
}

// TestWithStoreTLS: a TLS store serves a client with a certificate its CA
// signed, and refuses with Unauthenticated a client without a certificate,
// one whose certificate another CA signed, and one that does not trust the
// store's CA.
func TestWithStoreTLS(t *testing.T) {
	f := testCerts(t)
	other := testCerts(t)
	c := startTLSCluster(t, 1, loadStoreTLS(t, f))
	ctx := testCtx(t)

	cli, err := client.New(ctx, client.Config{Endpoints: c.endpoints(), TLS: clientTLS(t, f.Client, f.ClientKey, f.CA)})
	if err != nil {
		t.Fatalf("client with a CA-signed certificate: %v", err)
	}
	defer cli.Close()
	if err := cli.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatalf("put over TLS: %v", err)
	}
	if v, err := cli.Get(ctx, []byte("k")); err != nil || string(v) != "v" {
		t.Fatalf("get over TLS: %q, %v", v, err)
	}

	refused := []struct {
		name string
		tls  *tls.Config
	}{
		{"no client certificate", clientTLS(t, "", "", f.CA)},
		{"certificate of another CA", clientTLS(t, other.Client, other.ClientKey, f.CA)},
		{"store certificate of another CA", clientTLS(t, other.Node, other.NodeKey, f.CA)},
		{"does not trust the store", clientTLS(t, f.Client, f.ClientKey, other.CA)},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			cli, err := client.New(cctx, client.Config{Endpoints: c.endpoints(), TLS: tc.tls, DialTimeout: 2 * time.Second})
			if err == nil {
				_ = cli.Close()
				t.Fatal("client.New succeeded")
			}
			if got := status.Code(err); got != codes.Unauthenticated {
				t.Fatalf("client.New: %v (%v), want Unauthenticated", got, err)
			}
			t.Logf("refused: %v", err)
			// And a plain stub, once the handshake has failed for good.
			_, err = kvpb.NewKVClient(dialTLS(t, c.server(1).Addr(), tc.tls)).Get(cctx, &kvpb.GetRequest{Key: []byte("k")})
			if got := status.Code(err); got != codes.Unauthenticated {
				t.Fatalf("Get: %v (%v), want Unauthenticated", got, err)
			}
		})
	}

	// A plaintext client cannot tell a TLS port from a broken one: it is
	// refused, but as Unavailable (documented in the README).
	t.Run("plaintext", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := kvpb.NewKVClient(dial(t, c.server(1).Addr())).Get(cctx, &kvpb.GetRequest{Key: []byte("k")})
		if code := status.Code(err); code != codes.Unavailable {
			t.Fatalf("plaintext Get: %v (%v), want Unavailable", code, err)
		}
	})
}

// TestWithStoreTLSLimits: the request limits answer over TLS as they do
// in plaintext (TestWithStoreValidation).
func TestWithStoreTLSLimits(t *testing.T) {
	f := testCerts(t)
	c := startTLSCluster(t, 1, loadStoreTLS(t, f))
	ctx := testCtx(t)
	kv := kvpb.NewKVClient(dialTLS(t, c.server(1).Addr(), clientTLS(t, f.Client, f.ClientKey, f.CA)))
	bigKey := bytes.Repeat([]byte("k"), MaxKeySize+1)
	cases := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"key of exactly 8 KiB, value of exactly 8 MiB", func() error {
			_, err := kv.Put(ctx, &kvpb.PutRequest{Key: bigKey[:MaxKeySize], Value: make([]byte, MaxValueSize)})
			return err
		}, codes.OK},
		{"key over 8 KiB", func() error { _, err := kv.Get(ctx, &kvpb.GetRequest{Key: bigKey}); return err }, codes.InvalidArgument},
		{"put key over 8 KiB", func() error {
			_, err := kv.Put(ctx, &kvpb.PutRequest{Key: bigKey, Value: []byte("v")})
			return err
		}, codes.InvalidArgument},
		{"value over 8 MiB", func() error {
			_, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte("k"), Value: make([]byte, MaxValueSize+1)})
			return err
		}, codes.InvalidArgument},
		{"scan limit over 10000", func() error {
			_, err := kv.Scan(ctx, &kvpb.ScanRequest{Limit: MaxScanLimit + 1})
			return err
		}, codes.InvalidArgument},
		{"message over 16 MiB", func() error {
			_, err := kv.Put(ctx, &kvpb.PutRequest{Key: []byte("k"), Value: make([]byte, maxRecvMsgSize+1)})
			return err
		}, codes.ResourceExhausted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(tc.call()); got != tc.code {
				t.Fatalf("got %v, want %v", got, tc.code)
			}
		})
	}
	// The client refuses an oversized key itself or gets the store's
	// answer; either way the caller sees InvalidArgument.
	cli, err := client.New(ctx, client.Config{Endpoints: c.endpoints(), TLS: clientTLS(t, f.Client, f.ClientKey, f.CA)})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if err := cli.Put(ctx, bigKey, []byte("v")); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("client put of a big key: %v, want InvalidArgument", err)
	}
}

// TestWithStoreTLSThreeStores: three TLS stores elect a leader and
// replicate over TLS (raft streams, follower ReadIndex, the cluster view),
// and a client reads the write back from every store.
func TestWithStoreTLSThreeStores(t *testing.T) {
	f := testCerts(t)
	c := startTLSCluster(t, 3, loadStoreTLS(t, f))
	ctx := testCtx(t)
	cfg := clientTLS(t, f.Client, f.ClientKey, f.CA)
	cli, err := client.New(ctx, client.Config{Endpoints: c.endpoints(), TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if err := cli.Put(ctx, []byte("replicated"), []byte("yes")); err != nil {
		t.Fatalf("put: %v", err)
	}
	for _, s := range c.servers {
		kv := kvpb.NewKVClient(dialTLS(t, s.Addr(), cfg))
		id := s.Store().ID()
		waitFor(t, 10*time.Second, fmt.Sprintf("store %d to serve the write", id), func() bool {
			g, err := kv.Get(ctx, &kvpb.GetRequest{Context: &kvpb.ReadContext{ReplicaRead: true}, Key: []byte("replicated")})
			return err == nil && g.GetReadInfo().GetStoreId() == id && string(g.GetValue()) == "yes"
		})
	}
	stores, err := cli.Stores(ctx)
	if err != nil {
		t.Fatalf("stores: %v", err)
	}
	for _, st := range stores {
		if !st.Up {
			t.Errorf("store %d not up in the cluster view (peers' Status over TLS): %v", st.ID, st)
		}
	}
}

// TestWithStoreDisableAdmin: with DisableAdmin the mutating Admin calls
// answer PermissionDenied and change nothing, while routing and reads go
// on; with TLS, Join stays open to a caller with a store certificate.
func TestWithStoreDisableAdmin(t *testing.T) {
	f := testCerts(t)
	c := startTLSCluster(t, 1, loadStoreTLS(t, f), func(cfg *Config) { cfg.DisableAdmin = true })
	ctx := testCtx(t)
	cliCfg := clientTLS(t, f.Client, f.ClientKey, f.CA)
	admin := kvpb.NewAdminClient(dialTLS(t, c.server(1).Addr(), cliCfg))

	denied := map[string]func() error{
		"split": func() error {
			_, err := admin.Split(ctx, &kvpb.SplitRequest{Key: []byte("m")})
			return err
		},
		"transfer leader": func() error {
			_, err := admin.TransferLeader(ctx, &kvpb.TransferLeaderRequest{RegionId: 1, ToStoreId: 1})
			return err
		},
		"add peer": func() error {
			_, err := admin.AddPeer(ctx, &kvpb.AddPeerRequest{RegionId: 1, StoreId: 2})
			return err
		},
		"remove peer": func() error {
			_, err := admin.RemovePeer(ctx, &kvpb.RemovePeerRequest{RegionId: 1, StoreId: 1})
			return err
		},
		"fault": func() error {
			_, err := admin.Fault(ctx, &kvpb.FaultRequest{Clear: true})
			return err
		},
		"join with a client certificate": func() error {
			_, err := admin.Join(ctx, &kvpb.JoinRequest{StoreId: 7, Address: "127.0.0.1:1"})
			return err
		},
	}
	for name, call := range denied {
		t.Run(name, func(t *testing.T) {
			err := call()
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "--disable-admin") {
				t.Fatalf("%v, want PermissionDenied naming --disable-admin", err)
			}
		})
	}
	if rs := c.server(1).Store().Regions(); len(rs) != 1 {
		t.Fatalf("regions after the refused split: %d, want 1", len(rs))
	}

	// What clients route with, and replica checks, still answer.
	if _, err := admin.Status(ctx, &kvpb.StatusRequest{}); err != nil {
		t.Errorf("status: %v", err)
	}
	if _, err := admin.Stores(ctx, &kvpb.StoresRequest{}); err != nil {
		t.Errorf("stores: %v", err)
	}
	if _, err := admin.Regions(ctx, &kvpb.RegionsRequest{}); err != nil {
		t.Errorf("regions: %v", err)
	}
	if _, err := admin.RegionDigest(ctx, &kvpb.RegionDigestRequest{RegionId: 1}); err != nil {
		t.Errorf("region digest: %v", err)
	}
	cli, err := client.New(ctx, client.Config{Endpoints: c.endpoints(), TLS: cliCfg})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if err := cli.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatalf("put: %v", err)
	}
	if _, err := cli.Regions(ctx); err != nil {
		t.Fatalf("client regions: %v", err)
	}
	if _, _, err := cli.Split(ctx, []byte("m")); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("client split: %v, want PermissionDenied", err)
	}

	// A store certificate passes the guard: the join reaches the handler,
	// which judges it (store 1's own id is taken).
	storeCfg := clientTLS(t, f.Node, f.NodeKey, f.CA)
	_, err = kvpb.NewAdminClient(dialTLS(t, c.server(1).Addr(), storeCfg)).Join(ctx, &kvpb.JoinRequest{StoreId: 1, Address: "127.0.0.1:1"})
	if code := status.Code(err); code == codes.PermissionDenied || code == codes.OK {
		t.Fatalf("join with a store certificate: %v, want the handler's refusal, not the guard's", err)
	}
}

// TestWithStoreDisableAdminPlain: without TLS the guard refuses the same
// calls, Join included (no caller can prove it is a store).
func TestWithStoreDisableAdminPlain(t *testing.T) {
	c := newClusterWith(t, 1, nil, nil, func(cfg *Config) { cfg.DisableAdmin = true })
	if err := c.server(1).Start(); err != nil {
		t.Fatal(err)
	}
	c.waitLeader(t)
	ctx := testCtx(t)
	admin := c.admin(t, 1)
	if _, err := admin.Split(ctx, &kvpb.SplitRequest{Key: []byte("m")}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("split: %v, want PermissionDenied", err)
	}
	if _, err := admin.Join(ctx, &kvpb.JoinRequest{StoreId: 7, Address: "127.0.0.1:1"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("join: %v, want PermissionDenied", err)
	}
	// The etcd keyspace's restore (hedgekv etcd-restore) is an admin call.
	err := dial(t, c.server(1).Addr()).Invoke(ctx, "/"+etcdapi.RestoreServiceName+"/Apply", wrapperspb.Bytes([]byte("R")), new(wrapperspb.Int64Value))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("etcd restore step: %v, want PermissionDenied", err)
	}
	if _, err := admin.Regions(ctx, &kvpb.RegionsRequest{}); err != nil {
		t.Fatalf("regions: %v", err)
	}
}
