package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/hedgekv/hedgekv/cluster"
)

// TestEtcdRestore: hedgekv etcd-restore --check reads a snapshot taken
// through clientv3, the restore brings its keys up in a new cluster with
// their revisions, a second run says it is done, and a damaged file or a
// missing --from are usage errors.
func TestEtcdRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	start := func() *cluster.Local {
		c, err := cluster.StartLocal(ctx, cluster.LocalConfig{NoSync: true, DisableSplit: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Stop)
		return c
	}
	etcdClient := func(ep string) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		return cli
	}
	a := start()
	acli := etcdClient(a.Endpoints[0])
	for i := range 10 {
		if _, err := acli.Put(ctx, fmt.Sprintf("r/k%d", i%4), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := acli.Delete(ctx, "r/k3"); err != nil {
		t.Fatal(err)
	}
	want, err := acli.Get(ctx, "r/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	rc, err := acli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "snap.db")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	rev := want.Header.Revision

	code, stdout, stderr := runCLI(t, "etcd-restore", "--from", file, "--check")
	if code != exitOK || !strings.Contains(stdout, fmt.Sprintf("revision %d, compaction none, 11 history records, 0 leases", rev)) {
		t.Fatalf("--check: exit %d, %q %q", code, stdout, stderr)
	}
	b := start()
	ep := "--endpoints=" + strings.Join(b.Endpoints, ",")
	code, stdout, stderr = runCLI(t, "etcd-restore", "--from", file, ep)
	if wantOut := fmt.Sprintf("restored %s: revision %d, compaction none, 11 history records, 3 keys\n", file, rev); code != exitOK || stdout != wantOut {
		t.Fatalf("etcd-restore: exit %d, %q (want %q), stderr %q", code, stdout, wantOut, stderr)
	}
	got, err := etcdClient(b.Endpoints[2]).Get(ctx, "r/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if got.Header.Revision != rev || len(got.Kvs) != len(want.Kvs) {
		t.Fatalf("restored: revision %d, %d keys; want %d, %d", got.Header.Revision, len(got.Kvs), rev, len(want.Kvs))
	}
	for i := range got.Kvs {
		if !proto.Equal(got.Kvs[i], want.Kvs[i]) {
			t.Fatalf("restored %v, want %v", got.Kvs[i], want.Kvs[i])
		}
	}
	if code, stdout, _ := runCLI(t, "etcd-restore", "--from", file, ep); code != exitOK || !strings.Contains(stdout, "restored into this keyspace already") {
		t.Fatalf("again: exit %d, %q", code, stdout)
	}

	raw[100] ^= 0xff
	bad := filepath.Join(dir, "bad.db")
	if err := os.WriteFile(bad, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCLI(t, "etcd-restore", "--from", bad, ep); code != exitUsage || !strings.Contains(stderr, "sha256 trailer") {
		t.Fatalf("damaged file: exit %d, %q", code, stderr)
	} else {
		oneLine(t, stderr)
	}
	if code, _, stderr := runCLI(t, "etcd-restore", ep); code != exitUsage || !strings.Contains(stderr, "--from") {
		t.Fatalf("no --from: exit %d, %q", code, stderr)
	}
}
