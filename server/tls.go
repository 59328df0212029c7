package server

// Mutual TLS between stores and for clients. A store with Config.TLS
// serves only peers that present a certificate signed by its CA
// (tls.RequireAndVerifyClientCert), and presents its own certificate both
// when it serves and when it dials a peer: every store-to-store call (raft
// streams, snapshots, joins, address learning, the cluster view) goes over
// the same identity, so one certificate per store is enough.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	"github.com/hedgekv/hedgekv/tlsverdict"
)

// TLS is a store's mutual-TLS identity: its certificate and key, and the
// CA that must have signed every peer's and client's certificate.
type TLS struct {
	cert tls.Certificate
	cas  *x509.CertPool
}

// NewTLS builds a TLS identity from a loaded certificate and CA pool.
func NewTLS(cert tls.Certificate, cas *x509.CertPool) (*TLS, error) {
	if len(cert.Certificate) == 0 || cert.PrivateKey == nil {
		return nil, errors.New("tls: certificate or key missing")
	}
	if cas == nil {
		return nil, errors.New("tls: no CA")
	}
	return &TLS{cert: cert, cas: cas}, nil
}

// LoadTLS reads a store's certificate, key and CA from PEM files. It
// checks up front that the CA signed the certificate, for both serving and
// dialing peers: a store that starts with a mismatched pair would
// otherwise only find out when every peer refuses it.
func LoadTLS(certFile, keyFile, caFile string) (*TLS, error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("tls: a certificate, its key and the CA are all needed")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: load certificate %s with key %s: %w", certFile, keyFile, err)
	}
	cas, err := LoadCAPool(caFile)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("tls: parse %s: %w", certFile, err)
	}
	// One usage at a time: Verify accepts a chain valid for any of those
	// listed, and a store needs both.
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: cas, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			return nil, fmt.Errorf("tls: %s is not a store certificate of the CA in %s (it must serve and dial peers): %w", certFile, caFile, err)
		}
	}
	return NewTLS(cert, cas)
}

// LoadCAPool reads the PEM certificates in file into a pool.
func LoadCAPool(file string) (*x509.CertPool, error) {
	pemBytes, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tls: read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("tls: no PEM certificate in CA file %s", file)
	}
	return pool, nil
}

// serverCredentials are what the gRPC server accepts connections with.
func (t *TLS) serverCredentials() credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{t.cert},
		ClientCAs:    t.cas,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
}

// clientCredentials are what this store dials its peers with. ServerName
// is left empty: gRPC fills it from the dialed address, so a peer's
// certificate must name the host it is reached at.
func (t *TLS) clientCredentials() credentials.TransportCredentials {
	return tlsverdict.Credentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{t.cert},
		RootCAs:      t.cas,
		MinVersion:   tls.VersionTLS12,
	}))
}

// peerDialOptions are the options every connection a store makes to
// another store starts with: its TLS identity, if any, and the mapping of
// a refused handshake to Unauthenticated (so a join through a store that
// does not trust this one stops at once, instead of retrying as if the
// store were down), and the name of its cluster (clusterid.go).
func peerDialOptions(t *TLS, clusterID uint64) []grpc.DialOption {
	creds := insecure.NewCredentials()
	if t != nil {
		creds = t.clientCredentials()
	}
	return append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithChainUnaryInterceptor(tlsverdict.UnaryInterceptor),
	}, clusterIDDialOptions(clusterID)...)
}

// callerIsStore reports whether the caller of a request proved, with a
// verified certificate valid for serving, that it is a store rather than
// a client (hedgekv certs gives clients a client-only certificate). Without
// TLS nobody proves anything.
func callerIsStore(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return false
	}
	leaf := info.State.VerifiedChains[0][0]
	// No extended key usage at all means any usage.
	return len(leaf.ExtKeyUsage) == 0 || slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) ||
		slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny)
}

// CertFiles names the files GenerateCerts writes, all PEM.
type CertFiles struct {
	CA string
	// Node and NodeKey: a store's certificate, valid for serving (for the
	// hosts given) and for dialing peers. Every store of a local cluster
	// may share it.
	Node, NodeKey string
	// Client and ClientKey: a client-only certificate for the CLI and
	// applications.
	Client, ClientKey string
}

