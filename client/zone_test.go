package client

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client/clienttest"
)

// zonedCluster is a fake cluster whose every store advertises, for dc-a
// and dc-b, a counting forwarder to itself as its zone address, and whose
// endpoints are counting forwarders too (the addresses a user would give).
type zonedCluster struct {
	cl        *clienttest.Cluster
	endpoints []*clienttest.Forwarder            // by store index
	zoneFwd   map[string][]*clienttest.Forwarder // zone -> by store index
}

func newZonedCluster(t *testing.T) *zonedCluster {
	t.Helper()
	z := &zonedCluster{cl: clienttest.NewCluster(t, threeZones...), zoneFwd: map[string][]*clienttest.Forwarder{}}
	for i, addr := range z.cl.Endpoints() {
		z.endpoints = append(z.endpoints, clienttest.NewForwarder(t, addr))
		za := map[string]string{}
		for _, zone := range []string{"dc-a", "dc-b"} {
			f := clienttest.NewForwarder(t, addr)
			z.zoneFwd[zone] = append(z.zoneFwd[zone], f)
			za[zone] = f.Addr()
		}
		z.cl.Store(uint64(i + 1)).SetZoneAddrs(za)
	}
	return z
}

func (z *zonedCluster) client(t *testing.T, zone string) *Client {
	t.Helper()
	var eps []string
	for _, f := range z.endpoints {
		eps = append(eps, f.Addr())
	}
	c, err := New(context.Background(), Config{Endpoints: eps, Zone: zone, DialTimeout: time.Second, RequestTimeout: 3 * time.Second})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func sumBytes(fs []*clienttest.Forwarder) (up, down int64) {
	for _, f := range fs {
		up += f.BytesUp()
		down += f.BytesDown()
	}
	return up, down
}

// TestZoneAddressesCarryRequests: a client in dc-b sends its writes, leader
// reads and follower reads through the stores' dc-b addresses, learned
// from the cluster; the endpoints it was given only bootstrap it, and the
// dc-a addresses see nothing. A client without a zone keeps using the
// endpoints.
func TestZoneAddressesCarryRequests(t *testing.T) {
	z := newZonedCluster(t)
	c := z.client(t, "dc-b")
	ctx := context.Background()
	value := bytes.Repeat([]byte("v"), 64<<10)

	epUp, epDown := sumBytes(z.endpoints)
	if err := c.Put(ctx, []byte("k"), value); err != nil {
		t.Fatalf("put: %v", err)
	}
	if v, err := c.Get(ctx, []byte("k")); err != nil || !bytes.Equal(v, value) {
		t.Fatalf("leader get: %d bytes, %v", len(v), err)
	}
	follower := c.Session(ReadPolicy{Replica: ReplicaFollower})
	for range 4 {
		if v, err := follower.Get(ctx, []byte("k")); err != nil || !bytes.Equal(v, value) {
			t.Fatalf("follower get: %d bytes, %v", len(v), err)
		}
	}

	// Store 1 leads: the write and the leader read went through its dc-b
	// address, the follower reads through the followers'.
	leader := z.zoneFwd["dc-b"][0]
	if leader.BytesUp() < int64(len(value)) || leader.BytesDown() < int64(len(value)) {
		t.Errorf("store 1's dc-b address carried %d bytes up, %d down; want the %d byte value each way", leader.BytesUp(), leader.BytesDown(), len(value))
	}
	if _, down := sumBytes(z.zoneFwd["dc-b"][1:]); down < 4*int64(len(value)) {
		t.Errorf("the followers' dc-b addresses carried %d bytes down, want the 4 follower reads' %d", down, 4*len(value))
	}
	if up, down := sumBytes(z.zoneFwd["dc-a"]); up+down != 0 {
		t.Errorf("the dc-a addresses carried %d bytes up, %d down for a client in dc-b", up, down)
	}
	up, down := sumBytes(z.endpoints)
	if up-epUp > 4<<10 || down-epDown > 4<<10 {
		t.Errorf("the endpoints carried %d bytes up, %d down after New: requests went around the zone addresses", up-epUp, down-epDown)
	}
	for _, s := range []uint64{1, 2, 3} {
		if st, ok := c.cache.store(s); !ok || st.addr != z.zoneFwd["dc-b"][s-1].Addr() {
			t.Errorf("store %d dialled at %q, want its dc-b address", s, st.addr)
		}
	}

	// Admin calls (the store list, region metadata) follow the same rule.
	before := z.zoneFwd["dc-b"][0].Conns() + z.zoneFwd["dc-b"][1].Conns() + z.zoneFwd["dc-b"][2].Conns()
	epUp, epDown = sumBytes(z.endpoints)
	if _, err := c.Stores(ctx); err != nil {
		t.Fatalf("stores: %v", err)
	}
	if _, err := c.Regions(ctx); err != nil {
		t.Fatalf("regions: %v", err)
	}
	if up, down := sumBytes(z.endpoints); up != epUp || down != epDown {
		t.Errorf("admin calls went to the endpoints (%d bytes up, %d down)", up-epUp, down-epDown)
	}
	// One connection per store: a store the reads above happened not to
	// use may be dialled only now (gRPC connects lazily), but none twice.
	for i, f := range z.zoneFwd["dc-b"] {
		if n := f.Conns(); n > 1 {
			t.Errorf("store %d's dc-b address has %d connections; the client keeps one per store", i+1, n)
		}
	}
	if after := z.zoneFwd["dc-b"][0].Conns() + z.zoneFwd["dc-b"][1].Conns() + z.zoneFwd["dc-b"][2].Conns(); after > 3 {
		t.Errorf("admin calls opened %d more connections to the dc-b addresses (%d in all)", after-before, after)
	}

	// Without a zone, nothing changes: the endpoints carry the requests.
	noZone := z.client(t, "")
	before = z.endpoints[0].BytesDown()
	if v, err := noZone.Get(ctx, []byte("k")); err != nil || !bytes.Equal(v, value) {
		t.Fatalf("get without a zone: %d bytes, %v", len(v), err)
	}
	if got := z.endpoints[0].BytesDown() - before; got < int64(len(value)) {
		t.Errorf("a client without a zone read %d bytes through store 1's endpoint, want the %d byte value", got, len(value))
	}
}
