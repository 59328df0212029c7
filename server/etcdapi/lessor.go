package etcdapi

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
)

// The lessor runs etcd's lease expiry (server/lease/lessor.go) on the
// store whose peer leads the etcd region, the "primary": it alone keeps,
// in memory and on the monotonic clock, when each lease expires, renews it
// on KeepAlive, answers TimeToLive from it, and proposes a Revoke (through
// the region's raft log, like any write) for a lease that expired. The
// keyspace is the truth of which leases exist, their TTLs and their keys;
// the lessor's memory is only their expiries, which no replica persists,
// as on etcd without lease checkpoints.
//
// Every lessorTick the lessor asks the store whether its peer leads the
// region (Store.Regions: no traffic on the region, which may hibernate).
// On becoming primary it loads every lease from the keyspace (a leader
// read, retried every tick until it succeeds) with a full TTL from then,
// plus the election timeout (etcd's Promote(ElectionTimeout)): a lease
// never expires earlier than its last renewal or grant on any leader
// allowed. On losing the leadership it forgets them all (etcd's Demote).
// In between, the Applier tells it of every grant and revoke this store
// applies (applyGrant, applyRevoke), as etcd's apply calls its lessor: a
// grant's TTL runs from its apply on the leader. Promotion is marked
// before the load's read begins, and that read sees every entry committed
// when it began, so a grant is either in the load or applied, hence told,
// after the promotion. KeepAlive and TimeToLive also add a lease they find
// in the keyspace but not in memory (before the load), with a full TTL.
const (
	lessorTick = 100 * time.Millisecond
	// revokeRetryInterval is etcd's expiredLeaseRetryInterval: an expired
	// lease whose revoke did not succeed is proposed again after it.
	revokeRetryInterval = 3 * time.Second
	// maxPendingRevokes bounds the revokes under way (etcd's).
	maxPendingRevokes = 16
	// revokeTimeout bounds one revoke: no two of a lease run at once.
	revokeTimeout = revokeRetryInterval
	// goneKept is how long a revoked lease is remembered (gone), much
	// longer than a read of one lease takes.
	goneKept = 10 * time.Second
)

// errNotPrimary: this store's lessor does not lead the leases now; the
// request goes to the leader.
var errNotPrimary = errors.New("etcdapi: not the primary lessor")

type lessor struct {
	s *Service
	// extend is added to every lease's TTL at a promotion: the election
	// timeout, as etcd's Promote.
	extend time.Duration
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{} // revokes under way
	// pollMu makes each poll's look at the store and its promotion or
	// demotion one step: polls from requests and the loop do not cross.
	pollMu sync.Mutex

	mu      sync.Mutex
	primary bool
	gen     uint64        // bumped at every promotion and demotion
	demotec chan struct{} // closed at the demotion, while primary
	loaded  bool          // the leases were loaded since the promotion
	leases  map[int64]*leaseTimer
	// gone is when each lease recently revoked was forgotten: a read of
	// the keyspace that began before then may still hold it, and must not
	// bring it back. Entries are kept goneKept.
	gone map[int64]time.Time
}

// leaseTimer is a lease as the primary lessor holds it.
type leaseTimer struct {
	ttl      int64
	expiry   time.Time
	added    time.Time
	revokeAt time.Time     // the last revoke proposed for it, zero: none
	revokec  chan struct{} // closed when the lessor forgets it
}

func newLessor(s *Service, extend time.Duration) *lessor {
	ctx, cancel := context.WithCancel(context.Background())
	return &lessor{
		s: s, extend: extend, ctx: ctx, cancel: cancel,
		sem:  make(chan struct{}, maxPendingRevokes),
		gone: map[int64]time.Time{},
	}
}

func (l *lessor) start() { l.wg.Go(l.run) }

// stop ends the loop and the revokes under way and waits for them.
func (l *lessor) stop() {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	if l.primary {
		l.demoteLocked()
	}
	l.mu.Unlock()
}

func (l *lessor) run() {
	t := time.NewTicker(lessorTick)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		l.poll()
		l.mu.Lock()
		primary, loaded := l.primary, l.loaded
		l.mu.Unlock()
		if !primary {
			continue
		}
		if !loaded {
			l.load()
		}
		l.expire()
	}
}

// poll promotes or demotes the lessor as the store's peer of the etcd
// region leads it or not.
func (l *lessor) poll() {
	l.pollMu.Lock()
	defer l.pollMu.Unlock()
	st, ok := l.s.regionStatus()
	leads := ok && st.IsLeader
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() != nil {
		leads = false
	}
	switch {
	case leads && !l.primary:
		l.primary, l.loaded = true, false
		l.gen++
		l.demotec = make(chan struct{})
		l.leases = map[int64]*leaseTimer{}
		l.s.cfg.Logger.Debug("etcd lessor promoted", "store", l.s.cfg.Store.ID())
	case !leads && l.primary:
		l.demoteLocked()
		l.s.cfg.Logger.Debug("etcd lessor demoted", "store", l.s.cfg.Store.ID())
	}
}

