package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/server"
	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// serverFlags are the server command's flags.
type serverFlags struct {
	id      uint64
	listen  string
	status  string
	peers   string
	join    string
	zone    string
	dataDir string
	// clusterToken names the cluster (server.ClusterIDOf).
	clusterToken string
	tick         time.Duration
	logLevel     string
	// balanceInterval and maxStoreDownTime go to raftstore.Config as
	// they are (0: the store's defaults).
	balanceInterval  time.Duration
	maxStoreDownTime time.Duration
	// zoneAddrs is --advertise-zone-addrs: ZONE=HOST:PORT,...
	zoneAddrs string
	// allowFaults is --allow-faults: accept ctl fault.
	allowFaults bool
	// etcdReadMode is --etcd-read-mode: the etcd API's default read mode.
	etcdReadMode string
	// disableAdmin is --disable-admin: refuse the mutating Admin calls.
	disableAdmin bool
	// followerLeases is --follower-leases; leaseDuration and leaseStores
	// refine it.
	followerLeases bool
	leaseDuration  time.Duration
	leaseStores    string
	// store are the raft store's tuning knobs (config.go).
	store storeFlags
	// configFile is --config; fromFile holds the flags it set (those not
	// given on the command line), so errors name the key in the file.
	configFile string
	fromFile   map[string]bool
	// dev is --dev: one store on its own, with defaults for the rest.
	dev bool
}

// Where server --dev listens unless --listen and --status say: store 1 of
// the local cluster's ports, so the CLI's default endpoints reach it.
const (
	devListen = "127.0.0.1:20161"
	devStatus = "127.0.0.1:20181"
)

func newServerCmd(a *app) *cobra.Command { return serverCmd(a, &serverFlags{}) }

