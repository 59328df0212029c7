package raftstore_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/region"
)

// BenchmarkWrite is the write path in one process: 32 writers insert 1 KB
// values under fresh keys through region 1's leader, three stores over the
// in-memory network, each with its round log and fsyncs. It reports the
// raft messages per write; with -cpuprofile it says where a write's CPU
// goes without gRPC (measured: the CPU is a third busy, the rest is the
// rounds' disk waits: 32 writers are latency-bound).
//
//	go test -run=^$ -bench=BenchmarkWrite -benchtime=20000x -cpuprofile=/tmp/w.prof ./raftstore/
func BenchmarkWrite(b *testing.B) {
	c := newCluster(b, raftstoretest.Options{})
	ctx := context.Background()
	leader, _ := c.Leader(1)
	s, _ := c.Store(leader)
	var msgs atomic.Int64
	c.Net.AddFilter(raftstore.FilterFunc(func(*raftstore.Message) (bool, time.Duration) {
		msgs.Add(1)
		return false, 0
	}))
	value := make([]byte, 1024)
	const workers = 32
	var next atomic.Int64
	before := writeStats(c)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				key := []byte(fmt.Sprintf("user%012d", i))
				if err := s.Put(ctx, raftstore.WriteOptions{}, key, value); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(msgs.Load())/float64(b.N), "msgs/write")
	after := writeStats(c)
	n := float64(b.N)
	b.ReportMetric(float64(after.WALRecords-before.WALRecords)/n, "walrecords/write")
	b.ReportMetric(float64(after.WALSyncs-before.WALSyncs)/n, "fsyncs/write")
	b.ReportMetric(float64(after.BatchCommits-before.BatchCommits)/n, "commits/write")
}

// writeStats sums the write counters of every store of c.
func writeStats(c *raftstoretest.Cluster) (sum raftstore.Stats) {
	for _, id := range c.IDs() {
		if s, ok := c.Store(id); ok {
			st := s.Stats()
			sum.WALRecords += st.WALRecords
			sum.WALSyncs += st.WALSyncs
			sum.BatchCommits += st.BatchCommits
			sum.PagesWritten += st.PagesWritten
		}
	}
	return sum
}

