// Package server serves a raftstore.Store over gRPC: the KV service clients
// use, the Admin service operators use, and the Raft service through which
// stores exchange raft messages; plus the status HTTP endpoint (/metrics,
// /status, /healthz, /readyz). Shutdown stops it gracefully: leaderships
// handed to other stores first, then in-flight requests finished. It validates every request before it reaches the store and maps
// the store's errors onto gRPC status codes, region errors carrying a
// *kvpb.RegionError detail.
package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/server/controlplane"
	"github.com/hedgekv/hedgekv/server/etcdapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Config configures one Server.
type Config struct {
	Store raftstore.Config
	// ListenAddr is the gRPC address to listen on.
	ListenAddr string
	// Listener, if set, is a pre-bound gRPC listener used instead of
	// ListenAddr (tests bind 127.0.0.1:0 to learn the port up front).
	Listener net.Listener
	// StatusAddr is the status HTTP address; "" (and no StatusListener)
	// disables it.
	StatusAddr     string
	StatusListener net.Listener
	// Peers maps store ids, this one included, to their gRPC addresses.
	// It seeds the address book, which also keeps (in
	// <data-dir>/peers.json) every store that joined since; for the stores
	// it names, Peers wins over what the book remembers.
	Peers map[uint64]string
	// Join lists addresses of stores of a running cluster. A server that
	// knows no other store (no Peers, nothing remembered) joins through
	// one of them on Start: it announces itself and adopts their address
	// book. It should not bootstrap regions (Store.InitialStores empty):
	// it gets replicas by AddPeer or the balancer.
	Join []string
	// JoinTimeout bounds that join; 0 means DefaultJoinTimeout.
	JoinTimeout time.Duration
	// ZoneAddrs is this store's address per zone (zone -> HOST:PORT):
	// where stores and clients in that zone reach it, such as the
	// simulated WAN's proxy for that (zone, store) link. The store
	// advertises it to the cluster (Status, Stores, Join) and every store
	// keeps it in its address book. A store in zone Z that has zone
	// addresses of its own dials a peer at the peer's address for Z when
	// the peer advertises one, else at its address (see dialAddr); clients
	// do the same. Addresses are learned over the peers' own addresses.
	// Empty: the store advertises none, dials every peer at its own
	// address, and is reached at its address from every zone.
	ZoneAddrs map[string]string
	// DisableBalancing gives the store no ClusterView, so it never moves
	// leaders or replicas by itself (tests that move them by hand).
	DisableBalancing bool
	// AllowFaults lets operators inject faults through the Admin Fault
	// call (delays, stalls; see faults.go). Without it Fault answers
	// PermissionDenied.
	AllowFaults bool
	// TLS, if set, switches on mutual TLS (tls.go): the gRPC port serves
	// only callers with a certificate the CA signed, and every connection
	// this store makes to another presents TLS's certificate. Every store
	// of a cluster must agree. The status HTTP endpoint stays plain.
	TLS *TLS
	// DisableAdmin refuses, with PermissionDenied, every Admin call that
	// changes the cluster (adminGuard): what clients need for routing
	// and what only reads stays open.
	DisableAdmin bool
	// EtcdReadMode is the etcd API's read mode for a linearizable Range
	// whose session names none (etcdapi.ReadLeader, ReadFollower,
	// ReadStale; "": ReadLeader).
	EtcdReadMode string
	// EtcdKnobs are tests' hooks into the etcd API; nil in production.
	EtcdKnobs *etcdapi.TestingKnobs
}

// Shutdown bounds: in-flight requests get gracefulStopTimeout to finish
// before their connections are cut. Shutdown gives the leader transfers
// leaderTransferTimeout in all, each attempt (one target) at most
// transferAttemptTimeout. Together they stay under the 15 s that
// scripts/cluster.sh waits before it sends SIGKILL.
const (
	gracefulStopTimeout    = 5 * time.Second
	httpShutdownTimeout    = 2 * time.Second
	leaderTransferTimeout  = 4 * time.Second
	transferAttemptTimeout = 2 * time.Second
	// transferParallelism bounds the transfers under way at once, so a
	// store leading thousands of regions does not flood its peers.
	transferParallelism = 16
)

