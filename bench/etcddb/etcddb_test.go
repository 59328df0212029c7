package etcddb_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"testing"
	"time"

	"github.com/magiconair/properties"
	"github.com/pingcap/go-ycsb/pkg/ycsb"

	"github.com/hedgekv/hedgekv/bench"
	"github.com/hedgekv/hedgekv/bench/etcddb"
)

func TestRegisteredAndValidated(t *testing.T) {
	c := ycsb.GetDBCreator(etcddb.Name)
	if c == nil {
		t.Fatal("etcdkv is not registered")
	}
	p := properties.NewProperties()
	_, _, _ = p.Set(etcddb.PropRead, "eventual")
	if _, err := c.Create(p); err == nil {
		t.Fatal("unknown read consistency accepted")
	}
	p = properties.NewProperties()
	_, _, _ = p.Set(etcddb.PropDialTimeout, "soon")
	if _, err := c.Create(p); err == nil {
		t.Fatal("bad duration accepted")
	}
}

// TestAgainstEtcd exercises every method against a real three-member etcd;
// skipped when no etcd binary is installed.
func TestAgainstEtcd(t *testing.T) {
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("no etcd on PATH (apt-get install etcd-server)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster, err := bench.StartEtcdCluster(ctx, bench.EtcdClusterConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Stop()
	for _, read := range []string{etcddb.ReadLinearizable, etcddb.ReadSerializable} {
		t.Run(read, func(t *testing.T) {
			db, err := etcddb.Open(etcddb.Options{Endpoints: cluster.Endpoints, DialTimeout: 5 * time.Second, RequestTimeout: 10 * time.Second, Read: read})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			table := "t_" + read
			rec := func(i int) map[string][]byte {
				return map[string][]byte{"field0": fmt.Appendf(nil, "a%d", i), "field1": fmt.Appendf(nil, "b%d", i)}
			}
			for i := range 5 {
				if err := db.Insert(ctx, table, fmt.Sprintf("k%d", i), rec(i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := db.Insert(ctx, table+"0", "k0", rec(9)); err != nil { // neighbouring table
				t.Fatal(err)
			}
			// Serializable reads may lag; the write was acknowledged by a
			// quorum, so give the member a moment.
			var got map[string][]byte
			for range 50 {
				if got, err = db.Read(ctx, table, "k4", []string{"field1"}); err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil || len(got) != 1 || string(got["field1"]) != "b4" {
				t.Fatalf("read: %q %v", got, err)
			}
			if _, err := db.Read(ctx, table, "nope", nil); !errors.Is(err, etcddb.ErrNotFound) {
				t.Fatalf("read missing: %v", err)
			}
			if err := db.Update(ctx, table, "k1", map[string][]byte{"field1": []byte("B1")}); err != nil {
				t.Fatal(err)
			}
			if err := db.Update(ctx, table, "nope", rec(0)); !errors.Is(err, etcddb.ErrNotFound) {
				t.Fatalf("update missing: %v", err)
			}
			scan, err := db.Scan(ctx, table, "k3", 10, nil)
			if err != nil || len(scan) != 2 || string(scan[1]["field0"]) != "a4" {
				t.Fatalf("scan stays in the table: %q %v", scan, err)
			}
			if err := db.BatchInsert(ctx, table, []string{"x1", "x2"}, []map[string][]byte{rec(1), rec(2)}); err != nil {
				t.Fatal(err)
			}
			if err := db.BatchUpdate(ctx, table, []string{"x1"}, []map[string][]byte{{"field0": []byte("u")}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			batch, err := db.BatchRead(ctx, table, []string{"k1", "missing", "x1"}, nil)
			if err != nil || string(batch[0]["field1"]) != "B1" || batch[1] != nil || string(batch[2]["field0"]) != "u" || string(batch[2]["field1"]) != "b1" {
				t.Fatalf("batch read: %q %v", batch, err)
			}
			if err := db.BatchDelete(ctx, table, []string{"x1", "x2"}); err != nil {
				t.Fatal(err)
			}
			if err := db.Delete(ctx, table, "k0"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
