package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/region"
)

// errNoRegion: no store could name a region for the key or id asked.
var errNoRegion = errors.New("not found")

// regionRequest is one operation on one region, sent by Client.send.
type regionRequest struct {
	op string // "get", "put", ... for errors and logs
	// key locates the region, or regionID if byID.
	key      []byte
	byID     bool
	regionID uint64
	// write requests go to the leader with a WriteContext; reads follow the
	// policy with a ReadContext.
	write  bool
	policy ReadPolicy
	// longRunning gives every attempt all the time left instead of
	// attemptTimeout's share: the operation (adding a replica, which waits
	// for it to catch up) may take that long on a healthy leader.
	longRunning bool
	// hedger, for reads of a session with a hedge policy, races a backup
	// attempt against a slow one (hedge.go). nil: never hedged.
	hedger *hedger
	// hedgeInfo is set by each try's race, on the request's goroutine:
	// the last one is what ReadInfo.Hedge reports.
	hedgeInfo HedgeInfo
	// rpc performs one attempt against the chosen replica. It returns the
	// load the store reported, if any, and the RPC's error untouched.
	rpc func(ctx context.Context, cc grpc.ClientConnInterface, a *attempt) (*kvpb.Load, error)

	// Set by send's retry loop after a ServerIsBusy answer (policy's
	// BusyThreshold): busyAvoid reads from any other replica by power of
	// two choices, even under ReplicaLeader (a linearizable ReadIndex read
	// on a follower, as TiKV's load-based replica read does); noBusy drops
	// the threshold once every replica was busy, so the read waits at the
	// least loaded one instead of going round.
	busyAvoid, noBusy bool
}

// attempt is where one try of a request goes and what it carries.
type attempt struct {
	region  cachedRegion
	peer    region.Peer
	storeID uint64
	addr    string
	// replicaRead and maxStaleness qualify reads; see ReadContext.
	replicaRead  bool
	maxStaleness time.Duration
	// hedge marks a backup attempt sent by the race.
	hedge bool
	// busyThreshold, if > 0, lets the store refuse the read with
	// ServerIsBusy when its estimated wait is longer.
	busyThreshold time.Duration
	// resp is what the rpc answered on this attempt (set by the rpc func),
	// so concurrent attempts of one request never share a variable; info is
	// a read's ReadInfo.
	resp any
	info *kvpb.ReadInfo
}

func (a *attempt) readContext() *kvpb.ReadContext {
	rc := &kvpb.ReadContext{
		RegionId:    a.region.ID,
		RegionEpoch: kvpb.FromEpoch(a.region.Epoch),
		ReplicaRead: a.replicaRead,
		Hedge:       a.hedge,
	}
	if a.busyThreshold > 0 {
		rc.BusyThresholdMs = uint64(max((a.busyThreshold+time.Millisecond-1)/time.Millisecond, 1))
	}
	if a.maxStaleness > 0 {
		// Round up so that a sub-millisecond bound still permits a stale
		// read rather than silently meaning "no staleness".
		rc.MaxStalenessMs = uint64((a.maxStaleness + time.Millisecond - 1) / time.Millisecond)
	}
	return rc
}

func (a *attempt) writeContext(requestID uint64) *kvpb.WriteContext {
	return &kvpb.WriteContext{RegionId: a.region.ID, RegionEpoch: kvpb.FromEpoch(a.region.Epoch), RequestId: requestID}
}

// newRequestID returns a random non-zero ID for one logical write.
func newRequestID() uint64 { return rand.Uint64() | 1 }

// result is how a request ended: which attempt succeeded and where.
type result struct {
	attempts int
	final    *attempt
}

// Backoff schedule. NotLeader with a hint and a fresh EpochNotMatch are
// retried at once: the answer already says where to go. The others wait,
// doubling, because what they report (an election, a store restarting, a
// region being created by a split) takes time to settle.
type backoffKind int

