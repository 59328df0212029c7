package raftstoretest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"sort"
	"strings"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/replica"
)

// diffBudget bounds the search for a moment when two disagreeing replicas
// can be dumped at one applied index, even once the caller's ctx has ended:
// a mismatch is worth naming the key for.
const diffBudget = 3 * time.Second

// CheckReplicas checks that the replicas of every region on the running
// stores agree: same applied term, region metadata and data at the same
// applied index (replica.Compare). The caller should have stopped
// writing and healed the network; stopped stores are not checked.
//
// Each region is checked at its own quiet moment: a round of digests, one
// per replica, that all carry the same applied index. A digest is read in
// one transaction with its applied index, so digests read one after the
// other are comparable as soon as their indexes match, however the leader
// moves on afterwards. Until then (a follower has not heard the last commit
// index yet, a new leader's empty entry or a conf change is still
// arriving) the region is polled again. Every voter of a region's newest
// configuration whose store runs must have an initialized replica; until it
// has (it may be waiting for its snapshot) the region is polled again too.
// Learners are compared once they are initialized and are not waited for:
// one may legitimately be stuck half-added after a failed move. A store
// hosting a replica that the region's newest configuration no longer names
// (a removed peer being destroyed) is not compared.
//
// CheckReplicas returns nil once every region has been compared and found
// to agree; a *replica.MismatchError naming the first differing
// key (and both values) as soon as one region's replicas disagree; and an
// error saying which regions found no quiet moment, or miss a replica, if
// ctx ends first. It never passes without having compared every region.
func (c *Cluster) CheckReplicas(ctx context.Context) error {
	start := time.Now()
	agreed := 0
	pending, err := replica.Poll(ctx, c.opts.TickInterval,
		func(context.Context) ([]region.Region, error) { return c.Regions(), nil },
		func(_ context.Context, r region.Region) ([]replica.Digest, string) {
			return c.collectDigests(r)
		},
		func(region.Region, []replica.Digest) { agreed++ })
	var mismatch *replica.MismatchError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &mismatch):
		c.nameFirstDifference(ctx, mismatch)
		return fmt.Errorf("replica check: %w", mismatch)
	case ctx.Err() == nil:
		return fmt.Errorf("replica check: %w", err)
	}
	ids := make([]uint64, 0, len(pending))
	for id := range pending {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	reasons := make([]string, len(ids))
	for i, id := range ids {
		reasons[i] = pending[id] + c.raftStates(id)
	}
	return fmt.Errorf("replica check gave up after %v (%v) with %d region(s) never compared (%d agreed): %s%s",
		time.Since(start).Round(time.Millisecond), ctx.Err(), len(ids), agreed, strings.Join(reasons, "; "), dumpGoroutines())
}

// dumpGoroutines writes every goroutine's stack to a file and says where:
// a replica that never catches up may be a Ready loop that stopped.
func dumpGoroutines() string {
	f, err := os.CreateTemp("", "hedgekv-replica-check-*.stacks")
	if err != nil {
		return ""
	}
	defer f.Close()
	if err := pprof.Lookup("goroutine").WriteTo(f, 2); err != nil {
		return ""
	}
	return "; goroutines: " + f.Name()
}

// raftStates is regionID's raft state on every running store, to say why
// a replica lags when the check gives up.
func (c *Cluster) raftStates(regionID uint64) string {
	var b strings.Builder
	for _, id := range c.IDs() {
		s, ok := c.Store(id)
		if !ok {
			continue
		}
		for _, st := range s.Regions() {
			if st.Region.ID == regionID {
				fmt.Fprintf(&b, " [store %d: %v]", id, st)
			}
		}
	}
	return b.String()
}

// collectDigests reads the digest of r on every running store its newest
// configuration names. why is non-empty if they cannot be compared yet.
func (c *Cluster) collectDigests(r region.Region) (ds []replica.Digest, why string) {
	var missing []string
	for _, p := range r.Peers {
		s, running := c.Store(p.StoreID)
		if !running {
			continue
		}
		d, err := s.RegionDigest(r.ID)
		switch {
		case errors.Is(err, raftstore.ErrStopped):
			continue // stopped since the lookup: as if it were not running
		case raftstore.IsReplicaNotFound(err):
			if !p.IsLearner {
				missing = append(missing, fmt.Sprintf("voter %d on running store %d: %v", p.ID, p.StoreID, err))
			}
			continue
		case err != nil:
			missing = append(missing, fmt.Sprintf("store %d: %v", p.StoreID, err))
			continue
		case d.PeerID != p.ID:
			// A replica left over from an earlier peer of the store: it
			// is not the one the region replicates to.
			if !p.IsLearner {
				missing = append(missing, fmt.Sprintf("store %d hosts peer %d, but the region's voter there is %d", p.StoreID, d.PeerID, p.ID))
			}
			continue
		}
		ds = append(ds, d)
	}
	if len(missing) > 0 {
		return nil, fmt.Sprintf("region %d (epoch %d/%d): missing replica: %s", r.ID, r.Epoch.ConfVer, r.Epoch.Version, strings.Join(missing, ", "))
	}
	return ds, ""
}

// nameFirstDifference dumps one replica of each of the two largest groups
// of a mismatch at one applied index and records the first differing key.
func (c *Cluster) nameFirstDifference(ctx context.Context, e *replica.MismatchError) {
	if len(e.Groups) < 2 {
		return
	}
	a, b := e.Groups[0][0], e.Groups[1][0]
	sa, okA := c.Store(a)
	sb, okB := c.Store(b)
	if !okA || !okB {
		e.DiffNote = "a disagreeing store stopped before its data could be dumped"
		return
	}
	deadline := time.Now().Add(diffBudget)
	if d, ok := ctx.Deadline(); ok && d.After(deadline) {
		deadline = d
	}
	var last string
	for {
		ia, kvsA, errA := sa.RegionDump(e.RegionID)
		ib, kvsB, errB := sb.RegionDump(e.RegionID)
		switch {
		case errA != nil || errB != nil:
			last = fmt.Sprintf("dump failed: %v", errors.Join(errA, errB))
		case ia != ib:
			last = fmt.Sprintf("dumps never at one applied index (store %d at %d, store %d at %d)", a, ia, b, ib)
		default:
			if d, ok := replica.Diff(ia, a, kvsA, b, kvsB); ok {
				e.Diff = &d
				return
			}
			if e.What == "data" {
				e.DiffNote = fmt.Sprintf("yet dumps of stores %d and %d at applied index %d hold the same data", a, b, ia)
			}
			return
		}
		if time.Now().After(deadline) {
			e.DiffNote = last
			return
		}
		time.Sleep(c.opts.TickInterval)
	}
}
