package client

import (
	"slices"
	"testing"

	"github.com/hedgekv/hedgekv/region"
)

func testRegion(leader uint64) *cachedRegion {
	return &cachedRegion{Region: region.Region{ID: 1, Peers: peers3(0)}, leaderStoreID: leader}
}

func TestReplicaSelector(t *testing.T) {
	zones := map[uint64]string{1: "dc-a", 2: "dc-b", 3: "dc-c"}
	tests := []struct {
		name        string
		zone        string
		policy      ReplicaPolicy
		write       bool
		leader      uint64
		excluded    []uint64
		failed      []uint64 // stores that failed recently
		learners    []uint64 // stores whose peer is a learner
		inflight    map[uint64]int64
		want        []uint64 // acceptable stores
		replicaRead bool
		wantNone    bool
	}{
		{name: "leader", policy: ReplicaLeader, leader: 2, want: []uint64{2}},
		{name: "leader unknown: first peer", policy: ReplicaLeader, leader: 0, want: []uint64{1}},
		{name: "leader excluded: next peer", policy: ReplicaLeader, leader: 3, excluded: []uint64{3}, want: []uint64{1}},
		{name: "writes ignore the read policy", policy: ReplicaFollower, write: true, leader: 2, want: []uint64{2}},
		{name: "follower", policy: ReplicaFollower, leader: 1, want: []uint64{2, 3}, replicaRead: true},
		{name: "follower, one excluded", policy: ReplicaFollower, leader: 1, excluded: []uint64{2}, want: []uint64{3}, replicaRead: true},
		{name: "follower, none usable: leader", policy: ReplicaFollower, leader: 1, excluded: []uint64{2, 3}, want: []uint64{1}, replicaRead: true},
		{name: "follower avoids a recently failed store", policy: ReplicaFollower, leader: 1, failed: []uint64{3}, want: []uint64{2}, replicaRead: true},
		{name: "follower: the client's zone's", zone: "dc-b", policy: ReplicaFollower, leader: 1, want: []uint64{2}, replicaRead: true},
		{name: "follower: the client's zone's, though loaded", zone: "dc-c", policy: ReplicaFollower, leader: 1, inflight: map[uint64]int64{3: 10}, want: []uint64{3}, replicaRead: true},
		{name: "follower: the zone's store leads", zone: "dc-a", policy: ReplicaFollower, leader: 1, want: []uint64{2, 3}, replicaRead: true},
		{name: "follower: the zone's follower excluded", zone: "dc-b", policy: ReplicaFollower, leader: 1, excluded: []uint64{2}, want: []uint64{3}, replicaRead: true},
		{name: "prefer-leader: leader failed, the zone's follower", zone: "dc-c", policy: ReplicaPreferLeader, leader: 2, failed: []uint64{2}, want: []uint64{3}, replicaRead: true},
		{name: "closest: zone match", zone: "dc-c", policy: ReplicaClosest, leader: 1, want: []uint64{3}, replicaRead: true},
		{name: "closest: zone match excluded", zone: "dc-c", policy: ReplicaClosest, leader: 1, excluded: []uint64{3}, want: []uint64{1}, replicaRead: true},
		{name: "prefer-leader: healthy leader", policy: ReplicaPreferLeader, leader: 2, want: []uint64{2}, replicaRead: true},
		{name: "prefer-leader: leader failed recently", policy: ReplicaPreferLeader, leader: 2, failed: []uint64{2}, want: []uint64{1, 3}, replicaRead: true},
		{name: "mixed avoids the loaded store", policy: ReplicaMixed, leader: 1, inflight: map[uint64]int64{2: 10}, want: []uint64{1, 3}, replicaRead: true},
		// A learner is being added: it may be waiting for its snapshot
		// and serves a read only once caught up, if ever in time.
		{name: "follower skips a learner", policy: ReplicaFollower, leader: 1, learners: []uint64{3}, want: []uint64{2}, replicaRead: true},
		{name: "follower: the zone's learner skipped", zone: "dc-c", policy: ReplicaFollower, leader: 1, learners: []uint64{3}, want: []uint64{2}, replicaRead: true},
		{name: "mixed skips a learner", policy: ReplicaMixed, leader: 1, learners: []uint64{3}, want: []uint64{1, 2}, replicaRead: true},
		{name: "closest skips a learner", zone: "dc-c", policy: ReplicaClosest, leader: 1, learners: []uint64{3}, want: []uint64{1, 2}, replicaRead: true},
		{name: "follower: voters excluded, the learner", policy: ReplicaFollower, leader: 1, excluded: []uint64{1, 2}, learners: []uint64{3}, want: []uint64{3}, replicaRead: true},
		{name: "all excluded", policy: ReplicaMixed, leader: 1, excluded: []uint64{1, 2, 3}, wantNone: true},
		{name: "all excluded, leader policy", policy: ReplicaLeader, leader: 1, excluded: []uint64{1, 2, 3}, wantNone: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stats := &statsTable{}
			for _, id := range tt.failed {
				stats.get(id).markFailure()
			}
			for id, n := range tt.inflight {
				stats.get(id).inflight.Store(n)
			}
			sel := &replicaSelector{zone: tt.zone, stats: stats, zoneOf: func(id uint64) string { return zones[id] }}
			ex := storeSet{}
			for _, id := range tt.excluded {
				ex[id] = struct{}{}
			}
			// Selection is randomized: every draw must be acceptable.
			for range 200 {
				r := testRegion(tt.leader)
				for i := range r.Peers {
					r.Peers[i].IsLearner = slices.Contains(tt.learners, r.Peers[i].StoreID)
				}
				got, ok := sel.pick(r, tt.policy, tt.write, ex)
				if tt.wantNone {
					if ok {
						t.Fatalf("picked store %d, want none", got.peer.StoreID)
					}
					return
				}
				if !ok {
					t.Fatal("picked nothing")
				}
				accepted := false
				for _, w := range tt.want {
					accepted = accepted || got.peer.StoreID == w
				}
				if !accepted {
					t.Fatalf("picked store %d, want one of %v", got.peer.StoreID, tt.want)
				}
				if got.replicaRead != tt.replicaRead {
					t.Fatalf("replica_read %v, want %v", got.replicaRead, tt.replicaRead)
				}
			}
		})
	}
}

// With equal load, power of two choices spreads reads evenly.
func TestP2CSpreadsEvenly(t *testing.T) {
	sel := &replicaSelector{stats: &statsTable{}, zoneOf: func(uint64) string { return "" }}
	count := map[uint64]int{}
	const n = 3000
	for range n {
		got, _ := sel.pick(testRegion(1), ReplicaMixed, false, storeSet{})
		count[got.peer.StoreID]++
	}
	for id := uint64(1); id <= 3; id++ {
		if c := count[id]; c < n/4 || c > n/2 {
			t.Errorf("store %d got %d of %d reads: %v", id, c, n, count)
		}
	}
}
