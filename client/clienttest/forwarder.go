package clienttest

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Forwarder is a TCP forwarder on 127.0.0.1 that counts what passes
// through it: a stand-in for one link's proxy of the simulated WAN, for
// tests that check which way traffic goes.
type Forwarder struct {
	lis    net.Listener
	target string

	conns     atomic.Int64 // connections accepted
	bytesUp   atomic.Int64 // dialler -> target
	bytesDown atomic.Int64 // target -> dialler

	mu     sync.Mutex
	open   map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewForwarder forwards a new 127.0.0.1 port to target until the test
// ends.
func NewForwarder(t testing.TB, target string) *Forwarder {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("forwarder: listen: %v", err)
	}
	f := NewForwarderOn(lis, target)
	t.Cleanup(f.Close)
	return f
}

// NewForwarderOn forwards connections accepted on lis to target until
// Close (which closes lis).
func NewForwarderOn(lis net.Listener, target string) *Forwarder {
	f := &Forwarder{lis: lis, target: target, open: make(map[net.Conn]struct{})}
	f.wg.Add(1)
	go f.serve()
	return f
}

// Addr is the address to dial.
func (f *Forwarder) Addr() string { return f.lis.Addr().String() }

// Conns is the number of connections accepted so far.
func (f *Forwarder) Conns() int64 { return f.conns.Load() }

// BytesUp is the number of bytes forwarded from diallers to the target.
func (f *Forwarder) BytesUp() int64 { return f.bytesUp.Load() }

// BytesDown is the number of bytes forwarded from the target back.
func (f *Forwarder) BytesDown() int64 { return f.bytesDown.Load() }

// Close stops accepting, cuts every forwarded connection and waits for
// the forwarding goroutines.
func (f *Forwarder) Close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	_ = f.lis.Close()
	for c := range f.open {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// track records c as open; false (and c closed) once the forwarder is.
func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		_ = c.Close()
		return false
	}
	f.open[c] = struct{}{}
	return true
}

func (f *Forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.open, c)
	f.mu.Unlock()
	_ = c.Close()
}

func (f *Forwarder) serve() {
	defer f.wg.Done()
	for {
		in, err := f.lis.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		f.conns.Add(1)
		if !f.track(in) {
			return
		}
		f.wg.Add(1)
		go f.forward(in)
	}
}

func (f *Forwarder) forward(in net.Conn) {
	defer f.wg.Done()
	defer f.untrack(in)
	out, err := net.Dial("tcp", f.target)
	if err != nil || !f.track(out) {
		if out != nil {
			_ = out.Close()
		}
		return
	}
	defer f.untrack(out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn, n *atomic.Int64) {
		_, _ = io.Copy(countingWriter{dst, n}, src)
		// One direction ended: end both, as a proxy does.
		_ = in.Close()
		_ = out.Close()
		done <- struct{}{}
	}
	go pipe(out, in, &f.bytesUp)
	go pipe(in, out, &f.bytesDown)
	<-done
	<-done
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}
