package lossyfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// setup mounts a fresh backing directory; it returns the FS, the mount
// point and the backing directory.
func setup(t *testing.T, opts Options) (*FS, string, string) {
	t.Helper()
	root := t.TempDir()
	backing, mnt := filepath.Join(root, "backing"), filepath.Join(root, "mnt")
	f := MountT(t, backing, mnt, opts)
	return f, mnt, backing
}

func syncPath(t *testing.T, path string) {
	t.Helper()
	d, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", path, err)
	}
}

// writeFile creates path with data and, if durable, fsyncs it and its
// directory.
func writeFile(t *testing.T, path string, data []byte, durable bool) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if durable {
		syncPath(t, path)
		syncPath(t, filepath.Dir(path))
	}
}

func cut(t *testing.T, f *FS, mode CutMode) {
	t.Helper()
	if err := f.Cut(mode); err != nil {
		t.Fatalf("cut %v: %v", mode, err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// overwrite writes data at off in path, fdatasyncing it if sync.
func overwrite(t *testing.T, path string, data []byte, off int64, sync bool) {
	t.Helper()
	fl, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if _, err := fl.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := unix.Fdatasync(int(fl.Fd())); err != nil {
			t.Fatalf("fdatasync: %v", err)
		}
	}
}

func TestUnsyncedWriteLost(t *testing.T) {
	f, mnt, backing := setup(t, Options{})
	p := filepath.Join(mnt, "a")
	writeFile(t, p, []byte("durable"), true)
	overwrite(t, p, []byte("VOLATILE and longer"), 0, false)
	if got := readFile(t, p); string(got) != "VOLATILE and longer" {
		t.Fatalf("before the cut the mount shows %q", got)
	}
	if got := readFile(t, filepath.Join(backing, "a")); string(got) != "durable" {
		t.Fatalf("before the cut the backing holds %q, want only the durable state", got)
	}
	cut(t, f, CutAll)
	if got := readFile(t, p); string(got) != "durable" {
		t.Fatalf("after the cut: %q, want %q", got, "durable")
	}
}

func TestFdatasyncSurvives(t *testing.T) {
	f, mnt, backing := setup(t, Options{})
	p := filepath.Join(mnt, "a")
	writeFile(t, p, []byte("0123456789"), true)
	overwrite(t, p, []byte("abc"), 8, true)
	cut(t, f, CutAll)
	for _, path := range []string{p, filepath.Join(backing, "a")} {
		if got := readFile(t, path); string(got) != "01234567abc" {
			t.Fatalf("%s after the cut: %q", path, got)
		}
	}
}

func TestCreateWithoutDirSyncLost(t *testing.T) {
	f, mnt, backing := setup(t, Options{})
	p := filepath.Join(mnt, "new")
	writeFile(t, p, []byte("data"), false)
	syncPath(t, p) // the file, not its directory
	if _, err := os.Stat(filepath.Join(backing, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the backing has the entry before its directory was fsynced: %v", err)
	}
	cut(t, f, CutAll)
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file whose directory was never fsynced survived the cut (strict model): %v", err)
	}
	// Fsynced with its directory: it stays.
	writeFile(t, p, []byte("data"), true)
	cut(t, f, CutAll)
	if got := readFile(t, p); string(got) != "data" {
		t.Fatalf("after the cut: %q", got)
	}
}

func TestLenientDirModel(t *testing.T) {
	f, mnt, _ := setup(t, Options{DirModel: DirLenient})
	if err := os.Mkdir(filepath.Join(mnt, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(mnt, "sub", "new")
	writeFile(t, p, []byte("data"), false)
	syncPath(t, p) // the file alone: its directory's entries go with it
	cut(t, f, CutAll)
	if got := readFile(t, p); string(got) != "data" {
		t.Fatalf("after the cut: %q", got)
	}
}

func TestMkdirNeedsParentSync(t *testing.T) {
	f, mnt, backing := setup(t, Options{})
	sub := filepath.Join(mnt, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(sub, "x"), []byte("x"), true) // x and sub fsynced, not mnt
	cut(t, f, CutAll)
	if _, err := os.Stat(sub); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a directory whose parent was never fsynced survived: %v", err)
	}
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(sub, "x"), []byte("x"), true)
	syncPath(t, mnt)
	cut(t, f, CutAll)
	if got := readFile(t, filepath.Join(backing, "sub", "x")); string(got) != "x" {
		t.Fatalf("after the cut: %q", got)
	}
	// rmdir (after unlink) becomes durable with the parent's fsync.
	if err := os.Remove(filepath.Join(sub, "x")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(sub); err != nil {
		t.Fatal(err)
	}
	cut(t, f, CutAll)
	if got := readFile(t, filepath.Join(sub, "x")); string(got) != "x" {
		t.Fatalf("an unsynced rmdir survived: %q", got)
	}
	if err := os.Remove(filepath.Join(sub, "x")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(sub); err != nil {
		t.Fatal(err)
	}
	syncPath(t, mnt)
	cut(t, f, CutAll)
	if _, err := os.Stat(sub); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a synced rmdir did not survive: %v", err)
	}
}

func TestRename(t *testing.T) {
	f, mnt, backing := setup(t, Options{})
	a, b := filepath.Join(mnt, "a"), filepath.Join(mnt, "b")
	writeFile(t, a, []byte("A"), true)
	writeFile(t, b, []byte("B"), true)

	// The tmp-then-rename pattern, without the directory's fsync: undone.
	tmp := filepath.Join(mnt, "b.tmp")
	writeFile(t, tmp, []byte("B2"), false)
	syncPath(t, tmp)
	if err := os.Rename(tmp, b); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, b); string(got) != "B2" {
		t.Fatalf("live after rename: %q", got)
	}
	cut(t, f, CutAll)
	if got := readFile(t, b); string(got) != "B" {
		t.Fatalf("an unsynced rename survived: b=%q", got)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the never-durable tmp file survived: %v", err)
	}

	// With the directory's fsync: durable, the old name gone.
	if err := os.Rename(a, filepath.Join(mnt, "c")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, tmp, []byte("B3"), false)
	syncPath(t, tmp)
	if err := os.Rename(tmp, b); err != nil {
		t.Fatal(err)
	}
	syncPath(t, mnt)
	cut(t, f, CutAll)
	for name, want := range map[string]string{"b": "B3", "c": "A"} {
		if got := readFile(t, filepath.Join(backing, name)); string(got) != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	for _, name := range []string{"a", "b.tmp"} {
		if _, err := os.Stat(filepath.Join(mnt, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survived a durable rename away: %v", name, err)
		}
	}

	// A durable file renamed in one directory, the rename made durable:
	// its unsynced data is still volatile.
	overwrite(t, b, []byte("X"), 0, false)
	if err := os.Rename(b, a); err != nil {
		t.Fatal(err)
	}
	syncPath(t, mnt)
	cut(t, f, CutAll)
	if got := readFile(t, a); string(got) != "B3" {
		t.Errorf("a = %q, want B3", got)
	}
}

func TestCutTornKeepsSectorPrefix(t *testing.T) {
	old := bytes.Repeat([]byte{'o'}, 20000)
	seen := map[int]bool{}
	for seed := uint64(1); seed <= 8; seed++ {
		f, mnt, backing := setup(t, Options{Seed: seed})
		p := filepath.Join(mnt, "wal")
		writeFile(t, p, old, true)
		first := bytes.Repeat([]byte{'f'}, 1000)
		overwrite(t, p, first, 10, false)
		last := bytes.Repeat([]byte{'l'}, 9000)
		const off = 1300
		overwrite(t, p, last, off, false)
		cut(t, f, CutTorn)
		got := readFile(t, filepath.Join(backing, "wal"))
		// The earlier write survives in full, the last keeps a prefix
		// ending on a 512-byte boundary (possibly empty), the rest is old.
		want := bytes.Clone(old)
		copy(want[10:], first)
		k := 0
		for k < len(last) && got[off+k] == 'l' {
			k++
		}
		if k > 0 && (off+k)%512 != 0 {
			t.Fatalf("seed %d: the torn write kept %d bytes, ending at %d: not on a 512-byte boundary", seed, k, off+k)
		}
		if k == len(last) {
			t.Fatalf("seed %d: the last write survived whole", seed)
		}
		copy(want[off:], last[:k])
		if !bytes.Equal(got, want) {
			t.Fatalf("seed %d: after a torn cut the file differs from durable+first+%d bytes of the last write", seed, k)
		}
		seen[k] = true
		if err := f.Unmount(); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) < 2 {
		t.Errorf("8 seeds all kept the same prefix: %v", seen)
	}
}

func TestCutTornExtendingWrite(t *testing.T) {
	f, mnt, backing := setup(t, Options{Seed: 3})
	p := filepath.Join(mnt, "log")
	writeFile(t, p, []byte("head"), true)
	overwrite(t, p, bytes.Repeat([]byte{'x'}, 5000), 4, false)
	cut(t, f, CutTorn)
	got := readFile(t, filepath.Join(backing, "log"))
	if string(got[:4]) != "head" || (len(got) != 4 && len(got)%512 != 0) || len(got) >= 5004 {
		t.Fatalf("torn extending write left %d bytes", len(got))
	}
	if !bytes.Equal(got[4:], bytes.Repeat([]byte{'x'}, len(got)-4)) {
		t.Fatal("torn extending write: the kept prefix is not the write's")
	}
}

func TestCutRandomPagesKeepsWholePages(t *testing.T) {
	f, mnt, backing := setup(t, Options{Seed: 42})
	const pages = 32
	p := filepath.Join(mnt, "db")
	writeFile(t, p, bytes.Repeat([]byte{'o'}, pages*pageSize), true)
	fl, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range pages {
		// Two writes per page, at odd offsets: a page is all or nothing.
		if _, err := fl.WriteAt(bytes.Repeat([]byte{'n'}, 3000), int64(i*pageSize+7)); err != nil {
			t.Fatal(err)
		}
		if _, err := fl.WriteAt([]byte{'n'}, int64(i*pageSize)); err != nil {
			t.Fatal(err)
		}
	}
	fl.Close()
	cut(t, f, CutRandomPages)
	got := readFile(t, filepath.Join(backing, "db"))
	if len(got) != pages*pageSize {
		t.Fatalf("size %d", len(got))
	}
	kept := 0
	newPage := bytes.Repeat([]byte{'o'}, pageSize)
	newPage[0] = 'n'
	copy(newPage[7:], bytes.Repeat([]byte{'n'}, 3000))
	for i := range pages {
		pg := got[i*pageSize : (i+1)*pageSize]
		switch {
		case bytes.Equal(pg, newPage):
			kept++
		case bytes.Equal(pg, bytes.Repeat([]byte{'o'}, pageSize)):
		default:
			t.Fatalf("page %d is neither the old nor the new page", i)
		}
	}
	t.Logf("%d of %d unsynced pages persisted", kept, pages)
	if kept == 0 || kept == pages {
		t.Errorf("%d of %d pages persisted: not independent", kept, pages)
	}
}

// The mmap tests run their mapping in a child process (this test binary
// again, see TestMain): a page fault on a FUSE mapping served by the same
// process deadlocks with the garbage collector, which cannot stop a thread
// blocked in the fault while the server's goroutines wait for the stop.
// hedgekv's stores are other processes; only these tests need this.
const helperEnv = "LOSSYFS_TEST_HELPER"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		if err := runHelper(h, os.Getenv(helperEnv+"_PATH")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helper runs this test binary as helper name on path and returns its
// output (stdout), failing the test if it fails.
func helper(t *testing.T, name, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+name, helperEnv+"_PATH="+path)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helper %s: %v: %s", name, err, stderr.String())
	}
	return stdout.String()
}

func runHelper(name, path string) error {
	switch name {
	case "mmap":
		return helperMmap(path)
	case "bolt-write":
		return helperBoltWrite(path)
	case "bolt-read":
		return helperBoltRead(path)
	case "write-loop":
		return helperWriteLoop(path)
	}
	return fmt.Errorf("no helper %q", name)
}

func helperMmap(path string) error {
	fl, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer fl.Close()
	m, err := unix.Mmap(int(fl.Fd()), 0, 3*pageSize, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	defer unix.Munmap(m)
	_ = m[pageSize] // fault a page in before the write, as bbolt does
	if _, err := fl.WriteAt([]byte("unsynced"), pageSize+10); err != nil {
		return err
	}
	if got := string(m[pageSize+10 : pageSize+18]); got != "unsynced" {
		return fmt.Errorf("the mapping shows %q", got)
	}
	// A second mapping, made after the write.
	m2, err := unix.Mmap(int(fl.Fd()), 0, 3*pageSize, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	defer unix.Munmap(m2)
	if got := string(m2[pageSize+10 : pageSize+18]); got != "unsynced" {
		return fmt.Errorf("a new mapping shows %q", got)
	}
	return nil
}

func TestMmapSeesUnsyncedBytes(t *testing.T) {
	_, mnt, backing := setup(t, Options{})
	p := filepath.Join(mnt, "m")
	writeFile(t, p, bytes.Repeat([]byte{'o'}, 3*pageSize), true)
	helper(t, "mmap", p)
	if got := readFile(t, filepath.Join(backing, "m")); bytes.Contains(got, []byte("unsynced")) {
		t.Fatal("the unsynced write reached the backing")
	}
}

func boltPut(db *bbolt.DB, k, v string) error {
	return db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("b"))
		if err != nil {
			return err
		}
		return b.Put([]byte(k), []byte(v))
	})
}

// helperBoltWrite commits with NoSync=false, then once with NoSync=true,
// and exits without closing the database (as a killed process would).
func helperBoltWrite(path string) error {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path)) // the file's entry
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		return err
	}
	d.Close()
	// flock works: a second open times out.
	if db2, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 200 * time.Millisecond}); err == nil {
		db2.Close()
		return errors.New("a second bbolt.Open did not wait for the flock")
	}
	for i := range 200 {
		if err := boltPut(db, fmt.Sprintf("k%03d", i), string(bytes.Repeat([]byte{'v'}, 300))); err != nil {
			return err
		}
	}
	if err := boltPut(db, "synced", "yes"); err != nil {
		return err
	}
	db.NoSync = true
	if err := boltPut(db, "unsynced", "yes"); err != nil {
		return err
	}
	return db.View(func(tx *bbolt.Tx) error {
		if v := string(tx.Bucket([]byte("b")).Get([]byte("unsynced"))); v != "yes" {
			return fmt.Errorf("read back %q", v)
		}
		return nil
	})
}

