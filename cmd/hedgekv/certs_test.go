package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// makeCerts runs hedgekv certs into a new directory and returns it.
func makeCerts(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tls")
	code, stdout, stderr := runCLI(t, "certs", "--dir", dir, "--hosts", "127.0.0.1,localhost")
	if code != exitOK || stderr != "" {
		t.Fatalf("certs: exit %d, stderr %q", code, stderr)
	}
	if !strings.Contains(stdout, "client flags: --tls-cert "+filepath.Join(dir, "client.pem")) {
		t.Fatalf("certs stdout %q does not give the client flags", stdout)
	}
	return dir
}

// runServerCmd runs `hedgekv server ARGS` in the background until the test
// ends, and waits until its gRPC port accepts connections.
func runServerCmd(t *testing.T, addr string, args ...string) {
	t.Helper()
	prev := slog.Default() // the server command replaces it
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"server"}, args...), &logs, &logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("server exit %d; log:\n%s", code, logs.String())
			}
		case <-time.After(20 * time.Second):
			t.Errorf("server did not stop; log:\n%s", logs.String())
		}
		slog.SetDefault(prev)
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case code := <-done:
			t.Fatalf("server exited early with %d; log:\n%s", code, logs.String())
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not listening on %s; log:\n%s", addr, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCertsCommand(t *testing.T) {
	dir := makeCerts(t)
	for _, f := range []string{"ca.pem", "node.pem", "node-key.pem", "client.pem", "client-key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	code, _, stderr := runCLI(t, "certs", "--dir", dir)
	if code != exitFailure || !strings.Contains(stderr, "exists") {
		t.Errorf("certs into a used directory: exit %d, stderr %q; want %d saying the files exist", code, stderr, exitFailure)
	}
	oneLine(t, stderr)
	if code, _, stderr := runCLI(t, "certs", "--dir", dir, "--force"); code != exitOK {
		t.Errorf("certs --force: exit %d, stderr %q", code, stderr)
	}
	for _, args := range [][]string{{"certs"}, {"certs", "--dir", dir, "--hosts", " , "}} {
		code, _, stderr := runCLI(t, args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
		oneLine(t, stderr)
	}
}

// TestTLSFlagErrors: every wrong combination of TLS flags fails in one
// line, before anything is dialed or served.
func TestTLSFlagErrors(t *testing.T) {
	dir := makeCerts(t)
	ca, cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	missing := filepath.Join(dir, "missing.pem")
	serverArgs := []string{"server", "--id", "1", "--peers", "1=" + closedAddr(t), "--data-dir", t.TempDir()}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"get", "k", "--tls-cert", cert}, exitUsage, "--tls-key and --tls-ca missing"},
		{[]string{"get", "k", "--tls-cert", cert, "--tls-ca", ca}, exitUsage, "--tls-key missing"},
		{[]string{"get", "k", "--tls-ca", ca}, exitUsage, "--tls-cert and --tls-key missing"},
		{[]string{"get", "k", "--tls-cert", missing, "--tls-key", key, "--tls-ca", ca}, exitFailure, "no such file"},
		{[]string{"get", "k", "--tls-cert", cert, "--tls-key", key, "--tls-ca", missing}, exitFailure, "no such file"},
		{[]string{"get", "k", "--tls-cert", cert, "--tls-key", filepath.Join(dir, "node-key.pem"), "--tls-ca", ca}, exitFailure, "private key does not match"},
		{append(serverArgs, "--tls-cert", filepath.Join(dir, "node.pem")), exitUsage, "--tls-key and --tls-ca missing"},
		{append(serverArgs, "--tls-cert", missing, "--tls-key", key, "--tls-ca", ca), exitFailure, "no such file"},
		// A client-only certificate cannot serve.
		{append(serverArgs, "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca), exitFailure, "not a store certificate"},
	} {
		code, stdout, stderr := runCLI(t, tc.args...)
		if code != tc.code || stdout != "" || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d mentioning %q", tc.args, code, stdout, stderr, tc.code, tc.want)
		}
		oneLine(t, stderr)
	}
}

// TestServerTLSCommand: `hedgekv server` with the TLS flags and
// --disable-admin serves the CLI with the client certificate, refuses
// clients without one the CA signed with Unauthenticated, and refuses
// splits with PermissionDenied.
func TestServerTLSCommand(t *testing.T) {
	dir := makeCerts(t)
	other := makeCerts(t)
	addr := closedAddr(t)
	runServerCmd(t, addr, "--id", "1", "--peers", "1="+addr, "--data-dir", t.TempDir(), "--tick", "10ms", "--log-level", "warn",
		"--disable-admin",
		"--tls-cert", filepath.Join(dir, "node.pem"), "--tls-key", filepath.Join(dir, "node-key.pem"), "--tls-ca", filepath.Join(dir, "ca.pem"))
	ep := "--endpoints=" + addr
	tlsFlags := func(d string) []string {
		return []string{"--tls-cert", filepath.Join(d, "client.pem"), "--tls-key", filepath.Join(d, "client-key.pem"), "--tls-ca", filepath.Join(dir, "ca.pem")}
	}
	withTLS := func(d string, args ...string) []string { return append(append(args, ep), tlsFlags(d)...) }

	// The store elects itself within a few ticks; the put retries until then.
	if code, stdout, stderr := runCLI(t, withTLS(dir, "put", "k", "v")...); code != exitOK {
		t.Fatalf("put over TLS: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if code, stdout, stderr := runCLI(t, withTLS(dir, "get", "k")...); code != exitOK || stdout != "v\n" {
		t.Fatalf("get over TLS: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if code, _, stderr := runCLI(t, withTLS(dir, "ctl", "regions")...); code != exitOK {
		t.Fatalf("ctl regions with --disable-admin: exit %d, stderr %q", code, stderr)
	}

	code, _, stderr := runCLI(t, withTLS(dir, "ctl", "split", "m")...)
	if code != exitFailure || !strings.Contains(stderr, "PermissionDenied") || !strings.Contains(stderr, "--disable-admin") {
		t.Errorf("ctl split with --disable-admin: exit %d, stderr %q; want PermissionDenied naming --disable-admin", code, stderr)
	}
	oneLine(t, stderr)

	code, _, stderr = runCLI(t, withTLS(other, "get", "k", "--timeout", "3s")...)
	if code != exitFailure || !strings.Contains(stderr, "Unauthenticated") {
		t.Errorf("client certificate of another CA: exit %d, stderr %q; want Unauthenticated", code, stderr)
	}
	oneLine(t, stderr)

	// Without TLS the client cannot tell a TLS port from a broken one.
	code, _, stderr = runCLI(t, "get", "k", ep, "--timeout", "2s")
	if code != exitFailure || !strings.Contains(stderr, "need --tls-cert") {
		t.Errorf("plaintext client: exit %d, stderr %q; want a hint at the TLS flags", code, stderr)
	}
	oneLine(t, stderr)
}
