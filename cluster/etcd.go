package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hedgekv/hedgekv/netsim"
)

// ErrEtcdNotFound says no etcd binary was found.
var ErrEtcdNotFound = errors.New("etcd binary not found on PATH; install it with `apt-get install etcd-server` (Debian/Ubuntu) or pass its path")

// FindEtcd returns the etcd binary to run: explicit if set (a path or a name
// looked up on PATH), else "etcd" on PATH.
func FindEtcd(explicit string) (string, error) {
	name := explicit
	if name == "" {
		name = "etcd"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w (%w)", ErrEtcdNotFound, err)
	}
	return p, nil
}

// EtcdVersion returns the first line of `etcd --version`.
func EtcdVersion(ctx context.Context, binary string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line)
}

// EtcdConfig configures StartEtcd.
type EtcdConfig struct {
	Binary  string // from FindEtcd
	Members int    // default 3
	// Dir holds each member's data and log; "" makes a temporary directory
	// that Stop removes.
	Dir          string
	ReadyTimeout time.Duration // default 30s
	Logger       *slog.Logger

	// Topology, if set, runs one member per store of the topology, named
	// m<store>, in the store's zone, behind a simulated WAN (package
	// netsim), and Members is ignored. Two networks of (zone → member)
	// links are started, one in front of the members' client ports, one in
	// front of their peer ports. A client in zone Z reaches member S at
	// ZoneEndpoint(Z, S). For peer traffic see etcdPeerFront: a member
	// advertises one peer URL, the same for every viewer, so that URL is a
	// router which sends each connection through the link from its
	// sender's zone, read from the X-PeerURLs header etcd puts on every
	// raft request.
	Topology *netsim.Topology
}

// Etcd is a local etcd cluster of child processes on loopback ports.
type Etcd struct {
	// Endpoints are the members' own client URLs, in member order (behind a
	// WAN they bypass it; see ZoneEndpoint).
	Endpoints []string
	members   []*etcdMember
	dir       string
	ownDir    bool
	logger    *slog.Logger

	// Behind a topology: the members' store ids and zones (in member
	// order), the two networks and the peer routers.
	topo      *netsim.Topology
	stores    []uint64
	zones     []string
	clientNet *netsim.Network
	peerNet   *netsim.Network
	fronts    []*etcdPeerFront
}

type etcdMember struct {
	*child
	name    string
	logPath string
}

// StartEtcd starts cfg.Members etcd processes forming one cluster on
// free 127.0.0.1 ports and waits until it has a leader and serves reads.
// A member that finds its port taken (free when picked, bound by another
// process before the member started) makes it start over on new ports, up
// to three times, when the data directory is its own.
func StartEtcd(ctx context.Context, cfg EtcdConfig) (*Etcd, error) {
	return startRetryingPorts("etcd cluster", cfg.Dir == "", cfg.Logger, func() (*Etcd, error) { return startEtcd(ctx, cfg) })
}

