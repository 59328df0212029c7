package crash

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/test/lossyfs"
)

// Power cuts at chosen moments: a lossyfs hook on one store's mount
// watches its file-system operations, and at the chosen one (the rename
// of a checkpoint, the first write of a received snapshot, the creation
// of a round-log segment...) it kills the store with SIGKILL (the store's
// thread is blocked in that very FUSE request; a fatal signal ends the
// wait) and fails that operation and every later one with EIO. The test
// then waits for the process to exit, cuts the mount's power (Cut) and
// starts the store again; at the end, the checks of the random power
// cuts (powerloss_test.go): no acknowledged write lost, every store boots,
// the replicas agree, no store voted twice in a term, bbolt's check.
// MOMENT_REPEATS (default 1) repeats each test's cuts.

// errCut fails every operation of a mount from its moment on.
var errCut = errors.New("power cut at the chosen moment")

// momentWait bounds the wait for a moment to come.
const momentWait = 90 * time.Second

func momentRepeats() int {
	if v, err := strconv.Atoi(os.Getenv("MOMENT_REPEATS")); err == nil && v > 0 {
		return v
	}
	return 1
}

// matcher says whether an operation is the moment; it is called under
// the trap's lock, one operation at a time, so it may keep state.
type matcher func(op lossyfs.Op, p string) bool

// is matches operations of kind on a path matching glob.
func is(kind lossyfs.OpKind, glob string) matcher {
	return func(op lossyfs.Op, p string) bool {
		ok, _ := path.Match(glob, p)
		return op.Kind == kind && ok
	}
}

// nth matches the nth operation m matches.
func nth(n int, m matcher) matcher {
	seen := 0
	return func(op lossyfs.Op, p string) bool {
		if m(op, p) {
			seen++
			return seen == n
		}
		return false
	}
}

// after matches the first operation m matches once first has matched one.
func after(first, m matcher) matcher {
	armed := false
	return func(op lossyfs.Op, p string) bool {
		if armed && m(op, p) {
			return true
		}
		if first(op, p) {
			armed = true
		}
		return false
	}
}

// trap is a hook that cuts the power at the first operation match matches.
type trap struct {
	what  string
	match matcher
	mu    sync.Mutex
	fired bool
	hit   chan string // what was hit, once
}

func newTrap(what string, m matcher) *trap {
	return &trap{what: what, match: m, hit: make(chan string, 1)}
}

// hook runs in the FUSE server: it kills the caller and fails the
// operation, and never waits for the process or calls Cut (the process
// cannot exit while a request of its own is being served).
func (tr *trap) hook(op lossyfs.Op, p string) error {
	tr.mu.Lock()
	if tr.fired {
		tr.mu.Unlock()
		return errCut
	}
	if !tr.match(op, p) {
		tr.mu.Unlock()
		return nil
	}
	tr.fired = true
	tr.mu.Unlock()
	pid := processOf(int(op.Pid))
	desc := fmt.Sprintf("%v of %s (pid %d)", op, p, pid)
	if pid <= 1 || pid == os.Getpid() {
		desc += ": not a store's, not killed"
	} else if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		desc += fmt.Sprintf(": kill: %v", err)
	}
	tr.hit <- desc
	return errCut
}

// processOf is the process of thread tid (FUSE reports the caller's
// thread).
func processOf(tid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return tid
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Tgid:"); ok {
			if pid, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return pid
			}
		}
	}
	return tid
}

// moments is one test's cluster and its cuts.
type moments struct {
	*powerCluster
	cuts int
}

func newMoments(t *testing.T, cfg cluster.ProcessesConfig) *moments {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return &moments{powerCluster: startPowerCluster(t, seed, cfg)}
}

// arm installs tr on store's mount.
func (m *moments) arm(store uint64, tr *trap) { m.mounts[store].SetHook(tr.hook) }

// await waits for tr (armed on store's mount) to fire, then for the
// store's process to exit, cuts its mount's power in mode and starts the
// store again (waiting until it is ready unless noWait). It returns what
// the trap hit.
func (m *moments) await(store uint64, tr *trap, mode lossyfs.CutMode, noWait bool) string {
	t := m.t
	t.Helper()
	m.cuts++
	label := fmt.Sprintf("cut %d (%s, store %d, %v)", m.cuts, tr.what, store, mode)
	var hit string
	select {
	case hit = <-tr.hit:
	case <-time.After(momentWait):
		m.mounts[store].SetHook(nil)
		t.Fatalf("%s: the moment did not come in %v", label, momentWait)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := m.c.WaitExit(ctx, store)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("%s: the store's process at %s ended with %v, not killed", label, hit, err)
	}
	dropped := m.cutMounts(label, mode, store)
	m.mounts[store].SetHook(nil)
	if noWait {
		if err := m.c.Start(store); err != nil {
			t.Fatalf("%s: restart store %d: %v", label, store, err)
		}
	} else {
		m.restart(label, store)
	}
	t.Logf("%s: hit %s; dropped %s", label, hit, strings.Join(dropped, "; "))
	return hit
}

