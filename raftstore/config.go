package raftstore

import (
	"fmt"
	"math"
	"time"
)

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