func startEtcd(ctx context.Context, cfg EtcdConfig) (_ *Etcd, err error) {
	if cfg.Members <= 0 {
		cfg.Members = 3
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Binary == "" {
		if cfg.Binary, err = FindEtcd(""); err != nil {
			return nil, err
		}
	}
	c := &Etcd{logger: cfg.Logger}
	if c.dir, c.ownDir, err = clusterDir(cfg.Dir, "hedgekv-bench-etcd-*"); err != nil {
		return nil, fmt.Errorf("etcd cluster: %w", err)
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	if cfg.Members, err = c.placeMembers(cfg); err != nil {
		return nil, err
	}

	// The members' ports stay reserved (bound) until the members start:
	// the WAN's proxies and routers, bound meanwhile on ports the kernel
	// picks, could otherwise take one.
	ports, release, err := reservePorts(2 * cfg.Members)
	if err != nil {
		return nil, fmt.Errorf("etcd cluster: %w", err)
	}
	defer release()
	clientURL := func(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]) }
	peerURL := func(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]) }
	// advertised[i] is the peer URL the other members dial to reach member
	// i: its own listen URL, or its router behind a WAN.
	advertised := make([]string, cfg.Members)
	for i := range cfg.Members {
		advertised[i] = peerURL(i)
	}
	if c.topo != nil {
		if err := c.startWAN(ports); err != nil {
			return nil, err
		}
		for i, f := range c.fronts {
			advertised[i] = "http://" + f.addr()
		}
	}
	var initial []string
	for i := range cfg.Members {
		initial = append(initial, c.memberName(i)+"="+advertised[i])
	}
	release()
	for i := range cfg.Members {
		name := c.memberName(i)
		args := c.memberArgs(i, clientURL(i), peerURL(i), advertised[i], initial)
		m, err := startEtcdMember(cfg.Binary, name, args, filepath.Join(c.dir, name+".log"))
		if err != nil {
			return nil, err
		}
		c.members = append(c.members, m)
		c.Endpoints = append(c.Endpoints, clientURL(i))
	}
	cfg.Logger.Info("etcd cluster starting", "members", cfg.Members, "endpoints", strings.Join(c.Endpoints, ","), "dir", c.dir, "wan", c.topo != nil)
	if err := c.waitReady(ctx, cfg.ReadyTimeout); err != nil {
		return nil, err
	}
	if c.topo != nil && len(slices.Compact(slices.Sorted(slices.Values(c.zones)))) > 1 && c.peerNet.WANBytes() == 0 {
		return nil, errors.New("etcd cluster: the members elected a leader without a byte crossing the simulated WAN")
	}
	return c, nil
}

// placeMembers gives the cluster its members (their store ids) and their
// zones: the topology's, or cfg.Members stores without zones. It returns
// the number of members.
func (c *Etcd) placeMembers(cfg EtcdConfig) (int, error) {
	if cfg.Topology == nil {
		for i := range cfg.Members {
			c.stores = append(c.stores, uint64(i+1))
		}
		return cfg.Members, nil
	}
	if err := cfg.Topology.Validate(); err != nil {
		return 0, fmt.Errorf("etcd cluster: %w", err)
	}
	c.topo = cfg.Topology
	c.stores = cfg.Topology.Stores()
	if len(c.stores) == 0 {
		return 0, errors.New("etcd cluster: the topology has no store")
	}
	for _, s := range c.stores {
		z, _ := cfg.Topology.ZoneOf(s)
		c.zones = append(c.zones, z)
	}
	return len(c.stores), nil
}

// memberArgs are the etcd flags of member i, listening on clientURL and
// peerURL, reached by the others at advertised, in the initial cluster.
func (c *Etcd) memberArgs(i int, clientURL, peerURL, advertised string, initial []string) []string {
	name := c.memberName(i)
	return []string{
		"--name", name,
		"--data-dir", filepath.Join(c.dir, name),
		"--listen-client-urls", clientURL,
		"--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", advertised,
		"--initial-cluster", strings.Join(initial, ","),
		"--initial-cluster-token", "hedgekv-bench",
		"--initial-cluster-state", "new",
		"--logger", "zap",
		"--log-outputs", "stderr",
		"--log-level", "warn",
	}
}

// memberName is member i's name: m<store id>.
func (c *Etcd) memberName(i int) string { return "m" + strconv.FormatUint(c.stores[i], 10) }

