package raftstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
)

// loadSnapRegion writes n pairs of size-byte values into region 1 of e.
func loadSnapRegion(tb testing.TB, e *engine.Engine, n, size int) region.Region {
	tb.Helper()
	r := region.Region{ID: 1, Epoch: region.Epoch{ConfVer: 1, Version: 1}, Peers: []region.Peer{{ID: 1, StoreID: 1}, {ID: 2, StoreID: 2}}}
	val := bytes.Repeat([]byte("v"), size)
	for start := 0; start < n; start += 10000 {
		err := e.Update(func(tx *engine.Tx) error {
			if start == 0 {
				if err := putRegion(tx, r); err != nil {
					return err
				}
				if err := tx.PutApplyState(r.ID, engine.ApplyState{AppliedIndex: 100, AppliedTerm: 6, TruncatedIndex: 100, TruncatedTerm: 6}); err != nil {
					return err
				}
			}
			for i := start; i < min(n, start+10000); i++ {
				if err := tx.Put(fmt.Appendf(nil, "key%08d", i), val); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			tb.Fatal(err)
		}
	}
	return r
}

// TestSnapshotStreamed: a region's snapshot goes from a source (a read
// transaction) through a paced stream into a checked file, and applies
// from the file on another engine with the same data; a corrupted stream
// is refused; a source is read once.
func TestSnapshotStreamed(t *testing.T) {
	src, err := engine.Open(t.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	const n, size = 2000, 1000
	r := loadSnapRegion(t, src, n, size)
	ss, err := newSnapshots(src, slog.Default(), 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.close()
	snap, err := ss.open(r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Metadata.Index != 100 || len(snap.Data) > 32 || !IsSnapshotDescriptor(snap.Data) {
		t.Fatalf("snapshot = %+v, want a descriptor at index 100", snap.Metadata)
	}
	// Written after the snapshot was taken: not in it.
	if err := src.Update(func(tx *engine.Tx) error { return tx.Put([]byte("key99999999"), []byte("late")) }); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rc, err := ss.stream(snap.Data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ss.stream(snap.Data); err == nil {
		t.Fatal("a source was streamed twice")
	}
	var wire bytes.Buffer
	if _, err := io.Copy(&wire, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	took := time.Since(start)
	// 2 MB at 8 MiB/s, with up to 100ms of credit: at least ~140ms.
	if took < 120*time.Millisecond {
		t.Errorf("2 MB streamed in %v at 8 MiB/s: not paced", took)
	}
	path := filepath.Join(t.TempDir(), "recv")
	got, err := receiveSnapshotFile(src, path, r.ID, bytes.NewReader(wire.Bytes()))
	if err != nil || got.ID != r.ID {
		t.Fatalf("receive = %v, %v", got, err)
	}
	bad := bytes.Clone(wire.Bytes())
	bad[len(bad)/2] ^= 1
	if _, err := receiveSnapshotFile(src, filepath.Join(t.TempDir(), "bad"), r.ID, bytes.NewReader(bad)); !errors.Is(err, errCorrupt) {
		t.Fatalf("corrupted stream: err = %v, want errCorrupt", err)
	}
	if _, err := receiveSnapshotFile(src, filepath.Join(t.TempDir(), "other"), 2, bytes.NewReader(wire.Bytes())); !errors.Is(err, errCorrupt) {
		t.Fatalf("region 1's snapshot received as region 2's: err = %v", err)
	}

	dst, err := engine.Open(t.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := dst.Update(func(tx *engine.Tx) error {
		_, err := tx.ApplySnapshotFrom(f, snap.Metadata.Index, snap.Metadata.Term)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	keys := 0
	if err := dst.View(func(tx *engine.Tx) error {
		var err error
		tx.ForEachData(nil, nil, func(k, v []byte) bool {
			keys++
			if len(v) != size {
				err = fmt.Errorf("key %s: %d-byte value", k, len(v))
			}
			return err == nil
		})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if keys != n {
		t.Fatalf("applied %d keys, want %d", keys, n)
	}
}

// TestSnapshotSourcesClose: Stop's close ends a send in progress and
// closes unclaimed sources, so the engine can close.
func TestSnapshotSourcesClose(t *testing.T) {
	e, err := engine.Open(t.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	r := loadSnapRegion(t, e, 2000, 1000)
	ss, err := newSnapshots(e, slog.Default(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := ss.open(r.ID)
	if _, err := ss.open(r.ID); err != nil { // never claimed
		t.Fatal(err)
	}
	rc, err := ss.stream(a.Data)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var sent atomic.Int64
	wg.Add(1)
	go func() { defer wg.Done(); _, _ = io.Copy(countWriter{&sent}, rc) }()
	// Close once the send is under way (paced at 1 MiB/s, it has seconds
	// to go).
	deadline := time.Now().Add(5 * time.Second)
	for sent.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the send never started")
		}
		time.Sleep(time.Millisecond) // a bounded poll
	}
	ss.close()
	wg.Wait()
	done := make(chan error, 1)
	go func() { done <- e.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("engine close blocked by a snapshot transaction")
	}
}

// BenchmarkSnapshotStream measures a 64 MiB region's snapshot: streamed
// unpaced from its read transaction into a checked file, then applied from
// the file in bounded transactions (as the store's worker does), and, for
// comparison, in one write transaction (as the Ready loop did); and the
// heap each needed.
// go test ./raftstore/ -run '^$' -bench SnapshotStream -benchtime 1x
func BenchmarkSnapshotStream(b *testing.B) {
	src, err := engine.Open(b.TempDir(), engine.Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	r := loadSnapRegion(b, src, 64<<10, 1<<10)
	ss, err := newSnapshots(src, slog.Default(), -1)
	if err != nil {
		b.Fatal(err)
	}
	defer ss.close()
	for range b.N {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		peak := watchHeap()
		snap, err := ss.open(r.ID)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		rc, err := ss.stream(snap.Data)
		if err != nil {
			b.Fatal(err)
		}
		path := filepath.Join(b.TempDir(), "recv")
		if _, err := receiveSnapshotFile(src, path, r.ID, rc); err != nil {
			b.Fatal(err)
		}
		rc.Close()
		send := time.Since(start)
		sendPeak := peak()
		fi, _ := os.Stat(path)

		dst, err := engine.Open(b.TempDir(), engine.Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		var m2 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m2)
		peak = watchHeap()
		start = time.Now()
		if _, err := dst.ApplySnapshotFile(path, spanOf(r), nil, func() error { return nil }); err != nil {
			b.Fatal(err)
		}
		apply := time.Since(start)
		applyPeak := peak()
		dst.Close()

		one, err := engine.Open(b.TempDir(), engine.Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		peak = watchHeap()
		start = time.Now()
		f, _ := os.Open(path)
		if err := one.Update(func(tx *engine.Tx) error {
			_, err := tx.ApplySnapshotFrom(f, snap.Metadata.Index, snap.Metadata.Term)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		f.Close()
		apply1 := time.Since(start)
		apply1Peak := peak()
		one.Close()
		mib := float64(fi.Size()) / (1 << 20)
		b.ReportMetric(mib, "snapshot-MiB")
		b.ReportMetric(mib/send.Seconds(), "stream+check-MiB/s")
		b.ReportMetric(apply.Seconds(), "apply-s")
		b.ReportMetric(float64(sendPeak-m0.HeapInuse)/(1<<20), "send-heap-MiB")
		b.ReportMetric(float64(applyPeak-m2.HeapInuse)/(1<<20), "apply-heap-MiB")
		b.ReportMetric(apply1.Seconds(), "apply-1tx-s")
		b.ReportMetric(float64(apply1Peak-m1.HeapInuse)/(1<<20), "apply-1tx-heap-MiB")
	}
}

// watchHeap samples the heap in use every millisecond until the returned
// function is called, which returns the highest sample.
func watchHeap() func() uint64 {
	stop := make(chan struct{})
	res := make(chan uint64, 1)
	go func() {
		var hi uint64
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			hi = max(hi, m.HeapInuse)
			select {
			case <-stop:
				res <- hi
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 { close(stop); return <-res }
}

// countWriter discards what it is given and counts its bytes.
type countWriter struct{ n *atomic.Int64 }

func (w countWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return len(p), nil
}
