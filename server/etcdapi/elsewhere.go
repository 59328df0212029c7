package etcdapi

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/metadata"

	"github.com/hedgekv/hedgekv/region"
)

// A store with no replica of the keyspace's region (a cluster with more
// stores than replicas) still serves the etcd API, as any etcd member
// does: it asks the other stores which of them leads the region (their
// Maintenance.Status) and forwards the request there. The answer is kept
// for elsewhereTTL, so a stream of requests asks once; a leader that has
// moved since answers NotLeader, and the next lookup finds the new one.

// elsewhereTTL is how long a leader found on another store is used
// before it is looked up again.
const elsewhereTTL = time.Second

// elsewhereProbe bounds one store's answer to the lookup.
const elsewhereProbe = 500 * time.Millisecond

// elsewhere caches the leader found by leaderElsewhere.
type elsewhere struct {
	mu     sync.Mutex
	leader uint64
	at     time.Time
}

// holdsReplica reports whether this store has a replica of the region
// holding the keyspace.
func (s *Service) holdsReplica() bool {
	_, ok := s.regionStatus()
	return ok
}

// leaderElsewhere returns the store leading the keyspace's region as the
// other stores see it (0: none of them knows), for a store that holds no
// replica of it.
func (s *Service) leaderElsewhere(ctx context.Context) uint64 {
	if s.cfg.Members == nil || s.cfg.Conn == nil || forwarded(ctx) {
		return 0
	}
	s.found.mu.Lock()
	defer s.found.mu.Unlock()
	if s.found.leader != 0 && time.Since(s.found.at) < elsewhereTTL {
		return s.found.leader
	}
	s.found.leader = 0
	self := s.cfg.Store.ID()
	for id := range s.cfg.Members() {
		if id == self {
			continue
		}
		conn, err := s.cfg.Conn(id)
		if err != nil {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, elsewhereProbe)
		// Marked forwarded: the asked store answers from its own view.
		resp, err := pb.NewMaintenanceClient(conn).Status(metadata.AppendToOutgoingContext(pctx, mdForwarded, "1"), &pb.StatusRequest{})
		cancel()
		if err == nil && resp.Leader != 0 && resp.Leader != self {
			s.found.leader, s.found.at = resp.Leader, time.Now()
			return resp.Leader
		}
	}
	return 0
}

// forgetLeader drops the leader found elsewhere if it is id, a store that
// just failed a request (a proxied watch's stream broke): the next
// request looks it up again instead of asking id until elsewhereTTL ends.
func (s *Service) forgetLeader(id uint64) {
	s.found.mu.Lock()
	defer s.found.mu.Unlock()
	if s.found.leader == id {
		s.found.leader = 0
	}
}

// errElsewhere stops a retry loop: this store holds no replica of the
// keyspace, and leader, found on the other stores, should take the request.
type errElsewhere struct{ leader uint64 }

func (e *errElsewhere) Error() string {
	return "etcdserver: hedgekv: the etcd keyspace has no replica here"
}

// routeMissElsewhere turns a route miss (RegionNotFound with no region:
// nothing was proposed) on a store that holds no replica of the keyspace
// into errElsewhere, if another store knows the region's leader; any
// other error is returned as it is.
func (s *Service) routeMissElsewhere(ctx context.Context, err error) error {
	var rnf *region.RegionNotFoundError
	if err == nil || !errors.As(err, &rnf) || rnf.RegionID != 0 || s.holdsReplica() {
		return err
	}
	if leader := s.leaderElsewhere(ctx); leader != 0 {
		return &errElsewhere{leader: leader}
	}
	return err
}
