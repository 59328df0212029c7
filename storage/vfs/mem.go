package vfs

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// MemFS is a strict in-memory FS for crash tests, modelled on Pebble's
// vfs.NewStrictMem. It keeps, besides the live state every call sees, the
// state a power loss would leave:
//
//   - a file's data and size as of its last Sync or SyncData (both count);
//   - a directory's entries (create, remove, rename in or out, mkdir) as of
//     its last sync through OpenDir(dir).Sync(). A file synced in a
//     directory never synced vanishes in a crash; a rename reverts.
//
// Directories revert to their synced entries independently of each other,
// so a rename between two directories of which only the target was synced
// leaves the inode under both names after a crash (a worst case POSIX
// allows for files; no real file system does it for directories, this one
// may). The root always exists.
//
// Paths are cleaned with filepath.Clean; relative paths are relative to the
// root (there is no working directory), so "a/b" and "/a/b" are one file.
//
// A crash (Crash, ResetToSyncedState) invalidates every handle opened before
// it: their calls fail with an error that matches os.ErrClosed (ErrCrashed),
// except Close, which succeeds once so that deferred Closes stay quiet.
//
// All methods are safe for concurrent use; one mutex guards everything.
type MemFS struct {
	mu   sync.Mutex
	root *memNode
	// gen counts crashes; a handle from an older generation is stale.
	gen uint64
}

var _ FS = (*MemFS)(nil)

// ErrCrashed is returned (in an *os.PathError) by a handle opened before a
// simulated crash. It matches os.ErrClosed.
var ErrCrashed = fmt.Errorf("vfs: handle opened before a simulated crash: %w", os.ErrClosed)

// memNode is an inode: a file or a directory. Names live in the parent's
// entry maps, so a rename moves the pointer and handles keep working.
type memNode struct {
	isDir bool

	// Files. data is the live image, synced the image a crash falls back
	// to, and log the changes since the last sync, oldest first, replayed
	// onto synced at the next sync (cheaper than copying a long file on
	// every fsync) and by CrashTearLastWrite.
	data   []byte
	synced []byte
	log    []memChange

	// Directories: live entries and entries as of the last directory sync.
	children      map[string]*memNode
	syncedEntries map[string]*memNode
}

// memChange is one unsynced change to a file: a write of data at off, or
// (truncate) a resize to off.
type memChange struct {
	truncate bool
	off      int64
	data     []byte
}

func newFile() *memNode { return &memNode{} }

func newDir() *memNode {
	return &memNode{isDir: true, children: map[string]*memNode{}, syncedEntries: map[string]*memNode{}}
}

// NewStrictMem returns an empty MemFS holding only the root directory.
func NewStrictMem() *MemFS { return &MemFS{root: newDir()} }

// resize returns b with length n, zeroing any bytes it grows by (a shrunk
// slice keeps stale bytes in its capacity).
func resize(b []byte, n int64) []byte {
	if n <= int64(len(b)) {
		return b[:n]
	}
	if n <= int64(cap(b)) {
		old := len(b)
		b = b[:n]
		clear(b[old:])
		return b
	}
	nb := make([]byte, n, max(n, 2*int64(cap(b))))
	copy(nb, b)
	return nb
}

func (c memChange) apply(b []byte) []byte {
	if c.truncate {
		return resize(b, c.off)
	}
	if len(c.data) == 0 {
		return b // a write of nothing does not extend the file
	}
	if end := c.off + int64(len(c.data)); end > int64(len(b)) {
		b = resize(b, end)
	}
	copy(b[c.off:], c.data)
	return b
}

func (n *memNode) change(c memChange) {
	n.data = c.apply(n.data)
	n.log = append(n.log, c)
}

// sync makes a file's data or a directory's entries durable.
func (n *memNode) sync() {
	if n.isDir {
		n.syncedEntries = maps.Clone(n.children)
		return
	}
	for _, c := range n.log {
		n.synced = c.apply(n.synced)
	}
	n.log = nil
}

