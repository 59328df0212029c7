package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/netsim"
)

// ProcessesConfig configures StartProcesses.
type ProcessesConfig struct {
	// Binary is the hedgekv binary whose `server` command runs each store.
	Binary string
	// Dir holds each store's data directory and log; "" makes a temporary
	// directory that Stop removes.
	Dir string
	// DataDirs, if set, are the stores' data directories, one per zone
	// (default Dir/store<id>): e.g. each on a file system of its own, as
	// the power-loss tests mount them. Their logs stay in Dir.
	DataDirs []string
	// Zones, one per store (default dc-a, dc-b, dc-c: three stores).
	Zones []string
	// Tick is the servers' --tick (0: the server's default, 50ms).
	Tick time.Duration
	// BalanceInterval is the servers' --balance-interval (0: the server's
	// default; negative: no store moves leaders or replicas).
	BalanceInterval time.Duration
	// ExtraArgs are passed to every server after the flags above (e.g.
	// --split-max-bytes), to stores that Join later too.
	ExtraArgs []string
	// StoreArgs, if set, are one list per zone, passed to that store alone
	// after ExtraArgs: what differs between stores, such as each one's
	// --advertise-zone-addrs behind a simulated WAN.
	StoreArgs [][]string
	// LogLevel of the servers (default warn).
	LogLevel string
	// Ports, if set, are the stores' ports, two per store: store i's gRPC
	// port is Ports[2i], its status port Ports[2i+1]. Default: free ports
	// the kernel picks, which one of its outgoing connections may take
	// while a killed store is down; a caller that restarts stores can pick
	// ports outside that range instead.
	Ports        []int
	ReadyTimeout time.Duration // default 30s
	Logger       *slog.Logger
	// NoWait makes StartProcesses return once every process is launched,
	// without waiting for the cluster to settle (WaitSettled does): for a
	// caller that kills a store during its first open.
	NoWait bool
	// Topology, if set, runs the stores behind a simulated WAN (package
	// netsim, its links in this process), as `scripts/cluster.sh start
	// --topology` does with a `hedgekv netsim` process: one store per store
	// of the topology, in its zone (Zones is ignored), each dialling its
	// peers through its own zone's links from the first message on
	// (--peers) and advertising its address for every zone
	// (--advertise-zone-addrs). Clients reach the stores through
	// ZoneEndpoint. Join is refused behind a topology: a newcomer would
	// need links of its own.
	Topology *netsim.Topology
}

// Processes is a hedgekv cluster of `hedgekv server` child processes on
// free 127.0.0.1 ports, which a benchmark can kill -9 and restart one by
// one. Safe for concurrent use.
type Processes struct {
	// Endpoints are the stores' gRPC addresses, in store id order.
	Endpoints []string
	// StatusAddrs are the stores' status HTTP addresses, in the same order.
	StatusAddrs []string
	ids         []uint64
	zones       []string
	// common are the flags every store gets after its own (log level,
	// tick, balance interval, ExtraArgs).
	common []string
	binary string
	dir    string
	ownDir bool
	logger *slog.Logger

	// net is the simulated WAN in front of the stores (nil: none).
	net *netsim.Network

	mu      sync.Mutex
	stopped bool
	pids    []int        // of every process started
	procs   []*storeProc // by index into ids
	admins  map[uint64]*grpc.ClientConn
}

// storeProc is one store: its flags, and its current process (replaced,
// under Processes.mu, when the store is restarted).
type storeProc struct {
	id      uint64
	args    []string
	logPath string
	dataDir string
	run     *child
}

// StartProcesses starts one server process per zone, stores 1..N
// bootstrapping region 1 together, and waits until every store reports the
// same leader for every region. A store that finds its port taken (free
// when picked, bound by someone else before the store started) makes it
// start over on new ports, up to three times, when the directory is its own.
func StartProcesses(ctx context.Context, cfg ProcessesConfig) (*Processes, error) {
	return startRetryingPorts("process cluster", cfg.Dir == "", cfg.Logger, func() (*Processes, error) { return startProcesses(ctx, cfg) })
}

