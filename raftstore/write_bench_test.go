package raftstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
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
		}
	}
	return sum
}
