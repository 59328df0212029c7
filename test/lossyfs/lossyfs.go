// Package lossyfs is a FUSE file system for power-loss tests over real
// processes (a test helper; nothing in the hedgekv binary imports it). It
// shows a backing directory at a mount point, like a loopback, but keeps
// what was not fsynced in a volatile layer that Cut drops, as a power loss
// would. A kill -9 cannot do that: the kernel's page cache survives the
// process, so every write(2) that returned is on disk after a restart.
//
// # Design
//
// The backing directory holds exactly the durable state, always (between
// two operations): after a Cut, and after Unmount, it IS what survived.
// The live state (what processes see through the mount) is the durable
// state plus a volatile layer in this process's memory:
//
//   - A file is an open descriptor on its backing inode (the durable
//     content) plus the 4 KiB pages written since its last fsync or
//     fdatasync (their live content), its live size, and how far the
//     backing bytes are still valid after a truncation. Reads (read(2) and
//     mmap page faults: no direct_io, so the kernel's page cache works as
//     it would on a disk) see the live content. Fsync writes the dirty
//     pages into the backing inode and truncates it to the live size: only
//     the pages written, never a copy of the whole file. The backing is not
//     fsynced itself: the host does not lose power, only this layer does.
//   - A directory has its live entries and its durable entries (name to
//     file or directory state). Create, mkdir, unlink, rmdir and rename
//     change the live entries only. An fsync of the directory makes its
//     durable entries its live ones, in the backing directory: a file is
//     linked in by its descriptor (linkat of /proc/self/fd/N, so a new file
//     is an O_TMPFILE inode with no name until then; a file whose every
//     durable name is gone is copied to a new inode first, which only a
//     cross-directory rename fsynced in the wrong order needs); a new
//     directory is created (with its own durable entries) once an entry of
//     it becomes durable in a directory that is itself in the backing.
//     This is the strict POSIX model (DirStrict). DirLenient is ext4-like:
//     an fsync of a file or directory also makes the entries of its parent
//     and every ancestor durable (a journal commit).
//
// One mutex serializes every operation of a mount: simple, and fast enough
// for a test cluster. The mount is served by the process that called Mount:
// that process must not mmap files of its own mount (a page fault on the
// mapping blocks a thread the garbage collector then waits for, while the
// goroutines that would serve the fault wait for the collector: a
// deadlock). Read and write them, or mmap them from other processes (the
// stores under test, a helper process), as the tests do.
//
// A Cut (the processes using the mount must have been killed first) writes
// into the backing what the mode lets survive of each file's volatile
// layer, drops every pending directory change, unmounts and mounts the
// backing again (the kernel's caches go with the old mount):
//
//   - CutAll: nothing unsynced survives.
//   - CutTorn: each file's unsynced writes reach the disk in order and the
//     power fails during the last one: every write before it survives,
//     the last keeps a prefix ending on a 512-byte sector boundary (maybe
//     empty) and loses the rest (a truncation after the last write counts
//     as persisted).
//   - CutRandomPages: each unsynced 4 KiB page of each file persists or
//     not, independently, and the file's size is its live or its durable
//     one (a page beyond the surviving size is dropped; a hole reads as
//     zeros).
//
// Directory entries are all-or-nothing per directory fsync in every mode.
// Limits: no hard links, symlinks or device files; a directory cannot be
// renamed into another directory (EXDEV: callers copy); chmod, chown and
// timestamps apply to the backing at once (not volatile). SetFull makes
// writes, creates and growth fail with ENOSPC, as a full disk does.
//
// A hook (Options.OnOp, SetHook) sees each operation that changes the
// file system before it runs: its kind, path and caller. A test cuts the
// power at a chosen moment with it: the hook kills the caller (SIGKILL:
// a fatal signal ends a wait for a FUSE reply) and fails that operation
// and every later one; once the process has exited, the test calls Cut.
// Without a hook an operation pays one atomic load for it.
package lossyfs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// DirModel says when a directory's entry changes become durable.
type DirModel int

const (
	// DirStrict: only an fsync of the directory itself (POSIX).
	DirStrict DirModel = iota
	// DirLenient: also an fsync of any file or directory in it or below
	// it (ext4's journal commits every pending entry change).
	DirLenient
)

// CutMode says what a Cut keeps of the unsynced writes.
type CutMode int

const (
	CutAll         CutMode = iota // drop everything unsynced
	CutTorn                       // unsynced writes in order, the last torn on a 512-byte boundary
	CutRandomPages                // each unsynced 4 KiB page persists or not
)

func (m CutMode) String() string {
	switch m {
	case CutAll:
		return "all"
	case CutTorn:
		return "torn"
	case CutRandomPages:
		return "random-pages"
	}
	return "CutMode(" + strconv.Itoa(int(m)) + ")"
}

// Options configure Mount.
type Options struct {
	DirModel DirModel
	// Seed of the random choices of CutTorn and CutRandomPages (0: 1).
	Seed uint64
	// Debug logs every FUSE request (go-fuse's debug output).
	Debug bool
	// OnOp, if set, is called before each operation that changes the
	// file system (see OpKind), with the path relative to the mount root;
	// an error fails the operation with EIO. SetHook replaces it.
	OnOp func(op Op, path string) error
}

// OpKind is the kind of an operation a hook sees.
type OpKind int

