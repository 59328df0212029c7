package client

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/region"
)

func peers3(base uint64) []region.Peer {
	return []region.Peer{{ID: base + 1, StoreID: 1}, {ID: base + 2, StoreID: 2}, {ID: base + 3, StoreID: 3}}
}

func reg(id uint64, start, end string, ver uint64) region.Region {
	return region.Region{ID: id, StartKey: []byte(start), EndKey: []byte(end), Epoch: region.Epoch{ConfVer: 1, Version: ver}, Peers: peers3(id * 10)}
}

// A cacheStep is one thing a request does to the region cache; the
// functions below name them.
type cacheStep func(t *testing.T, c *regionCache)

// insert caches r with leader as its leader (0: unknown), as a region
// lookup does.
func insert(r region.Region, leader uint64) cacheStep {
	return func(t *testing.T, c *regionCache) { c.insert(r, leader) }
}

// leaderHint takes a NotLeader answer naming store as the region's leader;
// wantTaken says whether the cache should take the hint.
func leaderHint(regionID, store uint64, wantTaken bool) cacheStep {
	return func(t *testing.T, c *regionCache) {
		if got := c.updateLeader(regionID, store); got != wantTaken {
			t.Fatalf("hint naming store %d as region %d's leader taken: %v, want %v", store, regionID, got, wantTaken)
		}
	}
}

// leaderFailed reports that store, tried as the region's leader, did not
// answer.
func leaderFailed(regionID, store uint64) cacheStep {
	return func(t *testing.T, c *regionCache) { c.switchLeaderFrom(regionID, store) }
}

// epochNotMatch takes an EpochNotMatch answer from store to a request that
// carried sent: current are the regions that store has for sent's range.
// wantBehind says whether the store should be found behind the request.
func epochNotMatch(sent region.Region, current []region.Region, store uint64, wantBehind bool) cacheStep {
	return func(t *testing.T, c *regionCache) {
		if got := c.onEpochNotMatch(cachedRegion{Region: sent}, current, store); got != wantBehind {
			t.Fatalf("store %d behind: %v, want %v", store, got, wantBehind)
		}
	}
}

// drop forgets a region, as a request does on RegionNotFound.
func drop(regionID uint64) cacheStep {
	return func(t *testing.T, c *regionCache) { c.drop(regionID) }
}

// splitAtM is region 1 split at "m" (version 2): region 1 [, m), region 2 [m, ).
var splitAtM = []region.Region{reg(1, "", "m", 2), reg(2, "m", "", 2)}

// regionCacheCase runs steps on an empty cache, then looks key up.
type regionCacheCase struct {
	name  string
	steps []cacheStep
	key   string
	// want is the region id and leader the cache holds for key; 0: miss.
	wantID, wantLeader uint64
	wantLen            int
}

func runRegionCacheCases(t *testing.T, tests []regionCacheCase) {
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newRegionCache()
			for _, s := range tt.steps {
				s(t, c)
			}
			r, ok := c.lookupKey([]byte(tt.key))
			switch {
			case tt.wantID == 0 && ok:
				t.Errorf("key %q found in region %d, want a miss", tt.key, r.ID)
			case tt.wantID != 0 && !ok:
				t.Errorf("key %q: miss, want region %d", tt.key, tt.wantID)
			case ok && (r.ID != tt.wantID || r.leaderStoreID != tt.wantLeader):
				t.Errorf("key %q: region %d leader %d, want region %d leader %d", tt.key, r.ID, r.leaderStoreID, tt.wantID, tt.wantLeader)
			}
			if n := len(c.all()); n != tt.wantLen {
				t.Errorf("%d regions cached, want %d", n, tt.wantLen)
			}
		})
	}
}

