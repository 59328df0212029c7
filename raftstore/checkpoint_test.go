package raftstore

import (
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/hedgekv/hedgekv/storage/wal"
)

// TestUpdateSyncsWithoutHoldingTheRounds: a write outside the Ready loop
// (engine.update: an ID allocation, a peer created or destroyed) returns
// once durable, but the Ready loop's rounds go on while its checkpoint
// syncs; after a crash its write is there.
func TestUpdateSyncsWithoutHoldingTheRounds(t *testing.T) {
	dir := t.TempDir()
	e, err := openEngine(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	syncing, release := make(chan struct{}), make(chan struct{})
	testHookCheckpointSync = func() {
		close(syncing)
		<-release
	}
	defer func() { testHookCheckpointSync = nil }()
	done := make(chan error, 1)
	go func() {
		done <- e.update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Put([]byte("k"), []byte("durable")) })
	}()
	<-syncing
	testHookCheckpointSync = nil
	round := make(chan error, 1)
	go func() {
		round <- e.round(func() []wal.Item { return nil }, nil, func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketData).Put([]byte("r"), []byte("v"))
		})
	}()
	select {
	case err := <-round:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a round waited for update's checkpoint to sync")
	}
	select {
	case err := <-done:
		t.Fatalf("update returned before its checkpoint synced (err %v)", err)
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
	defer e.close()
	if err := e.db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get([]byte("k")); string(v) != "durable" {
			t.Errorf("update's write after a crash: %q, want durable", v)
		}
		for err := range tx.Check() {
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
