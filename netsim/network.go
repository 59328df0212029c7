package netsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// DefaultPortBase is the port base of the local cluster's netsim: zone i's
// proxy to store s listens on DefaultPortBase + 100*i + s (dc-b → store 1
// is 127.0.0.1:21201).
const DefaultPortBase = 21000

// DefaultControlAddr is where "hedgekv netsim" serves its control API.
const DefaultControlAddr = "127.0.0.1:21999"

// PartitionMode is how a partition cuts a link.
type PartitionMode string

const (
	// Blackhole holds every byte on the cut links, as a real partition
	// does: connections stay open, nobody is told, new connections are
	// accepted by the proxy but nothing crosses; only timeouts and
	// keepalives notice. Heal delivers what was held, in order, and the
	// connections carry on. The default.
	Blackhole PartitionMode = "blackhole"
	// Disconnect stops the cut links' proxies: every connection through
	// them is closed at once and new ones are refused, so the peer fails
	// fast, as if the store had crashed. Heal listens on the same
	// addresses again.
	Disconnect PartitionMode = "disconnect"
)

// ParsePartitionMode accepts "blackhole", "disconnect" and "" (Blackhole).
func ParsePartitionMode(s string) (PartitionMode, error) {
	switch PartitionMode(s) {
	case "", Blackhole:
		return Blackhole, nil
	case Disconnect:
		return Disconnect, nil
	}
	return "", fmt.Errorf("partition mode %q: want %s or %s", s, Blackhole, Disconnect)
}

// Options configure Start.
type Options struct {
	// PortBase places zone i's proxy to store s (i counted from 1 in
	// topology order) on PortBase + 100*i + s. 0 picks free ports (tests);
	// "hedgekv netsim" uses DefaultPortBase.
	PortBase int
	// Host is the address every proxy listens on; "" is 127.0.0.1.
	Host string
	// PartitionMode is what Partition does; "" is Blackhole.
	PartitionMode PartitionMode
	// StopTimeout bounds each toxiproxy Stop and Start (a watchdog: the
	// call goes on in the background and is reported). 0 is 5s.
	StopTimeout time.Duration
}

// Network is a running simulated WAN: one toxiproxy proxy per (zone →
// store) link.
type Network struct {
	topo  *Topology
	opts  Options
	api   *toxiproxy.ApiServer
	links []*link // zone-major, in topology order, stores ascending
	byKey map[linkKey]*link

	mu          sync.Mutex
	partitioned map[uint64]PartitionMode
	closed      bool
	servers     []*http.Server
}

type linkKey struct {
	zone  string
	store uint64
}

// link is the path every connection from one zone to one store takes.
type link struct {
	zone      string // where the traffic comes from
	store     uint64
	storeZone string
	spec      LinkSpec
	upstream  string
	addr      string
	proxy     *toxiproxy.Proxy
	gate      *gate
	cut       PartitionMode // "" while open; under Network.mu
}

func (l *link) wan() bool    { return l.zone != l.storeZone }
func (l *link) name() string { return fmt.Sprintf("%s → store %d", l.zone, l.store) }

