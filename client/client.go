package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/kvpb"
)

// Config configures a Client.
type Config struct {
	Endpoints      []string      // gRPC addresses of any stores
	Zone           string        // client's zone label: Follower and Closest prefer its replicas, and stores are dialled at their address for it (package doc)
	DialTimeout    time.Duration // default 3s
	RequestTimeout time.Duration // default 10s, used when ctx has no deadline
	// TLS, if set, dials every store over TLS with this config (LoadTLS
	// builds one): it must trust the stores' CA and, since stores with TLS
	// require one, carry a client certificate that CA signed. A store that
	// refuses it answers Unauthenticated. Nil: plaintext.
	TLS *tls.Config
	// Logger receives the client's own log: retries and hedges at debug
	// level, a store list that could not be loaded at warn. Nil:
	// slog.Default(), looked up once in New. Each record carries
	// component=hedgekv-client.
	Logger *slog.Logger
}

const (
	defaultDialTimeout    = 3 * time.Second
	defaultRequestTimeout = 10 * time.Second
)

// ErrNotFound is returned by Get when the key does not exist.
var ErrNotFound = errors.New("key not found")

// errEmptyKey: hedgekv has no empty key; refusing it here saves a round trip
// to a store that would refuse it with InvalidArgument.
var errEmptyKey = errors.New("empty key")

// KV is one key-value pair.
type KV struct{ Key, Value []byte }

// Client talks to a hedgekv cluster. It is safe for concurrent use; its own
// read methods read from region leaders (ReplicaLeader).
type Client struct {
	cfg      Config
	log      *slog.Logger
	conns    *connPool
	cache    *regionCache
	stats    *statsTable
	selector *replicaSelector
	leader   *Session
	hedges   hedgeCounters // every session's hedging, for HedgeStats
	meta     metaStats     // metadata calls' latency and back-off by address (metadata.go)

	mu        sync.Mutex
	endpoints []string // Config.Endpoints, the last one that answered first
}

// New connects to the cluster: it asks every endpoint, in parallel and
// within DialTimeout, which store it is, then loads the store list. It
// fails only if no endpoint answers. Region metadata is loaded lazily, on
// each key's first use.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = defaultDialTimeout
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = defaultRequestTimeout
	}
	var eps []string
	for _, e := range cfg.Endpoints {
		if e = strings.TrimSpace(e); e != "" && !slices.Contains(eps, e) {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("no endpoints given")
	}
	cfg.Endpoints = eps
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "hedgekv-client"),
		conns:     newConnPool(cfg.DialTimeout, cfg.TLS),
		stats:     &statsTable{},
		endpoints: append([]string(nil), eps...),
	}
	c.cache = newRegionCache()
	c.cache.zone = cfg.Zone
	c.cache.loadByKey = c.loadRegionByKey
	c.cache.loadAll = c.loadAllRegions
	c.cache.loadStores = c.loadStores
	c.selector = &replicaSelector{zone: cfg.Zone, stats: c.stats, zoneOf: c.cache.zoneOf}
	c.leader = c.Session(ReadPolicy{Replica: ReplicaLeader})

	if err := c.probeEndpoints(ctx); err != nil {
		_ = c.conns.close()
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if err := c.cache.refreshStores(lctx); err != nil {
		// Not fatal: the endpoints that answered are enough to start, and
		// the list is fetched again when a region names an unknown store.
		c.log.Warn("could not load the store list", "err", err)
	}
	return c, nil
}

// probeEndpoints asks each endpoint's Admin.Status which store it is. The
// endpoint address then becomes the way to dial that store, whatever
// address the store advertises (see regionCache.dialOverride), unless the
// store advertises an address for the client's zone: then that one.
//
// It returns once every endpoint has answered, or shortly after the first
// success: a dead endpoint must not hold up a client that can already
// work, and the probes still out finish in the background (bounded by
// DialTimeout). Endpoints that answered are tried first later.
func (c *Client) probeEndpoints(ctx context.Context) error {
	type answer struct {
		addr string
		err  error
	}
	ch := make(chan answer, len(c.cfg.Endpoints))
	for _, addr := range c.cfg.Endpoints {
		go func() {
			ch <- answer{addr, c.probe(ctx, addr)}
		}()
	}
	var (
		ok    []string
		errs  []error
		grace <-chan time.Time
		// silent are the endpoints that have not answered yet.
		silent = make(map[string]bool, len(c.cfg.Endpoints))
	)
	for _, addr := range c.cfg.Endpoints {
		silent[addr] = true
	}
collect:
	for range c.cfg.Endpoints {
		select {
		case a := <-ch:
			delete(silent, a.addr)
			if a.err != nil {
				errs = append(errs, a.err)
				continue
			}
			ok = append(ok, a.addr)
			if grace == nil {
				grace = time.After(probeGrace)
			}
		case <-grace:
			break collect
		}
	}
	if len(ok) == 0 {
		return fmt.Errorf("no usable endpoint among %s: %w", strings.Join(c.cfg.Endpoints, ","), errors.Join(errs...))
	}
	// An endpoint still silent when another answered a grace ago (a store
	// stopped or stalled, an address that accepts and never answers) starts
	// in its back-off, as a metadata call's loser does: asked last, and not
	// waited for by a fan-out to every store (gatherRegions). Without this a
	// command-line client, new each time, would wait for it on every call.
	for addr := range silent {
		c.meta.get(addr).markFailure()
	}
	c.mu.Lock()
	rest := make([]string, 0, len(c.endpoints))
	for _, e := range c.endpoints {
		if !slices.Contains(ok, e) {
			rest = append(rest, e)
		}
	}
	c.endpoints = append(ok, rest...)
	c.mu.Unlock()
	return nil
}

