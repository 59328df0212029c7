package cluster

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/netsim"
)

// etcdPeerFront is the peer URL a member advertises behind a simulated
// WAN. etcd gives every member one list of peer URLs, the same for every
// member that dials it, so it cannot be told "dial m1 at dc-b's link to
// m1". The front learns who dials instead: every raft request etcd sends
// (stream GETs and pipeline POSTs of package rafthttp) carries the
// sender's advertised peer URLs in its X-PeerURLs header, and a
// connection's requests all come from one member. So the front reads the
// first request's header block, finds the sender, and splices the
// connection, those bytes first, into the netsim link from the sender's
// zone to this member; both directions then pay that link's latency and
// bandwidth, as a store's connections through netsim do. A connection
// whose first request names no sender (rafthttp's /raft/probing RTT
// probes, the leader's /version probes: nothing that carries raft
// messages once the streams are up) must still come from another member,
// so it goes through the link from fallback, the zone of the first member
// outside this member's zone: exact when every other member's zone has the
// same link to this one (the default topology), and counted.
type etcdPeerFront struct {
	store        uint64
	fallback     string
	net          *netsim.Network
	ln           net.Listener
	logger       *slog.Logger
	attributed   atomic.Int64
	unattributed atomic.Int64

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// peekLimit bounds the header block a front reads before routing.
const peekLimit = 64 << 10

func listenEtcdPeerFront(store uint64, fallback string, n *netsim.Network, logger *slog.Logger) (*etcdPeerFront, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("peer router of store %d: %w", store, err)
	}
	return &etcdPeerFront{store: store, fallback: fallback, net: n, ln: ln, logger: logger, conns: map[net.Conn]struct{}{}}, nil
}

func (f *etcdPeerFront) addr() string { return f.ln.Addr().String() }

// serve accepts connections until close; senders maps every member's
// advertised host:port to its zone.
func (f *etcdPeerFront) serve(senders map[string]string) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			conn, err := f.ln.Accept()
			if err != nil {
				return
			}
			if !f.track(conn) {
				_ = conn.Close()
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer f.untrack(conn)
				f.handle(conn, senders)
			}()
		}
	}()
}

func (f *etcdPeerFront) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *etcdPeerFront) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	_ = c.Close()
}

func (f *etcdPeerFront) handle(down net.Conn, senders map[string]string) {
	head := peekHeader(down, 10*time.Second)
	zone, ok := senderZone(head, senders)
	if ok {
		f.attributed.Add(1)
	} else {
		zone = f.fallback
		f.unattributed.Add(1)
	}
	up, err := net.DialTimeout("tcp", f.net.Addr(zone, f.store), 5*time.Second)
	if err != nil {
		f.logger.Debug("etcd peer router: dial link", "store", f.store, "zone", zone, "err", err)
		return
	}
	if !f.track(up) {
		_ = up.Close()
		return
	}
	defer f.untrack(up)
	if _, err := up.Write(head); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, down)
		closeWrite(up)
	}()
	_, _ = io.Copy(down, up)
	closeWrite(down)
	<-done
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}

// peekHeader reads from c until the end of an HTTP header block
// ("\r\n\r\n"), peekLimit bytes, an error or the timeout, and returns what
// it read.
func peekHeader(c net.Conn, timeout time.Duration) []byte {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	buf := make([]byte, 0, 4096)
	for len(buf) < peekLimit && !bytes.Contains(buf, []byte("\r\n\r\n")) {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, len(buf))
		}
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			break
		}
	}
	return buf
}

// senderZone finds the X-PeerURLs header in an HTTP header block and the
// zone of the first of its URLs that names a member.
func senderZone(head []byte, senders map[string]string) (string, bool) {
	end := bytes.Index(head, []byte("\r\n\r\n"))
	if end < 0 {
		return "", false
	}
	for _, line := range strings.Split(string(head[:end]), "\r\n")[1:] {
		name, value, ok := strings.Cut(line, ":")
		if !ok || !strings.EqualFold(strings.TrimSpace(name), "X-PeerURLs") {
			continue
		}
		for _, u := range strings.Split(value, ",") {
			pu, err := url.Parse(strings.TrimSpace(u))
			if err != nil {
				continue
			}
			if z, ok := senders[pu.Host]; ok {
				return z, true
			}
		}
	}
	return "", false
}

// close stops accepting, closes every connection and waits for the
// router's goroutines.
func (f *etcdPeerFront) close() {
	f.mu.Lock()
	f.closed = true
	conns := make([]net.Conn, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	f.mu.Unlock()
	_ = f.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	f.wg.Wait()
}