// TestRegionCacheInsertAndDrop: what the cache keeps of the regions
// lookups give it, newer and older, and of a region dropped.
func TestRegionCacheInsertAndDrop(t *testing.T) {
	runRegionCacheCases(t, []regionCacheCase{
		{
			name:   "insert and look up",
			steps:  []cacheStep{insert(reg(1, "", "", 1), 2)},
			key:    "k",
			wantID: 1, wantLeader: 2, wantLen: 1,
		},
		{
			name: "a stale region does not undo a split",
			steps: []cacheStep{
				insert(reg(1, "", "m", 2), 1),
				insert(reg(2, "m", "", 2), 1),
				insert(reg(1, "", "", 1), 3),
			},
			key:    "x",
			wantID: 2, wantLeader: 1, wantLen: 2,
		},
		{
			name: "a newer region replaces the ones it overlaps",
			steps: []cacheStep{
				insert(reg(1, "", "", 1), 1),
				insert(reg(2, "m", "", 2), 3),
			},
			key:    "x",
			wantID: 2, wantLeader: 3, wantLen: 1,
		},
		{
			name: "same region without a leader keeps the known leader",
			steps: []cacheStep{
				insert(reg(1, "", "", 1), 2),
				insert(reg(1, "", "", 1), 0),
			},
			key:    "k",
			wantID: 1, wantLeader: 2, wantLen: 1,
		},
		{
			name:   "a leader that is not a peer is ignored",
			steps:  []cacheStep{insert(reg(1, "", "", 1), 9)},
			key:    "k",
			wantID: 1, wantLeader: 0, wantLen: 1,
		},
		{
			name: "drop",
			steps: []cacheStep{
				insert(reg(1, "", "m", 2), 1),
				insert(reg(2, "m", "", 2), 1),
				drop(2),
			},
			key: "x", wantLen: 1,
		},
	})
}

// TestRegionCacheLeader: how NotLeader hints and leaders that do not
// answer move the leader the cache presumes.
func TestRegionCacheLeader(t *testing.T) {
	runRegionCacheCases(t, []regionCacheCase{
		{
			name: "not leader hint",
			steps: []cacheStep{
				insert(reg(1, "", "", 1), 1),
				leaderHint(1, 3, true),
				leaderHint(1, 9, false), // store 9 hosts no peer of region 1
			},
			key:    "k",
			wantID: 1, wantLeader: 3, wantLen: 1,
		},
		{
			name: "switch leader walks the peers once per failure",
			steps: []cacheStep{
				insert(reg(1, "", "", 1), 3),
				leaderFailed(1, 3), // -> 1 (wraps)
				leaderFailed(1, 3), // a second failure report of 3: no-op
			},
			key:    "k",
			wantID: 1, wantLeader: 1, wantLen: 1,
		},
	})
}

// TestRegionCacheEpochNotMatch: what the cache makes of a store's
// EpochNotMatch answer, the store ahead of the cache or behind it.
func TestRegionCacheEpochNotMatch(t *testing.T) {
	runRegionCacheCases(t, []regionCacheCase{
		{
			name: "epoch not match installs the current regions",
			steps: []cacheStep{
				insert(reg(1, "", "", 1), 1),
				epochNotMatch(reg(1, "", "", 1), splitAtM, 2, false),
			},
			key:    "z",
			wantID: 2, wantLeader: 2, wantLen: 2,
		},
		{
			name: "epoch not match keeps the old leader for the same region",
			steps: []cacheStep{
				insert(reg(1, "", "", 1), 1),
				epochNotMatch(reg(1, "", "", 1), splitAtM, 2, false),
			},
			key:    "a",
			wantID: 1, wantLeader: 1, wantLen: 2,
		},
		{
			name: "epoch not match without current regions drops",
			steps: []cacheStep{
				insert(reg(1, "", "", 1), 1),
				epochNotMatch(reg(1, "", "", 1), nil, 2, false),
			},
			key: "a", wantLen: 0,
		},
		{
			// The request carried version 2 (learned from a store that
			// applied the split); the store answering has not: it is
			// behind, and the cache keeps what it knows.
			name: "epoch not match from a store behind the cache changes nothing",
			steps: []cacheStep{
				insert(reg(1, "", "m", 2), 1),
				insert(reg(2, "m", "", 2), 1),
				epochNotMatch(reg(1, "", "m", 2), []region.Region{reg(1, "", "", 1)}, 2, true),
			},
			key:    "a",
			wantID: 1, wantLeader: 1, wantLen: 2,
		},
	})
}

func TestRegionCacheLoads(t *testing.T) {
	c := newRegionCache()
	calls := 0
	c.loadByKey = func(ctx context.Context, key []byte) ([]*kvpb.RegionInfo, error) {
		calls++
		return []*kvpb.RegionInfo{{
			Region:        &kvpb.Region{Id: 7, Epoch: &kvpb.Epoch{ConfVer: 1, Version: 1}, Peers: []*kvpb.Peer{{Id: 1, StoreId: 1}, {Id: 2, StoreId: 2}}},
			LeaderStoreId: 2,
		}}, nil
	}
	for range 3 {
		r, err := c.locateKey(context.Background(), []byte("k"))
		if err != nil || r.ID != 7 || r.leaderStoreID != 2 {
			t.Fatalf("locate: %v %v", r, err)
		}
	}
	if calls != 1 {
		t.Errorf("%d loads, want 1 (then cached)", calls)
	}
	c.loadAll = func(ctx context.Context) ([]*kvpb.RegionInfo, error) { return nil, nil }
	if _, err := c.locateID(context.Background(), 8); !errors.Is(err, errNoRegion) {
		t.Errorf("locate unknown id: %v, want errNoRegion", err)
	}
	if r, err := c.locateID(context.Background(), 7); err != nil || r.ID != 7 {
		t.Errorf("locate id 7: %v %v", r, err)
	}
}

