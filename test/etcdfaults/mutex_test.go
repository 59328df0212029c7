package etcdfaults

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// TestMutexAndElectionUnderFaults: six clients (two per zone) take a
// concurrency.Mutex and three (one per zone) campaign in a
// concurrency.Election while the nemesis kills and cuts off stores. Each
// holder, inside, reads a log key and a counter, then appends "+id" and
// then "-id" to the log, the second append also setting the counter to
// what it read + 1, each append a Txn fenced on the holder's ownership
// (its key's create revision: Mutex.IsOwner) and on the log's mod
// revision (so an append replayed late by the network cannot land on a
// log that moved). Checked:
//
//   - never two holders at once: a fenced append refused while its holder
//     still owned the lock means someone else wrote the log meanwhile (a
//     violation, unless what was added was the holder's own earlier
//     append, replayed); in the final log every "-id" directly follows
//     its "+id";
//   - no lost update: every acknowledged append is a prefix of the final
//     log, and the counter equals the log's completed sections, between
//     the acknowledged ones and those plus the ones of unknown outcome;
//   - no lost wake-up: once the faults end every client gets the lock
//     finalRounds more times within a bound; a client whose session
//     expired (a partition outlasting it) makes a new one, as users do.
func TestMutexAndElectionUnderFaults(t *testing.T) {
	c := startCluster(t)
	s := seed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	direct := c.directClient(t)
	mlog := newFenceLog(t, ctx, direct, "etcdfaults/mutex/")
	elog := newFenceLog(t, ctx, direct, "etcdfaults/election/")

	var cs []*contender
	for i := range 6 {
		cs = append(cs, &contender{name: fmt.Sprintf("m%d", i), election: false, pfx: "/etcdfaults/lock", log: mlog, cli: c.zoneClient(t, zones[i%len(zones)])})
	}
	for i := range 3 {
		cs = append(cs, &contender{name: fmt.Sprintf("e%d", i), election: true, pfx: "/etcdfaults/leader", log: elog, cli: c.zoneClient(t, zones[i%len(zones)])})
	}
	faultsOver := make(chan struct{})
	var finalDeadline time.Time // set before faultsOver closes
	var wg sync.WaitGroup
	for _, ct := range cs {
		wg.Go(func() { ct.run(ctx, faultsOver, &finalDeadline) })
	}

	nem := newNemesis(c, s)
	nem.run(ctx, faultTime(20*time.Second))
	c.recover()
	t.Logf("faults: %s", nem.summary())
	for _, l := range nem.log {
		t.Log("  " + l)
	}
	finalDeadline = time.Now().Add(60 * time.Second)
	close(faultsOver)
	wg.Wait()

	renewed := 0
	for _, ct := range cs {
		t.Logf("%s: %d sections (%d after the faults), %d sessions, lock errors: %s", ct.name, ct.sections, ct.final, ct.sessions, ct.errs.String())
		if ct.final < finalRounds {
			t.Errorf("%s got the lock %d times of %d after the faults ended (no wake-up?; last error: %v)", ct.name, ct.final, finalRounds, ct.lastErr)
		}
		renewed += max(0, ct.sessions-1)
	}
	if nem.longCuts > 0 && renewed == 0 {
		t.Errorf("%d partitions outlasted the session TTL, yet no client made a new session", nem.longCuts)
	}
	t.Logf("sessions made anew after one expired: %d", renewed)
	mlog.check(t, ctx, direct, "mutex")
	elog.check(t, ctx, direct, "election")
}

// finalRounds is how many times each client must get the lock once the
// faults are over.
const finalRounds = 3

// fenceLog is the log and the counter the holders of one lock write.
type fenceLog struct {
	logKey, counterKey string

	mu           sync.Mutex
	acked        []string // every value of the log an acknowledged append wrote
	ackedExits   int
	unknownExits int
	violations   []string
}

func newFenceLog(t *testing.T, ctx context.Context, cli *clientv3.Client, pfx string) *fenceLog {
	f := &fenceLog{logKey: pfx + "log", counterKey: pfx + "counter"}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := cli.Txn(ctx).Then(clientv3.OpPut(f.logKey, ""), clientv3.OpPut(f.counterKey, "0")).Commit(); err != nil {
		t.Fatal(err)
	}
	return f
}

// holder is a client holding the lock: its key's create revision fences
// its writes.
type holder struct {
	id    string // the section's id in the log: client.sequence
	owner string // the client's name: its ids start with it and a dot
	key   string
	rev   int64
}

func (h holder) fence() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)
}

