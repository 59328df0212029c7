package client

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfSigned writes a self-signed certificate and its key to dir and
// returns their paths (a CA is all LoadTLS needs to check).
func selfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func TestLoadTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	cfg, err := LoadTLS(cert, key, cert)
	if err != nil || len(cfg.Certificates) != 1 || cfg.RootCAs == nil {
		t.Fatalf("LoadTLS: %+v, %v", cfg, err)
	}
	if cfg, err := LoadTLS("", "", cert); err != nil || len(cfg.Certificates) != 0 {
		t.Fatalf("CA only: %+v, %v", cfg, err)
	}
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("nothing"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, cert, key, ca, want string
	}{
		{"no CA", cert, key, "", "CA file is needed"},
		{"cert without key", cert, "", cert, "go together"},
		{"key without cert", "", key, cert, "go together"},
		{"missing CA", cert, key, filepath.Join(dir, "nope.pem"), "no such file"},
		{"CA not PEM", cert, key, garbage, "no PEM certificate"},
		{"missing cert", filepath.Join(dir, "nope.pem"), key, cert, "no such file"},
		{"key not PEM", cert, garbage, cert, "load certificate"},
	} {
		if _, err := LoadTLS(tc.cert, tc.key, tc.ca); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}
