// Package raftstoretest is the in-process cluster harness: N stores over
// the in-memory network with fault filters, in the spirit of
// hashicorp/raft's testing.go. Tests drive stores directly; logs go to the
// test's writer so only failing tests show them.
package raftstoretest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/clock"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
)

// Options shape a cluster.
type Options struct {
	Stores        int           // default 3
	TickInterval  time.Duration // default 10ms
	ElectionTicks int           // default 10
	// StoreElectionTicks overrides ElectionTicks for single stores: a store
	// that campaigns sooner than its peers lets a spec time an election
	// against the lease the others hold.
	StoreElectionTicks map[uint64]int
	// Clock, if set, gives each store its clock (see SkewedClock).
	Clock func(storeID uint64) clock.Clock
	// ManualClock runs every store on one clock.Manual (Cluster.Clock):
	// time stands still, so no store ticks, no lease ends and no store
	// hibernates until the test steps it with Tick or Advance. New and
	// WaitLeader step it a tick at a time while they wait for a leader.
	// Not with Clock.
	ManualClock bool
	// Knobs, if set, gives each store its testing knobs.
	Knobs          func(storeID uint64) raftstore.TestingKnobs
	LogGCThreshold uint64 // default raftstore's
	// SplitMaxKeys > 0 turns on automatic splits, checked every 100ms.
	SplitMaxKeys uint64
	// MergeMaxKeys > 0 turns on automatic merges of regions that together
	// hold at most that many keys and kept their shape MergeAfterSplit
	// (default 200ms); MergeSettleAfter > 0 has a frozen region's merge
	// settled after that long. Either runs the merge check every 100ms,
	// which is off otherwise.
	MergeMaxKeys     uint64
	MergeAfterSplit  time.Duration
	MergeSettleAfter time.Duration
	// KeepWhole is every store's Config.KeepWhole: ranges no split cuts.
	KeepWhole []raftstore.KeepRange
	// Balance turns on the leader and replica balancer, every 100ms.
	Balance bool
	// MaxStoreDownTime before a down store's replicas are replaced.
	MaxStoreDownTime time.Duration
	// DedupWindow: how many log entries a region remembers applied
	// request IDs for (0: the store's default).
	DedupWindow uint64
	// HibernateAfter, 0 for never (the store's default is 10s).
	HibernateAfter time.Duration
	// BatchInterval, 0 for the store's default (20 ms).
	BatchInterval time.Duration
	// FollowerLeases turns follower read leases on in every store;
	// FollowerLeaseDuration is their longest grant (0: the store's default).
	FollowerLeases        bool
	FollowerLeaseDuration time.Duration
	// Applier is every store's Config.Applier (nil: none), for the
	// commands of Store.Propose.
	Applier raftstore.Applier
	// PowerLoss runs every store on a modelled disk, so that its power
	// can be cut (CutPower, PowerLoss): the files a store writes through
	// vfs on its own vfs.NewStrictMem, and bbolt's file on the OS's with a
	// model of what a power loss keeps of it. Such stores sync for real
	// (not NoSync); their data dirs go on tmpfs when there is one (the
	// model, not the disk, says what a sync kept), removed by Shutdown.
	PowerLoss bool
	Dir       string    // required: a temp dir the cluster owns
	LogOutput io.Writer // default: discard
}

// Cluster is N in-process stores.
type Cluster struct {
	Net     *raftstore.InmemNetwork
	opts    Options
	ids     []uint64
	initial []uint64 // the stores that bootstrapped region 1

	mu     sync.Mutex
	stores map[uint64]*raftstore.Store
	disks  map[uint64]*disk // Options.PowerLoss: each store's, kept across restarts
	// dataDir is where the stores' data dirs go: Options.Dir, or with
	// Options.PowerLoss a dir on tmpfs, removed by Shutdown.
	dataDir, tmpfsDir string
	// stoppedViolations sums the follower-lease commit violations counted
	// by store instances since stopped (their counters die with them).
	stoppedViolations uint64

	// Options.ManualClock: the stores' clock, and each running store
	// instance's count of the ticks its loop has finished.
	manual *clock.Manual
	ticks  map[uint64]*tickCount
	tickMu sync.Mutex // one Advance at a time
}