func startProcesses(ctx context.Context, cfg ProcessesConfig) (_ *Processes, err error) {
	if cfg.Binary == "" {
		return nil, errors.New("process cluster: no hedgekv binary given")
	}
	if len(cfg.Zones) == 0 {
		cfg.Zones = []string{"dc-a", "dc-b", "dc-c"}
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "warn"
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	bin, err := filepath.Abs(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("process cluster: %w", err)
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("process cluster: hedgekv binary: %w", err)
	}
	c := &Processes{binary: bin, logger: cfg.Logger, admins: map[uint64]*grpc.ClientConn{}}
	if c.dir, c.ownDir, err = clusterDir(cfg.Dir, "hedgekv-bench-procs-*"); err != nil {
		return nil, fmt.Errorf("process cluster: %w", err)
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	var ids []uint64
	if cfg.Topology != nil {
		if err := cfg.Topology.Validate(); err != nil {
			return nil, fmt.Errorf("process cluster: %w", err)
		}
		if ids = cfg.Topology.Stores(); len(ids) == 0 {
			return nil, errors.New("process cluster: the topology has no store")
		}
		cfg.Zones = nil
		for _, id := range ids {
			z, _ := cfg.Topology.ZoneOf(id)
			cfg.Zones = append(cfg.Zones, z)
		}
	} else {
		for i := range cfg.Zones {
			ids = append(ids, uint64(i+1))
		}
	}
	n := len(cfg.Zones)
	ports, release, err := cfg.Ports, func() {}, error(nil)
	if len(ports) == 0 {
		ports, release, err = reservePorts(2 * n)
	} else if len(ports) != 2*n {
		err = fmt.Errorf("%d ports for %d stores, want %d", len(ports), n, 2*n)
	}
	if err != nil {
		return nil, fmt.Errorf("process cluster: %w", err)
	}
	upstream := make(map[uint64]string, n)
	for i, id := range ids {
		c.ids = append(c.ids, id)
		c.Endpoints = append(c.Endpoints, fmt.Sprintf("127.0.0.1:%d", ports[2*i]))
		c.StatusAddrs = append(c.StatusAddrs, fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]))
		upstream[id] = c.Endpoints[i]
	}
	if cfg.Topology != nil {
		// While the stores' ports are still held: the links bind ports the
		// kernel picks, which could otherwise be one of them.
		if c.net, err = netsim.Start(cfg.Topology, upstream, netsim.Options{}); err != nil {
			release()
			return nil, fmt.Errorf("process cluster: %w", err)
		}
	}
	// Held until now so that nothing else picks them meanwhile.
	release()
	if len(cfg.DataDirs) != 0 && len(cfg.DataDirs) != n {
		return nil, fmt.Errorf("process cluster: %d data directories for %d stores", len(cfg.DataDirs), n)
	}
	if len(cfg.StoreArgs) != 0 && len(cfg.StoreArgs) != n {
		return nil, fmt.Errorf("process cluster: %d lists of store arguments for %d stores", len(cfg.StoreArgs), n)
	}
	c.procs = make([]*storeProc, n)
	c.zones = slices.Clone(cfg.Zones)
	// A cluster token of its own: a port this cluster's stores free may be
	// bound by another cluster's, started beside it, and a store refuses
	// raft traffic only from stores of another cluster token.
	c.common = []string{"--cluster-token", clusterToken(), "--log-level", cfg.LogLevel}
	if cfg.Tick > 0 {
		c.common = append(c.common, "--tick="+cfg.Tick.String())
	}
	if cfg.BalanceInterval != 0 {
		c.common = append(c.common, "--balance-interval="+cfg.BalanceInterval.String())
	}
	c.common = append(c.common, cfg.ExtraArgs...)
	for i, id := range c.ids {
		dataDir := filepath.Join(c.dir, fmt.Sprintf("store%d", id))
		if len(cfg.DataDirs) != 0 {
			dataDir = cfg.DataDirs[i]
		}
		args := []string{"server",
			"--id", strconv.FormatUint(id, 10),
			"--listen", c.Endpoints[i],
			"--status", c.StatusAddrs[i],
			"--peers", c.peersFlag(i, upstream),
			"--zone", cfg.Zones[i],
			"--data-dir", dataDir,
		}
		if c.net != nil {
			args = append(args, "--advertise-zone-addrs", zoneAddrsFlag(c.net.ZoneAddrs(id)))
		}
		args = append(args, c.common...)
		if len(cfg.StoreArgs) != 0 {
			args = append(args, cfg.StoreArgs[i]...)
		}
		c.procs[i] = &storeProc{id: id, args: args, dataDir: dataDir, logPath: storeLogPath(c.dir, id)}
		if err := c.launch(c.procs[i]); err != nil {
			return nil, err
		}
	}
	c.logger.Info("process cluster starting", "binary", bin, "endpoints", strings.Join(c.Endpoints, ","), "dir", c.dir)
	if cfg.NoWait {
		return c, nil
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.ReadyTimeout)
	defer cancel()
	if _, err := c.WaitSettled(wctx, 0); err != nil {
		return nil, err
	}
	if c.net != nil && len(slices.Compact(slices.Sorted(slices.Values(c.zones)))) > 1 && c.net.WANBytes() == 0 {
		return nil, errors.New("process cluster: regions elected leaders without a byte crossing the simulated WAN (stores dialled each other directly)")
	}
	return c, nil
}