func helperBoltRead(path string) error {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			return fmt.Errorf("bbolt check: %w", err)
		}
		b := tx.Bucket([]byte("b"))
		if b == nil {
			return errors.New("no bucket")
		}
		fmt.Printf("synced=%s unsynced=%s keys=%d\n", b.Get([]byte("synced")), b.Get([]byte("unsynced")), b.Stats().KeyN)
		return nil
	})
}

func TestBolt(t *testing.T) {
	f, mnt, _ := setup(t, Options{})
	path := filepath.Join(mnt, "bolt.db")
	helper(t, "bolt-write", path)
	cut(t, f, CutAll)
	out := strings.TrimSpace(helper(t, "bolt-read", path))
	if want := "synced=yes unsynced= keys=201"; out != want {
		t.Fatalf("after the cut: %s, want %s (a NoSync=false commit survives, a NoSync=true one does not)", out, want)
	}
}

func TestFull(t *testing.T) {
	f, mnt, _ := setup(t, Options{})
	p := filepath.Join(mnt, "a")
	writeFile(t, p, []byte("a"), true)
	f.SetFull(true)
	fl, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if _, err := fl.WriteAt([]byte("b"), 0); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write on a full disk: %v, want ENOSPC", err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "b"), nil, 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("create on a full disk: %v, want ENOSPC", err)
	}
	f.SetFull(false)
	if _, err := fl.WriteAt([]byte("b"), 0); err != nil {
		t.Fatalf("write after the disk was freed: %v", err)
	}
}