// Start starts a proxy for every zone and every store of the topology (the
// same-zone links too: they add nothing but can be cut). upstream maps each
// store of the topology to its real listen address.
func Start(topo *Topology, upstream map[uint64]string, opts Options) (*Network, error) {
	if err := topo.Validate(); err != nil {
		return nil, err
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	mode, err := ParsePartitionMode(string(opts.PartitionMode))
	if err != nil {
		return nil, fmt.Errorf("netsim: %w", err)
	}
	opts.PartitionMode = mode
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 5 * time.Second
	}
	if opts.PortBase < 0 {
		return nil, fmt.Errorf("netsim: port base %d is negative", opts.PortBase)
	}
	if top := opts.PortBase + 100*len(topo.Zones) + MaxStoreID; opts.PortBase > 0 && top > 65535 {
		return nil, fmt.Errorf("netsim: port base %d is too high: %d zones need ports up to %d", opts.PortBase, len(topo.Zones), top)
	}
	stores := topo.Stores()
	for _, s := range stores {
		if upstream[s] == "" {
			return nil, fmt.Errorf("netsim: store %d of the topology has no upstream address", s)
		}
	}
	for _, s := range slices.Sorted(maps.Keys(upstream)) {
		if _, ok := topo.ZoneOf(s); !ok {
			return nil, fmt.Errorf("netsim: upstream store %d is in no zone of the topology", s)
		}
	}

	registerGate.Do(func() { toxics.Register(gateToxicType, new(gateToxic)) })
	// toxiproxy needs a non-nil metrics container and logger: a nil one
	// panics in a connection goroutine.
	n := &Network{
		topo:        topo,
		opts:        opts,
		api:         toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		byKey:       make(map[linkKey]*link),
		partitioned: make(map[uint64]PartitionMode),
	}
	for i, z := range topo.Zones {
		for _, s := range stores {
			storeZone, _ := topo.ZoneOf(s)
			l := &link{
				zone:      z.Name,
				store:     s,
				storeZone: storeZone,
				spec:      topo.Spec(z.Name, storeZone),
				upstream:  upstream[s],
				gate:      &gate{},
			}
			port := 0
			if opts.PortBase > 0 {
				port = opts.PortBase + 100*(i+1) + int(s)
			}
			if err := n.startLink(l, net.JoinHostPort(opts.Host, strconv.Itoa(port))); err != nil {
				n.Close()
				return nil, err
			}
			n.links = append(n.links, l)
			n.byKey[linkKey{l.zone, l.store}] = l
		}
	}
	return n, nil
}

// startLink creates a link's proxy, adds its toxics (before Start: toxics
// added while connections arrive can miss some) and starts it.
func (n *Network) startLink(l *link, listen string) error {
	p := toxiproxy.NewProxy(n.api, fmt.Sprintf("%s->%d", l.zone, l.store), listen, l.upstream)
	for _, dir := range []string{"upstream", "downstream"} {
		w, err := addToxic(p, "gate_"+dir, gateToxicType, dir, struct{}{})
		if err != nil {
			return fmt.Errorf("netsim: link %s: %w", l.name(), err)
		}
		w.Toxic.(*gateToxic).g = l.gate
		// Latency first, then bandwidth: a chunk pays its one-way delay,
		// then its transmission time.
		if l.spec.Latency > 0 {
			attrs := map[string]int64{"latency": l.spec.Latency.Milliseconds(), "jitter": l.spec.Jitter.Milliseconds()}
			if _, err := addToxic(p, "latency_"+dir, "latency", dir, attrs); err != nil {
				return fmt.Errorf("netsim: link %s: %w", l.name(), err)
			}
		}
		if rate := l.spec.RateKBps(); rate > 0 { // never rate 0: toxiproxy loops on it
			if _, err := addToxic(p, "bandwidth_"+dir, "bandwidth", dir, map[string]int64{"rate": rate}); err != nil {
				return fmt.Errorf("netsim: link %s: %w", l.name(), err)
			}
		}
	}
	if err := p.Start(); err != nil {
		return fmt.Errorf("netsim: link %s: listen %s: %w", l.name(), listen, unwrapOp(err))
	}
	l.proxy = p
	l.addr = p.Listen
	return nil
}

func addToxic(p *toxiproxy.Proxy, name, typ, stream string, attrs any) (*toxics.ToxicWrapper, error) {
	body, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		return nil, err
	}
	w, err := p.Toxics.AddToxicJson(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("toxic %s: %w", name, err)
	}
	return w, nil
}

// unwrapOp drops the "listen tcp ADDR:" prefix the caller already says.
func unwrapOp(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// Topology returns the topology the network runs.
func (n *Network) Topology() *Topology { return n.topo }

// Addr is the address a process in zone dials to reach store, "" if either
// is unknown.
func (n *Network) Addr(zone string, store uint64) string {
	if l := n.byKey[linkKey{zone, store}]; l != nil {
		return l.addr
	}
	return ""
}

// ZoneAddrs is every zone's address of store, by zone name (nil for a
// store not in the topology).
func (n *Network) ZoneAddrs(store uint64) map[string]string {
	var m map[string]string
	for _, l := range n.links {
		if l.store == store {
			if m == nil {
				m = make(map[string]string)
			}
			m[l.zone] = l.addr
		}
	}
	return m
}

// Partition cuts store off with the network's PartitionMode; see
// PartitionWith.
func (n *Network) Partition(store uint64) error {
	return n.PartitionWith(store, n.opts.PartitionMode)
}

// PartitionWith cuts store off from the other stores and from the clients
// of other zones: it cuts every other zone's link to the store, and the
// links of the store's own zone to every other store. Its own zone's link
// to it stays open, so clients in its zone still reach it (and, in a zone
// holding several stores, so do the other stores of the zone: the cut is
// one-way there, see docs/topology.md). Partitioning a store again changes
// its mode. Heal ends every partition.
func (n *Network) PartitionWith(store uint64, mode PartitionMode) error {
	mode, err := ParsePartitionMode(string(mode))
	if err != nil {
		return fmt.Errorf("netsim: %w", err)
	}
	if _, ok := n.topo.ZoneOf(store); !ok {
		return fmt.Errorf("netsim: store %d is not in the topology (stores %v)", store, n.topo.Stores())
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return errors.New("netsim: the network is closed")
	}
	n.partitioned[store] = mode
	return n.applyLocked()
}

// Heal ends every partition.
func (n *Network) Heal() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return errors.New("netsim: the network is closed")
	}
	clear(n.partitioned)
	return n.applyLocked()
}

