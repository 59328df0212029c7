package client

import (
	"math/rand/v2"
	"sync/atomic"

	"github.com/hedgekv/hedgekv/region"
)

// replicaSelector decides, per attempt, which peer of a region a request
// goes to. It is pure apart from reading the per-store stats: the retry loop
// feeds it the region as cached now and the stores this request must avoid.
type replicaSelector struct {
	zone  string      // the client's zone, for ReplicaClosest
	stats *statsTable // in-flight, latency, failures per store
	// zoneOf returns a store's zone ("" if unknown).
	zoneOf func(storeID uint64) string
	// rr is ReplicaRoundRobin's turn counter, shared by the client's
	// sessions as a driver's load-balancing policy is.
	rr atomic.Uint64
}

// selection is where one attempt goes.
type selection struct {
	peer region.Peer
	// replicaRead asks a follower to serve the read through ReadIndex
	// instead of refusing it with NotLeader.
	replicaRead bool
}

// storeSet is a small set of store ids (a region has three peers).
type storeSet map[uint64]struct{}

func (s storeSet) has(id uint64) bool { _, ok := s[id]; return ok }

// pick chooses the peer for the next attempt of a request on r. write
// requests and ReplicaLeader always target the (presumed) leader; the other
// policies are described on ReplicaPolicy. Peers on excluded stores (they
// failed earlier in this request) are never chosen; ok is false if that
// leaves none.
//
// The rules, in order:
//  1. Leader (and writes): the cached leader if not excluded; otherwise, or
//     if the leader is unknown, the first other peer in order, which will
//     either serve or answer NotLeader with a hint.
//  2. Follower: a follower by power of two choices, among those in the
//     client's zone when it has one and some are there; else the leader.
//  3. Mixed: any replica by power of two choices.
//  4. Closest: a replica in the client's zone; else the lowest latency
//     (never-measured stores first, so each gets measured once).
//  5. PreferLeader: the leader unless its store failed recently, else as
//     Follower.
//  6. RoundRobin: every replica in turn.
//
// For 2–6, stores that failed recently are avoided while others remain, so
// a dead store costs one failed attempt per back-off (failureBackoff,
// doubling to maxFailureBackoff), not one per request.
func (s *replicaSelector) pick(r *cachedRegion, policy ReplicaPolicy, write bool, excluded storeSet) (selection, bool) {
	if write || policy == ReplicaLeader {
		p, ok := s.leaderOrNext(r, excluded)
		return selection{peer: p}, ok
	}
	cands := s.candidates(r.Peers, excluded)
	if len(cands) == 0 {
		return selection{}, false
	}
	leader, leaderOK := r.PeerOnStore(r.leaderStoreID)
	leaderOK = leaderOK && r.leaderStoreID != 0 && !excluded.has(leader.StoreID)
	switch policy {
	case ReplicaFollower:
		return s.followerOrLeader(r, cands, excluded), true
	case ReplicaMixed:
		return selection{peer: s.p2c(cands), replicaRead: true}, true
	case ReplicaClosest:
		if s.zone != "" {
			var local []region.Peer
			for _, p := range cands {
				if s.zoneOf(p.StoreID) == s.zone {
					local = append(local, p)
				}
			}
			if len(local) > 0 {
				return selection{peer: s.p2c(local), replicaRead: true}, true
			}
		}
		return selection{peer: s.lowestLatency(cands, r.leaderStoreID), replicaRead: true}, true
	case ReplicaPreferLeader:
		if leaderOK && !s.stats.get(leader.StoreID).failedRecently() {
			return selection{peer: leader, replicaRead: true}, true
		}
		return s.followerOrLeader(r, cands, excluded), true
	case ReplicaRoundRobin:
		return selection{peer: cands[(s.rr.Add(1)-1)%uint64(len(cands))], replicaRead: true}, true
	}
	p, ok := s.leaderOrNext(r, excluded)
	return selection{peer: p}, ok
}