const (
	OpCreate   OpKind = iota // create(2), open(2) with O_CREAT of a new name
	OpOpen                   // open(2) of an existing file (To: "trunc" with O_TRUNC)
	OpWrite                  // write(2): Off, Len
	OpFsync                  // fsync(2) or fdatasync(2) of a file
	OpFsyncDir               // fsync(2) of a directory
	OpRename                 // rename(2): the path is the source, To the target
	OpUnlink                 // unlink(2)
	OpMkdir                  // mkdir(2)
	OpRmdir                  // rmdir(2)
	OpTruncate               // truncate(2), ftruncate(2): Off is the new size
	OpAllocate               // fallocate(2): Off, Len
)

var opNames = [...]string{"create", "open", "write", "fsync", "fsync-dir", "rename", "unlink", "mkdir", "rmdir", "truncate", "allocate"}

func (k OpKind) String() string {
	if k >= 0 && int(k) < len(opNames) {
		return opNames[k]
	}
	return "OpKind(" + strconv.Itoa(int(k)) + ")"
}

// Op is an operation a hook sees, before it runs.
type Op struct {
	Kind OpKind
	// Pid is the calling thread's id as FUSE reports it (kill(2) given a
	// thread's id signals its whole process; /proc/<pid>/status names the
	// process).
	Pid uint32
	// Off and Len: a write's or fallocate's range; a truncation's size is
	// Off.
	Off, Len int64
	// To is a rename's target path (relative to the mount root).
	To string
}

func (o Op) String() string {
	switch o.Kind {
	case OpWrite, OpAllocate:
		return fmt.Sprintf("%v [%d, +%d)", o.Kind, o.Off, o.Len)
	case OpTruncate:
		return fmt.Sprintf("%v to %d", o.Kind, o.Off)
	case OpRename:
		return fmt.Sprintf("%v to %s", o.Kind, o.To)
	}
	return o.Kind.String()
}

// Hook is the type of Options.OnOp.
type Hook func(op Op, path string) error

const (
	pageSize   = 4096
	sectorSize = 512
)

// FS is a mounted lossy file system.
type FS struct {
	backing, mnt string
	opts         Options
	full         atomic.Bool
	hook         atomic.Pointer[Hook]

	mu        sync.Mutex // serializes Cut and Unmount
	rng       *rand.Rand
	st        *state
	server    *fuse.Server
	unmounted bool
	last      CutReport
}

// CutReport is what a Cut found in the volatile layer.
type CutReport struct {
	Mode CutMode
	// Files with unsynced data or size; DirtyPages their unsynced pages.
	Files, DirtyPages int
	// Dirs whose entries had changed since their last fsync (all reverted).
	Dirs int
	// What was volatile, by live path: "f path (N pages)" for a file,
	// "d path: +created -removed" for a directory's entries.
	Details []string
}

func (r CutReport) String() string {
	return fmt.Sprintf("%v: %d files with %d unsynced pages, %d directories with unsynced entries [%s]",
		r.Mode, r.Files, r.DirtyPages, r.Dirs, strings.Join(r.Details, "; "))
}

// LastCut reports what the last Cut dropped (or tore).
func (f *FS) LastCut() CutReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// Mount shows backingDir at mountPoint (created if missing) with a
// volatile layer over it, served by this process until Unmount.
func Mount(backingDir, mountPoint string, opts Options) (*FS, error) {
	var err error
	f := &FS{opts: opts}
	if f.backing, err = filepath.Abs(backingDir); err != nil {
		return nil, err
	}
	if f.mnt, err = filepath.Abs(mountPoint); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(f.backing, 0o755); err != nil {
		return nil, fmt.Errorf("lossyfs: %w", err)
	}
	if err := os.MkdirAll(f.mnt, 0o755); err != nil {
		return nil, fmt.Errorf("lossyfs: %w", err)
	}
	seed := opts.Seed
	if seed == 0 {
		seed = 1
	}
	f.rng = rand.New(rand.NewPCG(seed, 0x6c6f737379))
	f.SetHook(opts.OnOp)
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

// MountPoint is where the file system is mounted.
func (f *FS) MountPoint() string { return f.mnt }

// BackingDir is the directory holding the durable state.
func (f *FS) BackingDir() string { return f.backing }

// SetFull makes writes, creates, mkdirs and file growth fail with ENOSPC
// (true) or work again (false).
func (f *FS) SetFull(full bool) { f.full.Store(full) }

// SetHook makes h the hook called before each operation that changes the
// file system (nil: none), as Options.OnOp. It runs on the goroutine that
// serves the request, before the operation takes the mount's lock: it may
// kill the caller (a fatal signal ends the caller's wait for the reply),
// but must not wait for anything the mount has to serve, nor call Cut or
// Unmount.
func (f *FS) SetHook(h func(op Op, path string) error) {
	if h == nil {
		f.hook.Store(nil)
		return
	}
	hk := Hook(h)
	f.hook.Store(&hk)
}

// callHook runs the hook, if any, for op on in (a directory's entry name
// if name is not empty); EIO if it fails the operation.
func (st *state) callHook(ctx context.Context, in *fs.Inode, name string, op Op) syscall.Errno {
	h := st.fs.hook.Load()
	if h == nil {
		return 0
	}
	p := in.Path(nil)
	if name != "" {
		p = path.Join(p, name)
	}
	if p == "" {
		p = "."
	}
	if c, ok := ctx.(*fuse.Context); ok {
		op.Pid = c.Caller.Pid
	}
	if err := (*h)(op, p); err != nil {
		return syscall.EIO
	}
	return 0
}

func (f *FS) mount() error {
	st, err := load(f, f.backing)
	if err != nil {
		return fmt.Errorf("lossyfs: load %s: %w", f.backing, err)
	}
	sec := time.Second
	opts := &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:        f.backing,
			Name:          "lossyfs",
			DisableXAttrs: true,
			Debug:         f.opts.Debug,
		},
		EntryTimeout:   &sec,
		AttrTimeout:    &sec,
		RootStableAttr: &fs.StableAttr{Mode: syscall.S_IFDIR, Ino: st.root.ino},
	}
	server, err := fs.Mount(f.mnt, &dirNode{st: st, d: st.root}, opts)
	if err != nil {
		st.close()
		return fmt.Errorf("lossyfs: mount %s at %s: %w", f.backing, f.mnt, err)
	}
	f.st, f.server = st, server
	return nil
}

