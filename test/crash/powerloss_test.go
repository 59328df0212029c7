package crash

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/replicacheck"
	"github.com/hedgekv/hedgekv/test/lossyfs"
	"github.com/hedgekv/hedgekv/test/testbin"
)

// The power-loss tests: each store's data directory is the root of its
// own lossyfs mount (a FUSE file system that keeps what was not fsynced in
// memory, in this test process), and a cut is SIGKILL of the chosen stores,
// lossyfs Cut of their mounts (a power loss: CutAll, CutTorn and
// CutRandomPages in turn), and a restart. CRASH_CUTS (default 10; 50 for
// the reliability figures) sets how many cuts each test makes. After the
// cuts: no acknowledged write lost, every store boots, the replicas agree
// (replicacheck, what `hedgekv ctl check` runs), every bbolt file passes
// bbolt's check, and no store voted for two candidates in one term across
// all its incarnations (its "vote granted" log lines).

// TestPowerLossOneStore cuts the power of the same store (store 1) again
// and again.
func TestPowerLossOneStore(t *testing.T) {
	runPowerLoss(t, func(int, *rand.Rand) []uint64 { return []uint64{1} })
}

// TestPowerLossMinority cuts a random minority each time: with three
// stores a minority is one store, a different one from cut to cut.
func TestPowerLossMinority(t *testing.T) {
	runPowerLoss(t, func(_ int, rng *rand.Rand) []uint64 { return []uint64{uint64(1 + rng.IntN(3))} })
}

// TestPowerLossAllStores cuts the power of all three stores at once: what
// each acknowledged before the cut must be on its disk alone.
func TestPowerLossAllStores(t *testing.T) {
	runPowerLoss(t, func(int, *rand.Rand) []uint64 { return []uint64{1, 2, 3} })
}

func cutCount() int {
	if v, err := strconv.Atoi(os.Getenv("CRASH_CUTS")); err == nil && v > 0 {
		return v
	}
	return 10
}

var cutModes = []lossyfs.CutMode{lossyfs.CutAll, lossyfs.CutTorn, lossyfs.CutRandomPages}

func runPowerLoss(t *testing.T, pick func(i int, rng *rand.Rand) []uint64) {
	cuts := cutCount()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %d cuts", seed, cuts)
	rng := rand.New(rand.NewPCG(seed, 2))
	pc := startPowerCluster(t, seed, cluster.ProcessesConfig{})
	w := startWriters(pc.cli, 4)
	defer w.stop() // also when a restart fails
	for i := range cuts {
		mode := cutModes[i%len(cutModes)]
		stores := pick(i, rng)
		time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond) // under load
		for _, s := range stores {
			if err := pc.c.Kill(s); err != nil {
				t.Fatalf("cut %d: kill store %d: %v", i, s, err)
			}
		}
		label := fmt.Sprintf("cut %d (%v of stores %v)", i, mode, stores)
		dropped := pc.cutMounts(label, mode, stores...)
		pc.restart(label, stores...)
		t.Logf("cut %d: %v of stores %v (%s); %d writes acknowledged so far", i, mode, stores, strings.Join(dropped, "; "), w.ackedCount())
	}
	time.Sleep(500 * time.Millisecond)
	w.stop()
	pc.check(fmt.Sprintf("%d power cuts under write load", cuts), w)
}

// powerCluster is three stores, each with its data directory the root of
// its own lossyfs mount, and a client.
type powerCluster struct {
	t      *testing.T
	mounts map[uint64]*lossyfs.FS
	c      *cluster.Processes
	cli    *client.Client
}

// startPowerCluster mounts the three file systems and starts the stores
// on them (cfg's Dir, DataDirs, LogLevel and ReadyTimeout are set here).
// With cfg.NoWait the stores are only launched: the caller waits for them
// and calls connect.
func startPowerCluster(t *testing.T, seed uint64, cfg cluster.ProcessesConfig) *powerCluster {
	t.Helper()
	return startPowerClusterHooked(t, seed, cfg, nil)
}

// startPowerClusterHooked is startPowerCluster with hooks on the stores'
// mounts from the start (by store id).
func startPowerClusterHooked(t *testing.T, seed uint64, cfg cluster.ProcessesConfig, hooks map[uint64]lossyfs.Hook) *powerCluster {
	t.Helper()
	root := t.TempDir()
	pc := &powerCluster{t: t, mounts: map[uint64]*lossyfs.FS{}}
	cfg.DataDirs = nil
	for s := uint64(1); s <= 3; s++ {
		backing, mnt := filepath.Join(root, fmt.Sprintf("disk%d", s)), filepath.Join(root, fmt.Sprintf("mnt%d", s))
		// Mounted before the stores start: the cleanups run in reverse,
		// so the stores are stopped before their mounts go.
		pc.mounts[s] = lossyfs.MountT(t, backing, mnt, lossyfs.Options{Seed: seed + s, OnOp: hooks[s]})
		cfg.DataDirs = append(cfg.DataDirs, mnt)
	}
	cfg.Dir = filepath.Join(root, "logs")
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.LogLevel, cfg.ReadyTimeout = "info", readyTimeout
	pc.c = testbin.StartProcesses(t, "hedgekv-powerloss-bin-", cfg)
	if !cfg.NoWait {
		pc.connect()
	}
	return pc
}