// tickCount is one store instance's ticks: its loop's ticker was armed at
// start, and done counts the ticks its loop has finished (AfterTick).
type tickCount struct {
	start time.Time
	done  atomic.Int64
}

// New starts a cluster and waits for region 1 to elect a leader.
func New(opts Options) (*Cluster, error) {
	if opts.Stores == 0 {
		opts.Stores = 3
	}
	if opts.TickInterval == 0 {
		opts.TickInterval = 10 * time.Millisecond
	}
	if opts.ElectionTicks == 0 {
		opts.ElectionTicks = 10
	}
	if opts.LogOutput == nil {
		opts.LogOutput = io.Discard
	}
	if opts.Dir == "" {
		return nil, errors.New("raftstoretest: Options.Dir is required")
	}
	if opts.ManualClock && opts.Clock != nil {
		return nil, errors.New("raftstoretest: Options.ManualClock and Options.Clock both set")
	}
	c := &Cluster{Net: raftstore.NewInmemNetwork(), opts: opts, stores: make(map[uint64]*raftstore.Store),
		disks: make(map[uint64]*disk), dataDir: opts.Dir}
	if opts.ManualClock {
		c.manual = clock.NewManual(time.Unix(1_700_000_000, 0))
		c.ticks = make(map[uint64]*tickCount)
	}
	if opts.PowerLoss {
		if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
			if dir, err := os.MkdirTemp("/dev/shm", "hedgekv-cluster-"); err == nil {
				c.dataDir, c.tmpfsDir = dir, dir
			}
		}
	}
	for i := 1; i <= opts.Stores; i++ {
		c.ids = append(c.ids, uint64(i))
	}
	c.initial = append([]uint64(nil), c.ids...)
	for _, id := range c.ids {
		if err := c.StartStore(id); err != nil {
			c.Shutdown()
			return nil, err
		}
	}
	if _, err := c.WaitLeader(1, 10*time.Second); err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

// IDs are the store IDs.
func (c *Cluster) IDs() []uint64 { return append([]uint64(nil), c.ids...) }