// DefaultJoinTimeout bounds the whole join of a starting store when
// Config.JoinTimeout is 0.
const DefaultJoinTimeout = controlplane.DefaultJoinTimeout

// Server is one hedgekv store process's network face.
type Server struct {
	cfg    Config
	logger *slog.Logger
	store  *raftstore.Store
	// cp is the control plane: address book, joins and removals, the
	// cluster view, zone addresses.
	cp *controlplane.Plane
	// etcdApplier applies the etcd keyspace's writes and wakes the etcd
	// API's watchers.
	etcdApplier *etcdapi.Applier
	etcd        *etcdapi.Service // the etcd API: Stop stops its lessor
	trans       *transport
	cluster     *clusterGuard // refuses calls from other clusters' stores
	admin       *adminService
	raft        *raftService
	grpc        *grpc.Server
	http        *http.Server
	metrics     *metrics
	load        *loadTracker
	faults      *faultInjector
	health      *health
	// inflight counts unary requests being handled, so Stop can let them
	// finish before it cuts raft traffic.
	inflight atomic.Int64
	// ctx ends at Stop: it bounds background work (joining, listings).
	ctx        context.Context
	cancel     context.CancelFunc
	background sync.WaitGroup

	mu        sync.Mutex
	started   bool
	stopped   bool
	lis       net.Listener
	statusLis net.Listener
	// bound and boundStatus are the listeners New bound (or was handed),
	// served by Start and closed by Stop if it never started.
	bound, boundStatus net.Listener
	serving            sync.WaitGroup
}

// bindListeners binds the gRPC and status addresses, or takes the
// listeners cfg hands in; the status one is nil without a status address.
func bindListeners(cfg Config) (lis, statusLis net.Listener, err error) {
	lis = cfg.Listener
	if lis == nil {
		if lis, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
			return nil, nil, fmt.Errorf("listen on %s: %w", cfg.ListenAddr, err)
		}
	}
	statusLis = cfg.StatusListener
	if statusLis == nil && cfg.StatusAddr != "" {
		if statusLis, err = net.Listen("tcp", cfg.StatusAddr); err != nil {
			if lis != cfg.Listener {
				_ = lis.Close()
			}
			return nil, nil, fmt.Errorf("listen on status address %s: %w", cfg.StatusAddr, err)
		}
	}
	return lis, statusLis, nil
}