// connect makes the cluster's client (closed in t.Cleanup).
func (pc *powerCluster) connect() {
	pc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cli, err := client.New(ctx, client.Config{Endpoints: pc.c.Endpoints, RequestTimeout: 3 * time.Second})
	cancel()
	if err != nil {
		pc.t.Fatal(err)
	}
	pc.cli = cli
	pc.t.Cleanup(func() { cli.Close() })
}

// cutMounts cuts the power of the stores' file systems (their processes
// must have exited) and returns what each cut dropped.
func (pc *powerCluster) cutMounts(label string, mode lossyfs.CutMode, stores ...uint64) []string {
	pc.t.Helper()
	var dropped []string
	for _, s := range stores {
		if err := pc.mounts[s].Cut(mode); err != nil {
			pc.t.Fatalf("%s: store %d's file system: %v", label, s, err)
		}
		dropped = append(dropped, fmt.Sprintf("store %d: %v", s, pc.mounts[s].LastCut()))
	}
	return dropped
}

// restart starts the stores again and waits until each is ready.
func (pc *powerCluster) restart(label string, stores ...uint64) {
	pc.t.Helper()
	for _, s := range stores {
		if err := pc.c.Start(s); err != nil {
			pc.t.Fatalf("%s: restart store %d: %v", label, s, err)
		}
	}
	for _, s := range stores {
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		err := pc.c.WaitReady(ctx, s)
		cancel()
		if err != nil {
			pc.t.Fatalf("%s: store %d did not come back: %v; its log ends with:\n%s",
				label, s, err, logTail(pc.c.LogPath(s), 30))
		}
	}
}

// check runs the end-of-test checks: every write the writers had
// acknowledged is read back, the replicas agree, no store voted twice in
// a term, and, the stores stopped and the file systems unmounted (one
// more power cut), every bbolt file passes bbolt's check.
func (pc *powerCluster) check(what string, ws ...*writers) {
	t := pc.t
	t.Helper()
	acked, lost := 0, 0
	var failed int64
	for _, w := range ws {
		w.stop()
		lost += w.lostWrites(t, pc.cli)
		acked += len(w.acked)
		failed += w.failed.Load()
	}
	t.Logf("%s: %d writes acknowledged, %d not (timed out or refused), %d acknowledged writes lost",
		what, acked, failed, lost)
	if acked == 0 {
		t.Error("no write was acknowledged")
	}

	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	rep, err := replicacheck.Check(cctx, pc.cli, 50*time.Millisecond)
	ccancel()
	if err != nil {
		t.Errorf("replica check: %v", err)
	} else {
		t.Logf("replica check: %d regions agree", len(rep.Agreed))
	}

	checkVotes(t, pc.c)

	// Every store's bbolt file passes bbolt's check: the stores stopped,
	// each file system unmounted (what was not fsynced is dropped: one more
	// power cut), the check runs on the backing directory, which holds the
	// durable state (never on the mount: this process serves it, and an
	// mmap of its own mount could deadlock it).
	pc.c.Stop()
	for s, m := range pc.mounts {
		if err := m.Unmount(); err != nil {
			t.Errorf("store %d: %v", s, err)
		}
		if err := checkBolt(filepath.Join(m.BackingDir(), "store.db")); err != nil {
			t.Errorf("store %d: %v", s, err)
		}
	}
}

func (w *writers) ackedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

var voteLine = regexp.MustCompile(`msg="vote granted".* region=(\d+) term=(\d+) candidate=(\d+)`)

// checkVotes fails the test if a store granted its vote (to another
// candidate or to itself) to two candidates in one term of one region,
// across every incarnation of the store (its log is appended to by each).
func checkVotes(t *testing.T, c *cluster.Processes) {
	t.Helper()
	total := 0
	for _, s := range c.StoreIDs() {
		f, err := os.Open(c.LogPath(s))
		if err != nil {
			t.Errorf("store %d: %v", s, err)
			continue
		}
		type key struct{ region, term string }
		votes := map[key]string{}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			m := voteLine.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			total++
			k := key{m[1], m[2]}
			if prev, ok := votes[k]; ok && prev != m[3] {
				t.Errorf("store %d voted twice in region %s term %s: for peer %s and for peer %s", s, m[1], m[2], prev, m[3])
				continue
			}
			votes[k] = m[3]
		}
		f.Close()
	}
	t.Logf("vote lines checked: %d", total)
	if total == 0 {
		t.Error("no vote granted was logged: the double-vote check saw nothing")
	}
}
