package netsim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// echoServer is a TCP echo server on 127.0.0.1, closed with the test.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func startNet(t *testing.T, topo *Topology, upstream map[uint64]string, opts Options) *Network {
	t.Helper()
	n, err := Start(topo, upstream, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return n
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads it back within timeout.
func roundTrip(c net.Conn, msg []byte, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	if err := c.SetDeadline(start.Add(timeout)); err != nil {
		return 0, err
	}
	if _, err := c.Write(msg); err != nil {
		return 0, err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return 0, err
	}
	if !bytes.Equal(got, msg) {
		return 0, fmt.Errorf("echoed %q, want %q", got, msg)
	}
	return time.Since(start), nil
}

// twoZones: store 1 in "near", nothing in "far", latency one way between.
func twoZones(latency time.Duration) *Topology {
	return &Topology{
		Zones: []Zone{{Name: "near", Stores: []uint64{1}}, {Name: "far"}},
		Links: []Link{{Between: [2]string{"near", "far"}, LinkSpec: LinkSpec{Latency: latency, BandwidthMbit: 300}}},
	}
}

func TestLatency(t *testing.T) {
	n := startNet(t, twoZones(14*ms), map[uint64]string{1: echoServer(t)}, Options{})
	remote, local := dial(t, n.Addr("far", 1)), dial(t, n.Addr("near", 1))
	msg := bytes.Repeat([]byte("x"), 64)
	var locals []time.Duration
	for i := range 5 {
		d, err := roundTrip(remote, msg, 2*time.Second)
		if err != nil {
			t.Fatalf("remote round trip %d: %v", i, err)
		}
		if d < 28*ms {
			t.Errorf("remote round trip %d took %v, want ≥ 28ms (14ms one way)", i, d)
		}
		if d, err = roundTrip(local, msg, 2*time.Second); err != nil {
			t.Fatalf("local round trip %d: %v", i, err)
		}
		locals = append(locals, d)
	}
	slices.Sort(locals)
	if med := locals[len(locals)/2]; med >= 10*ms {
		t.Errorf("local round trips %v: median %v, want < 10ms", locals, med)
	}
}

func TestAddresses(t *testing.T) {
	topo := Default()
	up := map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: "127.0.0.1:3"}
	var n *Network
	var base int
	// The scheme needs 3 zones × 100 ports from the base: try a few bases,
	// below Linux's ephemeral ports and away from the local cluster's.
	for try := range 10 {
		base = 22000 + 300*((os.Getpid()+try)%34)
		var err error
		if n, err = Start(topo, up, Options{PortBase: base}); err == nil {
			break
		}
		t.Logf("port base %d: %v", base, err)
	}
	if n == nil {
		t.Skip("no free port base found")
	}
	defer n.Close()
	for zi, zone := range topo.ZoneNames() {
		for _, s := range topo.Stores() {
			want := "127.0.0.1:" + strconv.Itoa(base+100*(zi+1)+int(s))
			if got := n.Addr(zone, s); got != want {
				t.Errorf("Addr(%s, %d) = %s, want %s", zone, s, got, want)
			}
		}
	}
	za := n.ZoneAddrs(2)
	if len(za) != 3 || za["dc-c"] != "127.0.0.1:"+strconv.Itoa(base+302) {
		t.Errorf("ZoneAddrs(2) = %v", za)
	}
	if n.Addr("dc-x", 1) != "" || n.Addr("dc-a", 4) != "" || n.ZoneAddrs(4) != nil {
		t.Error("unknown zone or store has an address")
	}
	st := n.Status()
	if len(st.Links) != 9 || st.Links[0].Zone != "dc-a" || st.Links[0].Store != 1 || st.Links[1].Store != 2 || st.Links[3].Zone != "dc-b" {
		t.Errorf("links not zone-major: %+v", st.Links)
	}
	for _, l := range st.Links {
		wantWAN := l.Zone != l.StoreZone
		if l.WAN != wantWAN || (wantWAN && l.Spec != topo.Default) || (!wantWAN && !l.Spec.IsZero()) {
			t.Errorf("link %+v", l)
		}
	}

	// A busy port: Start fails in one line and leaves nothing behind.
	_, err := Start(topo, up, Options{PortBase: base})
	if err == nil || !strings.Contains(err.Error(), "netsim: link dc-a → store 1: listen 127.0.0.1:"+strconv.Itoa(base+101)) || strings.Contains(err.Error(), "\n") {
		t.Errorf("second Start on the same ports: %v", err)
	}
}

