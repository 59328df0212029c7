// Package testbin serves the multi-process tests: it finds the repository
// and the hedgekv binary ($HEDGEKV_BIN if set, make test builds it once;
// otherwise a fresh `go build` into a temporary directory), starts stores
// as processes (StartProcesses, on cluster.Processes), runs commands and
// scripts/cluster.sh on free ports (cluster.go), and reads the CLI's JSON
// (ctljson.go).
package testbin

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/cluster"
)

// Binary is what a multi-process test runs.
type Binary struct {
	RepoRoot string // absolute path of the repository
	Path     string // the hedgekv binary
	cleanup  func()
}

// Close removes a binary this package built.
func (b *Binary) Close() {
	if b.cleanup != nil {
		b.cleanup()
	}
}

// Locate finds the repository root from a test directory two levels below
// it (test/NAME) and the binary; tmpPrefix names the build directory.
func Locate(tmpPrefix string) (*Binary, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return nil, fmt.Errorf("repository root not found from the test directory: %w", err)
	}
	b := &Binary{RepoRoot: root}
	if p := os.Getenv("HEDGEKV_BIN"); p != "" {
		if !filepath.IsAbs(p) {
			p = filepath.Join(root, p)
		}
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("HEDGEKV_BIN=%s: %w", p, err)
		}
		b.Path = p
		return b, nil
	}
	dir, err := os.MkdirTemp("", tmpPrefix)
	if err != nil {
		return nil, err
	}
	b.cleanup = func() { os.RemoveAll(dir) }
	b.Path = filepath.Join(dir, "hedgekv")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", b.Path, "./cmd/hedgekv")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Close()
		return nil, fmt.Errorf("go build ./cmd/hedgekv: %v\n%s", err, out)
	}
	return b, nil
}

// StartProcesses starts a cluster of hedgekv server processes for a test
// (cluster.StartProcesses with cfg), on free ports below the kernel's
// ephemeral range unless cfg.Ports names others, so that a stopped or
// killed store's port stays free until its restart. The binary is found
// as Locate finds it (tmpPrefix names its build directory); the cluster
// stops, and the binary goes, when the test ends.
func StartProcesses(t testing.TB, tmpPrefix string, cfg cluster.ProcessesConfig) *cluster.Processes {
	t.Helper()
	b, err := Locate(tmpPrefix)
	if err != nil {
		t.Fatalf("test setup: %v", err)
	}
	t.Cleanup(b.Close)
	cfg.Binary = b.Path
	if len(cfg.Ports) == 0 {
		n := len(cfg.Zones)
		if n == 0 {
			n = 3 // the launcher's default
		}
		if cfg.Ports, err = FreePorts(2 * n); err != nil {
			t.Fatal(err)
		}
	}
	timeout := cmp.Or(cfg.ReadyTimeout, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := cluster.StartProcesses(ctx, cfg)
	if err != nil {
		t.Fatalf("start the stores: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}
