package client

// Mutual TLS for clients: stores started with TLS (server --tls-cert,
// --tls-key, --tls-ca) accept only callers presenting a certificate their
// CA signed.

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hedgekv/hedgekv/tlsverdict"
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
	return tlsverdict.Credentials(credentials.NewTLS(cfg.Clone()))
}