// StartStore (re)starts store id from its data dir.
func (c *Cluster) StartStore(id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.stores[id]; ok {
		return fmt.Errorf("store %d already running", id)
	}
	log := slog.New(slog.NewTextHandler(c.opts.LogOutput, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg := raftstore.Config{
		StoreID:            id,
		Zone:               fmt.Sprintf("dc-%c", 'a'+rune(id-1)%26),
		DataDir:            filepath.Join(c.dataDir, fmt.Sprintf("store%d", id)),
		InitialStores:      c.initial,
		TickInterval:       c.opts.TickInterval,
		ElectionTicks:      c.opts.ElectionTicks,
		LogGCThreshold:     c.opts.LogGCThreshold,
		SplitCheckInterval: -1,
		MergeCheckInterval: -1,
		SplitMaxKeys:       c.opts.SplitMaxKeys,
		KeepWhole:          c.opts.KeepWhole,
		BalanceInterval:    -1,
		MaxStoreDownTime:   c.opts.MaxStoreDownTime,
		HibernateAfter:     c.opts.HibernateAfter,
		BatchInterval:      c.opts.BatchInterval,
		FollowerLeases:     c.opts.FollowerLeases,

		FollowerLeaseDuration: c.opts.FollowerLeaseDuration,
		DedupWindow:           c.opts.DedupWindow,
		Applier:               c.opts.Applier,
		NoSync:                true,
		Logger:                log,
	}
	if t, ok := c.opts.StoreElectionTicks[id]; ok {
		cfg.ElectionTicks = t
	}
	if c.opts.Clock != nil {
		cfg.Clock = c.opts.Clock(id)
	}
	if c.opts.Knobs != nil {
		cfg.Knobs = c.opts.Knobs(id)
	}
	var ticks *tickCount
	if c.manual != nil {
		ticks = &tickCount{start: c.manual.Now()}
		cfg.Clock = c.manual
		if after := cfg.Knobs.AfterTick; after != nil {
			cfg.Knobs.AfterTick = func() { after(); ticks.done.Add(1) }
		} else {
			cfg.Knobs.AfterTick = func() { ticks.done.Add(1) }
		}
	}
	if c.opts.SplitMaxKeys > 0 {
		cfg.SplitCheckInterval = 100 * time.Millisecond
	}
	if c.opts.MergeMaxKeys > 0 || c.opts.MergeSettleAfter > 0 {
		cfg.MergeCheckInterval = 100 * time.Millisecond
		cfg.MergeMaxKeys = c.opts.MergeMaxKeys
		cfg.MergeAfterSplit = c.opts.MergeAfterSplit
		if cfg.MergeAfterSplit == 0 {
			cfg.MergeAfterSplit = 200 * time.Millisecond
		}
		cfg.Knobs.MergeSettleAfter = c.opts.MergeSettleAfter
	}
	if c.opts.HibernateAfter == 0 {
		cfg.HibernateAfter = -1
	}
	if c.opts.Balance {
		cfg.BalanceInterval = 100 * time.Millisecond
	}
	if c.opts.PowerLoss {
		d := c.diskFor(id, cfg.DataDir)
		cfg.FS, cfg.AfterBoltSync, cfg.NoSync = d.mem, d.bolt.Synced, false
	}
	s, err := raftstore.NewStore(cfg, c.Net.Transport(id))
	if err != nil {
		return fmt.Errorf("start store %d: %w", id, err)
	}
	s.SetClusterView(c)
	s.SetRegionIDSource(c)
	c.Net.Register(id, s)
	s.Start()
	c.stores[id] = s
	if ticks != nil {
		c.ticks[id] = ticks
	}
	return nil
}

// AddStore starts a new, empty store that joins the running cluster.
func (c *Cluster) AddStore() (uint64, error) {
	c.mu.Lock()
	id := uint64(len(c.ids) + 1)
	c.ids = append(c.ids, id)
	c.mu.Unlock()
	return id, c.StartStore(id)
}

// StopStore stops store id as a crash would: it vanishes from the network
// and its process state is lost; its bbolt file stays.
func (c *Cluster) StopStore(id uint64) error {
	c.mu.Lock()
	s, ok := c.stores[id]
	delete(c.stores, id)
	delete(c.ticks, id)
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("store %d not running", id)
	}
	c.Net.Unregister(id)
	err := s.Stop()
	c.mu.Lock()
	c.stoppedViolations += s.Stats().FollowerLeaseCommitViolations
	c.mu.Unlock()
	return err
}

// FollowerLeaseViolations is how many commits broke the follower-lease
// rule on any store instance of the cluster so far, stopped ones included
// (raftstore.Stats.FollowerLeaseCommitViolations): always 0 unless the
// rule is broken.
func (c *Cluster) FollowerLeaseViolations() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.stoppedViolations
	for _, s := range c.stores {
		n += s.Stats().FollowerLeaseCommitViolations
	}
	return n
}

// Store returns a running store.
func (c *Cluster) Store(id uint64) (*raftstore.Store, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.stores[id]
	return s, ok
}

// Shutdown stops every store.
func (c *Cluster) Shutdown() {
	c.mu.Lock()
	ids := make([]uint64, 0, len(c.stores))
	for id := range c.stores {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		_ = c.StopStore(id)
	}
	c.Net.ClearFilters()
	c.Net.Wait()
	c.mu.Lock()
	for _, d := range c.disks {
		d.bolt.Release()
	}
	c.mu.Unlock()
	if c.tmpfsDir != "" {
		_ = os.RemoveAll(c.tmpfsDir)
	}
}

// Leader returns the store whose peer of regionID believes it leads, if
// exactly one running store does in the highest term seen.
func (c *Cluster) Leader(regionID uint64) (uint64, bool) {
	var best uint64
	var bestTerm uint64
	for _, id := range c.ids {
		s, ok := c.Store(id)
		if !ok {
			continue
		}
		for _, st := range s.Regions() {
			if st.Region.ID == regionID && st.IsLeader && st.Term >= bestTerm {
				best, bestTerm = id, st.Term
			}
		}
	}
	return best, best != 0
}