// peersFlag is store i's --peers: every store at its own address, or
// behind a WAN, the others through store i's zone's links to them.
func (c *Processes) peersFlag(i int, upstream map[uint64]string) string {
	var peers []string
	for j, id := range c.ids {
		addr := upstream[id]
		if c.net != nil && j != i {
			addr = c.net.Addr(c.zones[i], id)
		}
		peers = append(peers, fmt.Sprintf("%d=%s", id, addr))
	}
	return strings.Join(peers, ",")
}

// zoneAddrsFlag renders a store's address per zone as
// --advertise-zone-addrs takes it, zones sorted.
func zoneAddrsFlag(addrs map[string]string) string {
	var out []string
	for _, z := range slices.Sorted(maps.Keys(addrs)) {
		out = append(out, z+"="+addrs[z])
	}
	return strings.Join(out, ",")
}

// Network is the simulated WAN the stores run behind, nil without one
// (and after Stop).
func (c *Processes) Network() *netsim.Network {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.net
}

// Zone is a store's zone, "" for an unknown store.
func (c *Processes) Zone(store uint64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.ids, store); i >= 0 {
		return c.zones[i]
	}
	return ""
}

// ZoneEndpoint is the address a client in zone dials to reach store:
// through the zone's link to it, or the store's own address without a WAN
// (or for a zone the WAN does not know). "" for an unknown store.
func (c *Processes) ZoneEndpoint(zone string, store uint64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.ids, store)
	if i < 0 {
		return ""
	}
	if c.net != nil {
		if a := c.net.Addr(zone, store); a != "" {
			return a
		}
	}
	return c.Endpoints[i]
}

// launch starts p's process (its log appended to, so a restart keeps the
// first run's lines).
func (c *Processes) launch(p *storeProc) error {
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("store %d: %w", p.id, err)
	}
	r, err := startChild(c.binary, p.args, nil, logFile)
	if err != nil {
		return fmt.Errorf("store %d: %w", p.id, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		// Stop ran meanwhile and will not see this process: end it here.
		_ = r.cmd.Process.Kill()
		<-r.exited
		return fmt.Errorf("store %d: the cluster was stopped", p.id)
	}
	p.run = r
	c.pids = append(c.pids, r.cmd.Process.Pid)
	return nil
}

// PIDs are the process ids of every server process the cluster started,
// restarts included.
func (c *Processes) PIDs() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.pids)
}