const (
	boNoLeader    backoffKind = iota // NotLeader without a usable hint
	boUnreachable                    // store down, connection refused, attempt timed out
	boRegionMiss                     // region gone, key outside it, repeated epoch errors
	boNotReady                       // stale read refused (DataIsNotReady)
	numBackoffKinds
)

var backoffBase = [numBackoffKinds]struct{ base, max time.Duration }{
	boNoLeader:    {10 * time.Millisecond, 300 * time.Millisecond},
	boUnreachable: {20 * time.Millisecond, 500 * time.Millisecond},
	boRegionMiss:  {2 * time.Millisecond, 100 * time.Millisecond},
	boNotReady:    {2 * time.Millisecond, 50 * time.Millisecond},
}

type backoffer struct {
	n [numBackoffKinds]int
}

// next returns how long to wait before the next try of this kind: base ×
// 2^n capped, with "equal jitter" (half fixed, half random) so that clients
// failing together do not retry in lockstep.
func (b *backoffer) next(k backoffKind) time.Duration {
	d := backoffBase[k].base << min(b.n[k], 16)
	if d > backoffBase[k].max || d <= 0 {
		d = backoffBase[k].max
	}
	b.n[k]++
	return d/2 + rand.N(d/2+1)
}

// deadHintGrace is how long a request declines NotLeader hints naming a
// store in its back-off. It covers a leader election after the leader
// died (followers name the dead leader until they time out: 0.5-1 s with
// the default ticks). Past it, the replicas that keep naming the store
// hear from it; it is the leader, and a back-off that other requests keep
// re-arming (their attempts timed out at a loaded store) must not keep
// this one away from it for the back-off's 5 s, over and over, until the
// deadline.
const deadHintGrace = time.Second

// minAttemptTimeout is the least time an attempt is given before the retry
// loop gives up on it and tries elsewhere; see attemptTimeout.
const minAttemptTimeout = time.Second

// attemptTimeout bounds one attempt to half of what remains of the request
// (but at least minAttemptTimeout, or all of it). A store that stopped
// answering without closing its connections (a partition, a stall) would
// otherwise eat the whole deadline; this leaves time to try another replica.
func attemptTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	remaining := time.Until(dl)
	d := max(remaining/2, min(remaining, minAttemptTimeout))
	return context.WithTimeout(ctx, d)
}

// send runs req until it succeeds, fails with an error retrying cannot fix,
// or ctx ends.
//
// It retries, after updating the region cache:
//   - NotLeader: with a hint, at the hinted leader at once; without one, at
//     the next peer after a backoff (an election is under way).
//   - EpochNotMatch: with the regions the store reports as current.
//   - RegionNotFound: after dropping the region so it is reloaded from a
//     store; a replica read at another replica (the store may not have
//     created the region yet).
//   - KeyNotInRegion: after dropping the region so it is reloaded.
//   - DataIsNotReady (stale reads): at another replica, and in the end at
//     the leader, which can always serve.
//   - ServerIsBusy (a read with a busy threshold): at once at another
//     replica; once every replica was busy, without the threshold at the
//     one with the least load.
//   - Unavailable (store down, connection refused) and an attempt that timed
//     out while the request's deadline had not: at another replica, the
//     store marked as failed for this request and for replica selection.
//
// Anything else (InvalidArgument, a NotFound without region error, ...) is
// returned at once. When ctx ends, the error returned wraps both ctx's error
// and the last attempt's, so errors.Is(err, context.DeadlineExceeded) and
// errors.As(err, &region.NotLeaderError{}) both see through it. A request
// without a deadline gets Config.RequestTimeout.
func (c *Client) send(ctx context.Context, req *regionRequest) (result, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
		defer cancel()
	}
	r := &retryState{excluded: storeSet{}}
	var lastErr error
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			return result{attempts: n - 1}, c.giveUp(req, n-1, err, lastErr, r.notReady)
		}
		wait, a, err := c.tryOnce(ctx, req, r.excluded)
		if err == nil {
			return result{attempts: n, final: a}, nil
		}
		// An attempt cut short by the request's own deadline says nothing
		// new: keep the cause of the attempt before it (NotLeader, a store
		// down), which is what the caller needs to see.
		if lastErr == nil || ctx.Err() == nil {
			lastErr = err
		}
		sleep, again, ferr := c.afterFailure(ctx, req, r, wait, a, err)
		if ferr != nil {
			return result{attempts: n, final: a}, ferr
		}
		if !again {
			// The attempt failed because the request's own deadline ended;
			// the loop's check reports it.
			continue
		}
		if c.log.Enabled(ctx, slog.LevelDebug) {
			attrs := []any{"op", req.op, "attempt", n, "sleep", sleep, "err", err}
			if len(req.key) > 0 {
				attrs = append(attrs, "key", region.FormatKey(req.key))
			}
			if a != nil {
				attrs = append(attrs, "region", a.region.ID, "store", a.storeID)
			}
			c.log.Debug("retrying", attrs...)
		}
		if sleep > 0 {
			t := time.NewTimer(sleep)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return result{attempts: n}, c.giveUp(req, n, ctx.Err(), lastErr, r.notReady)
			}
		}
	}
}