// New opens the store and builds the services; nothing listens until Start.
func New(cfg Config) (*Server, error) {
	if cfg.Store.StoreID == 0 {
		return nil, errors.New("server: store id must not be 0")
	}
	if cfg.Listener == nil && cfg.ListenAddr == "" {
		return nil, errors.New("server: no listen address")
	}
	switch cfg.EtcdReadMode {
	case "", etcdapi.ReadLeader, etcdapi.ReadFollower, etcdapi.ReadStale:
	default:
		return nil, fmt.Errorf("server: etcd read mode %q: want %s, %s or %s", cfg.EtcdReadMode, etcdapi.ReadLeader, etcdapi.ReadFollower, etcdapi.ReadStale)
	}
	logger := cfg.Store.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("store", cfg.Store.StoreID)
	cfg.Peers = maps.Clone(cfg.Peers)
	cfg.Join = slices.Clone(cfg.Join)
	cfg.ZoneAddrs = maps.Clone(cfg.ZoneAddrs)
	if cfg.Store.ClusterID == 0 {
		cfg.Store.ClusterID = ClusterIDOf("")
	}
	if err := controlplane.CheckZoneAddrs(cfg.ZoneAddrs); err != nil {
		return nil, fmt.Errorf("server: store %d: zone addresses: %w", cfg.Store.StoreID, err)
	}

	// Bind before anything is created on disk: a port taken by another
	// process fails the server here, leaving no data dir behind.
	lis, statusLis, err := bindListeners(cfg)
	if err != nil {
		return nil, fmt.Errorf("server: store %d: %w", cfg.Store.StoreID, err)
	}
	closeBound := func() {
		if lis != cfg.Listener {
			_ = lis.Close()
		}
		if statusLis != nil && statusLis != cfg.StatusListener {
			_ = statusLis.Close()
		}
	}
	cp, err := controlplane.Open(controlplane.Config{
		StoreID:        cfg.Store.StoreID,
		Zone:           cfg.Store.Zone,
		DataDir:        cfg.Store.DataDir,
		Peers:          cfg.Peers,
		Join:           cfg.Join,
		JoinTimeout:    cfg.JoinTimeout,
		ZoneAddrs:      cfg.ZoneAddrs,
		DialOptions:    peerDialOptions(cfg.TLS, cfg.Store.ClusterID),
		MaxRecvMsgSize: maxRecvMsgSize,
		Logger:         logger,
	})
	if err != nil {
		closeBound()
		return nil, fmt.Errorf("server: store %d: %w", cfg.Store.StoreID, err)
	}
	s := &Server{cfg: cfg, logger: logger, load: &loadTracker{}, cp: cp, bound: lis, boundStatus: statusLis}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.metrics = newMetrics(func() float64 { return float64(s.load.inflightReads()) })
	s.faults = newFaultInjector(s.metrics)
	topts := defaultTransportOptions()
	topts.tls = cfg.TLS
	topts.clusterID = cfg.Store.ClusterID
	s.trans = newTransport(cfg.Store.StoreID, cp.DialAddrs(), topts, s.metrics, logger)
	s.trans.stalled = s.faults.stalled

	// Every store applies the etcd keyspace's writes (etcdapi): a
	// replica without the Applier would skip them.
	scfg := cfg.Store
	etcdApplier := etcdapi.NewApplier()
	scfg.Applier = etcdApplier
	keep := etcdapi.KeepRange()
	if !slices.ContainsFunc(scfg.KeepWhole, func(kr raftstore.KeepRange) bool {
		return bytes.Equal(kr.Start, keep.Start) && bytes.Equal(kr.End, keep.End)
	}) {
		scfg.KeepWhole = append(slices.Clone(scfg.KeepWhole), keep)
	}
	store, err := raftstore.NewStore(scfg, s.trans)
	if err != nil {
		s.trans.Close()
		s.cancel()
		closeBound()
		return nil, fmt.Errorf("server: open store %d: %w", cfg.Store.StoreID, err)
	}
	s.store = store
	s.etcdApplier = etcdApplier
	s.health = &health{store: store}
	s.metrics.registerStoreStats(store.Stats)
	s.metrics.registerStoreGauges(store.Gauges, func() bool { ok, _ := s.health.ready(); return ok })
	store.SetMetricsHook(s.metrics.storeHook())
	s.trans.SetHandler(store)
	s.raft = newRaftService(cfg.Store.StoreID, drainingHandler{Handler: store, draining: &s.health.draining}, logger)
	s.raft.waitStall = s.faults.waitStall
	s.raft.onStream = cp.PeerConnected
	s.raft.allocRegionID = store.AllocRegionID
	store.SetRegionIDSource(peerRegionIDs{self: cfg.Store.StoreID, members: cp.DialAddrs, conn: s.trans.conn})
	s.admin = &adminService{srv: s}
	cp.Attach(controlplane.Deps{
		Transport:   s.trans,
		Local:       s.admin.localSummary,
		Leaders:     s.leadersDigest,
		MaxReplicas: store.MaxReplicas,
		ListenAddr:  s.Addr,
		Context:     s.ctx,
	})
	if !cfg.DisableBalancing {
		store.SetClusterView(cp.ClusterView())
	}

	s.cluster = &clusterGuard{id: cfg.Store.ClusterID, logger: logger}
	s.grpc = s.newGRPCServer(store)
	return s, nil
}