// StoreIDs are the stores' ids, ascending.
func (c *Processes) StoreIDs() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.ids)
}

// Dir is where the stores keep their data and logs.
func (c *Processes) Dir() string { return c.dir }

// LogPath is a store's log file ("" for an unknown store). It outlives
// Stop (a test prints the logs of the stores it stopped), but not the
// removal of a directory the cluster made itself.
func (c *Processes) LogPath(store uint64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.ids, store) || c.dir == "" {
		return ""
	}
	return storeLogPath(c.dir, store)
}

func storeLogPath(dir string, store uint64) string {
	return filepath.Join(dir, fmt.Sprintf("store%d.log", store))
}

// proc returns a store and its current process (nil if none).
func (c *Processes) proc(store uint64) (*storeProc, *child) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.ids, store); i >= 0 && i < len(c.procs) && c.procs[i] != nil {
		return c.procs[i], c.procs[i].run
	}
	return nil, nil
}

// Running reports whether the store's process is alive.
func (c *Processes) Running(store uint64) bool {
	_, r := c.proc(store)
	return r.running()
}

// PID is the process id of a store's current process (0 if none).
func (c *Processes) PID(store uint64) int {
	if _, r := c.proc(store); r != nil {
		return r.cmd.Process.Pid
	}
	return 0
}

// Kill sends the store's process SIGKILL (kill -9: no shutdown, sockets
// closed by the kernel) and waits until it has exited.
func (c *Processes) Kill(store uint64) error {
	p, r := c.proc(store)
	if p == nil {
		return fmt.Errorf("process cluster: no store %d", store)
	}
	if !r.running() {
		return fmt.Errorf("process cluster: store %d is not running", store)
	}
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("process cluster: kill -9 store %d (pid %d): %w", store, r.cmd.Process.Pid, err)
	}
	<-r.exited
	return nil
}

// WaitExit waits until the store's current process has exited (killed by
// something else than Kill: a test's file-system hook) and returns what it
// exited with.
func (c *Processes) WaitExit(ctx context.Context, store uint64) error {
	p, r := c.proc(store)
	if p == nil || r == nil {
		return fmt.Errorf("process cluster: no process of store %d", store)
	}
	select {
	case <-r.exited:
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("process cluster: store %d (pid %d) still running: %w", store, r.cmd.Process.Pid, ctx.Err())
	}
}

// Restart starts a stopped store again with the same flags and data
// directory and waits until every store agrees on every region's leader
// and has applied its commit index.
func (c *Processes) Restart(ctx context.Context, store uint64) error {
	if err := c.Start(store); err != nil {
		return err
	}
	if _, err := c.WaitSettled(ctx, 0); err != nil {
		return fmt.Errorf("process cluster: after restarting store %d: %w", store, err)
	}
	return nil
}

// Start starts a stopped store again with the same flags and data
// directory, and returns at once (Restart then waits for the whole cluster
// to settle; WaitReady waits for this store alone).
func (c *Processes) Start(store uint64) error {
	p, r := c.proc(store)
	if p == nil {
		return fmt.Errorf("process cluster: no store %d", store)
	}
	if r.running() {
		return fmt.Errorf("process cluster: store %d is still running", store)
	}
	if err := c.launch(p); err != nil {
		return fmt.Errorf("process cluster: restart: %w", err)
	}
	return nil
}

// WaitReady waits until a store's /readyz answers 200: it has caught up
// (every region it hosts knows a leader and has applied what it knows
// committed). It fails at once if the store's process exits.
func (c *Processes) WaitReady(ctx context.Context, store uint64) error {
	addr := c.StatusAddr(store)
	if addr == "" {
		return fmt.Errorf("process cluster: no store %d", store)
	}
	hc := http.Client{Timeout: 2 * time.Second}
	last := "no answer yet"
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if p, r := c.proc(store); p == nil || !r.running() {
			return fmt.Errorf("process cluster: store %d is not running (%v)", store, c.ExitErr(store))
		}
		resp, err := hc.Get("http://" + addr + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("process cluster: store %d not ready (last: %s): %w", store, last, ctx.Err())
		case <-t.C:
		}
	}
}

