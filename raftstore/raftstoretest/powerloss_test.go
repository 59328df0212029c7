package raftstoretest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/storage/vfs"
)

// TestPowerLossKeepsAcknowledgedWrites cuts the power of one store at a
// time, in every crash mode, and then of every store at once, while
// writes go on: each acknowledged write was synced on a majority, so it
// must be there after every restart, and the replicas must agree.
func TestPowerLossKeepsAcknowledgedWrites(t *testing.T) {
	c, err := New(Options{Dir: t.TempDir(), PowerLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	rng := rand.New(rand.NewPCG(1, 2))  // the cuts'
	wrng := rand.New(rand.NewPCG(3, 4)) // the writes'
	acked := map[string]string{}
	n := 0
	// write runs alone or on its own goroutine while the cuts wait for it.
	write := func(count int) error {
		for range count {
			n++
			k, v := fmt.Sprintf("k%03d", wrng.IntN(200)), fmt.Sprint(n)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := c.Put(ctx, []byte(k), []byte(v))
			cancel()
			if err != nil {
				return fmt.Errorf("put %s: %w", k, err)
			}
			acked[k] = v
		}
		return nil
	}
	check := func(what string) {
		t.Helper()
		for k, v := range acked {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			got, found, err := c.Get(ctx, []byte(k))
			cancel()
			if err != nil || !found || string(got) != v {
				t.Fatalf("after %s: get %s = %q (found %v, err %v), want the acknowledged %q", what, k, got, found, err, v)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := c.CheckReplicas(ctx); err != nil {
			t.Fatalf("after %s: %v", what, err)
		}
	}
	if err := write(50); err != nil {
		t.Fatal(err)
	}
	for i, id := range c.IDs() {
		mode := vfs.CrashMode(i % 3)
		// Writes race the cut: some land in rounds the store never synced.
		done := make(chan error)
		go func() { done <- write(20) }()
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond) // a pace: where the cut lands
		if err := c.PowerLoss(id, mode, rng); err != nil {
			t.Fatalf("power loss of store %d (%s): %v", id, mode, err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("power loss of store %d (%s)", id, mode))
	}
	// Every store at once: what was acknowledged was synced on a majority.
	if err := write(30); err != nil {
		t.Fatal(err)
	}
	for i, id := range c.IDs() {
		if err := c.CutPower(id, vfs.CrashMode(i%3), rng); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range c.IDs() {
		if err := c.StartStore(id); err != nil {
			t.Fatalf("restart after the whole cluster lost power: %v", err)
		}
	}
	if _, err := c.WaitLeader(1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	check("the whole cluster lost power")
}