// serverCmd is the server command with its flags parsed into f, which
// tests read back.
func serverCmd(a *app, f *serverFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "server [--config FILE] --id N --listen ADDR --status ADDR (--peers 1=ADDR,2=ADDR,3=ADDR | --join ADDR[,ADDR]) --zone Z --data-dir DIR | server --dev",
		Short: "Run one store until SIGINT or SIGTERM (--dev: a single-store cluster for development)",
		Long: `Run one store until SIGINT or SIGTERM.

With --dev the store is a cluster of its own, for development (as etcd
with no flags, or cockroach start-single-node): store 1, one replica per
region, on ` + devListen + ` (status ` + devStatus + `), where bin/hedgekv
reaches it with no flags, its data in a new temporary directory removed
when it stops, unless --data-dir names one to keep. --listen, --status,
--data-dir, --id, --zone and the tuning flags still apply; --peers and
--join do not.

With --peers the listed stores form the cluster and bootstrap its first
region together. With --join the store joins a running cluster through any
of the given stores: it announces itself, learns every store's address, and
starts without regions (add-peer or the balancer give it replicas). The
stores a store knows are kept in its data directory, so a restart (with
either flag) keeps the stores that joined.

With --advertise-zone-addrs the store tells the cluster its address per
zone (such as the simulated WAN's proxy for each zone's link to it): stores
and clients (--zone Z) in zone Z then reach it at its address for Z, and
this store reaches each peer at the peer's address for its own --zone. Its
--listen address stays directly reachable.

With --tls-cert, --tls-key and --tls-ca (global flags) the gRPC port
speaks mutual TLS: it serves only callers whose certificate the CA signed,
and the store presents its certificate to its peers too (hedgekv certs
makes a CA and certificates). The --status HTTP port stays plain HTTP.

With --config FILE the flags are read from a TOML file as well: each key
is a flag's name without the dashes (election-ticks = 10, tick = "50ms",
peers = ["1=127.0.0.1:20161", ...]); a flag given on the command line
wins over the file. scripts/server.example.toml lists every key. The
store's tuning knobs (--tick, --election-ticks, --heartbeat-ticks,
--lease-drift-margin, --max-clock-offset, --split-*, --hibernate-after,
--log-gc-threshold, --dedup-window, --balance-interval,
--max-store-down-time, --max-replicas, --follower-lease-*) take 0 for the
store's default; a value out of range stops the server before it starts.`,
		Args: exactArgs(),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if err := f.loadConfigFile(cmd); err != nil {
				return err
			}
			if f.dev {
				cleanup, err := f.devDefaults()
				if err != nil {
					return err
				}
				defer cleanup()
			}
			cfg, level, err := f.config()
			if err != nil {
				return err
			}
			cfg.AllowFaults = f.allowFaults
			cfg.DisableAdmin = f.disableAdmin
			cfg.EtcdReadMode = f.etcdReadMode
			if cfg.TLS, err = a.serverTLS(); err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
			slog.SetDefault(log)
			cfg.Store.Logger = log // the server and the store add the store id themselves
			srv, err := server.New(cfg)
			if err != nil {
				return fmt.Errorf("store %d: %w", cfg.Store.StoreID, err)
			}
			if err := srv.StartContext(cmd.Context()); err != nil {
				srv.Stop()
				return fmt.Errorf("store %d: start: %w", cfg.Store.StoreID, err)
			}
			log.Info("serving", "store", cfg.Store.StoreID, "listen", cfg.ListenAddr, "status", cfg.StatusAddr, "zone", cfg.Store.Zone, "zone_addrs", cfg.ZoneAddrs)
			if f.dev {
				log.Info("dev mode: a single-store cluster", "data_dir", cfg.Store.DataDir, "kept", cmd.Flags().Changed("data-dir"),
					"cli", "export "+endpointsEnv+"="+cfg.ListenAddr)
			}
			<-cmd.Context().Done()
			// SIGINT or SIGTERM: a graceful stop (leaderships handed to
			// other stores, in-flight requests finished), bounded by the
			// server itself so that a rolling restart fails no request.
			// The signal's context is done, so the shutdown gets its own.
			log.Info("stopping: handing over leaderships, then draining requests", "store", cfg.Store.StoreID)
			srv.Shutdown(context.Background())
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.Uint64Var(&f.id, "id", 0, "this store's id (one of the ids in --peers; with --join, one no store has)")
	fl.StringVar(&f.listen, "listen", "", "gRPC listen address (default: this store's address in --peers; required with --join)")
	fl.StringVar(&f.status, "status", "", "status HTTP address (/metrics, /status); empty disables it")
	fl.StringVar(&f.peers, "peers", "", "every store of the cluster as ID=ADDR, comma-separated")
	fl.StringVar(&f.join, "join", "", "join a running cluster through any of these stores' gRPC addresses, comma-separated")
	fl.StringVar(&f.zone, "zone", "", "this store's zone label")
	fl.StringVar(&f.zoneAddrs, "advertise-zone-addrs", "", "this store's address per zone as ZONE=HOST:PORT, comma-separated: stores and clients in ZONE reach it there")
	fl.StringVar(&f.dataDir, "data-dir", "", "directory for the store's data")
	fl.StringVar(&f.clusterToken, "cluster-token", server.DefaultClusterToken, "names the cluster, as etcd's --initial-cluster-token: every store of a cluster gets the same one, and a store refuses raft traffic from stores started with another (give each cluster its own); recorded in the data dir on first start, which refuses another token after")
	fl.DurationVar(&f.tick, "tick", 50*time.Millisecond, "raft tick interval")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.DurationVar(&f.balanceInterval, "balance-interval", 0, "how often the store balances replicas and leaders (0: default 5s, negative: never)")
	fl.DurationVar(&f.maxStoreDownTime, "max-store-down-time", 0, "how long a store may be down before its replicas are replaced elsewhere (0: default 30s)")
	fl.StringVar(&f.etcdReadMode, "etcd-read-mode", etcdapi.ReadLeader, "who answers a linearizable Range of the etcd API whose session names no mode (gRPC metadata hedgekv-read-mode): leader, follower (this store, after a ReadIndex or under a follower lease) or stale (this store, at most hedgekv-max-staleness old)")
	fl.BoolVar(&f.disableAdmin, "disable-admin", false, "refuse the Admin calls that change the cluster (split, transfer-leader, add/remove-peer, fault, join from a non-store) with PermissionDenied; routing lookups and reads stay open")
	fl.BoolVar(&f.allowFaults, "allow-faults", false, "accept fault injection (ctl fault: delays, stalls); for tests and benchmarks")
	fl.BoolVar(&f.followerLeases, "follower-leases", false, "followers hold read leases and serve linearizable reads locally, with no round trip; writes then also wait for every lease holder (every store of the cluster must agree)")
	fl.DurationVar(&f.leaseDuration, "follower-lease-duration", 0, "longest follower read lease a leader grants, at most the leader lease (0: the leader lease, (--election-ticks - 2) ticks less --lease-drift-margin: 360ms by default); also the longest a write waits for a holder that stopped answering")
	fl.StringVar(&f.leaseStores, "follower-lease-stores", "", "only these store ids (comma-separated) hold follower leases (default: every store)")
	f.store.register(fl)
	fl.StringVar(&f.configFile, "config", "", "read flags from this TOML `FILE` too (keys: the flag names without --); flags on the command line win")
	fl.BoolVar(&f.dev, "dev", false, "development mode: a single-store cluster, store 1 on "+devListen+", data in a temporary directory unless --data-dir (no other flag needed)")
	return cmd
}