func TestStartErrors(t *testing.T) {
	topo := Default()
	for _, c := range []struct {
		name string
		up   map[uint64]string
		opts Options
		topo *Topology
		want string
	}{
		{"missing upstream", map[uint64]string{1: "a:1", 2: "a:2"}, Options{}, topo, "netsim: store 3 of the topology has no upstream address"},
		{"extra upstream", map[uint64]string{1: "a:1", 2: "a:2", 3: "a:3", 4: "a:4"}, Options{}, topo, "netsim: upstream store 4 is in no zone of the topology"},
		{"negative port base", map[uint64]string{1: "a:1", 2: "a:2", 3: "a:3"}, Options{PortBase: -1}, topo, "netsim: port base -1 is negative"},
		{"port base too high", map[uint64]string{1: "a:1", 2: "a:2", 3: "a:3"}, Options{PortBase: 65300}, topo, "netsim: port base 65300 is too high: 3 zones need ports up to 65699"},
		{"bad mode", map[uint64]string{1: "a:1", 2: "a:2", 3: "a:3"}, Options{PartitionMode: "drop"}, topo, `netsim: partition mode "drop": want blackhole or disconnect`},
		{"invalid topology", nil, Options{}, &Topology{}, "topology: no zone (add a [[zone]] with a name and stores)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, err := Start(c.topo, c.up, c.opts)
			if err == nil {
				n.Close()
				t.Fatal("started")
			}
			if err.Error() != c.want {
				t.Errorf("error %q, want %q", err, c.want)
			}
		})
	}
}