func TestUnmountLeavesNoMount(t *testing.T) {
	root := t.TempDir()
	mnt := filepath.Join(root, "mnt")
	f := MountT(t, filepath.Join(root, "backing"), mnt, Options{})
	if !Mounted(mnt) {
		t.Fatalf("%s is not in /proc/self/mountinfo after Mount", mnt)
	}
	writeFile(t, filepath.Join(mnt, "a"), []byte("a"), true)
	// A file left open makes the unmount lazy, not fail.
	fl, err := os.Open(filepath.Join(mnt, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if err := f.Unmount(); err != nil {
		t.Fatal(err)
	}
	if Mounted(mnt) {
		t.Fatalf("%s is still mounted", mnt)
	}
	if err := f.Unmount(); err != nil {
		t.Fatalf("a second Unmount: %v", err)
	}
	if got := readFile(t, filepath.Join(root, "backing", "a")); string(got) != "a" {
		t.Fatalf("backing after unmount: %q", got)
	}
}

// TestHookSeesOps: the hook sees each changing operation with its path
// relative to the mount root, and an error from it fails the operation
// with EIO (and changes nothing).
func TestHookSeesOps(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	failOn := ""
	f, mnt, _ := setup(t, Options{OnOp: func(op Op, p string) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, op.Kind.String()+" "+p)
		if op.Kind == OpRename && op.To != "sub/b" {
			return fmt.Errorf("bad rename target %q", op.To)
		}
		if op.Pid != uint32(os.Getpid()) && !sameProcess(op.Pid) {
			return fmt.Errorf("caller %d is not this process", op.Pid)
		}
		if failOn != "" && op.Kind.String()+" "+p == failOn {
			return errors.New("injected")
		}
		return nil
	}})
	if err := os.Mkdir(filepath.Join(mnt, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(mnt, "sub", "a"), []byte("hello"), true)
	if err := os.Truncate(filepath.Join(mnt, "sub", "a"), 2); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(mnt, "sub", "a"), filepath.Join(mnt, "sub", "b")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(mnt, "sub", "b")); err != nil {
		t.Fatal(err)
	}
	syncPath(t, mnt)
	mu.Lock()
	got := strings.Join(seen, ", ")
	want := []string{"mkdir sub", "create sub/a", "write sub/a", "fsync sub/a", "fsync-dir sub",
		"truncate sub/a", "rename sub/a", "unlink sub/b", "fsync-dir ."}
	failOn = "write sub/c"
	mu.Unlock()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("the hook did not see %q; it saw: %s", w, got)
		}
	}
	err := os.WriteFile(filepath.Join(mnt, "sub", "c"), []byte("x"), 0o644)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("a write the hook failed: %v, want EIO", err)
	}
	if b := readFile(t, filepath.Join(mnt, "sub", "c")); len(b) != 0 {
		t.Fatalf("the failed write changed the file: %q", b)
	}
	f.SetHook(nil)
	mu.Lock()
	n := len(seen)
	mu.Unlock()
	writeFile(t, filepath.Join(mnt, "sub", "c"), []byte("x"), true)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Fatalf("the hook ran after SetHook(nil): %s", seen[n:])
	}
}