// ExitErr is what a store's last process exited with: nil while it runs
// or after a clean exit (as after a graceful stop).
func (c *Processes) ExitErr(store uint64) error {
	_, r := c.proc(store)
	if r.running() || r == nil {
		return nil
	}
	return r.err
}

// Join starts store id (one no store has had) in zone as a new process
// that joins the running cluster through the running stores (server
// --join), on free ports, and returns at once: the store is a member once
// its /readyz answers. The new store's addresses are appended to
// Endpoints and StatusAddrs.
func (c *Processes) Join(id uint64, zone string) error {
	if slices.Contains(c.StoreIDs(), id) {
		return fmt.Errorf("process cluster: store %d exists", id)
	}
	if c.net != nil {
		return errors.New("process cluster: join: not behind a topology (the WAN has no links to a new store)")
	}
	var via []string
	for i, sid := range c.StoreIDs() {
		if c.Running(sid) {
			via = append(via, c.Endpoints[i])
		}
	}
	if len(via) == 0 {
		return errors.New("process cluster: join: no store is running")
	}
	ports, release, err := reservePorts(2)
	if err != nil {
		return fmt.Errorf("process cluster: join: %w", err)
	}
	listen, status := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	release()
	dataDir := filepath.Join(c.dir, fmt.Sprintf("store%d", id))
	args := []string{"server",
		"--id", strconv.FormatUint(id, 10),
		"--listen", listen,
		"--status", status,
		"--join", strings.Join(via, ","),
		"--zone", zone,
		"--data-dir", dataDir,
	}
	p := &storeProc{id: id, args: append(args, c.common...), dataDir: dataDir, logPath: storeLogPath(c.dir, id)}
	c.mu.Lock()
	c.ids = append(c.ids, id)
	c.zones = append(c.zones, zone)
	c.procs = append(c.procs, p)
	c.Endpoints = append(c.Endpoints, listen)
	c.StatusAddrs = append(c.StatusAddrs, status)
	c.mu.Unlock()
	if err := c.launch(p); err != nil {
		return fmt.Errorf("process cluster: join: %w", err)
	}
	return nil
}

// StopStore ends a store's process gracefully (SIGTERM; SIGKILL after
// grace) and waits until it has exited.
func (c *Processes) StopStore(store uint64, grace time.Duration) error {
	p, r := c.proc(store)
	if p == nil {
		return fmt.Errorf("process cluster: no store %d", store)
	}
	if !r.running() {
		return nil
	}
	stopChildren([]*child{r}, grace, func(int) {
		c.logger.Warn("store still running after SIGTERM; killing it", "store", store, "grace", grace)
	})
	return nil
}

// Forget drops a stopped store (removed from the cluster) from the
// cluster's stores: WaitSettled no longer waits for it, and Endpoints and
// StatusAddrs no longer list it. Its data directory stays until Stop.
func (c *Processes) Forget(store uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.ids, store)
	if i < 0 {
		return fmt.Errorf("process cluster: no store %d", store)
	}
	if c.procs[i] != nil && c.procs[i].run.running() {
		return fmt.Errorf("process cluster: store %d is still running", store)
	}
	c.ids = slices.Delete(c.ids, i, i+1)
	c.zones = slices.Delete(c.zones, i, i+1)
	c.procs = slices.Delete(c.procs, i, i+1)
	c.Endpoints = slices.Delete(slices.Clone(c.Endpoints), i, i+1)
	c.StatusAddrs = slices.Delete(slices.Clone(c.StatusAddrs), i, i+1)
	if cc := c.admins[store]; cc != nil {
		_ = cc.Close()
		delete(c.admins, store)
	}
	return nil
}

// StatusAddr is a store's status HTTP address ("" for an unknown store).
func (c *Processes) StatusAddr(store uint64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.ids, store); i >= 0 {
		return c.StatusAddrs[i]
	}
	return ""
}