// Status returns store id's view of regionID.
func (c *Cluster) Status(id, regionID uint64) (raftstore.RegionStatus, bool) {
	s, ok := c.Store(id)
	if !ok {
		return raftstore.RegionStatus{}, false
	}
	for _, st := range s.Regions() {
		if st.Region.ID == regionID {
			return st, true
		}
	}
	return raftstore.RegionStatus{}, false
}

// WaitLeader waits until regionID has a leader. On a manual clock it
// steps the clock a tick at a time while it waits: an election needs time
// to pass.
func (c *Cluster) WaitLeader(regionID uint64, timeout time.Duration) (uint64, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if id, ok := c.Leader(regionID); ok {
			return id, nil
		}
		if c.manual != nil {
			if err := c.Tick(1); err != nil {
				return 0, fmt.Errorf("region %d: wait for a leader: %w", regionID, err)
			}
		}
		// A pace: the real time the election's messages take between looks
		// (and, on a manual clock, between ticks).
		time.Sleep(c.opts.TickInterval)
	}
	return 0, fmt.Errorf("region %d: no leader after %v", regionID, timeout)
}

// Clock is the stores' manual clock (Options.ManualClock), nil without one.
func (c *Cluster) Clock() *clock.Manual { return c.manual }

// Tick steps the manual clock n ticks (Options.TickInterval each); see
// Advance.
func (c *Cluster) Tick(n int) error {
	return c.Advance(time.Duration(n) * c.opts.TickInterval)
}

// Advance moves the manual clock d forward, at most a tick at a time, and
// after each step waits until every running store's loop has finished
// every tick that fell due, round included: no tick is dropped, and when
// Advance returns each store has taken all of d's ticks. It fails if a
// store's loop takes no tick for 10 s (a loop frozen by a failed disk
// takes none).
func (c *Cluster) Advance(d time.Duration) error {
	if c.manual == nil {
		return errors.New("raftstoretest: Advance needs Options.ManualClock")
	}
	c.tickMu.Lock()
	defer c.tickMu.Unlock()
	for d > 0 {
		step := min(d, c.opts.TickInterval)
		d -= step
		c.manual.Advance(step)
		if err := c.waitTicks(10 * time.Second); err != nil {
			return err
		}
	}
	return nil
}

// waitTicks waits until every running store instance has finished the
// ticks due by the manual clock's time.
func (c *Cluster) waitTicks(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	now := c.manual.Now()
	for {
		behind := uint64(0)
		c.mu.Lock()
		for id, t := range c.ticks {
			if t.done.Load() < int64(now.Sub(t.start)/c.opts.TickInterval) {
				behind = id
				break
			}
		}
		c.mu.Unlock()
		if behind == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("raftstoretest: store %d's loop has not finished its ticks due at %v after %v", behind, now, timeout)
		}
		// A bounded poll: the loops take their ticks on their own goroutines.
		time.Sleep(100 * time.Microsecond)
	}
}

// Put writes through whichever store leads, retrying region errors and
// dropped proposals until ctx ends, like a client would.
func (c *Cluster) Put(ctx context.Context, key, value []byte) error {
	// One request ID across all attempts: a retry of a write that did land
	// must not apply it again.
	return c.PutWithID(ctx, rand.Uint64()|1, key, value)
}

// PutWithID is Put with the caller's request ID, for a client that retries
// a write whose acknowledgement it lost.
func (c *Cluster) PutWithID(ctx context.Context, requestID uint64, key, value []byte) error {
	opts := raftstore.WriteOptions{RequestID: requestID}
	return c.retry(ctx, key, func(ctx context.Context, s *raftstore.Store) error {
		return s.Put(ctx, opts, key, value)
	})
}

// Delete removes key like Put writes it.
func (c *Cluster) Delete(ctx context.Context, key []byte) error {
	opts := raftstore.WriteOptions{RequestID: rand.Uint64() | 1}
	return c.retry(ctx, key, func(ctx context.Context, s *raftstore.Store) error {
		return s.Delete(ctx, opts, key)
	})
}