// unmountServer ends the current mount: fusermount -u, and a lazy
// unmount (fusermount3 -uz) if that fails.
func (f *FS) unmountServer() error {
	if f.server == nil {
		return nil
	}
	err := f.server.Unmount()
	if err != nil {
		var out []byte
		var lerr error
		for _, bin := range []string{"fusermount3", "fusermount"} {
			out, lerr = exec.Command(bin, "-uz", f.mnt).CombinedOutput()
			if lerr == nil {
				break
			}
		}
		if lerr != nil {
			return fmt.Errorf("lossyfs: unmount %s: %v; lazy unmount: %v: %s", f.mnt, err, lerr, strings.TrimSpace(string(out)))
		}
	}
	f.server = nil
	if f.st != nil {
		f.st.close()
		f.st = nil
	}
	return nil
}

// Unmount unmounts the file system (lazily if it is busy); the backing
// directory keeps the durable state, the volatile layer is dropped.
// Calling it again does nothing.
func (f *FS) Unmount() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unmounted {
		return nil
	}
	f.unmounted = true
	if f.st != nil {
		f.st.mu.Lock()
		f.st.dead = true
		f.st.mu.Unlock()
	}
	return f.unmountServer()
}

// Cut is a power loss: what mode lets survive of the unsynced writes is
// written to the backing directory, the rest of the volatile layer is
// dropped, and the mount is made again on the backing directory. Every
// process using the mount must have been killed first (an open file makes
// the unmount fail, or be lazy).
func (f *FS) Cut(mode CutMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unmounted {
		return errors.New("lossyfs: cut after unmount")
	}
	st := f.st
	st.mu.Lock()
	var errs []error
	files := make([]*file, 0, len(st.files))
	for fl := range st.files {
		files = append(files, fl)
	}
	slices.SortFunc(files, func(a, b *file) int { return int(a.ino) - int(b.ino) })
	rep := CutReport{Mode: mode}
	for _, fl := range files {
		if fl.dirty() {
			rep.Files++
			rep.DirtyPages += len(fl.pages)
		}
		if err := fl.cut(mode, f.rng); err != nil {
			errs = append(errs, err)
		}
	}
	for d := range st.dirs {
		if !sameEntries(d.live, d.durable) {
			rep.Dirs++
		}
	}
	rep.Details = st.root.details(".", 0)
	f.last = rep
	st.dead = true
	st.mu.Unlock()
	if err := f.unmountServer(); err != nil {
		errs = append(errs, err)
		return errors.Join(errs...)
	}
	if err := f.mount(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Mounted reports whether path is a mount point in /proc/self/mountinfo.
func Mounted(path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && unescapeMount(f[4]) == path {
			return true
		}
	}
	return false
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// state is one mount's tree: the volatile layer over the backing.
type state struct {
	fs      *FS
	mu      sync.Mutex
	dead    bool // cut or unmounted: every operation fails with EIO
	root    *dir
	files   map[*file]struct{}
	dirs    map[*dir]struct{}
	nextIno uint64
}

type file struct {
	ino   uint64
	fd    int
	size  int64 // live
	dsize int64 // durable: the backing inode's size
	valid int64 // backing bytes below valid are live where no page is dirty
	mtime time.Time
	pages map[int64][]byte // page offset -> live content of a dirty page
	last  *lastWrite
}

// lastWrite is the last unsynced write, with what it overwrote.
type lastWrite struct {
	off     int64
	n       int
	pre     []byte
	preSize int64
}

type dir struct {
	ino  uint64
	fd   int // in the backing; -1 while not there
	mode uint32
	// live and durable entries: *file or *dir.
	live, durable map[string]any
	// parent is the live parent (nil: root, or removed); dparent and
	// dname where it is in the backing (fd >= 0).
	parent  *dir
	dparent *dir
	dname   string
}

func (st *state) ino() uint64 {
	st.nextIno++
	return st.nextIno
}

func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

func load(f *FS, backing string) (*state, error) {
	st := &state{fs: f, files: map[*file]struct{}{}, dirs: map[*dir]struct{}{}, nextIno: 1}
	fd, err := unix.Open(backing, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	st.root = &dir{ino: st.ino(), fd: fd, mode: 0o755, live: map[string]any{}, durable: map[string]any{}}
	st.dirs[st.root] = struct{}{}
	if err := st.loadDir(st.root, backing); err != nil {
		st.close()
		return nil, err
	}
	return st, nil
}

func (st *state) loadDir(d *dir, path string) error {
	ents, err := os.ReadDir(path)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(path, e.Name())
		switch {
		case e.Type().IsRegular():
			fd, err := unix.Openat(d.fd, e.Name(), unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			var s unix.Stat_t
			if err := unix.Fstat(fd, &s); err != nil {
				unix.Close(fd)
				return fmt.Errorf("%s: %w", p, err)
			}
			fl := &file{ino: st.ino(), fd: fd, size: s.Size, dsize: s.Size, valid: s.Size, pages: map[int64][]byte{}}
			st.files[fl] = struct{}{}
			d.live[e.Name()], d.durable[e.Name()] = fl, fl
		case e.IsDir():
			fd, err := unix.Openat(d.fd, e.Name(), unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			var s unix.Stat_t
			_ = unix.Fstat(fd, &s)
			sub := &dir{ino: st.ino(), fd: fd, mode: s.Mode & 0o7777, live: map[string]any{}, durable: map[string]any{},
				parent: d, dparent: d, dname: e.Name()}
			st.dirs[sub] = struct{}{}
			d.live[e.Name()], d.durable[e.Name()] = sub, sub
			if err := st.loadDir(sub, p); err != nil {
				return err
			}
		default:
			// Symlinks and devices are not supported; not shown.
		}
	}
	return nil
}

func (st *state) close() {
	for fl := range st.files {
		if fl.fd >= 0 {
			unix.Close(fl.fd)
			fl.fd = -1
		}
	}
	for d := range st.dirs {
		if d.fd >= 0 {
			unix.Close(d.fd)
			d.fd = -1
		}
	}
}

// tmpfile makes a new inode on the backing file system with no name.
func (st *state) tmpfile(mode uint32) (int, error) {
	fd, err := unix.Openat(st.root.fd, ".", unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, mode)
	if err == nil {
		return fd, nil
	}
	// No O_TMPFILE: a named file unlinked at once (linkFile copies it).
	name := fmt.Sprintf(".lossyfs-new-%d-%d", os.Getpid(), st.ino())
	fd, err2 := unix.Openat(st.root.fd, name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, mode)
	if err2 != nil {
		return -1, fmt.Errorf("O_TMPFILE: %v; create: %w", err, err2)
	}
	_ = unix.Unlinkat(st.root.fd, name, 0)
	return fd, nil
}

// ---- file content ----

// read fills buf with the live content at off; it returns how many bytes
// there are (less than len(buf) at the end of the file).
func (fl *file) read(buf []byte, off int64) (int, error) {
	if off >= fl.size {
		return 0, nil
	}
	end := min(off+int64(len(buf)), fl.size)
	buf = buf[:end-off]
	n := 0
	if off < fl.valid {
		want := int(min(end, fl.valid) - off)
		for n < want {
			m, err := unix.Pread(fl.fd, buf[n:want], off+int64(n))
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return 0, err
			}
			if m == 0 {
				break
			}
			n += m
		}
	}
	clear(buf[n:])
	for p := off &^ (pageSize - 1); p < end; p += pageSize {
		if pg, ok := fl.pages[p]; ok {
			lo, hi := max(p, off), min(p+pageSize, end)
			copy(buf[lo-off:hi-off], pg[lo-p:hi-p])
		}
	}
	return len(buf), nil
}

func (fl *file) write(data []byte, off int64) error {
	pre := make([]byte, len(data))
	if _, err := fl.read(pre, off); err != nil {
		return err
	}
	fl.last = &lastWrite{off: off, n: len(data), pre: pre, preSize: fl.size}
	end := off + int64(len(data))
	for p := off &^ (pageSize - 1); p < end; p += pageSize {
		pg, ok := fl.pages[p]
		if !ok {
			pg = make([]byte, pageSize)
			if _, err := fl.read(pg, p); err != nil {
				return err
			}
			fl.pages[p] = pg
		}
		lo, hi := max(p, off), min(p+pageSize, end)
		copy(pg[lo-p:hi-p], data[lo-off:hi-off])
	}
	fl.size = max(fl.size, end)
	fl.mtime = time.Now()
	return nil
}

func (fl *file) truncate(n int64) {
	if n < fl.size {
		for p, pg := range fl.pages {
			switch {
			case p >= n:
				delete(fl.pages, p)
			case p+pageSize > n:
				clear(pg[n-p:])
			}
		}
		fl.valid = min(fl.valid, n)
	}
	fl.size = n
	fl.last = nil
	fl.mtime = time.Now()
}

func (fl *file) pwrite(b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fl.fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func (fl *file) sortedPages() []int64 {
	ps := make([]int64, 0, len(fl.pages))
	for p := range fl.pages {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// flush makes the live content durable (fsync).
func (fl *file) flush() error {
	if fl.valid < fl.dsize {
		if err := unix.Ftruncate(fl.fd, fl.valid); err != nil {
			return err
		}
	}
	for _, p := range fl.sortedPages() {
		if p >= fl.size {
			continue
		}
		if err := fl.pwrite(fl.pages[p][:min(pageSize, fl.size-p)], p); err != nil {
			return err
		}
	}
	if err := unix.Ftruncate(fl.fd, fl.size); err != nil {
		return err
	}
	fl.dsize, fl.valid = fl.size, fl.size
	fl.pages = map[int64][]byte{}
	fl.last = nil
	return nil
}

// cut writes to the backing what mode lets survive of the volatile layer.
func (fl *file) cut(mode CutMode, rng *rand.Rand) error {
	if fl.fd < 0 || (len(fl.pages) == 0 && fl.size == fl.dsize && fl.valid == fl.dsize) {
		return nil
	}
	switch mode {
	case CutTorn:
		last := fl.last
		if err := fl.flush(); err != nil {
			return err
		}
		if last == nil {
			return nil
		}
		// Where the kept prefix may end: off itself (nothing kept) or a
		// sector boundary strictly inside the write.
		ends := []int64{last.off}
		for b := (last.off/sectorSize + 1) * sectorSize; b < last.off+int64(last.n); b += sectorSize {
			ends = append(ends, b)
		}
		keep := ends[rng.IntN(len(ends))] - last.off
		if lim := last.preSize - (last.off + keep); lim > 0 {
			if err := fl.pwrite(last.pre[keep:keep+min(lim, int64(last.n)-keep)], last.off+keep); err != nil {
				return err
			}
		}
		if sz := max(last.preSize, last.off+keep); sz < fl.size {
			if err := unix.Ftruncate(fl.fd, sz); err != nil {
				return err
			}
		}
	case CutRandomPages:
		size := fl.dsize
		if rng.IntN(2) == 0 {
			size = fl.size
			if fl.valid < fl.dsize {
				if err := unix.Ftruncate(fl.fd, fl.valid); err != nil {
					return err
				}
			}
			if err := unix.Ftruncate(fl.fd, size); err != nil {
				return err
			}
		}
		for _, p := range fl.sortedPages() {
			if rng.IntN(2) == 0 || p >= size {
				continue
			}
			if err := fl.pwrite(fl.pages[p][:min(pageSize, size-p)], p); err != nil {
				return err
			}
		}
	}
	return nil
}

// ---- directories ----

// linkFile gives fl the name dirfd/name in the backing.
func (st *state) linkFile(fl *file, dirfd int, name string) error {
	err := unix.Linkat(unix.AT_FDCWD, procPath(fl.fd), dirfd, name, unix.AT_SYMLINK_FOLLOW)
	if err != unix.ENOENT {
		return err
	}
	// Its last name is gone (and it is no O_TMPFILE): copy its durable
	// content to a new inode.
	var s unix.Stat_t
	if err := unix.Fstat(fl.fd, &s); err != nil {
		return err
	}
	nfd, err := st.tmpfile(s.Mode & 0o7777)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < fl.dsize; {
		n, err := unix.Pread(fl.fd, buf[:min(int64(len(buf)), fl.dsize-off)], off)
		if err != nil || n == 0 {
			unix.Close(nfd)
			return fmt.Errorf("copy of an unlinked file: %v", err)
		}
		if _, err := unix.Pwrite(nfd, buf[:n], off); err != nil {
			unix.Close(nfd)
			return err
		}
		off += int64(n)
	}
	unix.Close(fl.fd)
	fl.fd = nfd
	return unix.Linkat(unix.AT_FDCWD, procPath(fl.fd), dirfd, name, unix.AT_SYMLINK_FOLLOW)
}

// materialize creates directory x as parent/name in the backing, with its
// durable entries.
func (st *state) materialize(x, parent *dir, name string) error {
	if err := unix.Mkdirat(parent.fd, name, x.mode); err != nil {
		return err
	}
	fd, err := unix.Openat(parent.fd, name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	x.fd, x.dparent, x.dname = fd, parent, name
	for n, e := range x.durable {
		switch e := e.(type) {
		case *file:
			err = st.linkFile(e, x.fd, n)
		case *dir:
			err = st.materialize(e, x, n)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// dematerialize forgets the backing of x and its subdirectories (removed).
func dematerialize(x *dir) {
	if x.fd >= 0 {
		unix.Close(x.fd)
	}
	x.fd, x.dparent, x.dname = -1, nil, ""
	for _, e := range x.durable {
		if sub, ok := e.(*dir); ok && sub.fd >= 0 {
			dematerialize(sub)
		}
	}
}

// syncDir makes d's live entries its durable ones.
func (st *state) syncDir(d *dir) error {
	if d.fd < 0 {
		d.durable = maps(d.live)
		return nil
	}
	type add struct {
		name, tmp string
		e         any
	}
	var adds []add
	// 1. Every entry to add gets a temporary name first, so that a file
	// renamed within d never loses its last name on the way.
	for name, e := range d.live {
		if d.durable[name] == e {
			continue
		}
		a := add{name: name, e: e}
		switch e := e.(type) {
		case *file:
			a.tmp = fmt.Sprintf(".lossyfs-sync-%d", e.ino)
			if err := st.linkFile(e, d.fd, a.tmp); err != nil {
				return fmt.Errorf("link %s: %w", name, err)
			}
		case *dir:
			a.tmp = fmt.Sprintf(".lossyfs-sync-%d", e.ino)
			if e.fd >= 0 && e.dparent == d {
				if err := unix.Renameat(d.fd, e.dname, d.fd, a.tmp); err != nil {
					return fmt.Errorf("rename %s: %w", e.dname, err)
				}
				delete(d.durable, e.dname)
				e.dname = a.tmp
			} else if err := st.materialize(e, d, a.tmp); err != nil {
				return fmt.Errorf("mkdir %s: %w", name, err)
			}
		}
		adds = append(adds, a)
	}
	// 2. Remove what is no longer there.
	for name, old := range d.durable {
		if d.live[name] == old {
			continue
		}
		switch old := old.(type) {
		case *file:
			if err := unix.Unlinkat(d.fd, name, 0); err != nil && err != unix.ENOENT {
				return fmt.Errorf("unlink %s: %w", name, err)
			}
		case *dir:
			if err := os.RemoveAll(procPath(d.fd) + "/" + name); err != nil {
				return fmt.Errorf("remove %s: %w", name, err)
			}
			dematerialize(old)
		}
		delete(d.durable, name)
	}
	// 3. The temporary names become the real ones.
	for _, a := range adds {
		if err := unix.Renameat(d.fd, a.tmp, d.fd, a.name); err != nil {
			return fmt.Errorf("rename to %s: %w", a.name, err)
		}
		if x, ok := a.e.(*dir); ok {
			x.dname = a.name
		}
		d.durable[a.name] = a.e
	}
	return nil
}

func (fl *file) dirty() bool {
	return fl.fd >= 0 && (len(fl.pages) > 0 || fl.size != fl.dsize || fl.valid != fl.dsize)
}

// details lists the volatile state below d (live path p), bounded.
func (d *dir) details(p string, depth int) []string {
	var out []string
	var changes []string
	for name, e := range d.live {
		if d.durable[name] != e {
			changes = append(changes, "+"+name)
		}
	}
	for name, e := range d.durable {
		if d.live[name] != e {
			changes = append(changes, "-"+name)
		}
	}
	if len(changes) > 0 {
		slices.Sort(changes)
		out = append(out, "d "+p+": "+strings.Join(changes, " "))
	}
	names := make([]string, 0, len(d.live))
	for name := range d.live {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		switch e := d.live[name].(type) {
		case *file:
			if e.dirty() {
				out = append(out, fmt.Sprintf("f %s (%d pages, size %d, durable %d)", filepath.Join(p, name), len(e.pages), e.size, e.dsize))
			}
		case *dir:
			if depth < 64 {
				out = append(out, e.details(filepath.Join(p, name), depth+1)...)
			}
		}
	}
	return out
}

func sameEntries(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func maps(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// syncUp is DirLenient's fsync: d's entries and every ancestor's.
func (st *state) syncUp(d *dir) error {
	var chain []*dir
	for x := d; x != nil && len(chain) < 4096; x = x.parent {
		chain = append(chain, x)
	}
	// Root first: a directory is created in the backing once its parent is.
	for i := len(chain) - 1; i >= 0; i-- {
		if err := st.syncDir(chain[i]); err != nil {
			return err
		}
	}
	return nil
}

// ---- FUSE nodes ----

type fileNode struct {
	fs.Inode
	st *state
	f  *file
}

type dirNode struct {
	fs.Inode
	st *state
	d  *dir
}

var (
	_ fs.NodeLookuper  = (*dirNode)(nil)
	_ fs.NodeReaddirer = (*dirNode)(nil)
	_ fs.NodeMkdirer   = (*dirNode)(nil)
	_ fs.NodeCreater   = (*dirNode)(nil)
	_ fs.NodeUnlinker  = (*dirNode)(nil)
	_ fs.NodeRmdirer   = (*dirNode)(nil)
	_ fs.NodeRenamer   = (*dirNode)(nil)
	_ fs.NodeFsyncer   = (*dirNode)(nil)
	_ fs.NodeGetattrer = (*dirNode)(nil)
	_ fs.NodeSetattrer = (*dirNode)(nil)
	_ fs.NodeStatfser  = (*dirNode)(nil)
	_ fs.NodeOpener    = (*fileNode)(nil)
	_ fs.NodeReader    = (*fileNode)(nil)
	_ fs.NodeWriter    = (*fileNode)(nil)
	_ fs.NodeFsyncer   = (*fileNode)(nil)
	_ fs.NodeFlusher   = (*fileNode)(nil)
	_ fs.NodeGetattrer = (*fileNode)(nil)
	_ fs.NodeSetattrer = (*fileNode)(nil)
	_ fs.NodeAllocater = (*fileNode)(nil)
)

// lock takes the mount's lock; false (and EIO) once it was cut.
func (st *state) lock() syscall.Errno {
	st.mu.Lock()
	if st.dead {
		st.mu.Unlock()
		return syscall.EIO
	}
	return 0
}

func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

func (fl *file) attr(a *fuse.Attr) syscall.Errno {
	var s syscall.Stat_t
	if err := syscall.Fstat(fl.fd, &s); err != nil {
		return toErrno(err)
	}
	a.FromStat(&s)
	a.Ino = fl.ino
	a.Nlink = 1
	a.Size = uint64(fl.size)
	a.Blocks = (a.Size + 511) / 512
	if !fl.mtime.IsZero() {
		a.SetTimes(nil, &fl.mtime, nil)
	}
	return 0
}

func (d *dir) attr(a *fuse.Attr) syscall.Errno {
	if d.fd >= 0 {
		var s syscall.Stat_t
		if err := syscall.Fstat(d.fd, &s); err != nil {
			return toErrno(err)
		}
		a.FromStat(&s)
	} else {
		now := time.Now()
		a.Mode = syscall.S_IFDIR | d.mode
		a.SetTimes(&now, &now, &now)
		a.Size = 4096
	}
	a.Ino = d.ino
	a.Nlink = 2
	return 0
}

func (n *dirNode) child(ctx context.Context, e any, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	switch e := e.(type) {
	case *file:
		if errno := e.attr(&out.Attr); errno != 0 {
			return nil, errno
		}
		return n.NewInode(ctx, &fileNode{st: n.st, f: e}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: e.ino}), 0
	case *dir:
		if errno := e.attr(&out.Attr); errno != 0 {
			return nil, errno
		}
		return n.NewInode(ctx, &dirNode{st: n.st, d: e}, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: e.ino}), 0
	}
	return nil, syscall.EIO
}

func (n *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.st.lock(); errno != 0 {
		return nil, errno
	}
	defer n.st.mu.Unlock()
	e := n.d.live[name]
	if e == nil {
		return nil, syscall.ENOENT
	}
	return n.child(ctx, e, out)
}

func (n *dirNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	if errno := n.st.lock(); errno != 0 {
		return nil, errno
	}
	defer n.st.mu.Unlock()
	names := make([]string, 0, len(n.d.live))
	for name := range n.d.live {
		names = append(names, name)
	}
	slices.Sort(names)
	list := make([]fuse.DirEntry, 0, len(names))
	for _, name := range names {
		switch e := n.d.live[name].(type) {
		case *file:
			list = append(list, fuse.DirEntry{Name: name, Mode: syscall.S_IFREG, Ino: e.ino})
		case *dir:
			list = append(list, fuse.DirEntry{Name: name, Mode: syscall.S_IFDIR, Ino: e.ino})
		}
	}
	return fs.NewListDirStream(list), 0
}

func (n *dirNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.st.callHook(ctx, &n.Inode, name, Op{Kind: OpMkdir}); errno != 0 {
		return nil, errno
	}
	if n.st.fs.full.Load() {
		return nil, syscall.ENOSPC
	}
	if errno := n.st.lock(); errno != 0 {
		return nil, errno
	}
	defer n.st.mu.Unlock()
	if n.d.live[name] != nil {
		return nil, syscall.EEXIST
	}
	x := &dir{ino: n.st.ino(), fd: -1, mode: mode & 0o7777, live: map[string]any{}, durable: map[string]any{}, parent: n.d}
	n.st.dirs[x] = struct{}{}
	n.d.live[name] = x
	return n.child(ctx, x, out)
}

func (n *dirNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if errno := n.st.callHook(ctx, &n.Inode, name, Op{Kind: OpCreate}); errno != 0 {
		return nil, nil, 0, errno
	}
	if n.st.fs.full.Load() {
		return nil, nil, 0, syscall.ENOSPC
	}
	if errno := n.st.lock(); errno != 0 {
		return nil, nil, 0, errno
	}
	defer n.st.mu.Unlock()
	switch e := n.d.live[name].(type) {
	case *dir:
		return nil, nil, 0, syscall.EISDIR
	case *file:
		if flags&syscall.O_EXCL != 0 {
			return nil, nil, 0, syscall.EEXIST
		}
		if flags&syscall.O_TRUNC != 0 {
			e.truncate(0)
		}
		ino, errno := n.child(ctx, e, out)
		return ino, nil, 0, errno
	}
	fd, err := n.st.tmpfile(mode & 0o7777)
	if err != nil {
		return nil, nil, 0, toErrno(err)
	}
	fl := &file{ino: n.st.ino(), fd: fd, pages: map[int64][]byte{}}
	n.st.files[fl] = struct{}{}
	n.d.live[name] = fl
	ino, errno := n.child(ctx, fl, out)
	return ino, nil, 0, errno
}

func (n *dirNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if errno := n.st.callHook(ctx, &n.Inode, name, Op{Kind: OpUnlink}); errno != 0 {
		return errno
	}
	if errno := n.st.lock(); errno != 0 {
		return errno
	}
	defer n.st.mu.Unlock()
	switch n.d.live[name].(type) {
	case nil:
		return syscall.ENOENT
	case *dir:
		return syscall.EISDIR
	}
	delete(n.d.live, name)
	return 0
}

func (n *dirNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if errno := n.st.callHook(ctx, &n.Inode, name, Op{Kind: OpRmdir}); errno != 0 {
		return errno
	}
	if errno := n.st.lock(); errno != 0 {
		return errno
	}
	defer n.st.mu.Unlock()
	switch x := n.d.live[name].(type) {
	case nil:
		return syscall.ENOENT
	case *file:
		return syscall.ENOTDIR
	case *dir:
		if len(x.live) > 0 {
			return syscall.ENOTEMPTY
		}
		x.parent = nil
	}
	delete(n.d.live, name)
	return 0
}

func (n *dirNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*dirNode)
	if !ok {
		return syscall.EXDEV
	}
	if flags&^uint32(unix.RENAME_NOREPLACE) != 0 {
		return syscall.EINVAL
	}
	if n.st.fs.hook.Load() != nil {
		to := path.Join(np.Path(nil), newName)
		if errno := n.st.callHook(ctx, &n.Inode, name, Op{Kind: OpRename, To: to}); errno != 0 {
			return errno
		}
	}
	if errno := n.st.lock(); errno != 0 {
		return errno
	}
	defer n.st.mu.Unlock()
	src := n.d.live[name]
	if src == nil {
		return syscall.ENOENT
	}
	dst := np.d.live[newName]
	if dst == src {
		return 0
	}
	if dst != nil && flags&unix.RENAME_NOREPLACE != 0 {
		return syscall.EEXIST
	}
	if x, isDir := src.(*dir); isDir {
		if np.d != n.d {
			return syscall.EXDEV
		}
		switch y := dst.(type) {
		case *file:
			return syscall.ENOTDIR
		case *dir:
			if len(y.live) > 0 {
				return syscall.ENOTEMPTY
			}
			y.parent = nil
		}
		x.parent = np.d
	} else if y, ok := dst.(*dir); ok {
		_ = y
		return syscall.EISDIR
	}
	delete(n.d.live, name)
	np.d.live[newName] = src
	return 0
}

func (n *dirNode) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if errno := n.st.callHook(ctx, &n.Inode, "", Op{Kind: OpFsyncDir}); errno != 0 {
		return errno
	}
	if errno := n.st.lock(); errno != 0 {
		return errno
	}
	defer n.st.mu.Unlock()
	if n.st.fs.opts.DirModel == DirLenient {
		return toErrno(n.st.syncUp(n.d))
	}
	return toErrno(n.st.syncDir(n.d))
}

func (n *dirNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if errno := n.st.lock(); errno != 0 {
		return errno
	}
	defer n.st.mu.Unlock()
	return n.d.attr(&out.Attr)
}

func (n *dirNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if errno := n.st.lock(); errno != 0 {
		return errno
	}
	defer n.st.mu.Unlock()
	if m, ok := in.GetMode(); ok {
		n.d.mode = m & 0o7777
		if n.d.fd >= 0 {
			if err := unix.Fchmod(n.d.fd, m&0o7777); err != nil {
				return toErrno(err)
			}
		}
	}
	return n.d.attr(&out.Attr)
}

func (n *dirNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if errno := n.st.lock(); errno != 0 {
		return errno
	}
	defer n.st.mu.Unlock()
	var s syscall.Statfs_t
	if err := syscall.Fstatfs(n.st.root.fd, &s); err != nil {
		return toErrno(err)
	}
	out.FromStatfsT(&s)
	return 0
}

func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.st.fs.hook.Load() != nil {
		op := Op{Kind: OpOpen}
		if flags&syscall.O_TRUNC != 0 {
			op.To = "trunc"
		}
		if errno := n.st.callHook(ctx, &n.Inode, "", op); errno != 0 {
			return nil, 0, errno
		}
	}
	if errno := n.st.lock(); errno != 0 {
		return nil, 0, errno
	}
	defer n.st.mu.Unlock()
	if flags&syscall.O_TRUNC != 0 {
		n.f.truncate(0)
	}
	// No FOPEN_DIRECT_IO (mmap must work) and no FOPEN_KEEP_CACHE.
	return nil, 0, 0
}

func (n *fileNode) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if errno := n.st.lock(); errno != 0 {
		return nil, errno
	}
	defer n.st.mu.Unlock()
	m, err := n.f.read(dest, off)
	if err != nil {
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(dest[:m]), 0
}

func (n *fileNode) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := n.st.callHook(ctx, &n.Inode, "", Op{Kind: OpWrite, Off: off, Len: int64(len(data))}); errno != 0 {
		return 0, errno
	}
	if n.st.fs.full.Load() {
		return 0, syscall.ENOSPC
	}
	if errno := n.st.lock(); errno != 0 {
		return 0, errno
	}
	defer n.st.mu.Unlock()
	if err := n.f.write(data, off); err != nil {
		return 0, toErrno(err)
	}
	return uint32(len(data)), 0
}

func (n *fileNode) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if errno := n.st.callHook(ctx, &n.Inode, "", Op{Kind: OpFsync}); errno != 0 {
		return errno
	}
	if errno := n.st.lock(); errno != 0 {
		return errno
	}
	defer n.st.mu.Unlock()
	if err := n.f.flush(); err != nil {
		return toErrno(err)
	}
	if n.st.fs.opts.DirModel == DirLenient {
		if p := n.parentDir(); p != nil {
			return toErrno(n.st.syncUp(p))
		}
	}
	return 0
}

// parentDir is the directory whose live entries hold this file (nil if
// none: unlinked).
func (n *fileNode) parentDir() *dir {
	if _, parent := n.Parent(); parent != nil {
		if pn, ok := parent.Operations().(*dirNode); ok {
			for _, e := range pn.d.live {
				if e == n.f {
					return pn.d
				}
			}
		}
	}
	return nil
}

func (n *fileNode) Flush(ctx context.Context, f fs.FileHandle) syscall.Errno { return 0 }

func (n *fileNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if errno := n.st.lock(); errno != 0 {
		return errno
	}
	defer n.st.mu.Unlock()
	return n.f.attr(&out.Attr)
}

func (n *fileNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		if errno := n.st.callHook(ctx, &n.Inode, "", Op{Kind: OpTruncate, Off: int64(sz)}); errno != 0 {
			return errno
		}
	}
	if errno := n.st.lock(); errno != 0 {
		return errno
	}
	defer n.st.mu.Unlock()
	if sz, ok := in.GetSize(); ok {
		if int64(sz) > n.f.size && n.st.fs.full.Load() {
			return syscall.ENOSPC
		}
		n.f.truncate(int64(sz))
	}
	if m, ok := in.GetMode(); ok {
		if err := unix.Fchmod(n.f.fd, m&0o7777); err != nil {
			return toErrno(err)
		}
	}
	if mt, ok := in.GetMTime(); ok {
		n.f.mtime = mt
	}
	return n.f.attr(&out.Attr)
}

func (n *fileNode) Allocate(ctx context.Context, f fs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	if errno := n.st.callHook(ctx, &n.Inode, "", Op{Kind: OpAllocate, Off: int64(off), Len: int64(size)}); errno != 0 {
		return errno
	}
	if errno := n.st.lock(); errno != 0 {
		return errno
	}
	defer n.st.mu.Unlock()
	switch mode {
	case 0:
		if end := int64(off + size); end > n.f.size {
			if n.st.fs.full.Load() {
				return syscall.ENOSPC
			}
			n.f.truncate(end)
		}
		return 0
	case unix.FALLOC_FL_KEEP_SIZE:
		return 0
	}
	return syscall.EOPNOTSUPP
}