// newGRPCServer is the store's gRPC server, its interceptors and options
// set and the KV, Admin and Raft services registered on it.
func (s *Server) newGRPCServer(store *raftstore.Store) *grpc.Server {
	stallUnary, stallStream := s.faults.stallInterceptors()
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRecvMsgSize),
		grpc.ChainUnaryInterceptor(s.cluster.unary, unaryInterceptor(s.metrics, s.logger, &s.inflight), adminGuard(s.cfg.DisableAdmin), stallUnary),
		grpc.ChainStreamInterceptor(s.cluster.stream, stallStream),
		// Peers ping every 10s to find half-open raft streams; allow it.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 3 * time.Second}),
		// Reuse request goroutines: a fresh goroutine per RPC grows its
		// stack through grpc's deep call chain every time (copystack was
		// 15% of a follower's CPU under YCSB).
		grpc.NumStreamWorkers(uint32(4 * runtime.GOMAXPROCS(0))),
	}
	if s.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(s.cfg.TLS.serverCredentials()))
	}
	g := grpc.NewServer(opts...)
	kvpb.RegisterKVServer(g, &kvService{store: store, load: s.load, metrics: s.metrics, faults: s.faults})
	kvpb.RegisterAdminServer(g, s.admin)
	kvpb.RegisterRaftServer(g, s.raft)
	s.etcd = etcdapi.Register(g, etcdapi.Config{
		Store:         store,
		Applier:       s.etcdApplier,
		Conn:          s.trans.conn,
		Members:       s.cp.DialAddrs,
		TLS:           s.cfg.TLS != nil,
		DefaultRead:   s.cfg.EtcdReadMode,
		TickInterval:  s.cfg.Store.TickInterval,
		ElectionTicks: s.cfg.Store.ElectionTicks,
		Context:       s.ctx,
		Logger:        s.logger,
		Knobs:         s.cfg.EtcdKnobs,
	})
	return g
}

// Start is StartContext without a caller's context.
func (s *Server) Start() error { return s.StartContext(context.Background()) }

// StartContext listens, serves gRPC and the status HTTP endpoint, joins
// the cluster if it has to (see Config.Join; ctx bounds that), then starts
// the store, so that raft traffic from peers can be received as soon as
// the store begins to talk to them. After an error, call Stop.
func (s *Server) StartContext(ctx context.Context) error {
	if err := s.listenAndServe(); err != nil {
		return err
	}
	if s.cp.NeedsJoin() {
		jctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(s.ctx, cancel)
		err := s.cp.JoinCluster(jctx)
		stop()
		cancel()
		if err != nil {
			return fmt.Errorf("server: store %d: %w", s.cfg.Store.StoreID, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("server: stopped while starting")
	}
	s.cp.StartZoneLearning()
	s.store.Start()
	s.health.started.Store(true)
	s.background.Go(func() { s.health.watch(s.ctx, s.logger.Info) })
	s.logger.Info("server started", "addr", s.lis.Addr().String(), "status_addr", s.statusAddrLocked(), "stores", s.cp.Len())
	return nil
}

// listenAndServe binds the listeners and starts serving them.
func (s *Server) listenAndServe() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return errors.New("server: already started or stopped")
	}
	lis, statusLis := s.bound, s.boundStatus
	s.lis, s.statusLis, s.started = lis, statusLis, true

	s.serving.Go(func() {
		if err := s.grpc.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.logger.Error("gRPC server stopped", "err", err)
		}
	})
	if statusLis != nil {
		s.http = &http.Server{Handler: s.statusHandler(), ReadHeaderTimeout: 5 * time.Second}
		s.serving.Go(func() {
			if err := s.http.Serve(statusLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.logger.Error("status HTTP server stopped", "err", err)
			}
		})
	}
	return nil
}