// Get reads key from the leader, retrying like Put.
func (c *Cluster) Get(ctx context.Context, key []byte) (val []byte, found bool, err error) {
	err = c.retry(ctx, key, func(ctx context.Context, s *raftstore.Store) error {
		var e error
		val, found, _, e = s.Get(ctx, raftstore.ReadOptions{}, key)
		return e
	})
	return val, found, err
}

// retry runs op on the store leading the region that holds key until it
// succeeds, fails for good, or ctx ends.
func (c *Cluster) retry(ctx context.Context, key []byte, op func(context.Context, *raftstore.Store) error) error {
	// One attempt may wait out an election, not more: then look again.
	attempt := 2 * c.opts.TickInterval * time.Duration(c.opts.ElectionTicks)
	var last error
	for {
		if id, ok := c.LeaderOf(key); ok {
			if s, running := c.Store(id); running {
				opCtx, cancel := context.WithTimeout(ctx, attempt)
				last = op(opCtx, s)
				cancel()
				if last == nil || !Retryable(last) {
					return last
				}
			}
		}
		select {
		case <-ctx.Done():
			if last == nil {
				last = ctx.Err()
			}
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
		case <-time.After(c.opts.TickInterval):
		}
	}
}

// RegionOf returns the newest metadata any running store has for the
// region holding key.
func (c *Cluster) RegionOf(key []byte) (region.Region, bool) {
	var best region.Region
	found := false
	for _, id := range c.ids {
		s, ok := c.Store(id)
		if !ok {
			continue
		}
		for _, st := range s.Regions() {
			r := st.Region
			if r.Contains(key) && (!found || r.Epoch.Version > best.Epoch.Version || (r.Epoch.Version == best.Epoch.Version && r.Epoch.ConfVer > best.Epoch.ConfVer)) {
				best, found = r, true
			}
		}
	}
	return best, found
}

// LeaderOf returns the store leading the region that holds key.
func (c *Cluster) LeaderOf(key []byte) (uint64, bool) {
	r, ok := c.RegionOf(key)
	if !ok {
		return 0, false
	}
	return c.Leader(r.ID)
}

// Regions returns the newest view of every region, in key order.
func (c *Cluster) Regions() []region.Region {
	var t region.Tree
	newest := map[uint64]region.Region{}
	for _, id := range c.ids {
		s, ok := c.Store(id)
		if !ok {
			continue
		}
		for _, st := range s.Regions() {
			old, seen := newest[st.Region.ID]
			if !seen || old.Epoch.Version < st.Region.Epoch.Version || (old.Epoch.Version == st.Region.Epoch.Version && old.Epoch.ConfVer < st.Region.Epoch.ConfVer) {
				newest[st.Region.ID] = st.Region
			}
		}
	}
	// Older shapes first, so that where two overlap (a store that has not
	// applied a split or a merge yet) the newer one wins: a merge's and a
	// split's versions are above those of the regions they replace.
	all := make([]region.Region, 0, len(newest))
	for _, r := range newest {
		all = append(all, r)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Epoch.Version < all[j].Epoch.Version })
	for _, r := range all {
		t.Insert(r)
	}
	return t.All()
}

// Split splits the region holding key at key, retrying like Put.
func (c *Cluster) Split(ctx context.Context, key []byte) error {
	retried := false
	return c.retry(ctx, key, func(ctx context.Context, s *raftstore.Store) error {
		_, _, err := s.Split(ctx, key)
		if err != nil && retried && errors.Is(err, raftstore.ErrInvalidRequest) {
			// An earlier attempt's split applied after its wait ran out (a
			// slow round under -race): key is a boundary now, as asked.
			if r, ok := c.RegionOf(key); ok && bytes.Equal(r.StartKey, key) {
				return nil
			}
		}
		retried = retried || Retryable(err)
		return err
	})
}

