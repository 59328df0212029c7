package client

// Which replica a read policy sends to: leader, follower, closest,
// prefer-leader away from a failed leader, mixed by in-flight requests.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client/clienttest"
)

func TestPolicySelection(t *testing.T) {
	tests := []struct {
		name   string
		zone   string
		policy ReplicaPolicy
		leader uint64
		// want checks every request the stores received.
		want func(r clienttest.Request) error
	}{
		{
			name: "leader", policy: ReplicaLeader, leader: 2,
			want: func(r clienttest.Request) error {
				if r.StoreID != 2 || r.ReplicaRead {
					return fmt.Errorf("store %d replica_read %v, want leader 2 without replica_read", r.StoreID, r.ReplicaRead)
				}
				return nil
			},
		},
		{
			name: "follower picks a follower with replica_read", policy: ReplicaFollower, leader: 1,
			want: func(r clienttest.Request) error {
				if r.StoreID == 1 || !r.ReplicaRead {
					return fmt.Errorf("store %d replica_read %v, want a follower with replica_read", r.StoreID, r.ReplicaRead)
				}
				return nil
			},
		},
		{
			name: "closest picks the zone match", zone: "dc-b", policy: ReplicaClosest, leader: 1,
			want: func(r clienttest.Request) error {
				if r.StoreID != 2 || !r.ReplicaRead {
					return fmt.Errorf("store %d replica_read %v, want store 2 (dc-b) with replica_read", r.StoreID, r.ReplicaRead)
				}
				return nil
			},
		},
		{
			name: "prefer-leader reads the healthy leader", policy: ReplicaPreferLeader, leader: 3,
			want: func(r clienttest.Request) error {
				if r.StoreID != 3 {
					return fmt.Errorf("store %d, want leader 3", r.StoreID)
				}
				return nil
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := clienttest.NewCluster(t, threeZones...)
			cl.SetLeader(1, tt.leader)
			c := newTestClient(t, cl, tt.zone)
			s := c.Session(ReadPolicy{Replica: tt.policy})
			warm(t, c) // loads the region through the leader
			cl.ResetRequests()
			for range 20 {
				if _, err := s.Get(context.Background(), []byte("k")); !errors.Is(err, ErrNotFound) {
					t.Fatalf("get: %v", err)
				}
			}
			reqs := cl.Requests()
			if len(reqs) != 20 {
				t.Fatalf("%d requests reached stores, want 20", len(reqs))
			}
			for _, r := range reqs {
				if err := tt.want(r); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestPreferLeaderAvoidsFailedLeader(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	c := newTestClient(t, cl, "")
	warm(t, c)
	cl.Store(1).Stop() // the leader's store dies; the region still has it as leader
	cl.SetLeader(1, 0)
	// Without a leader, a follower can only serve stale reads: allow them.
	s := c.Session(ReadPolicy{Replica: ReplicaPreferLeader, MaxStaleness: time.Second})
	for i := range 5 {
		_, info, err := s.GetWithInfo(context.Background(), []byte("k"))
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("get %d: %v", i, err)
		}
		if info.StoreID == 1 {
			t.Fatalf("get %d served by the dead leader's store", i)
		}
		if i > 0 && info.Attempts != 1 {
			t.Errorf("get %d took %d attempts; after the first failure the leader should be avoided", i, info.Attempts)
		}
	}
}

func TestClosestLowestLatency(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	delay := map[uint64]time.Duration{1: 15 * time.Millisecond, 2: 0, 3: 30 * time.Millisecond}
	cl.SetHook(func(_ context.Context, s uint64, m string) error {
		if m == "Get" {
			time.Sleep(delay[s])
		}
		return nil
	})
	c := newTestClient(t, cl, "dc-elsewhere")
	s := c.Session(ReadPolicy{Replica: ReplicaClosest})
	for range 15 {
		if _, err := s.Get(context.Background(), []byte("k")); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get: %v", err)
		}
	}
	reqs := cl.Requests()
	// The first three requests measure each store once; the rest must all
	// go to the fastest.
	for _, r := range reqs[3:] {
		if r.StoreID != 2 {
			t.Fatalf("request went to store %d, want the fastest (2); all: %v", r.StoreID, reqs)
		}
	}
}

func TestMixedBalancesByInflight(t *testing.T) {
	cl := clienttest.NewCluster(t, threeZones...)
	// Store 1 is slow, so the client's requests pile up there; power of
	// two choices must steer new ones to the others.
	cl.SetHook(func(_ context.Context, s uint64, m string) error {
		if m == "Get" && s == 1 {
			time.Sleep(40 * time.Millisecond)
		}
		return nil
	})
	c := newTestClient(t, cl, "")
	warm(t, c)
	cl.ResetRequests()
	s := c.Session(ReadPolicy{Replica: ReplicaMixed})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 15 {
				if _, err := s.Get(context.Background(), []byte("k")); !errors.Is(err, ErrNotFound) {
					t.Errorf("get: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	count := map[uint64]int{}
	for _, r := range cl.Requests() {
		count[r.StoreID]++
	}
	if count[2] == 0 || count[3] == 0 {
		t.Fatalf("requests per store %v: the fast stores must share the load", count)
	}
	if count[1]*3 > count[2] || count[1]*3 > count[3] {
		t.Errorf("requests per store %v: the slow store 1 got too large a share", count)
	}
}
