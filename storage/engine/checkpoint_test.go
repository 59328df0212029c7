package engine

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/storage/wal"
)

// TestUpdateSyncsWithoutHoldingTheRounds: a write outside the Ready loop
// (Engine.Update: an ID allocation, a peer created or destroyed) returns
// once durable, but the Ready loop's rounds go on while its checkpoint
// syncs; after a crash its write is there.
func TestUpdateSyncsWithoutHoldingTheRounds(t *testing.T) {
	dir := t.TempDir()
	syncing, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool // set once open: the Update's sync is held, once
	e, err := Open(dir, Options{beforeCheckpointSync: func() {
		if held.CompareAndSwap(true, false) {
			close(syncing)
			<-release
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	held.Store(true)
	done := make(chan error, 1)
	go func() {
		done <- e.Update(func(tx *Tx) error { return tx.PutNextID(42) })
	}()
	<-syncing
	round := make(chan error, 1)
	go func() {
		round <- e.Round(func() []wal.Item { return nil }, nil, func(tx *Tx) error {
			return tx.Put([]byte("r"), []byte("v"))
		})
	}()
	select {
	case err := <-round:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a round waited for Update's checkpoint to sync")
	}
	select {
	case err := <-done:
		t.Fatalf("Update returned before its checkpoint synced (err %v)", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	crash(e)
	e, err = openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.View(func(tx *Tx) error {
		if n := tx.NextID(); n != 42 {
			t.Errorf("Update's write after a crash: next ID %d, want 42", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := checkBolt(e); err != nil {
		t.Fatal(err)
	}
}
