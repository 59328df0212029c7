package raftstoretest

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"

	"github.com/hedgekv/hedgekv/storage/vfs"
	"github.com/hedgekv/hedgekv/storage/vfs/vfstest"
)

// disk is a store's modelled disk (Options.PowerLoss): the files the store
// writes through vfs on a strict in-memory file system, and a model of
// what a power loss keeps of bbolt's file, which stays on the OS's.
type disk struct {
	mem  *vfs.MemFS
	bolt *vfstest.OSFile
}

// diskFor returns store id's modelled disk, made on first use. c.mu is
// held.
func (c *Cluster) diskFor(id uint64, dataDir string) *disk {
	if d, ok := c.disks[id]; ok {
		return d
	}
	d := &disk{mem: vfs.NewStrictMem(), bolt: &vfstest.OSFile{Path: filepath.Join(dataDir, "store.db")}}
	c.disks[id] = d
	return d
}

// CutPower cuts store id's power: the store stops as kill -9 would stop
// it (raftstore.Store.Crash: nothing flushed or checkpointed), then its
// disk loses what was never synced, as mode says for the files written
// through vfs, and page by page at random for bbolt's file. The store
// stays down until StartStore. The cluster must run with
// Options.PowerLoss.
func (c *Cluster) CutPower(id uint64, mode vfs.CrashMode, rng *rand.Rand) error {
	c.mu.Lock()
	d, ok := c.disks[id]
	s, running := c.stores[id]
	delete(c.stores, id)
	delete(c.ticks, id)
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("store %d: no modelled disk (Options.PowerLoss)", id)
	}
	if running {
		c.Net.Unregister(id)
		s.Crash()
		c.mu.Lock()
		c.stoppedViolations += s.Stats().FollowerLeaseCommitViolations
		c.mu.Unlock()
	}
	d.mem.Crash(mode, rng)
	if err := d.bolt.PowerLoss(rng); err != nil {
		return fmt.Errorf("store %d: power loss of its bbolt file: %w", id, err)
	}
	return nil
}

// PowerLoss is CutPower, then StartStore: the store restarts on what its
// disk kept.
func (c *Cluster) PowerLoss(id uint64, mode vfs.CrashMode, rng *rand.Rand) error {
	if err := c.CutPower(id, mode, rng); err != nil {
		return err
	}
	return c.StartStore(id)
}