// splitPath cleans name into its components below the root; nil is the root.
func splitPath(name string) []string {
	p := strings.TrimLeft(filepath.ToSlash(filepath.Clean(name)), "/")
	if p == "" || p == "." {
		return nil
	}
	parts := strings.Split(p, "/")
	for len(parts) > 0 && parts[0] == ".." { // the root's parent is the root
		parts = parts[1:]
	}
	return parts
}

func pathErr(op, name string, err error) error { return &os.PathError{Op: op, Path: name, Err: err} }

// walk returns the node at parts.
func (fs *MemFS) walk(parts []string) (*memNode, error) {
	n := fs.root
	for _, p := range parts {
		if !n.isDir {
			return nil, syscall.ENOTDIR
		}
		c, ok := n.children[p]
		if !ok {
			return nil, os.ErrNotExist
		}
		n = c
	}
	return n, nil
}

// parent returns the directory that holds name's last component, and that
// component; name must not be the root.
func (fs *MemFS) parent(name string) (*memNode, string, error) {
	parts := splitPath(name)
	if len(parts) == 0 {
		return nil, "", syscall.EINVAL
	}
	dir, err := fs.walk(parts[:len(parts)-1])
	if err != nil {
		return nil, "", err
	}
	if !dir.isDir {
		return nil, "", syscall.ENOTDIR
	}
	return dir, parts[len(parts)-1], nil
}

func (fs *MemFS) open(name string, n *memNode, write bool) *memFile {
	return &memFile{fs: fs, n: n, name: name, gen: fs.gen, write: write}
}

// Create implements FS: an existing file is truncated (same inode, as
// O_TRUNC does); a new one is an unsynced entry of its directory.
func (fs *MemFS) Create(name string) (File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dir, base, err := fs.parent(name)
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	n, ok := dir.children[base]
	switch {
	case !ok:
		n = newFile()
		dir.children[base] = n
	case n.isDir:
		return nil, pathErr("open", name, syscall.EISDIR)
	default:
		n.change(memChange{truncate: true})
	}
	return fs.open(name, n, true), nil
}

// Open implements FS: read-only; a directory may be opened too (and synced).
func (fs *MemFS) Open(name string) (File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n, err := fs.walk(splitPath(name))
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	return fs.open(name, n, false), nil
}

// OpenReadWrite implements FS.
func (fs *MemFS) OpenReadWrite(name string) (File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n, err := fs.walk(splitPath(name))
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	if n.isDir {
		return nil, pathErr("open", name, syscall.EISDIR)
	}
	return fs.open(name, n, true), nil
}

// OpenDir implements FS.
func (fs *MemFS) OpenDir(name string) (File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n, err := fs.walk(splitPath(name))
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	if !n.isDir {
		return nil, pathErr("open", name, syscall.ENOTDIR)
	}
	return fs.open(name, n, false), nil
}

// Remove implements FS. An open handle on the file keeps working.
func (fs *MemFS) Remove(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dir, base, err := fs.parent(name)
	if err != nil {
		return pathErr("remove", name, err)
	}
	n, ok := dir.children[base]
	if !ok {
		return pathErr("remove", name, os.ErrNotExist)
	}
	if n.isDir && len(n.children) > 0 {
		return pathErr("remove", name, syscall.ENOTEMPTY) // matches os.ErrExist, as on Linux
	}
	delete(dir.children, base)
	return nil
}

// RemoveAll implements FS: name's entry is dropped from its parent, so the
// whole subtree comes back in a crash unless the parent was synced.
func (fs *MemFS) RemoveAll(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dir, base, err := fs.parent(name)
	if err == os.ErrNotExist {
		return nil
	}
	if err != nil {
		return pathErr("unlinkat", name, err)
	}
	delete(dir.children, base)
	return nil
}

