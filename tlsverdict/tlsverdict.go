// Package tlsverdict makes a refused TLS client certificate look like what
// it is to a gRPC caller: Unauthenticated, not a store that went away.
// Both the client (connections to stores) and the stores (connections to
// each other) dial with it.
package tlsverdict

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// Credentials wraps TLS client credentials so that the handshake also waits
// for the server's verdict on the client's certificate. With TLS 1.3 the
// server checks it only after the client has finished its side of the
// handshake, and a refusal then reaches gRPC as a broken pipe on its first
// write, indistinguishable from a server that went away. A gRPC server
// writes its SETTINGS frame as soon as its handshake is done, so the
// client reads the first byte the server sends: data means accepted; an
// alert ("remote error: tls: ...") fails the handshake, which HandshakeError
// then reports as Unauthenticated. The byte read is handed back to gRPC in
// front of the rest.
func Credentials(tc credentials.TransportCredentials) credentials.TransportCredentials {
	return verdictCreds{tc}
}

type verdictCreds struct {
	credentials.TransportCredentials
}

func (c verdictCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(verdictTimeout)
	}
	if err := conn.SetReadDeadline(deadline); err != nil {
		conn.Close()
		return nil, nil, err
	}
	first := make([]byte, 1)
	if _, err := io.ReadFull(conn, first); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("waiting for the server to accept our certificate: %w", err)
	}
	if err := conn.SetReadDeadline(time.Time{}); err != nil {
		conn.Close()
		return nil, nil, err
	}
	return &peekedConn{Conn: conn, first: first}, info, nil
}

func (c verdictCreds) Clone() credentials.TransportCredentials {
	return verdictCreds{c.TransportCredentials.Clone()}
}

// verdictTimeout bounds the wait for the server's first bytes when the
// handshake has no deadline of its own (gRPC always gives one).
const verdictTimeout = 20 * time.Second

// peekedConn is a connection some of whose first bytes were read already.
type peekedConn struct {
	net.Conn
	first []byte
}

func (p *peekedConn) Read(b []byte) (int, error) {
	if len(p.first) > 0 {
		n := copy(b, p.first)
		p.first = p.first[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// UnaryInterceptor turns a call that failed because the TLS handshake did
// not complete into Unauthenticated (see HandshakeError).
func UnaryInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return HandshakeError(invoker(ctx, method, req, reply, cc, opts...))
}

// HandshakeError maps a failed TLS handshake to Unauthenticated. gRPC
// reports it as Unavailable, which a caller would treat as a server that
// is down and retry elsewhere until its deadline; but a server that
// refuses our certificate, or presents one our CA did not sign, refuses
// again. The refusal arrives as "remote error: tls: ..." (or an x509
// error); gRPC keeps only its text, hence the match.
func HandshakeError(err error) error {
	if status.Code(err) != codes.Unavailable {
		return err
	}
	msg := status.Convert(err).Message()
	for _, marker := range []string{"tls: ", "x509: "} {
		if strings.Contains(msg, marker) {
			return status.Error(codes.Unauthenticated, "TLS handshake failed: "+msg)
		}
	}
	return err
}