// DataDir is a store's data directory.
func (c *Processes) DataDir(store uint64) string {
	if p, _ := c.proc(store); p != nil {
		return p.dataDir
	}
	return filepath.Join(c.dir, fmt.Sprintf("store%d", store))
}

// admin returns a connection to a store's admin service (kept for reuse:
// gRPC reconnects by itself after a restart).
func (c *Processes) admin(store uint64) (kvpb.AdminClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cc := c.admins[store]
	if cc == nil {
		i := slices.Index(c.ids, store)
		if i < 0 {
			return nil, fmt.Errorf("no store %d", store)
		}
		var err error
		cc, err = grpc.NewClient(c.Endpoints[i], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, fmt.Errorf("store %d: %w", store, err)
		}
		c.admins[store] = cc
	}
	return kvpb.NewAdminClient(cc), nil
}

// storeRegions asks one store which regions it hosts and whom it takes
// for their leaders.
func (c *Processes) storeRegions(ctx context.Context, store uint64) ([]*kvpb.RegionInfo, error) {
	a, err := c.admin(store)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := a.Regions(ctx, &kvpb.RegionsRequest{})
	if err != nil {
		return nil, fmt.Errorf("store %d: regions: %w", store, err)
	}
	return resp.GetRegions(), nil
}

// LeaderOf is the store that claims leadership of regionID in its own
// view (the highest term if several do), 0 if no running store does.
// Asking the stores, not a client's cache, tells a real election from a
// cache catching up.
func (c *Processes) LeaderOf(ctx context.Context, regionID uint64) uint64 {
	var leader, term uint64
	for _, id := range c.StoreIDs() {
		if !c.Running(id) {
			continue
		}
		infos, err := c.storeRegions(ctx, id)
		if err != nil {
			continue
		}
		for _, info := range infos {
			if info.GetRegion().GetId() == regionID && info.GetLeaderStoreId() == id && info.GetTerm() >= term {
				leader, term = id, info.GetTerm()
			}
		}
	}
	return leader
}

// settled reports whether every store is running and hosts at least one
// region, and for each region every store names the same running leader
// in the same term and has applied that leader's commit index. regionID,
// if not 0, must be among them.
func (c *Processes) settled(ctx context.Context, regionID uint64) (leader uint64, why error) {
	type view struct {
		leader, term, commit uint64
		minApplied           uint64
	}
	views := map[uint64]*view{}
	for _, id := range c.StoreIDs() {
		p, r := c.proc(id)
		if p == nil {
			return 0, fmt.Errorf("store %d: cluster stopped", id)
		}
		if !r.running() {
			return 0, fmt.Errorf("store %d exited (%v); its log ends with:\n%s", id, r.err, tail(p.logPath, 20))
		}
		infos, err := c.storeRegions(ctx, id)
		if err != nil {
			return 0, err
		}
		if len(infos) == 0 {
			return 0, fmt.Errorf("store %d hosts no region yet", id)
		}
		for _, info := range infos {
			rid := info.GetRegion().GetId()
			l := info.GetLeaderStoreId()
			v := views[rid]
			if v == nil {
				v = &view{leader: l, term: info.GetTerm(), minApplied: info.GetAppliedIndex()}
				views[rid] = v
			}
			if l == 0 || l != v.leader || info.GetTerm() != v.term {
				return 0, fmt.Errorf("region %d: stores disagree about the leader (store %d says %d in term %d)", rid, id, l, info.GetTerm())
			}
			if l == id {
				v.commit = info.GetCommitIndex()
			}
			v.minApplied = min(v.minApplied, info.GetAppliedIndex())
		}
	}
	if regionID != 0 && views[regionID] == nil {
		return 0, fmt.Errorf("no store hosts region %d", regionID)
	}
	for rid, v := range views {
		if v.minApplied < v.commit {
			return 0, fmt.Errorf("region %d: a replica has applied %d of the leader's %d", rid, v.minApplied, v.commit)
		}
	}
	if v := views[regionID]; v != nil {
		return v.leader, nil
	}
	return 0, nil
}