// settle waits until every store agrees on every region's leader.
func (m *moments) settle(what string) {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if _, err := m.c.WaitSettled(ctx, 0); err != nil {
		m.t.Fatalf("%s: %v", what, err)
	}
}

// follower is a running store that does not lead region.
func (m *moments) follower(region uint64, not ...uint64) uint64 {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	leader := m.c.LeaderOf(ctx, region)
	for _, s := range m.c.StoreIDs() {
		if s != leader && !contains(not, s) {
			return s
		}
	}
	m.t.Fatalf("region %d (leader %d): no follower", region, leader)
	return 0
}

func contains(s []uint64, v uint64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// waitAcked waits until w has acknowledged base+n writes.
func waitAcked(t *testing.T, w *writers, base, n int) {
	t.Helper()
	deadline := time.Now().Add(momentWait)
	for w.ackedCount() < base+n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d writes acknowledged in %v", w.ackedCount()-base, n, momentWait)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func modeAt(i int) lossyfs.CutMode { return cutModes[i%len(cutModes)] }

// TestMomentCheckpoint cuts a store in the middle of a checkpoint under
// write load: at the fsync of store.ckpt.tmp, at its rename (before it
// happens), and at the directory fsync right after the rename, each in
// the three cut modes, a different store each time.
func TestMomentCheckpoint(t *testing.T) {
	m := newMoments(t, cluster.ProcessesConfig{})
	w := startWriters(m.cli, 4)
	defer w.stop()
	steps := []struct {
		what  string
		match func() matcher
	}{
		{"fsync of store.ckpt.tmp", func() matcher { return is(lossyfs.OpFsync, "store.ckpt.tmp") }},
		{"rename of store.ckpt.tmp", func() matcher { return is(lossyfs.OpRename, "store.ckpt.tmp") }},
		{"dir fsync after the rename", func() matcher {
			return after(is(lossyfs.OpRename, "store.ckpt.tmp"), is(lossyfs.OpFsyncDir, "."))
		}},
	}
	i := 0
	for range momentRepeats() {
		for _, st := range steps {
			for range cutModes {
				store := uint64(1 + i%3)
				tr := newTrap(st.what, st.match())
				m.arm(store, tr)
				m.await(store, tr, modeAt(i), false)
				i++
			}
		}
	}
	m.check(fmt.Sprintf("%d checkpoint cuts", m.cuts), w)
}

// TestMomentWALSegment cuts a store as its round log starts a new segment
// (16 MiB of records, filled by 64 KiB values): at the create of
// wal/<seq>.wal, at the fsync of the wal directory that follows it, and
// at the new segment's first write. Filling a segment is slow over FUSE:
// by default one of the three, in one mode, both picked by the seed;
// MOMENT_REPEATS=n makes 3n cuts.
func TestMomentWALSegment(t *testing.T) {
	m := newMoments(t, cluster.ProcessesConfig{})
	first := int(time.Now().UnixNano() % 9)
	w := startWriters(m.cli, 2)
	defer w.stop()
	big := startWritersPadded(m.cli, 4, "big", 64<<10)
	defer big.stop()
	i := first
	for r := range momentRepeats() {
		for k, step := range []struct {
			what  string
			match matcher
		}{
			{"create of wal/*.wal", is(lossyfs.OpCreate, "wal/*.wal")},
			{"wal dir fsync after a segment's create", after(is(lossyfs.OpCreate, "wal/*.wal"), is(lossyfs.OpFsyncDir, "wal"))},
			{"first write of a new wal/*.wal", after(is(lossyfs.OpCreate, "wal/*.wal"), is(lossyfs.OpWrite, "wal/*.wal"))},
		} {
			if momentRepeats() == 1 && k != first%3 {
				continue
			}
			store := uint64(1 + (i+r)%3)
			tr := newTrap(step.what, step.match)
			m.arm(store, tr)
			m.await(store, tr, modeAt(i/3+r), false)
			i++
		}
	}
	m.check(fmt.Sprintf("%d round-log segment cuts", m.cuts), w, big)
}

// TestMomentRestart cuts a store while it opens after a kill -9: at the
// open's checkpoint (the first store.ckpt.tmp), at the incarnation bump's
// checkpoint (the second: each start bumps the store's incarnation with
// an update and a checkpoint), and at the create of the open's new
// round-log segment.
func TestMomentRestart(t *testing.T) {
	m := newMoments(t, cluster.ProcessesConfig{})
	w := startWriters(m.cli, 4)
	defer w.stop()
	i := 0
	for range momentRepeats() {
		for _, step := range []struct {
			what  string
			match matcher
		}{
			{"the open's checkpoint (1st store.ckpt.tmp write)", nth(1, is(lossyfs.OpWrite, "store.ckpt.tmp"))},
			{"the incarnation bump's checkpoint (2nd store.ckpt.tmp write)", nth(2, is(lossyfs.OpWrite, "store.ckpt.tmp"))},
			{"the incarnation bump's checkpoint rename", nth(2, is(lossyfs.OpRename, "store.ckpt.tmp"))},
			{"the open's segment create", is(lossyfs.OpCreate, "wal/*.wal")},
		} {
			store := uint64(1 + i%3)
			time.Sleep(300 * time.Millisecond) // under load
			if err := m.c.Kill(store); err != nil {
				t.Fatal(err)
			}
			tr := newTrap(step.what, step.match)
			m.arm(store, tr)
			if err := m.c.Start(store); err != nil {
				t.Fatal(err)
			}
			m.await(store, tr, modeAt(i), false)
			i++
		}
	}
	m.check(fmt.Sprintf("%d cuts of restarting stores", m.cuts), w)
}

// TestMomentBootstrap cuts each store during its very first open, each at
// a different moment and in a different mode: the first write of
// store.db (bbolt's initial pages), the create of the first round-log
// segment, and the first checkpoint's store.ckpt.tmp write. Each must then
// boot, and the cluster form.
func TestMomentBootstrap(t *testing.T) {
	for r := range momentRepeats() {
		steps := []struct {
			what  string
			match matcher
		}{
			{"first write of store.db", is(lossyfs.OpWrite, "store.db")},
			{"create of the first wal segment", is(lossyfs.OpCreate, "wal/*.wal")},
			{"first store.ckpt.tmp write", is(lossyfs.OpWrite, "store.ckpt.tmp")},
		}
		traps := map[uint64]*trap{}
		hooks := map[uint64]lossyfs.Hook{}
		for i, st := range steps {
			s := uint64(1 + (i+r)%3)
			traps[s] = newTrap(st.what, st.match)
			hooks[s] = traps[s].hook
		}
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		m := &moments{powerCluster: startPowerClusterHooked(t, seed, cluster.ProcessesConfig{NoWait: true}, hooks)}
		for s := uint64(1); s <= 3; s++ {
			m.await(s, traps[s], modeAt(int(s)+r), true)
		}
		m.settle("after the bootstrap cuts")
		m.connect()
		w := startWriters(m.cli, 4)
		time.Sleep(2 * time.Second)
		m.check(fmt.Sprintf("%d cuts at bootstrap", m.cuts), w)
	}
}

// TestMomentSnapshot cuts a follower while it receives and applies a
// snapshot: the follower is killed, the others write 64 KiB values and
// compact their logs past it (--log-gc-threshold 16), and on its restart
// the leader sends a snapshot of megabytes. The cuts: the first write of
// snap/*.hkvs, its fsync (before the apply marker), and a write of
// store.db during the apply that follows.
func TestMomentSnapshot(t *testing.T) {
	m := newMoments(t, cluster.ProcessesConfig{ExtraArgs: []string{"--log-gc-threshold=16"}, BalanceInterval: -1})
	w := startWriters(m.cli, 2)
	defer w.stop()
	big := startWritersPadded(m.cli, 2, "big", 64<<10)
	defer big.stop()
	waitAcked(t, big, 0, 20)
	i := 0
	for range momentRepeats() {
		for _, step := range []struct {
			what  string
			match matcher
		}{
			{"first write of snap/*.hkvs", is(lossyfs.OpWrite, "snap/*.hkvs")},
			{"fsync of snap/*.hkvs", is(lossyfs.OpFsync, "snap/*.hkvs")},
			{"20th store.db data-page write after the snap file's fsync", after(is(lossyfs.OpFsync, "snap/*.hkvs"), nth(20, dataPage))},
		} {
			f := m.follower(1)
			if err := m.c.Kill(f); err != nil {
				t.Fatal(err)
			}
			waitAcked(t, big, big.ackedCount(), 48) // 3 MB the follower misses
			tr := newTrap(step.what, step.match)
			m.arm(f, tr)
			if err := m.c.Start(f); err != nil {
				t.Fatal(err)
			}
			m.await(f, tr, modeAt(i), false)
			i++
		}
	}
	m.check(fmt.Sprintf("%d cuts in snapshots", m.cuts), w, big)
}

// dataPage matches a write of store.db past its two meta pages.
func dataPage(op lossyfs.Op, p string) bool {
	return op.Kind == lossyfs.OpWrite && p == "store.db" && op.Off >= 8192
}

// pause stops w and waits for the stores to go idle (no commit, so no
// timed checkpoint), so that the next checkpoint is the shape change's.
func pause(w *writers) {
	w.stop()
	time.Sleep(time.Second)
}

// TestMomentSplit cuts a store at the first checkpoint after a split
// request, the writers paused so that no timed checkpoint comes first:
// on the region's leader (the split's ID allocation, or the split round's
// checkpoint before it sends), and on a follower (the round that applies
// the split).
func TestMomentSplit(t *testing.T) {
	m := newMoments(t, cluster.ProcessesConfig{BalanceInterval: -1})
	var ws []*writers
	region := uint64(1)
	i := 0
	for r := range momentRepeats() {
		for _, onLeader := range []bool{true, false} {
			w := startWritersPadded(m.cli, 4, fmt.Sprintf("split%d", i), 0)
			ws = append(ws, w)
			waitAcked(t, w, 0, 200)
			pause(w)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			leader := m.c.LeaderOf(ctx, region)
			cancel()
			store, what := leader, "first store.ckpt.tmp write after a split, on the leader"
			if !onLeader {
				store, what = m.follower(region), "first store.ckpt.tmp write after a split, on a follower"
			}
			tr := newTrap(what, is(lossyfs.OpWrite, "store.ckpt.tmp"))
			m.arm(store, tr)
			key := fmt.Sprintf("split%d/2/", i)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				left, right, err := m.cli.Split(ctx, []byte(key))
				m.t.Logf("split %d at %q (repeat %d): %v | %v, %v", i, key, r, left, right, err)
			}()
			m.await(store, tr, modeAt(i), false)
			m.settle("after the split cut")
			i++
		}
	}
	m.check(fmt.Sprintf("%d cuts in splits", m.cuts), ws...)
}

// TestMomentConfChange cuts a store at the first checkpoint after a
// membership change that affects it, the writers paused: the removal of
// its replica of region 1, then the addition of a new one.
func TestMomentConfChange(t *testing.T) {
	m := newMoments(t, cluster.ProcessesConfig{BalanceInterval: -1})
	var ws []*writers
	i := 0
	for range momentRepeats() {
		for _, remove := range []bool{true, false} {
			w := startWritersPadded(m.cli, 4, fmt.Sprintf("conf%d", i), 0)
			ws = append(ws, w)
			waitAcked(t, w, 0, 200)
			pause(w)
			var store uint64
			var what string
			var op func(ctx context.Context) error
			if remove {
				store = m.follower(1)
				what = "first store.ckpt.tmp write after RemovePeer, on the removed store"
				op = func(ctx context.Context) error { return m.cli.RemovePeer(ctx, 1, store) }
			} else {
				store = missing(m)
				what = "first store.ckpt.tmp write after AddPeer, on the added store"
				op = func(ctx context.Context) error { return m.cli.AddPeer(ctx, 1, store) }
			}
			tr := newTrap(what, is(lossyfs.OpWrite, "store.ckpt.tmp"))
			m.arm(store, tr)
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				done <- op(ctx)
			}()
			m.await(store, tr, modeAt(i), false)
			if err := <-done; err != nil {
				t.Logf("%s: %v (the cut may have answered it)", what, err)
			}
			if !remove {
				// The added replica catches up (and becomes a voter).
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				err := m.cli.AddPeer(ctx, 1, store)
				cancel()
				if err != nil {
					t.Fatalf("add the replica again: %v", err)
				}
			}
			if !remove {
				// (A store with no region never counts as settled.)
				m.settle("after the membership cut")
			}
			i++
		}
	}
	m.check(fmt.Sprintf("%d cuts in membership changes", m.cuts), ws...)
}

// missing is a store with no replica of region 1 (after a RemovePeer).
func missing(m *moments) uint64 {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	regions, err := m.cli.Regions(ctx)
	if err != nil {
		m.t.Fatal(err)
	}
	for _, r := range regions {
		if r.Region.ID != 1 {
			continue
		}
		for _, s := range m.c.StoreIDs() {
			if _, ok := r.Region.PeerOnStore(s); !ok {
				return s
			}
		}
	}
	m.t.Fatal("every store has a replica of region 1")
	return 0
}
