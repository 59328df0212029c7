package raftstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
)

// BenchmarkRead compares lease reads on the leader with ReadIndex reads on
// a follower, side by side, over the in-memory network, and reports the
// raft messages each read cost.
//
//	go test -run=^$ -bench=BenchmarkRead -benchtime=20000x ./raftstore/
func BenchmarkRead(b *testing.B) {
	for _, mode := range []string{"leader", "follower"} {
		b.Run(mode, func(b *testing.B) {
			c := newCluster(b, raftstoretest.Options{})
			ctx := context.Background()
			if err := c.Put(ctx, []byte("k"), []byte("v")); err != nil {
				b.Fatal(err)
			}
			leader, _ := c.Leader(1)
			target := leader
			opts := raftstore.ReadOptions{}
			if mode == "follower" {
				target, opts.ReplicaRead = leader%3+1, true
			}
			s, _ := c.Store(target)
			var msgs atomic.Int64
			var mu sync.Mutex
			byType := map[string]int{}
			c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
				msgs.Add(1)
				mu.Lock()
				byType[m.TypeName()]++
				mu.Unlock()
				return false, 0
			}))
			defer func() { b.Logf("messages by type: %v", byType) }()
			b.ResetTimer()
			var wg sync.WaitGroup
			const workers = 32
			per := b.N / workers
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range per {
						if _, _, _, err := s.Get(ctx, opts, []byte("k")); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(msgs.Load())/float64(per*workers), "msgs/read")
		})
	}
}
