package raftstore

import (
	"context"
	"errors"
	"testing"
	"time"
)

// An Applier's command that reaches a store without one (its Propose
// refuses it, so it is stepped here as another store's would arrive) is
// acknowledged with ErrNoApplier, writes nothing, and the store goes on.
func TestApplyCommandWithoutApplier(t *testing.T) {
	c := newMiniCluster(t, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := c.mustLeaderOf([]byte("k"))
	err := s.propose(ctx, WriteOptions{}, command{op: opApply, key: []byte("k"), value: []byte("incr k")})
	if !errors.Is(err, ErrNoApplier) {
		t.Fatalf("an opApply entry without an Applier: %v, want ErrNoApplier", err)
	}
	c.put(ctx, []byte("k"), []byte("v"))
	v, found, _, err := s.Get(ctx, ReadOptions{}, []byte("k"))
	if err != nil || !found || string(v) != "v" {
		t.Fatalf("after it: get k = %q %v %v", v, found, err)
	}
}
