package tlsverdict

import (
	"errors"
	"io"
	"net"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestHandshakeError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: waiting for the server to accept our certificate: remote error: tls: certificate required"`), codes.Unauthenticated},
		{status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: remote error: tls: certificate required"`), codes.Unauthenticated},
		{status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"`), codes.Unauthenticated},
		{status.Error(codes.Unavailable, "connection refused"), codes.Unavailable},
		{status.Error(codes.NotFound, "tls: "), codes.NotFound},
		{status.Error(codes.InvalidArgument, "tls: not a handshake"), codes.InvalidArgument},
		{errors.New("x509: not a status"), codes.Unknown},
	} {
		if got := status.Code(HandshakeError(tc.err)); got != tc.want {
			t.Errorf("%v -> %v, want %v", tc.err, got, tc.want)
		}
	}
	if HandshakeError(nil) != nil {
		t.Error("nil error mapped to an error")
	}
}

// TestPeekedConn: the byte read to learn the server's verdict comes back
// first, then the rest of the stream.
func TestPeekedConn(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		_, _ = b.Write([]byte("ello"))
		b.Close()
	}()
	p := &peekedConn{Conn: a, first: []byte("h")}
	got, err := io.ReadAll(p)
	if err != nil || string(got) != "hello" {
		t.Fatalf("read %q, %v", got, err)
	}
}