// devDefaults fills in what --dev leaves out: store 1 alone (its own
// --peers), the local cluster's first ports, one replica per region (the
// balancer would otherwise look for three stores forever), and a
// temporary data directory, which cleanup removes when the server stops.
func (f *serverFlags) devDefaults() (cleanup func(), err error) {
	if strings.TrimSpace(f.peers) != "" || strings.TrimSpace(f.join) != "" {
		return nil, usagef("--dev runs a store on its own: --peers and --join do not apply")
	}
	if f.id == 0 {
		f.id = 1
	}
	if f.listen == "" {
		f.listen = devListen
	}
	if f.status == "" {
		f.status = devStatus
	}
	if f.store.maxReplicas == 0 {
		f.store.maxReplicas = 1
	}
	f.peers = fmt.Sprintf("%d=%s", f.id, f.listen)
	cleanup = func() {}
	if f.dataDir == "" {
		dir, err := os.MkdirTemp("", "hedgekv-dev-")
		if err != nil {
			return nil, fmt.Errorf("--dev: a temporary data directory: %w", err)
		}
		f.dataDir = dir
		cleanup = func() { _ = os.RemoveAll(dir) }
	}
	return cleanup, nil
}

// serverTLS is the store's TLS identity from the global TLS flags, nil
// without them. LoadTLS checks that the CA signed the certificate for
// both serving and dialing peers, so a wrong file fails here, in one
// line, not in every peer's log.
func (a *app) serverTLS() (*server.TLS, error) {
	on, err := a.tlsFlagsGiven()
	if !on || err != nil {
		return nil, err
	}
	id, err := server.LoadTLS(a.tlsCert, a.tlsKey, a.tlsCA)
	if err != nil {
		return nil, runError{err}
	}
	return id, nil
}

// config validates the flags and builds the server's config. Every problem
// is a usage error.
func (f *serverFlags) config() (server.Config, slog.Level, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return server.Config{}, 0, usagef("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	cfg, err := f.baseConfig(level)
	if err != nil {
		return server.Config{}, 0, err
	}
	leases, err := f.leaseConfig()
	if err != nil {
		return server.Config{}, 0, err
	}
	cfg.Store.FollowerLeases, cfg.Store.FollowerLeaseDuration, cfg.Store.FollowerLeaseStores = leases.FollowerLeases, leases.FollowerLeaseDuration, leases.FollowerLeaseStores
	f.store.apply(&cfg.Store)
	// The store's own rules, checked here so that a bad value stops the
	// server before it opens anything, reported as the flag or key given.
	if err := f.validateStore(&cfg.Store); err != nil {
		return server.Config{}, 0, err
	}
	return cfg, level, nil
}

// leaseConfig parses the follower-lease flags; their ranges (the duration
// within the leader lease) are the store's to check (validateStore).
func (f *serverFlags) leaseConfig() (raftstore.Config, error) {
	var c raftstore.Config
	if !f.followerLeases {
		if f.leaseDuration != 0 || f.leaseStores != "" {
			return c, usagef("%s and %s need %s", f.opt("follower-lease-duration"), f.opt("follower-lease-stores"), f.opt("follower-leases"))
		}
		return c, nil
	}
	c.FollowerLeases = true
	c.FollowerLeaseDuration = f.leaseDuration
	for _, s := range strings.Split(f.leaseStores, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		id, err := strconv.ParseUint(s, 10, 64)
		if err != nil || id == 0 {
			return c, usagef("%s: %q is not a store id", f.opt("follower-lease-stores"), s)
		}
		c.FollowerLeaseStores = append(c.FollowerLeaseStores, id)
	}
	return c, nil
}

// baseConfig builds the server's config from every flag but the lease ones.
func (f *serverFlags) baseConfig(level slog.Level) (server.Config, error) {
	if strings.TrimSpace(f.join) != "" {
		cfg, _, err := f.joinConfig(level)
		return cfg, err
	}
	peers, err := parsePeers(f.peers)
	if err != nil {
		return server.Config{}, err
	}
	zoneAddrs, err := parseZoneAddrs(f.zoneAddrs)
	if err != nil {
		return server.Config{}, err
	}
	if err := f.checkCommon(); err != nil {
		return server.Config{}, err
	}
	if _, ok := peers[f.id]; !ok {
		return server.Config{}, usagef("--id %d is not among --peers %s", f.id, f.peers)
	}
	listen := f.listen
	if listen == "" {
		listen = peers[f.id]
	}
	return server.Config{
		Store: raftstore.Config{
			StoreID:          f.id,
			Zone:             f.zone,
			ClusterID:        server.ClusterIDOf(f.clusterToken),
			DataDir:          f.dataDir,
			InitialStores:    slices.Sorted(maps.Keys(peers)),
			TickInterval:     f.tick,
			BalanceInterval:  f.balanceInterval,
			MaxStoreDownTime: f.maxStoreDownTime,
		},
		ListenAddr: listen,
		StatusAddr: f.status,
		Peers:      peers,
		ZoneAddrs:  zoneAddrs,
	}, nil
}

// joinConfig is the config of a store joining a running cluster: no
// initial stores (it bootstraps nothing), its own address from --listen.
func (f *serverFlags) joinConfig(level slog.Level) (server.Config, slog.Level, error) {
	if strings.TrimSpace(f.peers) != "" {
		return server.Config{}, 0, usagef("--join and --peers exclude each other: --peers starts a new cluster, --join enters a running one")
	}
	var join []string
	for _, a := range strings.Split(f.join, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
			return server.Config{}, 0, usagef("--join: %q is not HOST:PORT", a)
		}
		join = append(join, a)
	}
	if len(join) == 0 {
		return server.Config{}, 0, usagef("--join names no address")
	}
	zoneAddrs, err := parseZoneAddrs(f.zoneAddrs)
	if err != nil {
		return server.Config{}, 0, err
	}
	if err := f.checkCommon(); err != nil {
		return server.Config{}, 0, err
	}
	if f.listen == "" {
		return server.Config{}, 0, usagef("--listen is required with --join")
	}
	host, _, err := net.SplitHostPort(f.listen)
	if err != nil {
		return server.Config{}, 0, usagef("--listen %q is not HOST:PORT", f.listen)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		// The listen address is what the store announces to the others.
		return server.Config{}, 0, usagef("--listen %q: with --join, listen on an address the other stores can reach, not a wildcard", f.listen)
	}
	return server.Config{
		Store: raftstore.Config{
			StoreID:          f.id,
			Zone:             f.zone,
			ClusterID:        server.ClusterIDOf(f.clusterToken),
			DataDir:          f.dataDir,
			TickInterval:     f.tick,
			BalanceInterval:  f.balanceInterval,
			MaxStoreDownTime: f.maxStoreDownTime,
		},
		ListenAddr: f.listen,
		StatusAddr: f.status,
		Join:       join,
		ZoneAddrs:  zoneAddrs,
	}, level, nil
}

