package raftstore

import (
	"math"
	"os"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// heapHeld is the live heap (HeapAlloc after a collection) that what
// build returns holds.
func heapHeld(build func() any) uint64 {
	var before, after runtime.MemStats
	runtime.GC() // twice: sync.Pools (bbolt's pages) keep a victim cache over one
	runtime.GC()
	runtime.ReadMemStats(&before)
	held := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(held)
	if after.HeapAlloc < before.HeapAlloc {
		return 0
	}
	return after.HeapAlloc - before.HeapAlloc
}

// TestMirrorHeapHeld measures the heap the log mirrors of many regions
// hold, each region's log at its longest (LogGCThreshold applied entries
// of 1 KB, the next compaction not yet due): with the whole log mirrored
// (as before the bound) and with the bounded mirror, both as a running
// store builds it (batches of 32 appended, applied and trimmed) and as an
// open loads it from bbolt. HEDGEKV_MIRROR_MEM=full measures the scale
// run's store (51 regions of 5,000 entries); the default is small.
func TestMirrorHeapHeld(t *testing.T) {
	regions, perRegion := 8, 2000
	if os.Getenv("HEDGEKV_MIRROR_MEM") == "full" {
		regions, perRegion = 51, 5000
	}
	const size, batch = 1000, 32
	running := func(bounded bool) func() any {
		return func() any {
			var held []*peerStorage
			for r := range regions {
				s, err := newPeerStorage(nil, persistedPeer{region: region.Region{ID: uint64(r + 1)}, apply: initApplyState}, nil)
				if err != nil {
					t.Fatal(err)
				}
				for lo := uint64(raftInitIndex + 1); lo <= uint64(raftInitIndex+perRegion); lo += batch {
					_ = s.Append(sizedEnts(6, lo, lo+batch-1, size))
					if bounded {
						_ = s.trim(lo+batch-1, 0, 0)
					}
				}
				held = append(held, s)
			}
			return held
		}
	}
	runOld, runNew := heapHeld(running(false)), heapHeld(running(true))

	e, err := engine.Open(t.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for r := range regions {
		rg := testRegion()
		rg.ID = uint64(r + 1)
		last := uint64(raftInitIndex + perRegion)
		mustUpdate(t, e, func(tx *engine.Tx) error {
			if err := putRegion(tx, rg); err != nil {
				return err
			}
			if err := tx.AppendEntries(rg.ID, sizedEnts(6, raftInitIndex+1, last, size), 0); err != nil {
				return err
			}
			return tx.PutApplyState(rg.ID, engine.ApplyState{AppliedIndex: last - batch, AppliedTerm: 6, TruncatedIndex: raftInitIndex, TruncatedTerm: raftInitTerm})
		})
	}
	openNew := heapHeld(func() any {
		pps, err := loadPeers(e)
		if err != nil {
			t.Fatal(err)
		}
		var held []*peerStorage
		for _, pp := range pps {
			s, err := newPeerStorage(e, pp, new(atomic.Uint64))
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, s)
		}
		return held
	})
	openOld := heapHeld(func() any { return loadWholeLogs(t, e, regions) })
	const mb = 1 << 20
	t.Logf("%d regions x %d entries of %d B: heap held by the log mirrors: running %.1f MB before, %.1f MB after; after open %.1f MB before, %.1f MB after",
		regions, perRegion, size, float64(runOld)/mb, float64(runNew)/mb, float64(openOld)/mb, float64(openNew)/mb)
	if runNew*4 > runOld || openNew*4 > openOld {
		t.Fatalf("the bounded mirror holds more than a quarter of the whole log's heap")
	}
}

// loadWholeLogs mirrors the whole log of regions 1..n, as open did before
// the bound.
func loadWholeLogs(t *testing.T, e *engine.Engine, n int) []*raft.MemoryStorage {
	var out []*raft.MemoryStorage
	err := e.View(func(tx *engine.Tx) error {
		for id := uint64(1); id <= uint64(n); id++ {
			ents, err := tx.Entries(id, raftInitIndex+1, math.MaxUint64, math.MaxUint64)
			if err != nil {
				return err
			}
			ms := raft.NewMemoryStorage()
			_ = ms.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: raftInitIndex, Term: raftInitTerm}})
			if err := ms.Append(ents); err != nil {
				return err
			}
			out = append(out, ms)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