// retryState is what a request's retry loop carries from one attempt to
// the next.
type retryState struct {
	bo       backoffer
	excluded storeSet
	// notReady is the last refusal of a stale read for its bound
	// (DataIsNotReady): when the request times out after trying the
	// leader too, lastErr is the leader's (often a connection error)
	// and would hide why no replica served it.
	notReady  error
	epochErrs int
	hints     int
	// declined maps a store this request declined to follow a
	// NotLeader hint to (it was in its back-off) to when it first
	// declined, or last saw it fail itself; see deadHintGrace.
	declined map[uint64]time.Time
}

// exclude keeps store out of the request's next attempts, until every
// replica of a's region was excluded: then none is.
func (r *retryState) exclude(store uint64, a *attempt) {
	r.excluded[store] = struct{}{}
	if len(r.excluded) >= len(a.region.Peers) {
		clear(r.excluded)
	}
}

// afterFailure acts on the error of attempt a (wait: tryOnce found nothing
// to send to yet) as send's comment says: it updates the region cache and
// r, and returns how long to sleep before the next attempt; again false
// when the request's own deadline ended it (no sleep, no log), or the error
// to return when retrying cannot fix it.
func (c *Client) afterFailure(ctx context.Context, req *regionRequest, r *retryState, wait bool, a *attempt, err error) (sleep time.Duration, again bool, _ error) {
	var (
		nl *region.NotLeaderError
		en *region.EpochNotMatchError
		rn *region.RegionNotFoundError
		kn *region.KeyNotInRegionError
		dr *region.DataIsNotReadyError
		sb *region.ServerIsBusyError
		fe *fatalError
		lm *leaderMovedError
	)
	switch {
	case errors.As(err, &fe):
		return 0, false, fmt.Errorf("%s: %w", req.op, fe.err)
	case wait:
		sleep = r.bo.next(boUnreachable)
	case errors.As(err, &nl):
		sleep = c.onNotLeader(r, a, nl)
	case errors.As(err, &lm):
		// The leader check found another leader and cut the attempt
		// short: the cache names it already. Not a failure of the
		// store left behind (it is alive, just no longer leading).
		if r.hints++; r.hints > 2 {
			sleep = r.bo.next(boNoLeader)
		}
	case errors.As(err, &en):
		// As TiKV's client: a store that knows newer regions has
		// given them, and the request goes there at once. A store
		// behind the cache (it has not applied the split or conf
		// change the cache learned from another) is asked again
		// after a back-off: it will catch up. A replica read asks
		// another replica first: the conf change may have removed
		// the one behind, which then never catches up (it hears of
		// its removal only when the leader tells it to go).
		if c.cache.onEpochNotMatch(a.region, en.Current, a.storeID) {
			if a.replicaRead {
				r.exclude(a.storeID, a)
			}
			sleep = r.bo.next(boRegionMiss)
		} else if r.epochErrs++; r.epochErrs > 1 {
			sleep = r.bo.next(boRegionMiss)
		}
	case errors.As(err, &rn):
		// The store does not host the region (yet: a split it has
		// not applied, a replica being added; or any more: one
		// removed). It is no answer: reload the region; a replica
		// read asks another replica in this request (a leader-bound
		// attempt goes where the reloaded region's leader is).
		c.cache.drop(a.region.ID)
		if a.replicaRead {
			r.exclude(a.storeID, a)
		}
		sleep = r.bo.next(boRegionMiss)
	case errors.As(err, &kn):
		c.cache.drop(a.region.ID)
		sleep = r.bo.next(boRegionMiss)
	case errors.As(err, &dr):
		r.notReady = err
		r.excluded[a.storeID] = struct{}{}
		if len(r.excluded) >= len(a.region.Peers) {
			// Every replica refused: wait for safe points to advance,
			// then go round again.
			clear(r.excluded)
			sleep = r.bo.next(boNotReady)
		}
	case errors.As(err, &sb):
		c.stats.get(a.storeID).observeBusy(sb.EstimatedWait)
		r.excluded[a.storeID] = struct{}{}
		req.busyAvoid = true
		if len(r.excluded) >= len(a.region.Peers) {
			clear(r.excluded)
			req.busyAvoid, req.noBusy = false, true
		}
	case isUnreachable(ctx, err):
		sleep = c.onUnreachable(req, r, a)
	case ctx.Err() != nil:
		return 0, false, nil
	default:
		return 0, false, fmt.Errorf("%s: %w", req.op, err)
	}
	return sleep, true, nil
}

