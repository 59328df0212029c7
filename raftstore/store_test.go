package raftstore_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
)

func newCluster(t testing.TB, opts raftstoretest.Options) *raftstoretest.Cluster {
	t.Helper()
	opts.Dir = t.TempDir()
	if testing.Verbose() {
		opts.LogOutput = os.Stderr
	}
	c, err := raftstoretest.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)
	return c
}

func TestThreeStoresReplicate(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 50; i++ {
		if err := c.Put(ctx, []byte(fmt.Sprintf("k%02d", i)), []byte(fmt.Sprint(i))); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	v, ok, err := c.Get(ctx, []byte("k07"))
	if err != nil || !ok || string(v) != "7" {
		t.Fatalf("get k07 = %q %v %v", v, ok, err)
	}
}