// leaderOrNext returns the cached leader, or the first peer after it (in
// peer order, wrapping) that is not excluded.
func (s *replicaSelector) leaderOrNext(r *cachedRegion, excluded storeSet) (region.Peer, bool) {
	n := len(r.Peers)
	start := 0
	for i, p := range r.Peers {
		if p.StoreID == r.leaderStoreID {
			start = i
			break
		}
	}
	for i := range n {
		p := r.Peers[(start+i)%n]
		if !excluded.has(p.StoreID) {
			return p, true
		}
	}
	return region.Peer{}, false
}

// followerOrLeader is ReplicaFollower: a follower among cands (the
// region's candidates) if there is one, else the leader. A client with a
// zone takes a follower in its zone when there is one: a follower read
// exists to avoid the WAN, and one in another zone pays the WAN trip and
// the ReadIndex round trip both. The caller has checked that some peer is
// not excluded.
func (s *replicaSelector) followerOrLeader(r *cachedRegion, cands []region.Peer, excluded storeSet) selection {
	var fs, local []region.Peer
	for _, p := range cands {
		if p.StoreID != r.leaderStoreID {
			fs = append(fs, p)
			if s.zone != "" && s.zoneOf(p.StoreID) == s.zone {
				local = append(local, p)
			}
		}
	}
	if len(local) > 0 {
		return selection{peer: s.p2c(local), replicaRead: true}
	}
	if len(fs) > 0 {
		return selection{peer: s.p2c(fs), replicaRead: true}
	}
	p, _ := s.leaderOrNext(r, excluded)
	return selection{peer: p, replicaRead: true}
}

// candidates filters out excluded stores and, while others remain,
// learners and stores in their back-off after a failure (see
// storeStats.usable: once the back-off has passed, one request at a time
// probes the store). A learner is a replica being added: until its
// snapshot is in and applied it serves nothing, and a read sent there
// waits out its attempt timeout (TiKV's client skips learners too).
func (s *replicaSelector) candidates(peers []region.Peer, excluded storeSet) []region.Peer {
	var usable, voters, healthy []region.Peer
	for _, p := range peers {
		if excluded.has(p.StoreID) {
			continue
		}
		usable = append(usable, p)
		if p.IsLearner {
			continue
		}
		voters = append(voters, p)
		if s.stats.get(p.StoreID).usable() {
			healthy = append(healthy, p)
		}
	}
	switch {
	case len(healthy) > 0:
		return healthy
	case len(voters) > 0:
		return voters
	}
	return usable
}

// p2c is power of two choices: sample two distinct peers at random and take
// the one with the lower expected cost. Unlike "least loaded", it does not
// make every client stampede to the same store the moment it looks idle,
// and unlike random it steers clear of a loaded store.
func (s *replicaSelector) p2c(peers []region.Peer) region.Peer {
	switch len(peers) {
	case 0:
		return region.Peer{}
	case 1:
		return peers[0]
	}
	i := rand.IntN(len(peers))
	j := rand.IntN(len(peers) - 1)
	if j >= i {
		j++
	}
	a, b := peers[i], peers[j]
	if s.stats.get(b.StoreID).score() < s.stats.get(a.StoreID).score() {
		return b
	}
	return a
}

// lowestLatency returns the peer whose store answered fastest on average.
// A store never measured wins, so that every store gets measured once;
// among equals the leader wins, since it serves without a ReadIndex round.
func (s *replicaSelector) lowestLatency(peers []region.Peer, leaderStore uint64) region.Peer {
	best := peers[0]
	bestLat, bestMeasured := s.stats.get(best.StoreID).latency()
	for _, p := range peers[1:] {
		lat, measured := s.stats.get(p.StoreID).latency()
		switch {
		case !measured && bestMeasured:
		case measured && !bestMeasured:
			continue
		case !measured && !bestMeasured:
			if p.StoreID != leaderStore {
				continue
			}
		case lat > bestLat || (lat == bestLat && p.StoreID != leaderStore):
			continue
		}
		best, bestLat, bestMeasured = p, lat, measured
	}
	return best
}