// onNotLeader follows a NotLeader answer to attempt a: to the hinted
// leader at once, or after a back-off to the next peer.
func (c *Client) onNotLeader(r *retryState, a *attempt, nl *region.NotLeaderError) (sleep time.Duration) {
	var hint uint64
	if nl.Leader != nil && nl.Leader.StoreID != a.storeID {
		hint = nl.Leader.StoreID
	}
	// A hint naming a store in its back-off is the follower's
	// memory of a leader that just failed (it has not timed out
	// yet): following it would send the request back to a dead
	// store, so it counts as no hint, and that store stays out of
	// this request, for deadHintGrace at most. Replicas that still
	// name it after that hear from it: it leads, whatever our
	// back-off says (other requests' timeouts, on a loaded store,
	// keep re-arming it), and the request goes there.
	deadHint := false
	if hint != 0 && c.stats.get(hint).failedRecently() {
		if r.declined == nil {
			r.declined = map[uint64]time.Time{}
		}
		first, ok := r.declined[hint]
		if !ok {
			first = time.Now()
			r.declined[hint] = first
		}
		deadHint = time.Since(first) < deadHintGrace
	}
	switch {
	case hint != 0 && !deadHint && c.cache.updateLeader(a.region.ID, hint):
		// The hinted store may have failed an earlier attempt of
		// this request; it is the leader now, so try it again.
		delete(r.excluded, hint)
		// Hints are followed at once, but a cluster whose replicas
		// disagree about the leader must not be hammered.
		if r.hints++; r.hints > 2 {
			sleep = r.bo.next(boNoLeader)
		}
	case hint != 0 && !deadHint:
		// The hinted store hosts no peer we know of: our peer
		// list is stale (a conf change). Reload the region, after
		// a pause: the store asked may not have applied the
		// change either.
		c.cache.drop(a.region.ID)
		sleep = r.bo.next(boRegionMiss)
	default:
		if deadHint {
			r.exclude(hint, a)
		}
		c.cache.switchLeaderFrom(a.region.ID, a.storeID)
		sleep = r.bo.next(boNoLeader)
	}
	return sleep
}