// RegionOf is the region holding key, as the first running store that
// answers sees it.
func (c *Processes) RegionOf(ctx context.Context, key []byte) (uint64, error) {
	var errs []error
	for _, id := range c.StoreIDs() {
		if !c.Running(id) {
			continue
		}
		a, err := c.admin(id)
		if err == nil {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			var resp *kvpb.RegionsResponse
			resp, err = a.Regions(rctx, &kvpb.RegionsRequest{Key: key, ByKey: true})
			cancel()
			if err == nil && len(resp.GetRegions()) > 0 {
				return resp.GetRegions()[0].GetRegion().GetId(), nil
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("store %d: %w", id, err))
		}
	}
	return 0, fmt.Errorf("process cluster: no store told the region of %q: %w", key, errors.Join(errs...))
}

// MoveLeader makes store the leader of regionID: it asks the current
// leader to transfer leadership, again until it has moved (a transfer can
// lose to an election) or ctx ends, then waits until the cluster has
// settled with that leader. With the balancer off (a negative
// BalanceInterval) the leader then stays there unless the store fails.
func (c *Processes) MoveLeader(ctx context.Context, regionID, store uint64) error {
	if !slices.Contains(c.StoreIDs(), store) {
		return fmt.Errorf("process cluster: no store %d", store)
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		cur := c.LeaderOf(ctx, regionID)
		if cur == store {
			if l, err := c.settled(ctx, regionID); err == nil && l == store {
				return nil
			}
		} else if cur != 0 {
			if a, err := c.admin(cur); err == nil {
				tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err = a.TransferLeader(tctx, &kvpb.TransferLeaderRequest{RegionId: regionID, ToStoreId: store})
				cancel()
				if err != nil {
					c.logger.Debug("process cluster: transfer leader", "region", regionID, "to", store, "err", err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("process cluster: move the leader of region %d to store %d (now on store %d): %w",
				regionID, store, c.LeaderOf(context.Background(), regionID), ctx.Err())
		case <-t.C:
		}
	}
}

// WaitSettled waits until the cluster is settled (see settled) and returns
// regionID's leader (0 when regionID is 0).
func (c *Processes) WaitSettled(ctx context.Context, regionID uint64) (uint64, error) {
	t := time.NewTicker(25 * time.Millisecond)
	defer t.Stop()
	for {
		leader, why := c.settled(ctx, regionID)
		if why == nil {
			return leader, nil
		}
		if strings.Contains(why.Error(), "exited") {
			return 0, fmt.Errorf("process cluster: %w", why)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("process cluster: not settled: %w (%w)", why, ctx.Err())
		case <-t.C:
		}
	}
}

// Stop terminates every store (SIGTERM, then SIGKILL after 3s) and removes
// a temporary directory. Safe to call more than once and concurrently.
func (c *Processes) Stop() {
	c.mu.Lock()
	var runs []*child
	for _, p := range c.procs {
		if p != nil && p.run != nil {
			runs = append(runs, p.run)
		}
	}
	c.procs, c.stopped = nil, true
	admins := c.admins
	c.admins = map[uint64]*grpc.ClientConn{}
	c.mu.Unlock()
	for _, cc := range admins {
		_ = cc.Close()
	}
	stopChildren(runs, 3*time.Second, func(i int) {
		c.logger.Debug("store still running 3s after SIGTERM; killing it", "pid", runs[i].cmd.Process.Pid)
	})
	c.mu.Lock()
	wan := c.net
	c.net = nil
	c.mu.Unlock()
	if wan != nil {
		if err := wan.Close(); err != nil {
			c.logger.Warn("process cluster: closing the simulated WAN", "err", err)
		}
	}
	if c.ownDir && c.dir != "" {
		_ = os.RemoveAll(c.dir)
		c.dir = ""
	}
}