// BenchmarkWriteRegions is BenchmarkWrite's load spread over N regions,
// all led from one store (the splits' new regions campaign there): what
// the region count alone costs a write, without gRPC and without leaders
// spread over processes. Keys are hashed-like (uniform over the space),
// so every region gets its share of each round's writes.
//
//	go test -run=^$ -bench=BenchmarkWriteRegions -benchtime=20000x ./raftstore/
func BenchmarkWriteRegions(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("regions=%d", n), func(b *testing.B) {
			// A 1 s election timeout: 64 writers over 16 regions on 2 cores
			// make rounds that outlast the default 100 ms, and leaders that
			// step down measure elections, not writes.
			c := newCluster(b, raftstoretest.Options{ElectionTicks: 100})
			ctx := context.Background()
			const space = 1_000_000
			for i := 1; i < n; i++ {
				if err := c.Split(ctx, []byte(fmt.Sprintf("user%012d", i*space/n))); err != nil {
					b.Fatal(err)
				}
			}
			if got := len(c.Regions()); got < n {
				b.Fatalf("%d regions, want %d", got, n)
			}
			// Writes go straight to the store leading every region (the
			// harness's routing builds every region's status per call).
			leader, err := c.WaitLeader(1, 10*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			s, _ := c.Store(leader)
			deadline := time.Now().Add(10 * time.Second)
			for _, r := range c.Regions() {
				for {
					if l, ok := c.Leader(r.ID); ok && l == leader {
						break
					}
					if time.Now().After(deadline) {
						b.Fatalf("region %d is not led by store %d", r.ID, leader)
					}
					if l, ok := c.Leader(r.ID); ok {
						if ls, ok := c.Store(l); ok {
							_ = ls.TransferLeader(ctx, r.ID, leader)
						}
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			var msgs atomic.Int64
			c.Net.AddFilter(raftstore.FilterFunc(func(*raftstore.Message) (bool, time.Duration) {
				msgs.Add(1)
				return false, 0
			}))
			value := make([]byte, 1024)
			const workers = 64
			before := writeStats(c)
			b.ResetTimer()
			putFromWorkers(ctx, b, s, workers, value, func(i int64) []byte {
				return []byte(fmt.Sprintf("user%012d", (i*7919)%space)) // spread over every region
			})
			b.StopTimer()
			after := writeStats(c)
			nf := float64(b.N)
			b.ReportMetric(float64(msgs.Load())/nf, "msgs/write")
			b.ReportMetric(float64(after.WALRecords-before.WALRecords)/nf, "walrecords/write")
			b.ReportMetric(float64(after.BatchCommits-before.BatchCommits)/nf, "commits/write")
			b.ReportMetric(float64(after.PagesWritten-before.PagesWritten)/float64(max(1, after.BatchCommits-before.BatchCommits)), "pages/commit")
		})
	}
}

// BenchmarkWriteManyRegions writes to `written` regions of `regions`, all
// led from one store, the others asleep (hibernated) when the writes
// begin: what idle regions cost the writes to the rest, in one process,
// without the minutes `bench regions --count 10000 --load` takes. It
// reports the bbolt pages the batch commits wrote per write, and the GC
// cycles per thousand writes. Measured 2026-11-28 (20,000 writes, 64
// writers): 123 µs/write to 100 of 100 regions, 146 µs to 100 of 10,000
// (1.19×); pages per write 8.8 and 7.2, GC cycles per 1,000 writes 2.3
// and 0.35: in one process, with every region led from one store, idle
// regions cost the writes far less than across three processes.
//
//	go test -run=^$ -bench=BenchmarkWriteManyRegions -benchtime=20000x ./raftstore/
func BenchmarkWriteManyRegions(b *testing.B) {
	for _, tc := range []struct{ regions, written int }{{100, 100}, {10000, 100}} {
		b.Run(fmt.Sprintf("regions=%d/written=%d", tc.regions, tc.written), func(b *testing.B) {
			c := newCluster(b, raftstoretest.Options{ElectionTicks: 100, HibernateAfter: time.Second})
			ctx := context.Background()
			leader, err := c.WaitLeader(1, 10*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			s, _ := c.Store(leader)
			const space = 1_000_000
			width := space / tc.regions
			// Straight to the store that leads every region (the harness's
			// routing reads every region's status per call): a split-born
			// region's first campaign is on the store that split it.
			for i := 1; i < tc.regions; i++ {
				key := []byte(fmt.Sprintf("user%012d", i*width))
				// A split-born region may lose its first leader on a busy
				// machine (check quorum) and elect again: retry for a while.
				for giveUp := time.Now().Add(30 * time.Second); ; {
					if _, _, err := s.Split(ctx, key); err == nil {
						break
					} else if time.Now().After(giveUp) {
						b.Fatalf("split at %s: %v", key, err)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			deadline := time.Now().Add(2 * time.Minute)
			for {
				asleep := true
				for _, id := range c.IDs() {
					if st, ok := c.Store(id); ok {
						g := st.Gauges()
						asleep = asleep && g.Regions == tc.regions && g.Hibernating >= tc.regions-tc.regions/100
					}
				}
				if sum := s.Summary(); asleep && sum.Leaders == tc.regions {
					break
				}
				if time.Now().After(deadline) {
					g := s.Gauges()
					b.Fatalf("after 2m: store %d leads %d of %d regions, %d hibernating", leader, s.Summary().Leaders, tc.regions, g.Hibernating)
				}
				time.Sleep(100 * time.Millisecond)
			}
			value := make([]byte, 1024)
			const workers = 64
			before := writeStats(c)
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			b.ResetTimer()
			putFromWorkers(ctx, b, s, workers, value, func(i int64) []byte {
				r := int(i%int64(tc.written)) * (tc.regions / tc.written)
				return []byte(fmt.Sprintf("user%012d", r*width+int(i*7919)%width))
			})
			b.StopTimer()
			runtime.ReadMemStats(&ms1)
			after := writeStats(c)
			nf := float64(b.N)
			b.ReportMetric(float64(after.PagesWritten-before.PagesWritten)/nf, "pages/write")
			b.ReportMetric(float64(ms1.NumGC-ms0.NumGC)*1000/nf, "gcs/1000writes")
		})
	}
}

// putFromWorkers makes b.N writes of value through s from workers
// goroutines, write i under keyOf(i), each retried on a region error for
// up to a second (a leader settling after the splits).
func putFromWorkers(ctx context.Context, b *testing.B, s *raftstore.Store, workers int, value []byte, keyOf func(i int64) []byte) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				key := keyOf(i)
				err := s.Put(ctx, raftstore.WriteOptions{}, key, value)
				for try := 0; err != nil && region.IsRegionError(err) && try < 100; try++ {
					time.Sleep(10 * time.Millisecond)
					err = s.Put(ctx, raftstore.WriteOptions{}, key, value)
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