// CertFilesIn names the files GenerateCerts writes in dir.
func CertFilesIn(dir string) CertFiles {
	return CertFiles{
		CA:        filepath.Join(dir, "ca.pem"),
		Node:      filepath.Join(dir, "node.pem"),
		NodeKey:   filepath.Join(dir, "node-key.pem"),
		Client:    filepath.Join(dir, "client.pem"),
		ClientKey: filepath.Join(dir, "client-key.pem"),
	}
}

// certValidity is how long generated certificates last: long enough that
// a demo or test cluster never sees one expire.
const certValidity = 5 * 365 * 24 * time.Hour

// GenerateCerts makes a fresh CA (ECDSA P-256) and signs with it one store
// certificate for hosts (IP addresses or DNS names) and one client
// certificate, writing them to dir (CertFilesIn). The CA's key is not
// kept: a new set means a new CA. It refuses to overwrite existing files
// unless overwrite is set, since stores running on the old CA would stop
// trusting anything signed by a new one.
func GenerateCerts(dir string, hosts []string, overwrite bool) (CertFiles, error) {
	files := CertFilesIn(dir)
	var sans []string
	for _, h := range hosts {
		if h = strings.TrimSpace(h); h != "" {
			sans = append(sans, h)
		}
	}
	if len(sans) == 0 {
		return files, errors.New("certs: no host to issue the store certificate for")
	}
	if !overwrite {
		for _, f := range []string{files.CA, files.Node, files.NodeKey, files.Client, files.ClientKey} {
			if _, err := os.Stat(f); err == nil {
				return files, fmt.Errorf("certs: %s exists (overwrite to replace the whole set)", f)
			}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return files, fmt.Errorf("certs: %w", err)
	}
	now := time.Now().Add(-time.Hour) // tolerate clocks a little behind
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return files, fmt.Errorf("certs: CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "hedgekv CA"},
		NotBefore:             now,
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caCert, caDER, err := signCert(caTmpl, nil, &caKey.PublicKey, caKey)
	if err != nil {
		return files, err
	}
	node := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "hedgekv store"},
		NotBefore:   now,
		NotAfter:    now.Add(certValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range sans {
		if ip := net.ParseIP(h); ip != nil {
			node.IPAddresses = append(node.IPAddresses, ip)
		} else {
			node.DNSNames = append(node.DNSNames, h)
		}
	}
	cli := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "hedgekv client"},
		NotBefore:   now,
		NotAfter:    now.Add(certValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := writePEM(files.CA, "CERTIFICATE", caDER, 0o644); err != nil {
		return files, err
	}
	for _, leaf := range []struct {
		tmpl      *x509.Certificate
		cert, key string
	}{{node, files.Node, files.NodeKey}, {cli, files.Client, files.ClientKey}} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return files, fmt.Errorf("certs: key: %w", err)
		}
		_, der, err := signCert(leaf.tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return files, err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return files, fmt.Errorf("certs: marshal key: %w", err)
		}
		if err := writePEM(leaf.key, "PRIVATE KEY", keyDER, 0o600); err != nil {
			return files, err
		}
		if err := writePEM(leaf.cert, "CERTIFICATE", der, 0o644); err != nil {
			return files, err
		}
	}
	return files, nil
}

// signCert signs tmpl with parent's key (self-signed when parent is nil),
// giving it a random serial number.
func signCert(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) (*x509.Certificate, []byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("certs: serial: %w", err)
	}
	tmpl.SerialNumber = serial
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: sign %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: parse %q: %w", tmpl.Subject.CommonName, err)
	}
	return cert, der, nil
}

// writePEM writes one PEM block to file with mode perm, replacing it
// through a temporary file so a reader never sees half a key.
func writePEM(file, blockType string, der []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), ".tmp-"+filepath.Base(file)+"-*")
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("certs: %w", err)
	}
	if err := pem.Encode(tmp, &pem.Block{Type: blockType, Bytes: der}); err != nil {
		tmp.Close()
		return fmt.Errorf("certs: write %s: %w", file, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("certs: write %s: %w", file, err)
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}