// onUnreachable handles an attempt whose store did not answer: the store
// is marked failed and kept out of this request.
func (c *Client) onUnreachable(req *regionRequest, r *retryState, a *attempt) time.Duration {
	c.stats.get(a.storeID).markFailure()
	// Failed for this request itself: hints to it are declined
	// for a grace from now.
	if r.declined == nil {
		r.declined = map[uint64]time.Time{}
	}
	r.declined[a.storeID] = time.Now()
	r.excluded[a.storeID] = struct{}{}
	if req.write || req.policy.Replica == ReplicaLeader {
		c.cache.switchLeaderFrom(a.region.ID, a.storeID)
	}
	if len(r.excluded) >= len(a.region.Peers) {
		clear(r.excluded)
	}
	c.conns.resetBackoff(a.addr)
	return r.bo.next(boUnreachable)
}

// fatalError marks an error the retry loop must return as is.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// tryOnce locates the region, picks a replica and sends one attempt. wait
// reports a failure before any RPC was sent that calls for a backoff (no
// region could be loaded, no replica usable). The returned attempt is nil
// only when wait is true or the error is fatal.
func (c *Client) tryOnce(ctx context.Context, req *regionRequest, excluded storeSet) (wait bool, a *attempt, err error) {
	var loc cachedRegion
	if req.byID {
		loc, err = c.cache.locateID(ctx, req.regionID)
	} else {
		loc, err = c.cache.locateKey(ctx, req.key)
	}
	if err != nil {
		// No region for a key is transient (every key has one; the stores
		// asked may be catching up), but no region with an id after every
		// region was reloaded means there is none.
		if isUnreachable(ctx, err) || errors.Is(err, errNoStore) || (errors.Is(err, errNoRegion) && !req.byID) {
			return true, nil, err
		}
		return false, nil, &fatalError{err}
	}
	policy := req.policy.Replica
	if req.busyAvoid && !req.write {
		policy = ReplicaMixed
	}
	sel, ok := c.selector.pick(&loc, policy, req.write, excluded)
	if !ok {
		clear(excluded)
		return true, nil, fmt.Errorf("region %d: no usable replica", loc.ID)
	}
	a = newAttempt(req, loc, sel.peer, sel.replicaRead)
	st, ok := c.cache.store(a.storeID)
	if !ok {
		// A store we have not heard of (added after we loaded the store
		// list): learn it, or skip it for this request.
		if rerr := c.cache.refreshStores(ctx); rerr != nil {
			c.log.Debug("refresh stores", "err", rerr)
		}
		if st, ok = c.cache.store(a.storeID); !ok {
			excluded[a.storeID] = struct{}{}
			return true, nil, fmt.Errorf("store %d: address unknown: %w", a.storeID, errNoStore)
		}
	}
	a.addr = st.addr
	if req.hedger != nil && !req.write && !req.hedger.policy.Off() {
		a, err = c.race(ctx, req, loc, excluded, a)
	} else {
		err = c.runAttempt(ctx, req, a)
	}
	var fe *fatalError
	if errors.As(err, &fe) {
		return false, nil, err
	}
	return false, a, err
}

// newAttempt is req's attempt at peer of loc (its address still to be
// filled in): a read of the replica's own state when replicaRead (never for
// a write), a read with the policy's staleness bound and busy threshold.
// tryOnce makes the attempts of the retry loop with it, race the hedges.
func newAttempt(req *regionRequest, loc cachedRegion, peer region.Peer, replicaRead bool) *attempt {
	a := &attempt{region: loc, peer: peer, storeID: peer.StoreID, replicaRead: replicaRead && !req.write}
	if !req.write {
		a.maxStaleness = req.policy.MaxStaleness
		if !req.noBusy {
			a.busyThreshold = req.policy.BusyThreshold
		}
	}
	return a
}

