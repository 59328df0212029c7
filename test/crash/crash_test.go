// Package crash kills stores with kill -9 under write load, again and
// again, and then checks that no acknowledged write was lost and that every
// store's bbolt file passes bbolt's own consistency check (Tx.Check, what
// `bbolt check` runs). Three `hedgekv server` processes are started by the
// cluster package's process launcher on free ports; CRASH_KILLS (default
// 10; 50 for the reliability figures) sets how many kills. powerloss_test.go
// cuts the power instead (lossyfs: what was not fsynced is lost).
package crash

import (
	"bytes"
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
	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/test/testbin"
)

// readyTimeout bounds the start of the cluster and each restart of a store.
const readyTimeout = 60 * time.Second

func TestKillUnderWriteLoad(t *testing.T) {
	kills := 10
	if v, err := strconv.Atoi(os.Getenv("CRASH_KILLS")); err == nil && v > 0 {
		kills = v
	}
	c := startStores(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cli, err := client.New(ctx, client.Config{Endpoints: c.Endpoints, RequestTimeout: 3 * time.Second})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	w := startWriters(cli, 4)
	defer w.stop() // also when a restart fails
	killAndRestart(t, c, kills)
	w.stop()

	lost := w.lostWrites(t, cli)
	t.Logf("%d kill -9s under write load: %d writes acknowledged, %d not (timed out or refused), %d acknowledged writes lost",
		kills, len(w.acked), w.failed.Load(), lost)
	if len(w.acked) == 0 {
		t.Fatal("no write was acknowledged")
	}
	checkReplayed(t, c, kills)

	// Every store's file passes bbolt's consistency check.
	c.Stop()
	for _, s := range c.StoreIDs() {
		if err := checkBolt(filepath.Join(c.DataDir(s), "store.db")); err != nil {
			t.Errorf("store %d: %v", s, err)
		}
	}
}

// startStores starts three stores, data and logs in a directory of the
// test's, kept after the stores stop for the bbolt check.
func startStores(t *testing.T) *cluster.Processes {
	t.Helper()
	// Info: the log says when a restart replayed the round log.
	return testbin.StartProcesses(t, "hedgekv-crash-bin-", cluster.ProcessesConfig{
		Dir: t.TempDir(), LogLevel: "info", ReadyTimeout: readyTimeout,
	})
}

// writers write every key once, with its own value; a write is recorded
// only once acknowledged.
type writers struct {
	mu     sync.Mutex
	acked  map[string]string // key -> the value's head (value(head) is the value)
	prefix string            // of every key
	pad    int               // bytes of padding after each value's head
	failed atomic.Int64
	done   chan struct{}
	wg     sync.WaitGroup
	stop   func() // ends the writers and waits for them; more than once is fine
}

func startWriters(cli *client.Client, n int) *writers {
	return startWritersPadded(cli, n, "crash", 0)
}

// startWritersPadded starts n writers whose keys start with prefix and
// whose values carry pad bytes more (large values fill the round log and
// make snapshots of megabytes).
func startWritersPadded(cli *client.Client, n int, prefix string, pad int) *writers {
	w := &writers{acked: map[string]string{}, done: make(chan struct{}), prefix: prefix, pad: pad}
	w.stop = sync.OnceFunc(func() {
		close(w.done)
		w.wg.Wait()
	})
	for i := range n {
		w.wg.Go(func() { w.write(cli, i) })
	}
	return w
}

func (w *writers) write(cli *client.Client, id int) {
	for n := 0; n < 1_000_000; n++ {
		select {
		case <-w.done:
			return
		default:
		}
		key, val := fmt.Sprintf("%s/%d/%06d", w.prefix, id, n), fmt.Sprintf("v%d.%d", id, n)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err := cli.Put(ctx, []byte(key), w.value(val))
		cancel()
		if err != nil {
			w.failed.Add(1)
			continue
		}
		w.mu.Lock()
		w.acked[key] = val
		w.mu.Unlock()
	}
}

// value is the value written with head: head and w.pad bytes after it.
func (w *writers) value(head string) []byte {
	v := make([]byte, len(head)+w.pad)
	copy(v, head)
	for i := len(head); i < len(v); i++ {
		v[i] = 'a' + byte(i%26)
	}
	return v
}

// killAndRestart kills a random store with kill -9, kills times, and
// starts it again, waiting until it is ready (has caught up) each time.
func killAndRestart(t *testing.T, c *cluster.Processes, kills int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for i := range kills {
		store := uint64(1 + rng.IntN(3))
		if err := c.Kill(store); err != nil {
			t.Fatalf("kill %d (store %d): %v", i, store, err)
		}
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		err := c.Start(store)
		if err == nil {
			err = c.WaitReady(ctx, store)
		}
		cancel()
		if err != nil {
			t.Fatalf("restart %d (store %d): %v; its log ends with:\n%s", i, store, err, logTail(c.LogPath(store), 20))
		}
		time.Sleep(time.Duration(200+rng.IntN(400)) * time.Millisecond)
	}
}

// lostWrites reads every acknowledged write back, linearizably, and
// returns how many are missing or wrong (the first ten fail the test).
func (w *writers) lostWrites(t *testing.T, cli *client.Client) int {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	lost := 0
	for key, want := range w.acked {
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
		if err != nil || !bytes.Equal(got, w.value(want)) {
			lost++
			if lost <= 10 {
				t.Errorf("acknowledged %s=%s (+%d bytes): read %q, %v", key, want, w.pad, got[:min(len(got), 64)], err)
			}
		}
	}
	return lost
}

// checkReplayed: a restart after a kill goes back to the last checkpoint
// and replays the round log after it (raftstore/checkpoint.go); the kills
// must have exercised that path, not only clean checkpoints.
func checkReplayed(t *testing.T, c *cluster.Processes, kills int) {
	t.Helper()
	replays := 0
	for _, s := range c.StoreIDs() {
		b, _ := os.ReadFile(c.LogPath(s))
		replays += strings.Count(string(b), "replayed the round log")
	}
	t.Logf("restarts that replayed WAL records after the checkpoint: %d", replays)
	if kills >= 10 && replays == 0 {
		t.Error("no restart replayed the round log: the recovery path went untested")
	}
}

// logTail is the last n lines of the file at path.
func logTail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
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