// section is one critical section of h: read, append "+id", append "-id"
// and the counter. It reports whether the last append was acknowledged.
func (f *fenceLog) section(ctx context.Context, cli *clientv3.Client, h holder) bool {
	rctx, cancel := context.WithTimeout(ctx, opTimeout)
	r, err := cli.Txn(rctx).If(h.fence()).Then(clientv3.OpGet(f.logKey), clientv3.OpGet(f.counterKey)).Commit()
	cancel()
	if err != nil || !r.Succeeded {
		return false // not the owner any more (its session expired), or unknown
	}
	lkv, ckv := r.Responses[0].GetResponseRange().Kvs, r.Responses[1].GetResponseRange().Kvs
	if len(lkv) != 1 || len(ckv) != 1 {
		f.violate("%s: the log or the counter is missing: %v %v", h.id, lkv, ckv)
		return false
	}
	log, counter := string(lkv[0].Value), string(ckv[0].Value)
	n, err := strconv.Atoi(counter)
	if err != nil {
		f.violate("%s: counter %q", h.id, counter)
		return false
	}
	enter := log + "+" + h.id + " "
	rev, ok := f.append(ctx, cli, h, lkv[0].ModRevision, log, enter, nil)
	if !ok {
		return false
	}
	time.Sleep(10 * time.Millisecond) // hold the lock a little
	_, ok = f.append(ctx, cli, h, rev, enter, enter+"-"+h.id+" ", []clientv3.Op{clientv3.OpPut(f.counterKey, strconv.Itoa(n+1))})
	return ok
}

// append writes val (prev and more) to the log if h still owns the lock
// and the log is still prev, at modRev; more are written with it (the
// counter: then the append is a section's exit). It returns the append's
// revision.
func (f *fenceLog) append(ctx context.Context, cli *clientv3.Client, h holder, modRev int64, prev, val string, more []clientv3.Op) (int64, bool) {
	exit := len(more) > 0
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	r, err := cli.Txn(ctx).
		If(h.fence(), clientv3.Compare(clientv3.ModRevision(f.logKey), "=", modRev)).
		Then(append([]clientv3.Op{clientv3.OpPut(f.logKey, val)}, more...)...).
		Else(clientv3.OpGet(h.key), clientv3.OpGet(f.logKey)).Commit()
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case err != nil:
		if exit {
			f.unknownExits++
		}
		return 0, false
	case r.Succeeded:
		f.acked = append(f.acked, val)
		if exit {
			f.ackedExits++
		}
		return r.Header.Revision, true
	}
	own, cur := r.Responses[0].GetResponseRange().Kvs, r.Responses[1].GetResponseRange().Kvs
	if len(own) == 0 || own[0].CreateRevision != h.rev || len(cur) == 0 {
		return 0, false // the lock was lost: the session expired
	}
	// Still the owner, and the log moved: only this client's own earlier
	// append, delivered late, may have moved it.
	now := string(cur[0].Value)
	added, ok := strings.CutPrefix(now, prev)
	for _, tok := range strings.Fields(added) {
		if !strings.HasPrefix(tok[1:], h.owner+".") {
			ok = false
		}
	}
	if !ok {
		f.violations = append(f.violations, fmt.Sprintf("%s held the lock (key %s at %d) and found the log written by another: read %q, now %q",
			h.id, h.key, h.rev, tailOf(prev), tailOf(now)))
	}
	return 0, false
}

func tailOf(s string) string {
	if len(s) > 80 {
		return "..." + s[len(s)-80:]
	}
	return s
}

func (f *fenceLog) violate(format string, a ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.violations = append(f.violations, fmt.Sprintf(format, a...))
}

