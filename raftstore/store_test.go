package raftstore_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
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

// TestSummaryConcurrent: the cluster view of every peer asks Summary at
// once while splits change what it counts; under -race, the cached
// summary must never be written while another caller copies it.
func TestSummaryConcurrent(t *testing.T) {
	c := newCluster(t, raftstoretest.Options{})
	s, ok := c.Store(1)
	if !ok {
		t.Fatal("no store 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				sum := s.Summary()
				sum.ReplicaStores = append(sum.ReplicaStores, 99) // the caller's own copy
			}
		})
	}
	for i := range 5 {
		if err := c.Split(ctx, []byte{'b' + byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := s.Summary()
		if slices.Contains(got.ReplicaStores, 99) {
			t.Fatalf("summary %+v holds a store a caller added to its copy", got)
		}
		if got.Regions == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("summary %+v, want the 6 regions the splits made", got)
		}
		time.Sleep(10 * time.Millisecond) // a bounded poll: a follower applies the last split a moment later
	}
}