// TestPartitionCutsLinks: which links a partition cuts, in a zone with two
// stores and a zone with one.
func TestPartitionCutsLinks(t *testing.T) {
	topo := &Topology{Zones: []Zone{{Name: "a", Stores: []uint64{1, 2}}, {Name: "b", Stores: []uint64{3}}}}
	echo := echoServer(t)
	n := startNet(t, topo, map[uint64]string{1: echo, 2: echo, 3: echo}, Options{})
	cut := func() []string {
		var s []string
		for _, l := range n.Status().Links {
			if l.Cut != "" {
				s = append(s, fmt.Sprintf("%s→%d:%s", l.Zone, l.Store, l.Cut))
			}
		}
		return s
	}
	check := func(step string, want ...string) {
		t.Helper()
		if got := cut(); !slices.Equal(got, want) {
			t.Errorf("%s: cut links %v, want %v", step, got, want)
		}
	}
	check("start")
	if err := n.Partition(1); err != nil {
		t.Fatal(err)
	}
	// Store 1's own zone keeps reaching it; everyone else loses it, and
	// zone a (store 1's way out) loses the other stores.
	check("partition 1", "a→2:blackhole", "a→3:blackhole", "b→1:blackhole")
	if err := n.PartitionWith(3, Disconnect); err != nil {
		t.Fatal(err)
	}
	// a→3 is cut by both: the harsher mode wins.
	check("partition 3", "a→2:blackhole", "a→3:disconnect", "b→1:disconnect", "b→2:disconnect")
	if got := n.Partitioned(); !slices.Equal(got, []uint64{1, 3}) {
		t.Errorf("Partitioned() = %v", got)
	}
	if err := n.Partition(1); err != nil { // again: idempotent
		t.Fatal(err)
	}
	check("partition 1 again", "a→2:blackhole", "a→3:disconnect", "b→1:disconnect", "b→2:disconnect")
	if err := n.Heal(); err != nil {
		t.Fatal(err)
	}
	check("heal")
	if got := n.Partitioned(); len(got) != 0 {
		t.Errorf("Partitioned() after heal = %v", got)
	}
	if err := n.Partition(9); err == nil || err.Error() != "netsim: store 9 is not in the topology (stores [1 2 3])" {
		t.Errorf("Partition(9) = %v", err)
	}
	if err := n.PartitionWith(1, "drop"); err == nil || !strings.Contains(err.Error(), `partition mode "drop"`) {
		t.Errorf("PartitionWith(1, drop) = %v", err)
	}
	// Every link works again.
	for _, l := range n.Status().Links {
		if _, err := roundTrip(dial(t, l.Address), []byte("ok"), 2*time.Second); err != nil {
			t.Errorf("link %s→%d after heal: %v", l.Zone, l.Store, err)
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestBlackhole: a blackholed link holds data and new connections get
// nothing through; the local link keeps working; heal delivers what was
// held, and the connections carry on.
func TestBlackhole(t *testing.T) {
	n := startNet(t, twoZones(2*ms), map[uint64]string{1: echoServer(t)}, Options{})
	remote, local := dial(t, n.Addr("far", 1)), dial(t, n.Addr("near", 1))
	if _, err := roundTrip(remote, []byte("before"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := n.Partition(1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := roundTrip(remote, []byte("held"), 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("round trip on a blackholed link: %v, want a timeout", err)
	}
	fresh := dial(t, n.Addr("far", 1)) // the proxy accepts...
	if _, err := roundTrip(fresh, []byte("new"), 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("round trip on a new connection to a blackholed link: %v, want a timeout", err) // ...but nothing crosses
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the cut took %v to show", d)
	}
	if _, err := roundTrip(local, []byte("local"), 2*time.Second); err != nil {
		t.Errorf("the store's own zone lost it: %v", err)
	}
	if err := n.Heal(); err != nil {
		t.Fatal(err)
	}
	// What was held arrives, in order, and the connections carry on.
	for _, c := range []struct {
		conn net.Conn
		held string
	}{{remote, "held"}, {fresh, "new"}} {
		got := make([]byte, len(c.held))
		_ = c.conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadFull(c.conn, got); err != nil || string(got) != c.held {
			t.Errorf("after heal read %q, %v; want the held %q", got, err, c.held)
		}
		if _, err := roundTrip(c.conn, []byte("after"), 2*time.Second); err != nil {
			t.Errorf("round trip after heal: %v", err)
		}
	}
}

// TestDisconnect: a disconnected link closes its connections and refuses
// new ones; heal listens on the same address again.
func TestDisconnect(t *testing.T) {
	n := startNet(t, twoZones(2*ms), map[uint64]string{1: echoServer(t)}, Options{PartitionMode: Disconnect})
	addr := n.Addr("far", 1)
	remote := dial(t, addr)
	if _, err := roundTrip(remote, []byte("before"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := n.Partition(1); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(remote, []byte("gone"), 2*time.Second); err == nil || isTimeout(err) {
		t.Errorf("round trip on a disconnected link: %v, want the connection closed", err)
	}
	if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		c.Close()
		t.Error("dial to a disconnected link succeeded")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial to a disconnected link: %v, want connection refused", err)
	}
	if _, err := roundTrip(dial(t, n.Addr("near", 1)), []byte("local"), 2*time.Second); err != nil {
		t.Errorf("the store's own zone lost it: %v", err)
	}
	if err := n.Heal(); err != nil {
		t.Fatal(err)
	}
	if n.Addr("far", 1) != addr {
		t.Errorf("address changed from %s to %s", addr, n.Addr("far", 1))
	}
	if _, err := roundTrip(dial(t, addr), []byte("after"), 2*time.Second); err != nil {
		t.Errorf("after heal: %v", err)
	}
}

func TestWANBytes(t *testing.T) {
	n := startNet(t, twoZones(1*ms), map[uint64]string{1: echoServer(t)}, Options{})
	remote, local := dial(t, n.Addr("far", 1)), dial(t, n.Addr("near", 1))
	msg := bytes.Repeat([]byte("w"), 1000)
	for range 3 {
		if _, err := roundTrip(local, msg, 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if got := n.WANBytes(); got != 0 {
		t.Errorf("WANBytes after local traffic = %d, want 0", got)
	}
	for range 3 {
		if _, err := roundTrip(remote, msg, 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if got := n.WANBytes(); got != 6000 {
		t.Errorf("WANBytes after 3 remote round trips of 1000 bytes = %d, want 6000", got)
	}
	st := n.Status()
	if st.WANBytes != 6000 {
		t.Errorf("Status().WANBytes = %d", st.WANBytes)
	}
	for _, l := range st.Links {
		if want := map[bool]uint64{true: 6000, false: 6000}[l.WAN]; l.Bytes != want {
			t.Errorf("link %s→%d carried %d bytes, want %d", l.Zone, l.Store, l.Bytes, want)
		}
	}
}

func TestControlAPI(t *testing.T) {
	n := startNet(t, Default(), map[uint64]string{1: echoServer(t), 2: echoServer(t), 3: echoServer(t)}, Options{})
	addr, err := n.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctl := Control{Addr: addr}
	if err := ctl.Partition(ctx, 2); err != nil {
		t.Fatal(err)
	}
	st, err := ctl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Partitioned, []uint64{2}) || st.PartitionMode != Blackhole || len(st.Links) != 9 || st.Topology == nil || len(st.Topology.Zones) != 3 || st.Topology.Default.Latency != 14*ms {
		t.Errorf("status %+v", st)
	}
	for _, l := range st.Links {
		wantCut := (l.Store == 2) != (l.Zone == "dc-b")
		if (l.Cut != "") != wantCut || l.Address != n.Addr(l.Zone, l.Store) || l.Upstream == "" {
			t.Errorf("link %+v", l)
		}
	}
	if err := ctl.PartitionWith(ctx, 3, Disconnect); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(n.Partitioned(), []uint64{2, 3}) {
		t.Errorf("Partitioned() = %v", n.Partitioned())
	}
	if err := ctl.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	if len(n.Partitioned()) != 0 {
		t.Errorf("Partitioned() after heal = %v", n.Partitioned())
	}

	for _, c := range []struct {
		err  error
		want string
	}{
		{ctl.Partition(ctx, 7), "netsim control " + addr + ": partition: store 7 is not in the topology (stores [1 2 3]) (HTTP 404)"},
		{ctl.PartitionWith(ctx, 1, "drop"), "netsim control " + addr + `: partition: partition mode "drop": want blackhole or disconnect (HTTP 400)`},
		{Control{Addr: addr}.do(ctx, http.MethodPost, "/partition", nil), "netsim control " + addr + ": partition: the store parameter is missing (POST /partition?store=N) (HTTP 400)"},
		{Control{Addr: addr}.do(ctx, http.MethodPost, "/partition?store=x", nil), "netsim control " + addr + `: partition: store "x" is not a positive integer (HTTP 400)`},
		{Control{Addr: addr}.do(ctx, http.MethodGet, "/heal", nil), "netsim control " + addr + ": Method Not Allowed (HTTP 405)"},
	} {
		if c.err == nil || c.err.Error() != c.want {
			t.Errorf("error %v, want %s", c.err, c.want)
		}
	}

	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Heal(ctx); err == nil || err.Error() != "netsim control "+addr+`: nothing listens there (is "hedgekv netsim" running?)` {
		t.Errorf("after Close: %v", err)
	}
	if err := n.Partition(1); err == nil || err.Error() != "netsim: the network is closed" {
		t.Errorf("Partition after Close: %v", err)
	}
	if _, err := n.Serve("127.0.0.1:0"); err == nil {
		t.Error("Serve after Close succeeded")
	}
}

// TestCloseWhilePartitioned: Close returns promptly with connections held
// by a blackhole and with links disconnected.
func TestCloseWhilePartitioned(t *testing.T) {
	topo := &Topology{Zones: []Zone{{Name: "a", Stores: []uint64{1}}, {Name: "b", Stores: []uint64{2}}}, Default: LinkSpec{Latency: 5 * ms}}
	echo := echoServer(t)
	n, err := Start(topo, map[uint64]string{1: echo, 2: echo}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	held := dial(t, n.Addr("b", 1))
	if err := n.Partition(1); err != nil {
		t.Fatal(err)
	}
	if err := n.PartitionWith(2, Disconnect); err != nil {
		t.Fatal(err)
	}
	// Zone b's connection to store 1 is one of store 2's links: its
	// Disconnect may have reset it already (a CI run saw "connection reset
	// by peer" here), which is as good as held for what Close must do.
	_, _ = held.Write([]byte("held"))
	start := time.Now()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close took %v", d)
	}
	if err := n.Close(); err != nil { // twice is fine
		t.Fatal(err)
	}
	_ = held.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadAll(held); isTimeout(err) {
		t.Error("a held connection stayed open after Close")
	}
}

// TestNoGoroutineLeft: partitions of both kinds, heal and Close leave no
// toxiproxy goroutine behind.
func TestNoGoroutineLeft(t *testing.T) {
	echo := echoServer(t)
	before := runtime.NumGoroutine()
	for range 2 {
		n, err := Start(Default(), map[uint64]string{1: echo, 2: echo, 3: echo}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		c1, c2, c3 := dial(t, n.Addr("dc-b", 1)), dial(t, n.Addr("dc-c", 2)), dial(t, n.Addr("dc-a", 2))
		if _, err := roundTrip(c1, []byte("hi"), 2*time.Second); err != nil {
			t.Fatal(err)
		}
		steps := []func() error{
			func() error { return n.Partition(1) },
			func() error { _, err := c1.Write([]byte("held")); return err },
			func() error { return n.PartitionWith(3, Disconnect) },
			func() error { _, err := c2.Write([]byte("x")); return err },
			n.Heal,
			func() error { return n.Partition(2) },
			func() error { _, err := c3.Write([]byte("held")); return err },
			n.Close,
		}
		for i, step := range steps {
			if err := step(); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
		}
		for _, c := range []net.Conn{c1, c2, c3} {
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			_, _ = io.ReadAll(c)
			c.Close()
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines before, %d after Close:\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

// TestBandwidth: 8 Mbit/s is 1000 KB/s, so 100 KB takes at least 100 ms
// each way (pipelined: about 100-200 ms for the echo), where the local
// link is unlimited.
func TestBandwidth(t *testing.T) {
	topo := &Topology{
		Zones: []Zone{{Name: "near", Stores: []uint64{1}}, {Name: "far"}},
		Links: []Link{{Between: [2]string{"near", "far"}, LinkSpec: LinkSpec{BandwidthMbit: 8}}},
	}
	n := startNet(t, topo, map[uint64]string{1: echoServer(t)}, Options{})
	msg := bytes.Repeat([]byte("b"), 100_000)
	echo := func(c net.Conn) time.Duration {
		start := time.Now()
		_ = c.SetDeadline(start.Add(5 * time.Second))
		errc := make(chan error, 1)
		go func() { _, err := c.Write(msg); errc <- err }()
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	if d := echo(dial(t, n.Addr("far", 1))); d < 90*ms || d > 3*time.Second {
		t.Errorf("100 KB echoed over 8 Mbit/s in %v, want ≥ 90ms (and < 3s)", d)
	}
	if d := echo(dial(t, n.Addr("near", 1))); d > 80*ms {
		t.Errorf("100 KB echoed over the unlimited local link in %v", d)
	}
	if got := n.WANBytes(); got != 200_000 {
		t.Errorf("WANBytes = %d, want 200000", got)
	}
}