// startWAN starts the client and peer networks in front of the members'
// ports (ports[2i] client, ports[2i+1] peer of member i) and a peer router
// per member.
func (c *Etcd) startWAN(ports []int) error {
	clientUp := make(map[uint64]string, len(c.stores))
	peerUp := make(map[uint64]string, len(c.stores))
	for i, s := range c.stores {
		clientUp[s] = fmt.Sprintf("127.0.0.1:%d", ports[2*i])
		peerUp[s] = fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])
	}
	var err error
	if c.clientNet, err = netsim.Start(c.topo, clientUp, netsim.Options{}); err != nil {
		return fmt.Errorf("etcd cluster: client links: %w", err)
	}
	if c.peerNet, err = netsim.Start(c.topo, peerUp, netsim.Options{}); err != nil {
		return fmt.Errorf("etcd cluster: peer links: %w", err)
	}
	// The routers listen first: each needs every member's advertised URL
	// to tell who is calling.
	for i, s := range c.stores {
		// Who calls without saying so: only other members dial a peer
		// URL, so the first other member in another zone stands for them.
		fallback := c.zones[i]
		for _, z := range c.zones {
			if z != c.zones[i] {
				fallback = z
				break
			}
		}
		f, err := listenEtcdPeerFront(s, fallback, c.peerNet, c.logger)
		if err != nil {
			return fmt.Errorf("etcd cluster: %w", err)
		}
		c.fronts = append(c.fronts, f)
	}
	senders := make(map[string]string, len(c.fronts)) // advertised host:port → zone
	for i, f := range c.fronts {
		senders[f.addr()] = c.zones[i]
	}
	for _, f := range c.fronts {
		f.serve(senders)
	}
	return nil
}

func startEtcdMember(binary, name string, args []string, logPath string) (*etcdMember, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: %w", name, err)
	}
	// No ETCD_* settings of ours may leak into the members.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	r, err := startChild(binary, args, env, logFile)
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: %w", name, err)
	}
	return &etcdMember{child: r, name: name, logPath: logPath}, nil
}

func (c *Etcd) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd cluster: client: %w", err)
	}
	defer cli.Close()
	var lastErr error
	for {
		for _, m := range c.members {
			select {
			case <-m.exited:
				return fmt.Errorf("etcd member %s exited during start-up (%v); its log ends with:\n%s", m.name, m.err, tail(m.logPath, 20))
			default:
			}
		}
		if lastErr = c.ready(ctx, cli); lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd cluster not ready after %v: %w; member m1's log ends with:\n%s", timeout, lastErr, tail(c.members[0].logPath, 20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ready: every member reports the same leader, and a linearizable read works.
func (c *Etcd) ready(ctx context.Context, cli *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var leader uint64
	for _, ep := range c.Endpoints {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			return fmt.Errorf("status of %s: %w", ep, err)
		}
		if st.Leader == 0 || (leader != 0 && st.Leader != leader) {
			return fmt.Errorf("%s: no agreed leader yet", ep)
		}
		leader = st.Leader
	}
	if _, err := cli.Get(ctx, "hedgekv-bench-ready"); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	return nil
}

// Stop terminates the members (SIGTERM, then SIGKILL after 2s: members
// stopping together spend seconds trying to hand leadership over, and a
// benchmark cluster's data is disposable) and removes a temporary data
// directory. Safe to call more than once.
func (c *Etcd) Stop() {
	runs := make([]*child, len(c.members))
	for i, m := range c.members {
		runs[i] = m.child
	}
	stopChildren(runs, 2*time.Second, func(i int) {
		c.logger.Debug("etcd member still running 2s after SIGTERM; killing it", "member", c.members[i].name)
	})
	c.members = nil
	for _, f := range c.fronts {
		f.close()
	}
	c.fronts = nil
	for _, n := range []*netsim.Network{c.peerNet, c.clientNet} {
		if n != nil {
			if err := n.Close(); err != nil {
				c.logger.Warn("etcd cluster: closing the simulated WAN", "err", err)
			}
		}
	}
	c.peerNet, c.clientNet = nil, nil
	if c.ownDir && c.dir != "" {
		_ = os.RemoveAll(c.dir)
		c.dir = ""
	}
}

// Stores are the members' store ids, in member order (1..Members without a
// topology).
func (c *Etcd) Stores() []uint64 { return slices.Clone(c.stores) }

// Zone is the zone of the member of store, "" without a topology or for
// an unknown store.
func (c *Etcd) Zone(store uint64) string {
	if i := slices.Index(c.stores, store); i >= 0 && i < len(c.zones) {
		return c.zones[i]
	}
	return ""
}

