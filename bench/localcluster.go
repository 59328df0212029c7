package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/server"
)

// LocalClusterConfig configures an in-process hedgekv cluster.
type LocalClusterConfig struct {
	// Dir holds the stores' data; "" makes a temporary directory that Stop
	// removes.
	Dir string
	// Zones, one per store (default dc-a, dc-b, dc-c: three stores).
	Zones []string
	// NoSync skips fsync on the stores' bbolt commits.
	NoSync bool
	// Logger for the stores (nil: warnings and errors of slog.Default's
	// handler only, so the servers stay quiet during a benchmark).
	Logger *slog.Logger
	// ReadyTimeout bounds the wait for every region to have a leader
	// (default 30s).
	ReadyTimeout time.Duration
}

// LocalCluster is a hedgekv cluster of in-process servers on loopback ports.
type LocalCluster struct {
	Endpoints []string
	servers   []*server.Server
	dir       string
	ownDir    bool
}

// StartLocalCluster starts one server per zone, stores 1..N bootstrapping
// region 1 together, each listening on a free 127.0.0.1 port, and waits
// until every region has a leader.
func StartLocalCluster(ctx context.Context, cfg LocalClusterConfig) (_ *LocalCluster, err error) {
	if len(cfg.Zones) == 0 {
		cfg.Zones = []string{"dc-a", "dc-b", "dc-c"}
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(levelHandler{Handler: slog.Default().Handler(), min: slog.LevelWarn})
	}
	c := &LocalCluster{dir: cfg.Dir}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "hedgekv-bench-cluster-*"); err != nil {
			return nil, fmt.Errorf("local cluster: %w", err)
		}
		c.ownDir = true
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	n := len(cfg.Zones)
	ids := make([]uint64, n)
	lis := make([]net.Listener, n)
	peers := make(map[uint64]string, n)
	for i := range n {
		ids[i] = uint64(i + 1)
		if lis[i], err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			for _, l := range lis[:i] {
				_ = l.Close()
			}
			return nil, fmt.Errorf("local cluster: listen: %w", err)
		}
		peers[ids[i]] = lis[i].Addr().String()
		c.Endpoints = append(c.Endpoints, lis[i].Addr().String())
	}
	for i := range n {
		srv, err := server.New(server.Config{
			Store: raftstore.Config{
				StoreID:       ids[i],
				Zone:          cfg.Zones[i],
				DataDir:       filepath.Join(c.dir, fmt.Sprintf("store%d", ids[i])),
				InitialStores: ids,
				NoSync:        cfg.NoSync,
				Logger:        logger,
			},
			Listener: lis[i],
			Peers:    peers,
		})
		if err != nil {
			for _, l := range lis[i:] {
				_ = l.Close()
			}
			return nil, fmt.Errorf("local cluster: store %d: %w", ids[i], err)
		}
		c.servers = append(c.servers, srv)
	}
	for i, srv := range c.servers {
		if err := srv.Start(); err != nil {
			return nil, fmt.Errorf("local cluster: start store %d: %w", ids[i], err)
		}
	}
	if err := c.waitLeaders(ctx, cfg.ReadyTimeout); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *LocalCluster) waitLeaders(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		ready := false
		for _, srv := range c.servers {
			regions := srv.Store().Regions()
			if len(regions) == 0 {
				ready = false
				break
			}
			ready = true
			for _, r := range regions {
				if r.LeaderStoreID == 0 {
					ready = false
				}
			}
			if !ready {
				break
			}
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("local cluster: regions without a leader after %v: %w", timeout, ctx.Err())
		case <-t.C:
		}
	}
}

// Stop stops every server and removes a temporary data directory.
func (c *LocalCluster) Stop() {
	for _, srv := range c.servers {
		srv.Stop()
	}
	c.servers = nil
	if c.ownDir && c.dir != "" {
		_ = os.RemoveAll(c.dir)
		c.dir = ""
	}
}

// levelHandler drops records below min.
type levelHandler struct {
	slog.Handler
	min slog.Level
}

func (h levelHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h levelHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelHandler{Handler: h.Handler.WithAttrs(attrs), min: h.min}
}

func (h levelHandler) WithGroup(name string) slog.Handler {
	return levelHandler{Handler: h.Handler.WithGroup(name), min: h.min}
}
