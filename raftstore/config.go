package raftstore

import (
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/hedgekv/hedgekv/clock"
	"github.com/hedgekv/hedgekv/storage/engine"
	"github.com/hedgekv/hedgekv/storage/vfs"
)

// Config configures one Store.
type Config struct {
	StoreID uint64
	Zone    string
	// DataDir holds the store's single bbolt file (store.db).
	DataDir string
	// InitialStores lists the stores that bootstrap region 1 (covering the
	// whole key space) when the engine is empty. Peer i of region 1 lives on
	// InitialStores[i] and has Raft ID InitialStores[i].
	InitialStores []uint64
	// ClusterID names the cluster the store belongs to (the server derives
	// it from its cluster token). The first open records it; a data dir
	// that recorded another is refused, as one of another store is, and
	// the server refuses raft traffic from another cluster's stores. 0
	// takes whatever the data dir recorded.
	ClusterID uint64

	TickInterval     time.Duration // default 50ms
	ElectionTicks    int           // default 10
	HeartbeatTicks   int           // default 2
	LeaseDriftMargin float64       // fraction of the election timeout given up for clock drift; default 0.1
	// FollowerLeases lets followers hold read leases and serve
	// linearizable reads locally with no round trip (followerlease.go).
	// Every store of a cluster must agree on it: a leader with it off
	// neither grants nor caps, and one with it on defers its first commits.
	FollowerLeases bool
	// FollowerLeaseDuration is the longest follower lease a leader grants
	// (default, and at most: the leader lease, (ElectionTicks-2) ticks less
	// the drift margin). Writes wait at most this long for a holder that
	// stopped acking, and a new leader holds its first commit back for it.
	FollowerLeaseDuration time.Duration
	// FollowerLeaseStores, if set, are the only stores granted leases.
	FollowerLeaseStores []uint64
	// LogGCThreshold: compact a region's raft log once more than this many
	// applied entries sit in it. Default 5000; tests use tiny values.
	LogGCThreshold uint64
	// MaxClockOffset is the most the stores' wall clocks may disagree; it
	// is added to every staleness bound. Default 50ms.
	MaxClockOffset time.Duration
	// Automatic split: every SplitCheckInterval (negative disables), a leader
	// splits a region holding more than SplitMaxKeys keys or SplitMaxBytes
	// bytes (0: no limit) at its middle. Defaults: 10s, 0 keys, 64 MiB.
	SplitCheckInterval time.Duration
	SplitMaxKeys       uint64
	SplitMaxBytes      uint64
	// The merge check (merge.go): every MergeCheckInterval (negative
	// disables; default 10s) a leader settles a merge its region has been
	// frozen for since long (its coordinator stopped), and, if MergeMaxKeys
	// or MergeMaxBytes is set (default 0: no automatic merges), merges a
	// region it leads with its right neighbour when the two together hold
	// at most MergeMaxKeys keys and MergeMaxBytes bytes (0: no limit on
	// that one), both have kept their shape for MergeAfterSplit (default
	// 1m: a region just split is not merged back) and their replicas are
	// on the same stores.
	MergeCheckInterval time.Duration
	MergeMaxKeys       uint64
	MergeMaxBytes      uint64
	MergeAfterSplit    time.Duration
	// KeepWhole names key ranges no split may cut (keepwhole.go): the
	// split check never splits inside one, Split refuses a key inside
	// one, and EnsureBoundaries at a range's start and end makes it a
	// region of its own. Each is [Start, End), End not empty and after
	// Start; no two may overlap. A leader checks it when it proposes a
	// split, so stores that differ on it for a while (a rolling restart)
	// stay consistent.
	KeepWhole []KeepRange
	// Balancing: every BalanceInterval (negative disables; default 5s) a
	// store moves leaders and replicas toward an even spread, using the
	// ClusterView. A store down longer than MaxStoreDownTime (default
	// 30s) has its replicas replaced on other stores.
	BalanceInterval  time.Duration
	MaxStoreDownTime time.Duration
	// MaxReplicas is how many voters each region keeps. Default 3.
	MaxReplicas int
	// DedupWindow is how many log entries a region remembers applied
	// request IDs for, so that retried writes apply once. Default 100000: at
	// 5,000 writes a second that outlasts a client's 10s retry deadline twice.
	DedupWindow uint64
	// Applier applies the commands another layer proposes through
	// Store.Propose (applier.go); nil: Propose is refused. Every store of
	// a cluster must run the same one: a replica without it applies such
	// a command as nothing, and its data would part from the others'.
	Applier Applier
	// BatchInterval: the Ready loop's rounds write into one bbolt
	// transaction, committed at the end of the first round it is this old
	// (and at every checkpoint, 100 ms; storage/engine, batch.go), as etcd's
	// backend-batch-interval. Default 20 ms; negative: a commit every round.
	BatchInterval time.Duration
	// HibernateAfter: a region idle this long stops ticking until traffic
	// arrives (hibernate.go). Default 10s; negative disables.
	HibernateAfter time.Duration
	// Clock is the store's one clock (default clock.Real): the Ready loop
	// ticks on it, and every lease, staleness bound, hibernation and
	// background interval is measured on it. Tests give stores skewed
	// clocks, or a clock.Manual they step. Deadlines of callers' contexts
	// and the pace of polls stay on real time.
	Clock clock.Clock
	// SnapshotSendRate bounds the bytes per second this store's snapshot
	// sends read, all of them together (0: DefaultSnapshotSendRate, 64
	// MiB/s; negative: no limit), so that moving a region leaves the
	// network and disk to foreground traffic.
	SnapshotSendRate int64
	// NoSync skips fsync on bbolt commits (tests only; loses durability).
	NoSync bool
	// FS holds the files the store writes itself: its round log, its
	// checkpoint file and its snapshot files (nil: the operating
	// system's). It is the seam for tests (vfs.NewStrictMem forgets what
	// was never synced, as a power loss would) and for other file systems.
	// bbolt's own file (store.db) and the data dir's lock are always on the
	// operating system's.
	FS vfs.FS
	// AfterBoltSync, if set, runs each time bbolt's file was just made
	// durable: a test's model of what a power loss keeps of that file,
	// which cannot go through FS. nil in production.
	AfterBoltSync func()
	// Knobs are tests' hooks into this store; the zero value in
	// production.
	Knobs TestingKnobs

	// applyBatchBytes and clearBatchKeys bound the transactions of a
	// snapshot applied from its file and of a range clear (0: the
	// engine's defaults); tests set them small to get many.
	applyBatchBytes, clearBatchKeys int
	// checkpointInterval: the engine's (0: its default); tests make it
	// long to keep rounds in the open batch.
	checkpointInterval time.Duration
	Logger             *slog.Logger
}