// Rename implements FS. Errors are *os.LinkError, as from os.Rename.
func (fs *MemFS) Rename(oldname, newname string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	lerr := func(err error) error { return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err} }
	odir, obase, err := fs.parent(oldname)
	if err != nil {
		return lerr(err)
	}
	n, ok := odir.children[obase]
	if !ok {
		return lerr(os.ErrNotExist)
	}
	ndir, nbase, err := fs.parent(newname)
	if err != nil {
		return lerr(err)
	}
	old, exists := ndir.children[nbase]
	if exists && old == n {
		return nil // same inode: rename(2) does nothing
	}
	if n.isDir {
		op, np := splitPath(oldname), splitPath(newname)
		if len(np) > len(op) && slices.Equal(np[:len(op)], op) {
			return lerr(syscall.EINVAL) // into its own subtree
		}
		if exists && !old.isDir {
			return lerr(syscall.ENOTDIR)
		}
		if exists && len(old.children) > 0 {
			return lerr(syscall.ENOTEMPTY)
		}
	} else if exists && old.isDir {
		return lerr(syscall.EISDIR)
	}
	delete(odir.children, obase)
	ndir.children[nbase] = n
	return nil
}

// MkdirAll implements FS; each new directory is an unsynced entry of its
// parent. perm is ignored.
func (fs *MemFS) MkdirAll(dir string, perm os.FileMode) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := fs.root
	for _, p := range splitPath(dir) {
		c, ok := n.children[p]
		if !ok {
			c = newDir()
			n.children[p] = c
		} else if !c.isDir {
			return pathErr("mkdir", dir, syscall.ENOTDIR)
		}
		n = c
	}
	return nil
}

// List implements FS.
func (fs *MemFS) List(dir string) ([]string, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n, err := fs.walk(splitPath(dir))
	if err != nil {
		return nil, pathErr("open", dir, err)
	}
	if !n.isDir {
		return nil, pathErr("readdirent", dir, syscall.ENOTDIR)
	}
	return slices.Sorted(maps.Keys(n.children)), nil
}

// Stat implements FS.
func (fs *MemFS) Stat(name string) (os.FileInfo, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n, err := fs.walk(splitPath(name))
	if err != nil {
		return nil, pathErr("stat", name, err)
	}
	return n.stat(name), nil
}

// memFile is an open handle with its own offset.
type memFile struct {
	fs     *MemFS
	n      *memNode
	name   string
	gen    uint64
	write  bool
	off    int64
	closed bool
}

// check is called with fs.mu held.
func (f *memFile) check(op string) error {
	if f.closed {
		return pathErr(op, f.name, os.ErrClosed)
	}
	if f.gen != f.fs.gen {
		return pathErr(op, f.name, ErrCrashed)
	}
	return nil
}

func (f *memFile) Read(p []byte) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("read"); err != nil {
		return 0, err
	}
	if f.n.isDir {
		return 0, pathErr("read", f.name, syscall.EISDIR)
	}
	if f.off >= int64(len(f.n.data)) {
		return 0, io.EOF
	}
	k := copy(p, f.n.data[f.off:])
	f.off += int64(k)
	return k, nil
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("read"); err != nil {
		return 0, err
	}
	if f.n.isDir {
		return 0, pathErr("read", f.name, syscall.EISDIR)
	}
	if off < 0 {
		return 0, pathErr("readat", f.name, syscall.EINVAL)
	}
	if off >= int64(len(f.n.data)) {
		return 0, io.EOF
	}
	k := copy(p, f.n.data[off:])
	if k < len(p) {
		return k, io.EOF
	}
	return k, nil
}

func (f *memFile) Write(p []byte) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("write"); err != nil {
		return 0, err
	}
	if !f.write {
		return 0, pathErr("write", f.name, syscall.EBADF)
	}
	f.n.change(memChange{off: f.off, data: bytes.Clone(p)})
	f.off += int64(len(p))
	return len(p), nil
}

func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return pathErr("close", f.name, os.ErrClosed)
	}
	f.closed = true // a stale handle closes without error
	return nil
}

func (f *memFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("sync"); err != nil {
		return err
	}
	f.n.sync()
	return nil
}