func (l *lessor) demoteLocked() {
	l.primary, l.loaded = false, false
	l.gen++
	close(l.demotec)
	l.demotec = nil
	l.leases = nil
	clear(l.gone)
}

// primaryNow reports whether the lessor is primary, asking the store
// first if it was not (a promotion the loop has not seen yet), with the
// generation and the channel closed at its demotion.
func (l *lessor) primaryNow() (bool, uint64, <-chan struct{}) {
	l.mu.Lock()
	if !l.primary {
		l.mu.Unlock()
		l.poll()
		l.mu.Lock()
	}
	defer l.mu.Unlock()
	return l.primary, l.gen, l.demotec
}

// load loads the leases from the keyspace after a promotion: the ones
// memory lacks are added with a full TTL from now and the election
// timeout, the ones the keyspace does not hold (added before the read
// began) are forgotten.
func (l *lessor) load() {
	l.mu.Lock()
	gen, extend := l.gen, l.extend
	l.mu.Unlock()
	start := time.Now()
	var recs []leaseRecord
	err := l.s.leaderView(l.ctx, func(v view) error {
		return v.leases(func(r leaseRecord) bool {
			recs = append(recs, r)
			return true
		})
	})
	if err != nil {
		if !errors.Is(err, errNotPrimary) && l.ctx.Err() == nil {
			l.s.cfg.Logger.Warn("etcd lessor: load the leases", "err", err)
		}
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen != l.gen {
		return
	}
	now := time.Now()
	inState := make(map[int64]bool, len(recs))
	for _, r := range recs {
		inState[r.ID] = true
		if e := l.leases[r.ID]; e != nil {
			e.ttl = r.TTL
			continue
		}
		if g, ok := l.gone[r.ID]; ok && !g.Before(start) {
			continue // revoked while we read
		}
		l.addLocked(r.ID, r.TTL, now.Add(extend+ttlDuration(r.TTL)), now)
	}
	for id, e := range l.leases {
		if !inState[id] && e.added.Before(start) {
			l.forgetLocked(id)
		}
	}
	l.loaded = true
}

func ttlDuration(ttl int64) time.Duration {
	if ttl > int64(math.MaxInt64/time.Second) {
		return math.MaxInt64
	}
	return time.Duration(ttl) * time.Second
}

func (l *lessor) addLocked(id, ttl int64, expiry, now time.Time) *leaseTimer {
	e := &leaseTimer{ttl: ttl, expiry: expiry, added: now, revokec: make(chan struct{})}
	l.leases[id] = e
	return e
}

func (l *lessor) forgetLocked(id int64) {
	if e := l.leases[id]; e != nil {
		close(e.revokec)
		delete(l.leases, id)
	}
	l.gone[id] = time.Now()
}

// ensureLocked is lease id's timer, added if memory lacks it and it was
// not revoked since read, when a read of the keyspace found it (nil if it
// was), with a full TTL from now and, before the leases were loaded after
// the promotion, the election timeout, as they get.
func (l *lessor) ensureLocked(id, ttl int64, read time.Time) *leaseTimer {
	if e := l.leases[id]; e != nil {
		return e
	}
	if g, ok := l.gone[id]; ok && !g.Before(read) {
		return nil
	}
	now, d := time.Now(), ttlDuration(ttl)
	if !l.loaded {
		d += l.extend
	}
	return l.addLocked(id, ttl, now.Add(d), now)
}

// applyGrant is the Applier's word that this store applied the grant of
// lease id (its round may still be running): on the primary the lease's
// TTL runs from now (etcd's Grant on the primary: refresh(0)). An entry
// applied again (a replay) finds the lease there already.
func (l *lessor) applyGrant(id, ttl int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.primary && l.leases[id] == nil {
		now := time.Now()
		l.addLocked(id, ttl, now.Add(ttlDuration(ttl)), now)
	}
}

// applyRevoke is the Applier's word that this store applied the revoke of
// lease id; forget is the lessor's own finding that the keyspace does not
// hold it.
func (l *lessor) applyRevoke(id int64) { l.forget(id) }

func (l *lessor) forget(id int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.primary {
		l.forgetLocked(id)
	}
}

// expire proposes a Revoke for every lease past its expiry (again after
// revokeRetryInterval if the last one did not succeed), at most
// maxPendingRevokes at a time.
func (l *lessor) expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.primary {
		return
	}
	now := time.Now()
	for id, g := range l.gone {
		if now.Sub(g) > goneKept {
			delete(l.gone, id)
		}
	}
	for id, e := range l.leases {
		if now.Before(e.expiry) || (!e.revokeAt.IsZero() && now.Sub(e.revokeAt) < revokeRetryInterval) {
			continue
		}
		select {
		case l.sem <- struct{}{}:
		default:
			return // the next tick
		}
		e.revokeAt = now
		l.wg.Go(func() {
			defer func() { <-l.sem }()
			l.revokeExpired(id)
		})
	}
}