// Merge merges region leftID with its right neighbour through the store
// leading leftID, retrying region errors (a merge rolled back because a
// split, a transfer or a restart raced it is tried again) until ctx ends.
func (c *Cluster) Merge(ctx context.Context, leftID uint64) (region.Region, error) {
	attempt := 5 * time.Second
	var last error
	for {
		if id, ok := c.Leader(leftID); ok {
			if s, running := c.Store(id); running {
				opCtx, cancel := context.WithTimeout(ctx, attempt)
				r, err := s.Merge(opCtx, leftID)
				cancel()
				if err == nil || !Retryable(err) && !errors.Is(err, raftstore.ErrMergeRolledBack) {
					return r, err
				}
				last = err
			}
		}
		select {
		case <-ctx.Done():
			return region.Region{}, fmt.Errorf("merge region %d: %w (last error: %v)", leftID, ctx.Err(), last)
		case <-time.After(c.opts.TickInterval):
		}
	}
}

// Scan reads [start, end) across regions from their leaders, in key order.
func (c *Cluster) Scan(ctx context.Context, start, end []byte, limit int) ([]raftstore.KV, error) {
	var out []raftstore.KV
	for len(out) < limit {
		var kvs []raftstore.KV
		var r region.Region
		err := c.retry(ctx, start, func(ctx context.Context, s *raftstore.Store) error {
			var e error
			kvs, r, _, e = s.Scan(ctx, raftstore.ReadOptions{}, start, end, limit-len(out))
			return e
		})
		if err != nil {
			return out, err
		}
		out = append(out, kvs...)
		if len(r.EndKey) == 0 || (len(end) > 0 && string(r.EndKey) >= string(end)) {
			break
		}
		start = r.EndKey
	}
	return out, nil
}

// Stores implements raftstore.ClusterView over the running stores.
func (c *Cluster) Stores(context.Context) []raftstore.StoreInfo {
	var out []raftstore.StoreInfo
	for _, id := range c.ids {
		info := raftstore.StoreInfo{ID: id}
		if s, ok := c.Store(id); ok {
			info.Up, info.Zone = true, s.Zone()
			for _, st := range s.Regions() {
				info.RegionCount++
				if st.IsLeader {
					info.LeaderCount++
				}
			}
		}
		out = append(out, info)
	}
	return out
}

// AllocRegionID is every store's RegionIDSource: it asks the running
// stores in turn for a region ID from the cluster's counter, as the server
// asks its peers over gRPC (and, as there, not through the in-memory
// network's faults).
func (c *Cluster) AllocRegionID(ctx context.Context) (uint64, error) {
	var errs []error
	for _, id := range c.IDs() {
		s, ok := c.Store(id)
		if !ok {
			continue
		}
		rid, err := s.AllocRegionID(ctx)
		if err == nil {
			return rid, nil
		}
		errs = append(errs, fmt.Errorf("store %d: %w", id, err))
	}
	return 0, fmt.Errorf("no store took a region id: %w", errors.Join(errs...))
}

// SkewedClock is a clock whose readings are offset from the real one by
// offset and run rate times as fast (rate 1.001 gains a millisecond a
// second). Its readings keep a monotonic component, so intervals measured
// on it drift as a badly disciplined oscillator's would. Its tickers and
// timers are real time: the specs skew what leases and staleness bounds
// measure, not the pace of the loop.
func SkewedClock(offset time.Duration, rate float64) clock.Clock {
	return skewedClock{base: time.Now(), offset: offset, rate: rate}
}

type skewedClock struct {
	clock.Real
	base   time.Time
	offset time.Duration
	rate   float64
}

func (c skewedClock) Now() time.Time {
	elapsed := time.Since(c.base)
	return c.base.Add(c.offset + time.Duration(float64(elapsed)*c.rate))
}

// Retryable reports whether err means "try again, maybe elsewhere".
func Retryable(err error) bool {
	return region.IsRegionError(err) || errors.Is(err, raftstore.ErrProposalDropped) ||
		errors.Is(err, raftstore.ErrStopped) || errors.Is(err, raftstore.ErrDiskFailed) ||
		errors.Is(err, context.DeadlineExceeded)
}
