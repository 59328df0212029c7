// Package crash kills stores with kill -9 under write load, again and
// again, and then checks that no acknowledged write was lost and that every
// store's bbolt file passes bbolt's own consistency check (Tx.Check, what
// `bbolt check` runs). Three `hedgekv server` processes are started by
// scripts/cluster.sh on free ports; CRASH_KILLS (default 10; 50 for the
// reliability figures) sets how many kills.
package crash

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/test/testbin"
)

const scriptTimeout = 90 * time.Second

func TestKillUnderWriteLoad(t *testing.T) {
	kills := 10
	if v, err := strconv.Atoi(os.Getenv("CRASH_KILLS")); err == nil && v > 0 {
		kills = v
	}
	b, err := testbin.Locate("hedgekv-crash-bin-")
	if err != nil {
		t.Fatalf("crash setup: %v", err)
	}
	defer b.Close()
	block, err := testbin.FreeBlock()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	env := append(append(os.Environ(), "BIN="+b.Path, "CLUSTER_DIR="+dir), block.Env()...)
	env = append(env, "FAULTS=0", "TICK=", "START_TIMEOUT=60")
	script := func(args ...string) testbin.Result {
		return testbin.ClusterScript(b.RepoRoot, scriptTimeout, env, args...)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			script("stop")
		}
	})
	if r := script("start"); r.Err != nil {
		t.Fatalf("cluster.sh start: %v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cli, err := client.New(ctx, client.Config{Endpoints: block.GRPCAddrs, RequestTimeout: 3 * time.Second})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	// Writers: every key is written once, with its own value; a write is
	// recorded only once acknowledged.
	var (
		mu     sync.Mutex
		acked  = map[string]string{}
		failed atomic.Int64
		stop   = make(chan struct{})
		wg     sync.WaitGroup
	)
	for w := range 4 {
		wg.Go(func() {
			for n := 0; n < 1_000_000; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key, val := fmt.Sprintf("crash/%d/%06d", w, n), fmt.Sprintf("v%d.%d", w, n)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				err := cli.Put(ctx, []byte(key), []byte(val))
				cancel()
				if err != nil {
					failed.Add(1)
					continue
				}
				mu.Lock()
				acked[key] = val
				mu.Unlock()
			}
		})
	}

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for i := range kills {
		store := 1 + rng.IntN(3)
		if r := script("kill", strconv.Itoa(store)); r.Err != nil {
			t.Fatalf("kill %d (store %d): %v", i, store, r)
		}
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		if r := script("restart", strconv.Itoa(store)); r.Err != nil {
			t.Fatalf("restart %d (store %d): %v", i, store, r)
		}
		time.Sleep(time.Duration(200+rng.IntN(400)) * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	// Every acknowledged write is there, read linearizably.
	mu.Lock()
	defer mu.Unlock()
	lost := 0
	for key, want := range acked {
		var got []byte
		var err error
		for try := 0; try < 5; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			got, err = cli.Get(ctx, []byte(key))
			cancel()
			if err == nil || errors.Is(err, client.ErrNotFound) {
				break
			}
		}
		if err != nil || string(got) != want {
			lost++
			if lost <= 10 {
				t.Errorf("acknowledged %s=%s: read %q, %v", key, want, got, err)
			}
		}
	}
	t.Logf("%d kill -9s under write load: %d writes acknowledged, %d not (timed out or refused), %d acknowledged writes lost",
		kills, len(acked), failed.Load(), lost)
	if len(acked) == 0 {
		t.Fatal("no write was acknowledged")
	}
	// A restart after a kill goes back to the last checkpoint and replays
	// the round log after it (raftstore/checkpoint.go); the kills above
	// must have exercised that path, not only clean checkpoints.
	replays := 0
	for s := 1; s <= 3; s++ {
		b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("store%d.log", s)))
		replays += strings.Count(string(b), "replayed the round log")
	}
	t.Logf("restarts that replayed WAL records after the checkpoint: %d", replays)
	if kills >= 10 && replays == 0 {
		t.Error("no restart replayed the round log: the recovery path went untested")
	}

	// Every store's file passes bbolt's consistency check.
	if r := script("stop"); r.Err != nil {
		t.Fatalf("cluster.sh stop: %v", r)
	}
	stopped = true
	for s := 1; s <= 3; s++ {
		path := filepath.Join(dir, fmt.Sprintf("store%d", s), "store.db")
		if err := checkBolt(path); err != nil {
			t.Errorf("store %d: %v", s, err)
		}
	}
}

// checkBolt runs bbolt's consistency check on the file at path.
func checkBolt(path string) error {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	return db.View(func(tx *bbolt.Tx) error {
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		if len(errs) > 0 {
			return fmt.Errorf("bbolt check of %s: %w", path, errors.Join(errs...))
		}
		return nil
	})
}