// checkCommon checks the flags both kinds of start need.
func (f *serverFlags) checkCommon() error {
	if f.id == 0 {
		return usagef("--id is required and must be positive")
	}
	if f.id > 0xffff {
		return usagef("--id %d: store ids go up to 65535", f.id)
	}
	if f.dataDir == "" {
		return usagef("--data-dir is required")
	}
	// The store takes a zero tick for its default; here the default is
	// the flag's, so 0 can only be a mistake.
	if f.tick <= 0 {
		return usagef("%s must be positive, got %v", f.opt("tick"), f.tick)
	}
	return nil
}

// parsePeers parses "1=ADDR,2=ADDR,...".
func parsePeers(s string) (map[uint64]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, usagef("--peers is required (1=ADDR,2=ADDR,3=ADDR), or --join ADDR to join a running cluster")
	}
	peers := make(map[uint64]string)
	for _, item := range strings.Split(s, ",") {
		idStr, addr, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || strings.TrimSpace(addr) == "" {
			return nil, usagef("--peers: %q is not ID=ADDR", item)
		}
		id, err := strconv.ParseUint(strings.TrimSpace(idStr), 10, 64)
		if err != nil || id == 0 {
			return nil, usagef("--peers: store id %q must be a positive integer", idStr)
		}
		if _, dup := peers[id]; dup {
			return nil, usagef("--peers: store %d listed twice", id)
		}
		peers[id] = strings.TrimSpace(addr)
	}
	return peers, nil
}

// parseZoneAddrs parses --advertise-zone-addrs, "ZONE=HOST:PORT,...". ""
// is none. Each address is one other stores and clients dial, so it needs
// a host (not a wildcard) and a port; a zone is named once.
func parseZoneAddrs(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := make(map[string]string)
	for _, item := range strings.Split(s, ",") {
		zone, addr, ok := strings.Cut(strings.TrimSpace(item), "=")
		zone, addr = strings.TrimSpace(zone), strings.TrimSpace(addr)
		if !ok || zone == "" || addr == "" {
			return nil, usagef("--advertise-zone-addrs: %q is not ZONE=HOST:PORT", strings.TrimSpace(item))
		}
		if strings.ContainsAny(zone, " \t") {
			return nil, usagef("--advertise-zone-addrs: zone %q contains white space", zone)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host == "" {
			return nil, usagef("--advertise-zone-addrs: zone %s: %q is not HOST:PORT", zone, addr)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil, usagef("--advertise-zone-addrs: zone %s: port %q of %q is not a number in 1..65535", zone, port, addr)
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			return nil, usagef("--advertise-zone-addrs: zone %s: %q is a wildcard, not an address others can dial", zone, addr)
		}
		if _, dup := out[zone]; dup {
			return nil, usagef("--advertise-zone-addrs: zone %s listed twice", zone)
		}
		out[zone] = addr
	}
	return out, nil
}