// cutBy reports whether a partition of store cuts l.
func (n *Network) cutBy(l *link, store uint64) bool {
	zone, _ := n.topo.ZoneOf(store)
	if l.store == store {
		return l.zone != zone // every other zone's link to the store
	}
	return l.zone == zone // the store's zone's links to the other stores
}

// applyLocked brings every link to the state the partitions ask for. A
// link cut by several partitions is cut the harshest way (Disconnect).
func (n *Network) applyLocked() error {
	var errs []error
	for _, l := range n.links {
		var want PartitionMode
		for s, mode := range n.partitioned {
			if n.cutBy(l, s) && (want == "" || mode == Disconnect) {
				want = mode
			}
		}
		if want == l.cut {
			continue
		}
		if err := n.setLink(l, want); err != nil {
			errs = append(errs, err)
		}
	}
	return joinOneLine(errs)
}

// setLink moves a link from its current cut to want.
func (n *Network) setLink(l *link, want PartitionMode) error {
	switch want {
	case "":
		if l.cut == Disconnect {
			if err := n.watch("start "+l.name(), l.proxy.Start); err != nil {
				return err
			}
		}
		l.gate.open()
	case Blackhole:
		l.gate.close()
		if l.cut == Disconnect {
			if err := n.watch("start "+l.name(), l.proxy.Start); err != nil {
				return err
			}
		}
	case Disconnect:
		if err := n.watch("stop "+l.name(), func() error { l.proxy.Stop(); return nil }); err != nil {
			return err
		}
		// Whatever a blackhole held goes to connections that are closed.
		l.gate.open()
	}
	l.cut = want
	return nil
}

// watch runs a toxiproxy call that can hang with a watchdog: after
// StopTimeout it reports the call and leaves it running.
func (n *Network) watch(what string, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("netsim: %s: %w", what, unwrapOp(err))
		}
		return nil
	case <-time.After(n.opts.StopTimeout):
		return fmt.Errorf("netsim: %s: toxiproxy did not return within %v", what, n.opts.StopTimeout)
	}
}

func joinOneLine(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return fmt.Errorf("%w (and %d more)", errs[0], len(errs)-1)
}

// Partitioned returns the partitioned stores, ascending.
func (n *Network) Partitioned() []uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Sorted(maps.Keys(n.partitioned))
}

// WANBytes is the number of bytes that crossed links between different
// zones, both directions, since Start. Bytes a blackhole holds count once
// they pass.
func (n *Network) WANBytes() uint64 {
	var sum uint64
	for _, l := range n.links {
		if l.wan() {
			sum += l.gate.n.Load()
		}
	}
	return sum
}

// Close stops the control API and every proxy, closing every connection
// through them. It returns the first failure (a watchdog that fired).
func (n *Network) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	servers := n.servers
	n.servers = nil
	n.mu.Unlock()
	for _, s := range servers {
		_ = s.Close()
	}
	var (
		wg   sync.WaitGroup
		emu  sync.Mutex
		errs []error
	)
	for _, l := range n.links {
		if l.proxy == nil {
			continue
		}
		// Release what a blackhole holds, so that toxiproxy's goroutines
		// see their connections close.
		l.gate.open()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.watch("stop "+l.name(), func() error { l.proxy.Stop(); return nil }); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	return joinOneLine(errs)
}