// check reads the final log and counter and checks them against what the
// holders were told.
func (f *fenceLog) check(t *testing.T, ctx context.Context, cli *clientv3.Client, what string) {
	t.Helper()
	for _, v := range f.violations {
		t.Errorf("%s: two holders at once: %s", what, v)
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	r, err := cli.Txn(ctx).Then(clientv3.OpGet(f.logKey), clientv3.OpGet(f.counterKey)).Commit()
	if err != nil {
		t.Fatalf("%s: read the log: %v", what, err)
	}
	log := string(r.Responses[0].GetResponseRange().Kvs[0].Value)
	counter, _ := strconv.Atoi(string(r.Responses[1].GetResponseRange().Kvs[0].Value))
	toks := strings.Fields(log)
	entered := map[string]bool{}
	exits := 0
	for i, tok := range toks {
		id := tok[1:]
		switch tok[0] {
		case '+':
			if entered[id] {
				t.Errorf("%s: section %s entered twice in the log", what, id)
			}
			entered[id] = true
		case '-':
			exits++
			if i == 0 || toks[i-1] != "+"+id {
				t.Errorf("%s: section %s ends after %q, not right after it began: two holders at once", what, id, strings.Join(toks[max(0, i-4):i], " "))
			}
		}
	}
	lost := 0
	for _, v := range f.acked {
		if !strings.HasPrefix(log, v) {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%s: %d of %d acknowledged appends are not in the final log", what, lost, len(f.acked))
	}
	if counter != exits || counter < f.ackedExits || counter > f.ackedExits+f.unknownExits {
		t.Errorf("%s: counter %d; the log holds %d completed sections, %d acknowledged and %d of unknown outcome", what, counter, exits, f.ackedExits, f.unknownExits)
	}
	t.Logf("%s: %d sections begun, %d completed (%d acknowledged, %d of unknown outcome), counter %d", what, len(entered), exits, f.ackedExits, f.unknownExits, counter)
}

// contender is one client taking a Mutex or campaigning in an Election,
// again and again, with one session at a time.
type contender struct {
	name     string
	election bool
	pfx      string
	log      *fenceLog
	cli      *clientv3.Client

	sess     *concurrency.Session
	sessions int // made
	seq      int
	sections int // completed (the exit acknowledged)
	final    int // of those, after the faults
	errs     counts
	lastErr  error
}

// run takes the lock until the faults are over, then finalRounds more
// times before finalDeadline.
func (ct *contender) run(ctx context.Context, faultsOver <-chan struct{}, finalDeadline *time.Time) {
	defer func() {
		if ct.sess != nil {
			ct.sess.Orphan() // its lease expires; a revoke could wait on a cut store
		}
	}()
	over := false
	for ctx.Err() == nil {
		if !over {
			select {
			case <-faultsOver:
				over = true
			default:
			}
		}
		if over && (ct.final >= finalRounds || time.Now().After(*finalDeadline)) {
			return
		}
		ok, err := ct.round(ctx)
		if err != nil {
			ct.errs.add(errKind(err))
			ct.lastErr = err
			sleepCtx(ctx, 50*time.Millisecond)
			continue
		}
		if ok {
			ct.sections++
			if over {
				ct.final++
			}
		}
	}
}

// session is the contender's session, a new one if it has none or its
// lease expired (the client could not keep it alive).
func (ct *contender) session(ctx context.Context) (*concurrency.Session, error) {
	if ct.sess != nil {
		select {
		case <-ct.sess.Done():
			ct.sess = nil
		default:
			return ct.sess, nil
		}
	}
	// The grant is bounded; NewSession's own grant would wait as long as
	// the session's context lasts.
	gctx, cancel := context.WithTimeout(ctx, opTimeout)
	g, err := ct.cli.Grant(gctx, sessionTTL)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("grant: %w", err)
	}
	s, err := concurrency.NewSession(ct.cli, concurrency.WithTTL(sessionTTL), concurrency.WithLease(g.ID), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	ct.sess = s
	ct.sessions++
	return s, nil
}

// round takes the lock once, runs a section and lets the lock go; it
// reports whether the section completed.
func (ct *contender) round(ctx context.Context) (bool, error) {
	sess, err := ct.session(ctx)
	if err != nil {
		return false, err
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var h holder
	var release func(context.Context) error
	if ct.election {
		e := concurrency.NewElection(sess, ct.pfx)
		if err := e.Campaign(lctx, ct.name); err != nil {
			return false, fmt.Errorf("campaign: %w", err)
		}
		h.key, h.rev, release = e.Key(), e.Rev(), e.Resign
	} else {
		m := concurrency.NewMutex(sess, ct.pfx)
		if err := m.Lock(lctx); err != nil {
			return false, fmt.Errorf("lock: %w", err)
		}
		owner := m.IsOwner()
		h.key, h.rev, release = m.Key(), owner.GetCompare().GetCreateRevision(), m.Unlock
	}
	ct.seq++
	h.owner, h.id = ct.name, fmt.Sprintf("%s.%d", ct.name, ct.seq)
	ok := ct.log.section(ctx, ct.cli, h)
	// A release that fails leaves the key to the session's lease, or to
	// this client's next round (the same key, found again).
	rctx, rcancel := context.WithTimeout(ctx, opTimeout)
	_ = release(rctx)
	rcancel()
	return ok, nil
}

// counts counts errors by kind.
type counts map[string]int

func (c *counts) add(k string) {
	if *c == nil {
		*c = counts{}
	}
	(*c)[k]++
}

func (c counts) String() string {
	if len(c) == 0 {
		return "none"
	}
	var parts []string
	for k, n := range c {
		parts = append(parts, fmt.Sprintf("%s=%d", k, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// errKind names an error for the summary.
func errKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, concurrency.ErrSessionExpired):
		return "session-expired"
	}
	s := err.Error()
	if i := strings.Index(s, ":"); i > 0 {
		s2 := strings.TrimSpace(s[i+1:])
		if len(s2) > 40 {
			s2 = s2[:40]
		}
		return s[:i] + "(" + s2 + ")"
	}
	return s
}
