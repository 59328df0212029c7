package client

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/tlsverdict"
)

// errClosed is returned by requests made after Close.
var errClosed = errors.New("hedgekv client: closed")

// connPool holds one grpc.ClientConn per store address, created on first
// use. A ClientConn multiplexes every request to its store over one HTTP/2
// connection and reconnects by itself, so there is never a reason for a
// second one; conns live until Close.
type connPool struct {
	dialTimeout time.Duration
	creds       credentials.TransportCredentials

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
}

func newConnPool(dialTimeout time.Duration, tlsCfg *tls.Config) *connPool {
	return &connPool{dialTimeout: dialTimeout, creds: transportCredentials(tlsCfg), conns: make(map[string]*grpc.ClientConn)}
}

// get returns the conn for addr, creating it without blocking: grpc dials in
// the background and the first RPC waits for the connection (up to its own
// deadline) or fails fast with Unavailable once the dial has failed.
// maxResponseSize bounds one answer: room for the largest value (8 MiB)
// and for scans of ordinary records; a bigger answer fails with
// ResourceExhausted rather than exhausting the client's memory.
const maxResponseSize = 64 << 20

func (p *connPool) get(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errClosed
	}
	if cc, ok := p.conns[addr]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(p.creds),
		// A refused TLS handshake is Unauthenticated, not a store down.
		grpc.WithChainUnaryInterceptor(tlsverdict.UnaryInterceptor),
		grpc.WithConnectParams(grpc.ConnectParams{
			// A restarted store must be found again within a request's
			// deadline, not after grpc's default backoff of up to 120s.
			Backoff: backoff.Config{
				BaseDelay:  50 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   time.Second,
			},
			MinConnectTimeout: p.dialTimeout,
		}),
		// An 8 MiB value or a 10,000-pair scan exceeds grpc's 4 MiB default.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxResponseSize)),
	)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", addr, err)
	}
	p.conns[addr] = cc
	return cc, nil
}

// admin returns an Admin stub for addr.
func (p *connPool) admin(addr string) (kvpb.AdminClient, error) {
	cc, err := p.get(addr)
	if err != nil {
		return nil, err
	}
	return kvpb.NewAdminClient(cc), nil
}

// resetBackoff makes a conn in TRANSIENT_FAILURE try again now. The retry
// loop calls it before going back to a store it found unreachable, so a
// store that came back is used at once rather than after grpc's backoff.
func (p *connPool) resetBackoff(addr string) {
	p.mu.Lock()
	cc := p.conns[addr]
	p.mu.Unlock()
	kvpb.ResetBackoff(cc)
}

func (p *connPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for addr, cc := range p.conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close conn to %s: %w", addr, err))
		}
	}
	p.conns = nil
	return errors.Join(errs...)
}