// Shutdown stops the server gracefully, for a rolling restart that fails
// no request: /readyz turns 503 at once; every region this store leads is
// handed to a voter on another store (up ones first), bounded by ctx and
// leaderTransferTimeout, while requests are still served (they get
// NotLeader and follow the new leader); then Stop refuses new requests,
// lets those in flight finish (bounded by gracefulStopTimeout) and closes
// the store. Without the transfers, every region this store led would be
// leaderless for an election timeout after it stopped, and the writes and
// leader reads sent there meanwhile would wait it out.
func (s *Server) Shutdown(ctx context.Context) {
	s.mu.Lock()
	running := s.started && !s.stopped
	s.mu.Unlock()
	if running {
		s.health.draining.Store(true)
		s.transferLeadersAway(ctx)
	}
	s.Stop()
}

// transferLeadersAway hands every region this store leads to another
// voter, trying the voters on stores the cluster view reports up first
// and the others after, and logs what it could not hand over.
func (s *Server) transferLeadersAway(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, leaderTransferTimeout)
	defer cancel()
	start := time.Now()
	var led []raftstore.RegionStatus
	for _, st := range s.store.Regions() {
		if st.IsLeader {
			led = append(led, st)
		}
	}
	if len(led) == 0 {
		return
	}
	vctx, vcancel := context.WithTimeout(ctx, controlplane.StoreStatusTimeout)
	up := map[uint64]bool{}
	for _, st := range s.cp.ClusterView().Stores(vctx) {
		up[st.ID] = st.Up
	}
	vcancel()
	var (
		sem    = make(chan struct{}, transferParallelism)
		wg     sync.WaitGroup
		failed atomic.Int64
	)
	for _, st := range led {
		var targets []uint64
		for _, p := range st.Region.Peers {
			if p.StoreID != s.cfg.Store.StoreID && !p.IsLearner {
				targets = append(targets, p.StoreID)
			}
		}
		// Stable: up stores first, each group in peer order.
		slices.SortStableFunc(targets, func(a, b uint64) int {
			switch {
			case up[a] == up[b]:
				return 0
			case up[a]:
				return -1
			}
			return 1
		})
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := s.transferLeader(ctx, st.Region.ID, targets); err != nil {
				failed.Add(1)
				s.logger.Warn("shutdown: leadership not handed over; the region elects a leader after this store stops", "region", st.Region.ID, "err", err)
			}
		})
	}
	wg.Wait()
	s.logger.Info("shutdown: leaderships handed over", "regions", len(led), "failed", failed.Load(), "took", time.Since(start).Round(time.Millisecond))
}

// transferLeader tries the targets in turn until one takes the region's
// leadership.
func (s *Server) transferLeader(ctx context.Context, regionID uint64, targets []uint64) error {
	if len(targets) == 0 {
		return errors.New("no other voter")
	}
	var err error
	for _, to := range targets {
		actx, cancel := context.WithTimeout(ctx, transferAttemptTimeout)
		err = s.store.TransferLeader(actx, regionID, to)
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		var nl *region.NotLeaderError
		if errors.As(err, &nl) {
			// Leadership moved meanwhile (an election, the balancer): no
			// longer ours to hand over.
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("transfer leader of region %d: %w", regionID, err)
	}
	return nil
}

// Stop stops serving and closes the store. It is safe to call more than
// once, and without Start. Shutdown is the graceful way.
func (s *Server) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	started := s.started
	s.mu.Unlock()
	s.cancel()
	// No lease expires here from now on, and the etcd API's KeepAlive
	// streams end (they would hold the graceful stop).
	s.etcd.Stop()
	// A stall or delay in progress would hold requests past the drain.
	s.faults.apply(&kvpb.FaultRequest{Clear: true})

	var unfinished int64
	if started {
		unfinished = s.drain()
		if s.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), httpShutdownTimeout)
			if err := s.http.Shutdown(ctx); err != nil {
				s.logger.Warn("status HTTP shutdown", "err", err)
				_ = s.http.Close()
			}
			cancel()
		}
		s.serving.Wait()
	} else {
		s.raft.stop()
		s.grpc.Stop()
		// Listeners bound (or handed in) but never served still belong
		// to us.
		if s.bound != nil {
			_ = s.bound.Close()
		}
		if s.boundStatus != nil {
			_ = s.boundStatus.Close()
		}
	}
	s.background.Wait()
	s.cp.Wait()
	s.trans.Close()
	s.raft.wait()
	if err := s.store.Stop(); err != nil {
		s.logger.Error("stop store", "err", err)
	}
	s.logger.Info("server stopped", "requests_unfinished", unfinished)
}

