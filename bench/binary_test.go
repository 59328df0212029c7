//go:build unix

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// builtBinary is the hedgekv binary built for this run of the package's
// tests: by the first test that needs one, then shared by the others
// (each build links the whole binary again, seconds of CPU each on a
// loaded machine), and removed by TestMain once every test has ended.
var builtBinary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// hedgekvBinary is the hedgekv binary the process tests run: $HEDGEKV_BIN
// if set (make smoke-test builds it), otherwise built here, once per run
// of the package's tests, so the tests run wherever Go does.
func hedgekvBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HEDGEKV_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("HEDGEKV_BIN=%s: %v", p, err)
		}
		return p
	}
	b := &builtBinary
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "hedgekv-bench-bin-"); b.err != nil {
			return
		}
		bin := filepath.Join(b.dir, "hedgekv")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/hedgekv")
		cmd.Dir = ".." // the repository root, from bench/
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build ./cmd/hedgekv: %v\n%s", err, out)
			return
		}
		b.path = bin
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// The scenario tests (a cluster of processes or an in-process cluster
// each, on ports of their own) call t.Parallel: go test runs them after
// the others, -parallel (GOMAXPROCS: two on 2 cores) at a time. Most of
// their time is waiting, on simulated WAN delays, run durations, idle
// windows and process starts, so two at a time take about two thirds of
// the time one at a time did; none may check a timing that a loaded
// machine misses (CI runs this package beside others anyway).
func TestMain(m *testing.M) {
	code := m.Run()
	if builtBinary.dir != "" {
		os.RemoveAll(builtBinary.dir)
	}
	os.Exit(code)
}
