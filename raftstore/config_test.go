package raftstore_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name  string
		mod   func(*raftstore.Config)
		field string // "" : valid
		want  string // in the message
	}{
		{"zero values are the defaults", func(*raftstore.Config) {}, "", ""},
		{"explicit defaults", func(c *raftstore.Config) {
			c.TickInterval, c.ElectionTicks, c.HeartbeatTicks, c.LeaseDriftMargin = 50*time.Millisecond, 10, 2, 0.1
			c.MaxClockOffset, c.MaxStoreDownTime, c.MaxReplicas = 50*time.Millisecond, 30*time.Second, 3
		}, "", ""},
		{"negative intervals disable", func(c *raftstore.Config) {
			c.SplitCheckInterval, c.BalanceInterval, c.HibernateAfter = -1, -time.Second, -1
		}, "", ""},
		{"follower lease up to the leader lease", func(c *raftstore.Config) {
			c.FollowerLeases, c.FollowerLeaseDuration, c.FollowerLeaseStores = true, 360*time.Millisecond, []uint64{1, 2}
		}, "", ""},
		{"smallest election timeout", func(c *raftstore.Config) { c.ElectionTicks, c.HeartbeatTicks = 2, 1 }, "", ""},

		{"store id zero", func(c *raftstore.Config) { c.StoreID = 0 }, "StoreID", "1..65535"},
		{"store id too big", func(c *raftstore.Config) { c.StoreID = 70000 }, "StoreID", "1..65535"},
		{"negative tick", func(c *raftstore.Config) { c.TickInterval = -time.Millisecond }, "TickInterval", "negative"},
		{"negative election ticks", func(c *raftstore.Config) { c.ElectionTicks = -1 }, "ElectionTicks", "negative"},
		{"negative heartbeat ticks", func(c *raftstore.Config) { c.HeartbeatTicks = -3 }, "HeartbeatTicks", "negative"},
		{"election equals heartbeat", func(c *raftstore.Config) { c.ElectionTicks, c.HeartbeatTicks = 4, 4 }, "ElectionTicks", "must exceed HeartbeatTicks (4)"},
		{"election against default heartbeat", func(c *raftstore.Config) { c.ElectionTicks = 2 }, "ElectionTicks", "must exceed HeartbeatTicks (2)"},
		{"heartbeat against default election", func(c *raftstore.Config) { c.HeartbeatTicks = 10 }, "ElectionTicks", "must exceed HeartbeatTicks (10)"},
		{"negative drift margin", func(c *raftstore.Config) { c.LeaseDriftMargin = -0.1 }, "LeaseDriftMargin", "[0, 1)"},
		{"drift margin one", func(c *raftstore.Config) { c.LeaseDriftMargin = 1 }, "LeaseDriftMargin", "[0, 1)"},
		{"drift margin NaN", func(c *raftstore.Config) { c.LeaseDriftMargin = math.NaN() }, "LeaseDriftMargin", "[0, 1)"},
		{"negative follower lease", func(c *raftstore.Config) { c.FollowerLeaseDuration = -time.Second }, "FollowerLeaseDuration", "negative"},
		{"follower lease longer than the leader's", func(c *raftstore.Config) { c.FollowerLeaseDuration = 361 * time.Millisecond }, "FollowerLeaseDuration", "longer than the leader lease (360ms"},
		{"follower lease against a shorter tick", func(c *raftstore.Config) {
			c.TickInterval, c.FollowerLeaseDuration = 10*time.Millisecond, 100*time.Millisecond
		}, "FollowerLeaseDuration", "longer than the leader lease (72ms"},
		{"negative clock offset", func(c *raftstore.Config) { c.MaxClockOffset = -time.Millisecond }, "MaxClockOffset", "negative"},
		{"negative down time", func(c *raftstore.Config) { c.MaxStoreDownTime = -time.Second }, "MaxStoreDownTime", "negative"},
		{"negative replicas", func(c *raftstore.Config) { c.MaxReplicas = -1 }, "MaxReplicas", "negative"},
		{"hibernate within a tick", func(c *raftstore.Config) { c.HibernateAfter = time.Millisecond }, "HibernateAfter", "shorter than one tick"},
		{"initial store zero", func(c *raftstore.Config) { c.InitialStores = []uint64{1, 0} }, "InitialStores", "store ID 0"},
		{"initial store twice", func(c *raftstore.Config) { c.InitialStores = []uint64{1, 2, 1} }, "InitialStores", "store 1 listed twice"},
		{"lease store too big", func(c *raftstore.Config) { c.FollowerLeaseStores = []uint64{65536} }, "FollowerLeaseStores", "store ID 65536"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := raftstore.Config{StoreID: 1, InitialStores: []uint64{1, 2, 3}}
			tt.mod(&c)
			before := c
			err := c.Validate()
			if c.TickInterval != before.TickInterval || c.ElectionTicks != before.ElectionTicks || c.LeaseDriftMargin != before.LeaseDriftMargin && !math.IsNaN(c.LeaseDriftMargin) {
				t.Errorf("Validate changed the config: %+v, was %+v", c, before)
			}
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var ce *raftstore.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("Validate() = %v, want a *ConfigError", err)
			}
			if ce.Field != tt.field || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v (field %s), want field %s and %q", err, ce.Field, tt.field, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("Validate() = %q, want one line", err)
			}
		})
	}
}

// TestNewStoreValidates: NewStore refuses what Validate refuses, before it
// touches the data directory.
func TestNewStoreValidates(t *testing.T) {
	dir := t.TempDir()
	_, err := raftstore.NewStore(raftstore.Config{StoreID: 1, DataDir: dir, ElectionTicks: 2, HeartbeatTicks: 3}, nil)
	var ce *raftstore.ConfigError
	if !errors.As(err, &ce) || ce.Field != "ElectionTicks" {
		t.Fatalf("NewStore = %v, want the ElectionTicks config error", err)
	}
}
