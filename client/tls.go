package client

// Mutual TLS for clients: stores started with TLS (server --tls-cert,
// --tls-key, --tls-ca) accept only callers presenting a certificate their
// CA signed.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// LoadTLS builds a Config.TLS from PEM files: the client's certificate and
// key, and the CA that signed the stores' certificates. certFile and
// keyFile go together; without them the client can check the stores but
// has no identity of its own, and stores refuse it (Unauthenticated).
func LoadTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, errors.New("tls: the CA file is needed to check the stores' certificates")
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("tls: a client certificate and its key go together")
	}
	pemBytes, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls: read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("tls: no PEM certificate in CA file %s", caFile)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tls: load certificate %s with key %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// transportCredentials are what the pool dials with: cfg (cloned, since
// gRPC sets fields on it) or plaintext.
func transportCredentials(cfg *tls.Config) credentials.TransportCredentials {
	if cfg == nil {
		return insecure.NewCredentials()
	}
	return verdictCreds{credentials.NewTLS(cfg.Clone())}
}

// verdictCreds are TLS client credentials whose handshake also waits for
// the server's verdict on the client's certificate. With TLS 1.3 the
// store checks it only after the client has finished its side of the
// handshake, and a refusal then reaches gRPC as a broken pipe on its first
// write, indistinguishable from a store that went away. A gRPC server
// writes its SETTINGS frame as soon as its handshake is done, so the
// client reads the first byte the server sends: data means accepted; an
// alert ("remote error: tls: ...") fails the handshake, which
// handshakeError then reports as Unauthenticated. The byte read is handed
// back to gRPC in front of the rest. (server/tls.go has the same for
// store-to-store connections; client may not import server.)
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
		return nil, nil, fmt.Errorf("waiting for the store to accept our certificate: %w", err)
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

// verdictTimeout bounds the wait for the store's first bytes when the
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

// handshakeErrorInterceptor turns a call that failed because the TLS
// handshake did not complete into Unauthenticated (see handshakeError).
func handshakeErrorInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return handshakeError(invoker(ctx, method, req, reply, cc, opts...))
}

// handshakeError maps a failed TLS handshake to Unauthenticated. gRPC
// reports it as Unavailable, which the client would treat as a store that
// is down and retry elsewhere until the deadline; but a store that refuses
// our certificate, or presents one our CA did not sign, refuses again.
// With TLS 1.3 the store checks the client's certificate after the client
// considers the handshake done, so the refusal arrives as "remote error:
// tls: ..." on the first read; gRPC keeps only its text, hence the match.
func handshakeError(err error) error {
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