func (f *memFile) SyncData() error { return f.Sync() }

func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("truncate"); err != nil {
		return err
	}
	if f.n.isDir || !f.write || size < 0 {
		return pathErr("truncate", f.name, syscall.EINVAL)
	}
	f.n.change(memChange{truncate: true, off: size})
	return nil
}

func (f *memFile) Stat() (os.FileInfo, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("stat"); err != nil {
		return nil, err
	}
	return f.n.stat(f.name), nil
}

func (n *memNode) stat(name string) os.FileInfo {
	fi := memFileInfo{name: filepath.Base(filepath.Clean(name)), size: int64(len(n.data)), mode: 0o600}
	if n.isDir {
		fi.size, fi.mode = 0, os.ModeDir|0o755
	}
	return fi
}

type memFileInfo struct {
	name string
	size int64
	mode os.FileMode
}

// memModTime is every file's ModTime: the tests must not depend on time.
var memModTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func (fi memFileInfo) Name() string       { return fi.name }
func (fi memFileInfo) Size() int64        { return fi.size }
func (fi memFileInfo) Mode() os.FileMode  { return fi.mode }
func (fi memFileInfo) ModTime() time.Time { return memModTime }
func (fi memFileInfo) IsDir() bool        { return fi.mode.IsDir() }
func (fi memFileInfo) Sys() any           { return nil }

// CrashMode says what a simulated power loss keeps of the unsynced data.
// Directories revert to their synced entries in every mode.
type CrashMode int

const (
	// CrashDropUnsynced keeps only synced data: every file reverts to its
	// image at its last Sync or SyncData.
	CrashDropUnsynced CrashMode = iota
	// CrashTearLastWrite models a crash in the middle of a write: a file's
	// unsynced changes all persist except its last unsynced write, of
	// which a prefix persists. The prefix ends at the write's start, at
	// its end, or at a 512-byte sector boundary (a multiple of 512 in file
	// offsets) inside it, chosen uniformly. Truncates after that write
	// persist. A file with no unsynced write keeps its unsynced truncates.
	CrashTearLastWrite
	// CrashRandomPages models reordered writeback: each 4096-byte page
	// whose live and synced contents differ persists (live content) or not
	// (synced content; zeros beyond the synced size) with probability 1/2,
	// independently. The size is the synced or the live size, 1/2 each.
	CrashRandomPages
)

// SectorSize and PageSize are the units CrashTearLastWrite and
// CrashRandomPages cut at.
const (
	SectorSize = 512
	PageSize   = 4096
)

func (m CrashMode) String() string {
	switch m {
	case CrashDropUnsynced:
		return "drop-unsynced"
	case CrashTearLastWrite:
		return "tear-last-write"
	case CrashRandomPages:
		return "random-pages"
	}
	return fmt.Sprintf("CrashMode(%d)", int(m))
}

// ResetToSyncedState simulates a power loss that keeps only what was synced:
// Crash(CrashDropUnsynced, nil).
func (fs *MemFS) ResetToSyncedState() { fs.Crash(CrashDropUnsynced, nil) }

// Crash simulates a power loss in place: the live state becomes what mode
// keeps of it, and every open handle goes stale (ErrCrashed). rng draws the
// random choices in a fixed order (paths sorted), so a seed replays a
// crash; it may be nil only for CrashDropUnsynced.
func (fs *MemFS) Crash(mode CrashMode, rng *rand.Rand) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.root = crashCopy(fs.root, mode, rng, map[*memNode]*memNode{})
	fs.gen++
}

// CrashClone returns a new MemFS holding what a power loss now would leave,
// as Crash does, while fs carries on unchanged (its handles stay valid).
func (fs *MemFS) CrashClone(mode CrashMode, rng *rand.Rand) *MemFS {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return &MemFS{root: crashCopy(fs.root, mode, rng, map[*memNode]*memNode{})}
}