func (l *lessor) revokeExpired(id int64) {
	ctx, cancel := context.WithTimeout(l.ctx, revokeTimeout)
	defer cancel()
	err := l.s.revoke(ctx, id)
	if err == nil || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound) {
		l.forget(id) // the apply told us already, if it was ours
		return
	}
	if l.ctx.Err() == nil {
		l.s.cfg.Logger.Warn("etcd lessor: revoke an expired lease", "lease", id, "err", err)
	}
}

// renew is etcd's lessor.Renew on the primary: the lease's TTL runs again
// from now. It returns the lease's granted TTL, 0 if there is no such
// lease, and the revision of the keyspace it was found in. A lease already
// expired is not renewed: as etcd, renew waits for its revoke (then the
// lease is not found) or the demotion (errNotPrimary).
func (l *lessor) renew(ctx context.Context, id int64) (int64, int64, error) {
	for {
		ok, gen, demotec := l.primaryNow()
		if !ok {
			return 0, 0, errNotPrimary
		}
		read := time.Now()
		rec, found, rev, err := l.s.leaseAt(ctx, id, false)
		if errors.Is(err, errNotPrimary) {
			l.poll() // deposed: the loop would see it a tick later
		}
		if err != nil {
			return 0, 0, err
		}
		if !found.exists {
			return 0, rev, nil
		}
		l.mu.Lock()
		if gen != l.gen {
			l.mu.Unlock()
			continue
		}
		e := l.ensureLocked(id, rec.TTL, read)
		if e == nil {
			l.mu.Unlock()
			continue // revoked meanwhile: read again
		}
		now := time.Now()
		if !now.Before(e.expiry) {
			revokec := e.revokec
			l.mu.Unlock()
			select {
			case <-revokec:
				continue
			case <-demotec:
				return 0, 0, errNotPrimary
			case <-ctx.Done():
				return 0, 0, ctx.Err()
			case <-l.ctx.Done():
				return 0, 0, errNotPrimary
			}
		}
		e.ttl, e.expiry = rec.TTL, now.Add(ttlDuration(rec.TTL))
		l.mu.Unlock()
		return rec.TTL, rev, nil
	}
}

// timeToLive is etcd's leaseTimeToLive on the primary: the seconds left
// before the lease expires (truncated, as etcd's), its granted TTL and,
// if asked, its keys (in key order); TTL -1 if there is no such lease.
func (l *lessor) timeToLive(ctx context.Context, req *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	ok, gen, _ := l.primaryNow()
	if !ok {
		return nil, errNotPrimary
	}
	read := time.Now()
	rec, f, rev, err := l.s.leaseAt(ctx, req.ID, req.Keys)
	if errors.Is(err, errNotPrimary) {
		l.poll()
	}
	if err != nil {
		return nil, err
	}
	out := &pb.LeaseTimeToLiveResponse{Header: l.s.header(rev), ID: req.ID, TTL: -1}
	if !f.exists {
		return out, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen != l.gen {
		// Demoted while reading: the expiry is not ours to tell (etcd's
		// ErrLeaderChanged).
		return nil, rpctypes.ErrGRPCLeaderChanged
	}
	e := l.ensureLocked(req.ID, rec.TTL, read)
	if e == nil {
		return out, nil // revoked meanwhile
	}
	out.TTL, out.GrantedTTL, out.Keys = int64(time.Until(e.expiry).Seconds()), rec.TTL, f.keys
	return out, nil
}

// leaseFound is what leaseAt found of a lease.
type leaseFound struct {
	exists bool
	keys   [][]byte
}

// leaseAt reads lease id (and its keys if withKeys) on the leader, with
// the keyspace's revision; errNotPrimary if this store does not lead the
// region.
func (s *Service) leaseAt(ctx context.Context, id int64, withKeys bool) (leaseRecord, leaseFound, int64, error) {
	var rec leaseRecord
	var f leaseFound
	var rev int64
	err := s.leaderView(ctx, func(v view) error {
		var err error
		if rev, err = v.currentRev(); err != nil {
			return err
		}
		if rec, f.exists, err = v.lease(id); err != nil || !f.exists || !withKeys {
			return err
		}
		f.keys, err = v.leaseKeys(id)
		return err
	})
	return rec, f, rev, err
}

// leaderView reads the keyspace on this store if it leads the region
// (a leader read: its lease, else ReadIndex), else fails with
// errNotPrimary.
func (s *Service) leaderView(ctx context.Context, fn func(view) error) error {
	_, err := s.cfg.Store.ReadView(ctx, raftstore.ReadOptions{}, []byte(Prefix), func(sv raftstore.StateView) error {
		return fn(readView(ctx, sv))
	})
	if err == nil {
		return nil
	}
	var nl *region.NotLeaderError
	if errors.As(err, &nl) {
		return errNotPrimary
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return toStatus(err)
}