// drain stops gRPC in an order that lets in-flight requests finish: first
// refuse new RPCs while raft traffic still flows both ways (a pending write
// needs it to commit), then, once the requests are done or
// gracefulStopTimeout passed, end the inbound raft streams, which never end
// by themselves and would hold GracefulStop forever. It returns how many
// requests were still in flight when it stopped waiting for them (0 when
// the drain let every one finish; "server stopped" logs it).
func (s *Server) drain() int64 {
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	deadline := time.Now().Add(gracefulStopTimeout)
	for s.inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	unfinished := s.inflight.Load()
	s.raft.stop()
	select {
	case <-stopped:
	case <-time.After(time.Until(deadline) + 100*time.Millisecond):
		s.logger.Warn("graceful stop timed out, closing connections", "requests_in_flight", s.inflight.Load())
		s.grpc.Stop()
		<-stopped
	}
	return unfinished
}

// Addr is the gRPC address actually listened on (after Start), else the
// configured one.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis != nil {
		return s.lis.Addr().String()
	}
	if s.cfg.Listener != nil {
		return s.cfg.Listener.Addr().String()
	}
	return s.cfg.ListenAddr
}

// StatusAddr is the status HTTP address, "" if disabled.
func (s *Server) StatusAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statusAddrLocked()
}

func (s *Server) statusAddrLocked() string {
	if s.statusLis != nil {
		return s.statusLis.Addr().String()
	}
	if s.cfg.StatusListener != nil {
		return s.cfg.StatusListener.Addr().String()
	}
	return s.cfg.StatusAddr
}

// Store is the underlying store.
func (s *Server) Store() *raftstore.Store { return s.store }

// ReadsCancelled is the number of KV reads (Get, BatchGet, Scan) that
// ended because their caller cancelled them, such as the losing request of
// a hedged read (hedgekv_reads_cancelled_total on /metrics).
func (s *Server) ReadsCancelled() uint64 {
	if s.metrics == nil {
		return 0
	}
	return s.metrics.readsCancelledN.Load()
}

// ReadCounters are a server's counts of KV reads by how they ended, for
// in-process readers (tests, benchmarks); /metrics has the same.
type ReadCounters struct {
	// Cancelled reads ended because their caller cancelled them, such as
	// the losing attempt of a hedged read.
	Cancelled uint64
	// Hedges are reads a client marked as hedges; HedgesCancelled those of
	// them it cancelled.
	Hedges, HedgesCancelled uint64
	// RefusedBusy reads were refused with ServerIsBusy.
	RefusedBusy uint64
}

// ReadCounters returns the server's read counters so far.
func (s *Server) ReadCounters() ReadCounters {
	if s.metrics == nil {
		return ReadCounters{}
	}
	m := s.metrics
	return ReadCounters{
		Cancelled:       m.readsCancelledN.Load(),
		Hedges:          m.hedgeReadsN.Load(),
		HedgesCancelled: m.hedgeReadsCancelledN.Load(),
		RefusedBusy:     m.readsBusyN.Load(),
	}
}

// leadersDigest changes whenever who leads a region this store hosts does,
// as it knows it: the cluster view's listing is not
// reused across a change of it.
func (s *Server) leadersDigest() string {
	// A count of changes, not a list of who leads what: the view reads it
	// on every call, and a list grows with the regions.
	return strconv.FormatUint(s.store.LeaderChanges(), 10)
}

// advertiseAddr is the address other stores and clients reach this store
// at: the configured peer address if any (it may be a proxy's), else the
// listen address.
func (s *Server) advertiseAddr() string { return s.cp.AdvertiseAddr() }

// Peers returns a copy of the address book: every store this one knows,
// by id.
func (s *Server) Peers() map[uint64]string { return s.cp.Peers() }