// sameProcess reports whether thread id tid is one of this process's.
func sameProcess(tid uint32) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid))
	return err == nil
}

// TestHookKillsCaller: a hook that kills the calling process with
// SIGKILL, and fails that operation and every later one, does not hang
// the mount: the process exits, and a Cut then drops what it had not
// synced, as a power loss at that operation would.
func TestHookKillsCaller(t *testing.T) {
	var fired atomic.Bool
	f, mnt, backing := setup(t, Options{})
	p := filepath.Join(mnt, "log")
	writeFile(t, p, nil, true)
	f.SetHook(func(op Op, path string) error {
		if fired.Load() {
			return errors.New("after the cut")
		}
		if op.Kind == OpWrite && path == "log" && op.Off >= 10*pageSize {
			fired.Store(true)
			if err := syscall.Kill(int(op.Pid), syscall.SIGKILL); err != nil {
				return err
			}
			return errors.New("cut")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=write-loop", helperEnv+"_PATH="+p)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the helper ended with %v (not SIGKILL): %s", err, stderr.String())
	}
	if !fired.Load() {
		t.Fatal("the hook never fired")
	}
	cut(t, f, CutAll)
	f.SetHook(nil)
	// The helper fsynced every 4 pages: the file keeps a multiple of 4
	// pages, at least 8 of the 10 written before the cut.
	got := readFile(t, filepath.Join(backing, "log"))
	if len(got) != 8*pageSize {
		t.Fatalf("after the cut the file has %d bytes, want %d", len(got), 8*pageSize)
	}
}

// helperWriteLoop appends pages to path, fsyncing every 4 pages, until it
// fails (or is killed).
func helperWriteLoop(path string) error {
	fl, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	page := bytes.Repeat([]byte{'p'}, pageSize)
	for i := 1; i <= 1000; i++ {
		if _, err := fl.Write(page); err != nil {
			return fmt.Errorf("write %d: %w", i, err)
		}
		if i%4 == 0 {
			if err := fl.Sync(); err != nil {
				return fmt.Errorf("fsync %d: %w", i, err)
			}
		}
	}
	return errors.New("the hook never killed the helper")
}