// crashCopy builds the post-crash copy of n. Fresh nodes keep stale handles
// and the original tree apart; seen keeps an inode linked from two
// directories one inode.
func crashCopy(n *memNode, mode CrashMode, rng *rand.Rand, seen map[*memNode]*memNode) *memNode {
	if c, ok := seen[n]; ok {
		return c
	}
	if n.isDir {
		c := newDir()
		seen[n] = c
		for _, name := range slices.Sorted(maps.Keys(n.syncedEntries)) {
			c.children[name] = crashCopy(n.syncedEntries[name], mode, rng, seen)
		}
		c.syncedEntries = maps.Clone(c.children)
		return c
	}
	var img []byte
	switch mode {
	case CrashDropUnsynced:
		img = bytes.Clone(n.synced)
	case CrashTearLastWrite:
		img = n.tornImage(rng)
	case CrashRandomPages:
		img = n.pagesImage(rng)
	default:
		panic(fmt.Sprintf("vfs: unknown %v", mode))
	}
	c := &memNode{data: img, synced: bytes.Clone(img)}
	seen[n] = c
	return c
}

func intN(rng *rand.Rand, n int) int {
	if rng == nil {
		panic("vfs: a nil rng for a random crash mode")
	}
	return rng.IntN(n)
}

// tornImage replays n's unsynced changes onto its synced image, the last
// write cut to a prefix (see CrashTearLastWrite).
func (n *memNode) tornImage(rng *rand.Rand) []byte {
	last := -1
	for i, c := range n.log {
		if !c.truncate && len(c.data) > 0 {
			last = i
		}
	}
	img := bytes.Clone(n.synced)
	for i, c := range n.log {
		if i == last {
			cuts := []int64{0}
			end := c.off + int64(len(c.data))
			for b := (c.off/SectorSize + 1) * SectorSize; b < end; b += SectorSize {
				cuts = append(cuts, b-c.off)
			}
			cuts = append(cuts, int64(len(c.data)))
			c.data = c.data[:cuts[intN(rng, len(cuts))]]
		}
		img = c.apply(img)
	}
	return img
}

// pagesImage mixes n's live and synced images page by page (see
// CrashRandomPages).
func (n *memNode) pagesImage(rng *rand.Rand) []byte {
	live, old := n.data, n.synced
	size := int64(len(old))
	if len(live) != len(old) && intN(rng, 2) == 1 {
		size = int64(len(live))
	}
	ext := int64(max(len(live), len(old)))
	img := make([]byte, ext)
	copy(img, old)
	for p := int64(0); p < ext; p += PageSize {
		e := min(p+PageSize, ext)
		lp, op := pageOf(live, p, e), pageOf(old, p, e)
		if !bytes.Equal(lp, op) && intN(rng, 2) == 1 {
			copy(img[p:e], lp)
		}
	}
	return img[:size]
}

// pageOf returns b[p:e], zero-padded where b is shorter.
func pageOf(b []byte, p, e int64) []byte {
	out := make([]byte, e-p)
	if p < int64(len(b)) {
		copy(out, b[p:min(e, int64(len(b)))])
	}
	return out
}

// String lists every path with its live size, the size a crash now would
// keep (DropUnsynced) and a mark on entries their directory has not synced.
func (fs *MemFS) String() string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var sb strings.Builder
	seen := map[*memNode]bool{}
	var walk func(dir *memNode, path string)
	walk = func(dir *memNode, path string) {
		if seen[dir] {
			return
		}
		seen[dir] = true
		for _, name := range slices.Sorted(maps.Keys(dir.children)) {
			c, p := dir.children[name], path+"/"+name
			mark := ""
			if dir.syncedEntries[name] != c {
				mark = " (entry unsynced)"
			}
			if c.isDir {
				fmt.Fprintf(&sb, "%s/%s\n", p, mark)
				walk(c, p)
			} else {
				fmt.Fprintf(&sb, "%s size=%d synced=%d%s\n", p, len(c.data), len(c.synced), mark)
			}
		}
	}
	sb.WriteString("/\n")
	walk(fs.root, "")
	return sb.String()
}