// probeGrace is how long New waits for the other endpoints once one has
// answered: enough for healthy stores on a LAN, little for a dead one.
const probeGrace = 100 * time.Millisecond

func (c *Client) probe(ctx context.Context, addr string) error {
	stub, err := c.conns.admin(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	resp, err := stub.Status(ctx, &kvpb.StatusRequest{})
	switch {
	case status.Code(err) == codes.Unimplemented:
		// It answers, it just cannot say who it is.
		return nil
	case err != nil:
		if isUnreachable(context.Background(), err) {
			// Asked last by metadata calls until it answers again.
			c.meta.get(addr).markFailure()
		}
		return &storeError{addr: addr, err: err}
	}
	if id := resp.GetStoreId(); id != 0 {
		c.cache.setEndpoint(id, addr, resp.GetZone(), resp.GetZoneAddresses())
	}
	return nil
}

// Close releases every connection. Requests in flight fail.
func (c *Client) Close() error {
	return c.conns.close()
}

// Session returns a handle whose reads follow p. Sessions are cheap and
// share the client's connections, cache and statistics; any number with
// different policies may be used concurrently.
//
// A session that hedges has its own hedge budget and counters
// (Session.HedgeStats); Client.HedgeStats sums them over all sessions.
func (c *Client) Session(p ReadPolicy) *Session {
	s := &Session{c: c, policy: p}
	if !p.Hedge.Off() {
		s.hedger = newHedger(p, &c.hedges)
	}
	return s
}

// HedgeStats returns the hedging counters of every session of this client
// taken together.
func (c *Client) HedgeStats() HedgeStats {
	return c.hedges.snapshot()
}

// Get reads key from its region's leader. A missing key is ErrNotFound.
func (c *Client) Get(ctx context.Context, key []byte) ([]byte, error) {
	return c.leader.Get(ctx, key)
}

// BatchGet reads keys from their regions' leaders; see Session.BatchGet.
func (c *Client) BatchGet(ctx context.Context, keys [][]byte) (map[string][]byte, error) {
	return c.leader.BatchGet(ctx, keys)
}

// Scan reads from region leaders; see Session.Scan.
func (c *Client) Scan(ctx context.Context, start, end []byte, limit int) ([]KV, error) {
	return c.leader.Scan(ctx, start, end, limit)
}

// Put writes key=value; it returns once the write is applied on the leader
// (and so durable on a quorum).
func (c *Client) Put(ctx context.Context, key, value []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("put: %w", errEmptyKey)
	}
	// One request ID for every attempt: the store applies a retried write
	// at most once, even when an earlier attempt landed unseen.
	reqID := newRequestID()
	_, err := c.send(ctx, &regionRequest{
		op:    "put",
		key:   key,
		write: true,
		rpc: func(ctx context.Context, cc grpc.ClientConnInterface, a *attempt) (*kvpb.Load, error) {
			_, err := kvpb.NewKVClient(cc).Put(ctx, &kvpb.PutRequest{Context: a.writeContext(reqID), Key: key, Value: value})
			return nil, err
		},
	})
	return err
}

// Delete removes key; deleting a missing key succeeds.
func (c *Client) Delete(ctx context.Context, key []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("delete: %w", errEmptyKey)
	}
	reqID := newRequestID()
	_, err := c.send(ctx, &regionRequest{
		op:    "delete",
		key:   key,
		write: true,
		rpc: func(ctx context.Context, cc grpc.ClientConnInterface, a *attempt) (*kvpb.Load, error) {
			_, err := kvpb.NewKVClient(cc).Delete(ctx, &kvpb.DeleteRequest{Context: a.writeContext(reqID), Key: key})
			return nil, err
		},
	})
	return err
}

// withTimeout applies RequestTimeout to a ctx without a deadline.
func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.cfg.RequestTimeout)
}