// setDefaults fills the zero fields of c with their defaults. It only
// fills zeros: a value that is wrong is Validate's to refuse, never
// replaced here, so an operator's mistake cannot turn silently into a
// setting they did not ask for.
func (c *Config) setDefaults() {
	if c.TickInterval == 0 {
		c.TickInterval = 50 * time.Millisecond
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = 2
	}
	if c.LeaseDriftMargin == 0 {
		c.LeaseDriftMargin = 0.1
	}
	if c.LogGCThreshold == 0 {
		c.LogGCThreshold = 5000
	}
	if c.SplitCheckInterval == 0 {
		c.SplitCheckInterval = 10 * time.Second
	}
	if c.SplitMaxBytes == 0 && c.SplitMaxKeys == 0 {
		c.SplitMaxBytes = 64 << 20
	}
	if c.MergeCheckInterval == 0 {
		c.MergeCheckInterval = 10 * time.Second
	}
	if c.MergeAfterSplit == 0 {
		c.MergeAfterSplit = time.Minute
	}
	if c.DedupWindow == 0 {
		c.DedupWindow = 100000
	}
	if c.MaxClockOffset == 0 {
		c.MaxClockOffset = 50 * time.Millisecond
	}
	c.balanceDefaults()
	if c.HibernateAfter == 0 {
		c.HibernateAfter = 10 * time.Second
	}
	if c.BatchInterval == 0 {
		c.BatchInterval = engine.DefaultBatchInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.SnapshotSendRate == 0 {
		c.SnapshotSendRate = DefaultSnapshotSendRate
	}
}

// ConfigError is one invalid field of a Config. It names the field so
// that a front end (the hedgekv server command) can report it as the flag
// or configuration key the operator wrote.
type ConfigError struct {
	Field  string // the Config field, such as "ElectionTicks"
	Value  any    // the value given
	Reason string // why it is refused; may name other Config fields
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("raftstore: config: %s %v: %s", e.Field, e.Value, e.Reason)
}

// Validate reports the first invalid field of c as a *ConfigError, nil if
// there is none. A zero value is valid everywhere it stands for a default
// (see Config): Validate checks the config the defaults complete, so that
// an explicit value is checked against the defaults of the others (an
// ElectionTicks of 2 fails against the default HeartbeatTicks of 2). It
// never changes c: a bad value is the operator's to fix, not ours to
// replace behind their back.
func (c *Config) Validate() error {
	if c.StoreID == 0 || c.StoreID > maxStoreID {
		return &ConfigError{"StoreID", c.StoreID, fmt.Sprintf("must be in 1..%d", maxStoreID)}
	}
	// Signs first, on the values as given: setDefaults fills only zeros,
	// so a negative value would otherwise reach the checks below as is.
	nonNegative := []struct {
		field string
		v     time.Duration
	}{
		{"TickInterval", c.TickInterval},
		{"FollowerLeaseDuration", c.FollowerLeaseDuration},
		{"MaxClockOffset", c.MaxClockOffset},
		{"MaxStoreDownTime", c.MaxStoreDownTime},
	}
	for _, f := range nonNegative {
		if f.v < 0 {
			return &ConfigError{f.field, f.v, "must not be negative (0: the default)"}
		}
	}
	for _, f := range []struct {
		field string
		v     int
	}{{"ElectionTicks", c.ElectionTicks}, {"HeartbeatTicks", c.HeartbeatTicks}, {"MaxReplicas", c.MaxReplicas}} {
		if f.v < 0 {
			return &ConfigError{f.field, f.v, "must not be negative (0: the default)"}
		}
	}
	if m := c.LeaseDriftMargin; math.IsNaN(m) || m < 0 || m >= 1 {
		return &ConfigError{"LeaseDriftMargin", m, "must be a fraction in [0, 1) (0: the default 0.1)"}
	}

	d := *c
	d.setDefaults()
	// etcd raft refuses ElectionTick <= HeartbeatTick, but only when a
	// region's peer is created, which for a store without regions (one
	// that joins) may be long after it started.
	if d.ElectionTicks <= d.HeartbeatTicks {
		return &ConfigError{"ElectionTicks", d.ElectionTicks, fmt.Sprintf("must exceed HeartbeatTicks (%d)", d.HeartbeatTicks)}
	}
	if c.FollowerLeaseDuration > 0 {
		// A follower lease longer than the leader's would outlive the
		// leader lease it is carved from (followerlease.go).
		if limit := d.leaderLease(); c.FollowerLeaseDuration > limit {
			return &ConfigError{"FollowerLeaseDuration", c.FollowerLeaseDuration,
				fmt.Sprintf("is longer than the leader lease (%v: ElectionTicks %d less 2, times TickInterval %v, less LeaseDriftMargin %g)",
					limit, d.ElectionTicks, d.TickInterval, d.LeaseDriftMargin)}
		}
	}
	// HibernateAfter is counted in ticks: less than one would silently
	// mean "never hibernate".
	if c.HibernateAfter > 0 && c.HibernateAfter < d.TickInterval {
		return &ConfigError{"HibernateAfter", c.HibernateAfter, fmt.Sprintf("is shorter than one tick (TickInterval %v); negative disables hibernation", d.TickInterval)}
	}
	if err := checkStoreIDs("InitialStores", c.InitialStores); err != nil {
		return err
	}
	if err := checkKeepWhole(c.KeepWhole); err != nil {
		return err
	}
	return checkStoreIDs("FollowerLeaseStores", c.FollowerLeaseStores)
}

// maxStoreID is the largest store ID: peer IDs embed it (membership.go).
const maxStoreID = 0xffff

// leaderLease is the leader lease of the config (Store.leaseDuration
// without a Store).
func (c *Config) leaderLease() time.Duration {
	s := Store{cfg: *c}
	return s.leaseDuration()
}

// checkStoreIDs checks a list of store IDs: each in range, none twice.
func checkStoreIDs(field string, ids []uint64) error {
	seen := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		if id == 0 || id > maxStoreID {
			return &ConfigError{field, ids, fmt.Sprintf("store ID %d is not in 1..%d", id, maxStoreID)}
		}
		if seen[id] {
			return &ConfigError{field, ids, fmt.Sprintf("store %d listed twice", id)}
		}
		seen[id] = true
	}
	return nil
}