// runAttempt sends one attempt to the store a names and classifies its
// error: a region error as such, anything else as a storeError. A read's
// latency feeds the store's window for percentile hedges.
func (c *Client) runAttempt(ctx context.Context, req *regionRequest, a *attempt) error {
	cc, err := c.conns.get(a.addr)
	if err != nil {
		return &fatalError{err}
	}
	actx, cancel := attemptTimeout(ctx)
	if req.longRunning {
		cancel()
		actx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	var moved func() uint64
	if !req.byID && !req.longRunning && !a.replicaRead && len(req.key) > 0 {
		var stop func()
		actx, moved, stop = c.watchLeader(actx, req.key, a)
		defer stop()
	}
	ss := c.stats.get(a.storeID)
	done := ss.start()
	begin := time.Now()
	load, err := req.rpc(actx, cc, a)
	if err != nil && moved != nil && ctx.Err() == nil {
		if leader := moved(); leader != 0 && !region.IsRegionError(kvpb.RegionErrorFromStatus(err).ToError()) {
			// Cut short by the leader check, not failed: the store
			// stays usable (done's "ok" only feeds latency and resets).
			done(false, nil)
			return &leaderMovedError{regionID: a.region.ID, from: a.storeID, to: leader, err: err}
		}
	}
	done(err == nil, load)
	if err == nil {
		if !req.write {
			now := time.Now()
			ss.readWindow().record(now.Sub(begin), now)
		}
		// A stale read names the leader its replica knows: the only way a
		// session that reads stale from followers while its cached leader
		// is down learns of the new one.
		if l := a.info.GetLeaderStoreId(); l != 0 && l != a.region.leaderStoreID {
			c.cache.updateLeader(a.region.ID, l)
		}
		return nil
	}
	// A region error a newer server sends and this client does not know
	// is not one: it falls through as a plain store error.
	if re := kvpb.RegionErrorFromStatus(err).ToError(); region.IsRegionError(re) {
		return fmt.Errorf("store %d: %w", a.storeID, re)
	}
	return &storeError{storeID: a.storeID, addr: a.addr, err: err}
}

// Leader check: an attempt at a region's presumed leader that has not
// answered within leaderCheckDelay (twice the store's usual latency, at
// least leaderCheckMin, at most leaderCheckMax) makes the client ask the
// stores, by a hedged metadata call, who leads the region now.
const (
	leaderCheckMin = 200 * time.Millisecond
	leaderCheckMax = 500 * time.Millisecond
)

func (c *Client) leaderCheckDelay(storeID uint64) time.Duration {
	lat, _ := c.stats.get(storeID).latency()
	return min(max(2*lat, leaderCheckMin), leaderCheckMax)
}

// watchLeader guards an attempt at a region's presumed leader (a write,
// or a leader read) by key. If it has not answered within
// leaderCheckDelay, the stores are asked who leads the key's region; when
// they name another store, the cache learns it and the attempt is
// cancelled, so the retry loop goes to the new leader at once instead of
// waiting out the attempt's timeout at one that does not answer (a leader
// that lost its leadership and then was cut off, or one cut off or stalled
// that the others have replaced). While they still name the same store,
// they are asked again every leaderCheckDelay: a leader cut off or stalled
// while it led is replaced only after an election timeout (0.5-1 s with
// the default ticks), later than the first check. A write
// cancelled so is retried with the same request ID, as after a timeout, so
// it is applied at most once; a wrong guess costs a NotLeader round trip.
// The returned ctx is the attempt's; moved returns the store the check
// found leading (0: none); stop ends the watch.
func (c *Client) watchLeader(ctx context.Context, key []byte, a *attempt) (actx context.Context, moved func() uint64, stop func()) {
	actx, cancel := context.WithCancel(ctx)
	var (
		movedTo atomic.Uint64
		mu      sync.Mutex
		t       *time.Timer
		delay   = c.leaderCheckDelay(a.storeID)
	)
	check := func() {
		if actx.Err() != nil {
			return
		}
		if leader := c.leaderElsewhere(actx, key, a); leader != 0 {
			movedTo.Store(leader)
			cancel()
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if actx.Err() == nil {
			t.Reset(delay)
		}
	}
	mu.Lock()
	t = time.AfterFunc(delay, check)
	mu.Unlock()
	return actx, movedTo.Load, func() {
		cancel()
		mu.Lock()
		t.Stop()
		mu.Unlock()
	}
}

// leaderElsewhere asks the stores who leads the region of the attempt a
// (by key) and returns that store when it is another one hosting a peer,
// after the cache has learned it; 0 otherwise.
func (c *Client) leaderElsewhere(ctx context.Context, key []byte, a *attempt) uint64 {
	infos, err := c.loadRegionByKey(ctx, key)
	if err != nil {
		return 0
	}
	for _, info := range infos {
		if info.GetRegion().GetId() != a.region.ID {
			continue
		}
		leader := info.GetLeaderStoreId()
		if leader == 0 || leader == a.storeID || !hostsStore(info.GetRegion(), leader) {
			return 0
		}
		c.cache.insertInfos(infos)
		c.log.Debug("leader moved while an attempt waited", "region", a.region.ID, "store", a.storeID, "leader", leader)
		return leader
	}
	return 0
}

// leaderMovedError is an attempt the leader check cut short because the
// stores named another leader (watchLeader). It is retried at once there;
// the store it left is not marked as failed.
type leaderMovedError struct {
	regionID, from, to uint64
	err                error
}

func (e *leaderMovedError) Error() string {
	return fmt.Sprintf("store %d: region %d: attempt cancelled, leader moved to store %d: %v", e.from, e.regionID, e.to, e.err)
}

func (e *leaderMovedError) Unwrap() error { return e.err }

// errNoStore: a region names a store no endpoint knows the address of.
var errNoStore = errors.New("store address unknown")

// storeError is a failed RPC to a store, with which store it was. Its text
// puts the gRPC code and message plainly ("store 2 (127.0.0.1:20162):
// Unavailable: connection refused") and it keeps the gRPC status reachable
// for status.FromError and status.Code.
type storeError struct {
	storeID uint64
	addr    string
	err     error
}

func (e *storeError) Error() string {
	who := e.addr
	if e.storeID != 0 {
		who = fmt.Sprintf("store %d (%s)", e.storeID, e.addr)
	}
	if st, ok := status.FromError(e.err); ok {
		return fmt.Sprintf("%s: %s: %s", who, st.Code(), st.Message())
	}
	return fmt.Sprintf("%s: %v", who, e.err)
}

func (e *storeError) Unwrap() error { return e.err }

// isUnreachable reports an error that says nothing about the request and
// everything about the store or the path to it: worth trying elsewhere. An
// attempt that timed out counts only while the request's own ctx is alive.
func isUnreachable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	case codes.Canceled:
		// Canceled with our ctx alive: the conn was closed under us (a
		// store restarting), not the caller giving up.
		return true
	}
	return false
}

// giveUp builds the error for a request whose ctx ended. notReady, the
// last refusal of a stale read for its bound, is named when there was one,
// since that, rather than the last error, is why the read failed.
func (c *Client) giveUp(req *regionRequest, attempts int, ctxErr, lastErr, notReady error) error {
	switch {
	case lastErr == nil:
		return fmt.Errorf("%s: %w", req.op, ctxErr)
	case notReady == nil:
		return fmt.Errorf("%s: gave up after %d attempts: %w; last error: %w", req.op, attempts, ctxErr, lastErr)
	case notReady == lastErr:
		return fmt.Errorf("%s: gave up after %d attempts: %w; no replica could serve it within its staleness bound (%v): %w",
			req.op, attempts, ctxErr, req.policy.MaxStaleness, lastErr)
	}
	return fmt.Errorf("%s: gave up after %d attempts: %w; no replica could serve it within its staleness bound (%v): %w; last error: %w",
		req.op, attempts, ctxErr, req.policy.MaxStaleness, notReady, lastErr)
}