// ZoneEndpoint is the client URL a client in zone dials to reach the
// member of store: through the zone's link to it, or the member's own URL
// without a topology. "" for an unknown store or zone.
func (c *Etcd) ZoneEndpoint(zone string, store uint64) string {
	i := slices.Index(c.stores, store)
	switch {
	case i < 0 || i >= len(c.Endpoints):
		return ""
	case c.clientNet == nil:
		return c.Endpoints[i]
	}
	if a := c.clientNet.Addr(zone, store); a != "" {
		return "http://" + a
	}
	return ""
}

// WANBytes is the number of bytes that crossed a link between two zones,
// client and peer traffic, both directions, since the cluster started (0
// without a topology).
func (c *Etcd) WANBytes() uint64 {
	var n uint64
	for _, net := range []*netsim.Network{c.clientNet, c.peerNet} {
		if net != nil {
			n += net.WANBytes()
		}
	}
	return n
}

// PeerConnections counts the connections the peer routers passed on:
// attributed to their sender's zone, and not (no X-PeerURLs header on the
// first request: etcd's probes), which went through the link from another
// member's zone (see etcdPeerFront).
func (c *Etcd) PeerConnections() (attributed, unattributed int64) {
	for _, f := range c.fronts {
		attributed += f.attributed.Load()
		unattributed += f.unattributed.Load()
	}
	return attributed, unattributed
}

// memberIDs maps member ids to store ids, and returns a client of the
// members' own URLs (the caller closes it).
func (c *Etcd) memberIDs(ctx context.Context) (map[uint64]uint64, *clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, nil, fmt.Errorf("etcd cluster: client: %w", err)
	}
	resp, err := cli.MemberList(ctx)
	if err != nil {
		_ = cli.Close()
		return nil, nil, fmt.Errorf("etcd cluster: member list: %w", err)
	}
	ids := make(map[uint64]uint64, len(resp.Members))
	for _, m := range resp.Members {
		for i := range c.stores {
			if m.Name == c.memberName(i) {
				ids[m.ID] = c.stores[i]
			}
		}
	}
	return ids, cli, nil
}

// Leader is the store id of the member every member names as leader; 0
// with a nil error while they disagree or have none.
func (c *Etcd) Leader(ctx context.Context) (uint64, error) {
	ids, cli, err := c.memberIDs(ctx)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	return c.agreedLeader(ctx, cli, ids)
}

func (c *Etcd) agreedLeader(ctx context.Context, cli *clientv3.Client, ids map[uint64]uint64) (uint64, error) {
	var leader uint64
	for _, ep := range c.Endpoints {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("etcd cluster: status of %s: %w", ep, err)
		}
		if st.Leader == 0 || (leader != 0 && st.Leader != leader) {
			return 0, nil
		}
		leader = st.Leader
	}
	return ids[leader], nil
}

// MoveLeader makes the member of store the leader (clientv3's
// Maintenance.MoveLeader, sent to the current leader) and waits until every
// member agrees.
func (c *Etcd) MoveLeader(ctx context.Context, store uint64) error {
	ids, cli, err := c.memberIDs(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	var target uint64
	for id, s := range ids {
		if s == store {
			target = id
		}
	}
	if target == 0 {
		return fmt.Errorf("etcd cluster: no member for store %d", store)
	}
	for {
		now, err := c.agreedLeader(ctx, cli, ids)
		if err != nil {
			return err
		}
		if now == store {
			return nil
		}
		if now != 0 {
			lcli, err := clientv3.New(clientv3.Config{
				Endpoints: []string{c.Endpoints[slices.Index(c.stores, now)]}, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
			})
			if err != nil {
				return fmt.Errorf("etcd cluster: client of the leader: %w", err)
			}
			mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = lcli.MoveLeader(mctx, target)
			cancel()
			_ = lcli.Close()
			if err != nil {
				c.logger.Debug("etcd cluster: move leader", "to", store, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd cluster: moving the leader to store %d: %w", store, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