func TestStoreAddresses(t *testing.T) {
	c := newRegionCache()
	c.setEndpoint(2, "proxy:2", "dc-b", nil)
	c.setStores([]*kvpb.Store{{Id: 1, Address: "a:1", Zone: "dc-a"}, {Id: 2, Address: "a:2", Zone: "dc-b"}})
	if s, ok := c.store(2); !ok || s.addr != "proxy:2" {
		t.Errorf("store 2 dialled at %q, want the endpoint the user gave (proxy:2)", s.addr)
	}
	if s, ok := c.store(1); !ok || s.addr != "a:1" || s.zone != "dc-a" {
		t.Errorf("store 1: %+v", s)
	}
	if _, ok := c.store(3); ok {
		t.Error("unknown store 3 found")
	}
}

// TestStoreAddressesByZone: the address-choice rule of the package
// documentation. A store's address for the client's zone wins over the
// endpoint the user gave for it and over its advertised address; without
// one (or without a client zone) nothing changes.
func TestStoreAddressesByZone(t *testing.T) {
	zoneAddrs := func(id string) map[string]string {
		return map[string]string{"dc-a": "a-proxy:" + id, "dc-b": "b-proxy:" + id}
	}
	stores := []*kvpb.Store{
		{Id: 1, Address: "direct:1", Zone: "dc-a", ZoneAddresses: zoneAddrs("1")},
		{Id: 2, Address: "direct:2", Zone: "dc-b", ZoneAddresses: zoneAddrs("2")},
		{Id: 3, Address: "direct:3", Zone: "dc-c"}, // advertises none
	}
	tests := []struct {
		name     string
		zone     string
		endpoint bool // the user gave store 1..3's direct address as endpoints
		want     [4]string
	}{
		{"no zone", "", false, [4]string{"", "direct:1", "direct:2", "direct:3"}},
		{"no zone, endpoints", "", true, [4]string{"", "ep:1", "ep:2", "ep:3"}},
		{"zone dc-b", "dc-b", false, [4]string{"", "b-proxy:1", "b-proxy:2", "direct:3"}},
		{"zone dc-b, endpoints", "dc-b", true, [4]string{"", "b-proxy:1", "b-proxy:2", "ep:3"}},
		{"zone nobody advertises", "dc-x", true, [4]string{"", "ep:1", "ep:2", "ep:3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Endpoint probes may finish before or after the store list.
			for _, probeFirst := range []bool{true, false} {
				c := newRegionCache()
				c.zone = tt.zone
				probe := func() {
					if !tt.endpoint {
						return
					}
					for _, s := range stores {
						id := fmt.Sprint(s.GetId())
						c.setEndpoint(s.GetId(), "ep:"+id, s.GetZone(), s.GetZoneAddresses())
					}
				}
				if probeFirst {
					probe()
				}
				c.setStores(stores)
				if !probeFirst {
					probe()
				}
				for id := uint64(1); id <= 3; id++ {
					if s, ok := c.store(id); !ok || s.addr != tt.want[id] {
						t.Errorf("probe first %v: store %d dialled at %q, want %q", probeFirst, id, s.addr, tt.want[id])
					}
				}
				// Admin calls meant for an endpoint go where its store is
				// dialled once the store is known to have a zone address.
				if tt.endpoint {
					for id := uint64(1); id <= 3; id++ {
						ep := fmt.Sprint("ep:", id)
						if got := c.adminAddr(ep); got != tt.want[id] {
							t.Errorf("admin calls for endpoint %s go to %q, want %q", ep, got, tt.want[id])
						}
					}
				}
			}
		})
	}
	// A store that stops advertising is dialled as before again.
	c := newRegionCache()
	c.zone = "dc-b"
	c.setStores(stores)
	c.setStores([]*kvpb.Store{{Id: 1, Address: "direct:1", Zone: "dc-a"}})
	if s, _ := c.store(1); s.addr != "direct:1" {
		t.Errorf("store 1 without zone addresses dialled at %q", s.addr)
	}
	if got := c.adminAddr("unknown:9"); got != "unknown:9" {
		t.Errorf("unknown endpoint routed to %q", got)
	}
}
