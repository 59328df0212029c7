package vfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// put creates name holding data, synced or not, and closes it.
func put(t *testing.T, fs FS, name string, data []byte, syncFile bool) {
	t.Helper()
	f, err := fs.Create(name)
	must(t, err)
	_, err = f.Write(data)
	must(t, err)
	if syncFile {
		must(t, f.SyncData())
	}
	must(t, f.Close())
}

// content returns name's data, or nil and false if it does not exist.
func content(t *testing.T, fs FS, name string) ([]byte, bool) {
	t.Helper()
	b, err := ReadFile(fs, name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false
	}
	must(t, err)
	return b, true
}

func TestMemDurability(t *testing.T) {
	old, new := []byte("old"), []byte("new")
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, fs *MemFS) // runs after /d/a holds old, all synced
		want  map[string][]byte             // after the reset; nil: absent
	}{
		{"write without sync", func(t *testing.T, fs *MemFS) {
			f, err := fs.OpenReadWrite("/d/a")
			must(t, err)
			_, err = f.Write(new)
			must(t, err)
		}, map[string][]byte{"/d/a": old}},
		{"write and SyncData", func(t *testing.T, fs *MemFS) {
			f, err := fs.OpenReadWrite("/d/a")
			must(t, err)
			_, err = f.Write([]byte("newer"))
			must(t, err)
			must(t, f.SyncData())
		}, map[string][]byte{"/d/a": []byte("newer")}},
		{"new file synced, dir not", func(t *testing.T, fs *MemFS) {
			put(t, fs, "/d/b", new, true)
		}, map[string][]byte{"/d/a": old, "/d/b": nil}},
		{"new file and dir synced", func(t *testing.T, fs *MemFS) {
			put(t, fs, "/d/b", new, true)
			must(t, SyncDir(fs, "/d"))
		}, map[string][]byte{"/d/a": old, "/d/b": new}},
		{"new file, dir synced, file not", func(t *testing.T, fs *MemFS) {
			put(t, fs, "/d/b", new, false)
			must(t, SyncDir(fs, "/d"))
		}, map[string][]byte{"/d/b": {}}},
		{"rename without dir sync", func(t *testing.T, fs *MemFS) {
			must(t, fs.Rename("/d/a", "/d/b"))
		}, map[string][]byte{"/d/a": old, "/d/b": nil}},
		{"rename with dir sync", func(t *testing.T, fs *MemFS) {
			must(t, fs.Rename("/d/a", "/d/b"))
			must(t, SyncDir(fs, "/d"))
		}, map[string][]byte{"/d/a": nil, "/d/b": old}},
		{"rename over a file without dir sync", func(t *testing.T, fs *MemFS) {
			put(t, fs, "/d/b", new, true)
			must(t, SyncDir(fs, "/d"))
			put(t, fs, "/d/tmp", []byte("tmp"), true)
			must(t, fs.Rename("/d/tmp", "/d/b"))
		}, map[string][]byte{"/d/b": new, "/d/tmp": nil}},
		{"rename across dirs, only target synced", func(t *testing.T, fs *MemFS) {
			must(t, fs.MkdirAll("/e", 0o755))
			must(t, SyncDir(fs, "/"))
			must(t, fs.Rename("/d/a", "/e/a"))
			must(t, SyncDir(fs, "/e"))
		}, map[string][]byte{"/d/a": old, "/e/a": old}},
		{"remove without dir sync", func(t *testing.T, fs *MemFS) {
			must(t, fs.Remove("/d/a"))
		}, map[string][]byte{"/d/a": old}},
		{"remove with dir sync", func(t *testing.T, fs *MemFS) {
			must(t, fs.Remove("/d/a"))
			must(t, SyncDir(fs, "/d"))
		}, map[string][]byte{"/d/a": nil}},
		{"RemoveAll without root sync", func(t *testing.T, fs *MemFS) {
			must(t, fs.RemoveAll("/d"))
		}, map[string][]byte{"/d/a": old}},
		{"MkdirAll without parent sync", func(t *testing.T, fs *MemFS) {
			must(t, fs.MkdirAll("/x/y", 0o755))
			must(t, SyncDir(fs, "/x/y"))
			must(t, SyncDir(fs, "/x"))
			put(t, fs, "/x/y/f", new, true)
			must(t, SyncDir(fs, "/x/y"))
		}, map[string][]byte{"/x/y/f": nil}},
		{"MkdirAll with every parent synced", func(t *testing.T, fs *MemFS) {
			must(t, fs.MkdirAll("x/y", 0o755)) // relative: from the root
			put(t, fs, "/x/y/f", new, true)
			must(t, SyncDir(fs, "/x/y"))
			must(t, SyncDir(fs, "/x"))
			must(t, SyncDir(fs, "/"))
		}, map[string][]byte{"/x/y/f": new}},
		{"Create truncates, unsynced", func(t *testing.T, fs *MemFS) {
			f, err := fs.Create("/d/a")
			must(t, err)
			must(t, f.Close())
		}, map[string][]byte{"/d/a": old}},
		{"Create truncates, synced", func(t *testing.T, fs *MemFS) {
			f, err := fs.Create("/d/a")
			must(t, err)
			must(t, f.Sync())
		}, map[string][]byte{"/d/a": {}}},
		{"truncate unsynced", func(t *testing.T, fs *MemFS) {
			f, err := fs.OpenReadWrite("/d/a")
			must(t, err)
			must(t, f.Truncate(1))
		}, map[string][]byte{"/d/a": old}},
		{"truncate synced, then grow unsynced", func(t *testing.T, fs *MemFS) {
			f, err := fs.OpenReadWrite("/d/a")
			must(t, err)
			must(t, f.Truncate(1))
			must(t, f.Sync())
			must(t, f.Truncate(5))
		}, map[string][]byte{"/d/a": []byte("o")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := NewStrictMem()
			must(t, fs.MkdirAll("/d", 0o755))
			put(t, fs, "/d/a", old, true)
			must(t, SyncDir(fs, "/d"))
			must(t, SyncDir(fs, "/"))
			tc.setup(t, fs)
			fs.ResetToSyncedState()
			for name, want := range tc.want {
				got, ok := content(t, fs, name)
				switch {
				case want == nil && ok:
					t.Errorf("%s survived with %q\n%s", name, got, fs)
				case want != nil && !ok:
					t.Errorf("%s is gone, want %q\n%s", name, want, fs)
				case !bytes.Equal(got, want):
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
		})
	}
}

func TestMemFileSemantics(t *testing.T) {
	fs := NewStrictMem()
	must(t, fs.MkdirAll("/a/b", 0o755))
	f, err := fs.Create("/a/b/f")
	must(t, err)
	_, err = f.Write([]byte("hello world"))
	must(t, err)

	// Own offset for Read; ReadAt independent of it.
	r, err := fs.Open("/a/b/f")
	must(t, err)
	buf := make([]byte, 5)
	if n, err := r.Read(buf); n != 5 || err != nil || string(buf) != "hello" {
		t.Fatalf("Read = %d %v %q", n, err, buf)
	}
	if n, err := r.ReadAt(buf, 6); n != 5 || err != nil || string(buf) != "world" {
		t.Fatalf("ReadAt = %d %v %q", n, err, buf)
	}
	if n, err := r.ReadAt(buf, 8); n != 3 || err != io.EOF {
		t.Fatalf("ReadAt past the end = %d %v", n, err)
	}
	if rest, err := io.ReadAll(r); err != nil || string(rest) != " world" {
		t.Fatalf("rest = %q %v", rest, err)
	}
	if _, err := r.Write([]byte("x")); err == nil {
		t.Fatal("Write on a read-only handle succeeded")
	}

	// Rename keeps the inode; both handles keep working.
	must(t, fs.Rename("/a/b/f", "/a/g"))
	_, err = f.Write([]byte("!"))
	must(t, err)
	if b, _ := content(t, fs, "/a/g"); string(b) != "hello world!" {
		t.Fatalf("after rename = %q", b)
	}
	// Remove of an open file leaves the handle readable.
	must(t, fs.Remove("/a/g"))
	if n, err := r.ReadAt(buf, 7); n != 5 || err != nil || string(buf) != "orld!" {
		t.Fatalf("ReadAt after Remove = %d %v %q", n, err, buf)
	}

	// Truncate shrinks, then grows with zeros; a write past the end leaves a hole.
	g, err := fs.Create("/t")
	must(t, err)
	_, err = g.Write([]byte("abcdef"))
	must(t, err)
	must(t, g.Truncate(2))
	must(t, g.Truncate(4))
	if b, _ := content(t, fs, "/t"); !bytes.Equal(b, []byte("ab\x00\x00")) {
		t.Fatalf("after truncates = %q", b)
	}
	_, err = g.Write([]byte("Z")) // offset still 6
	must(t, err)
	if b, _ := content(t, fs, "/t"); !bytes.Equal(b, []byte("ab\x00\x00\x00\x00Z")) {
		t.Fatalf("after write past the end = %q", b)
	}
	fi, err := g.Stat()
	must(t, err)
	if fi.Name() != "t" || fi.Size() != 7 || fi.IsDir() || !fi.Mode().IsRegular() {
		t.Fatalf("Stat = %v %v %v %v", fi.Name(), fi.Size(), fi.IsDir(), fi.Mode())
	}
	di, err := fs.Stat("/a/b/")
	must(t, err)
	if di.Name() != "b" || !di.IsDir() {
		t.Fatalf("dir Stat = %v %v", di.Name(), di.IsDir())
	}
	if names, err := fs.List("/"); err != nil || !slices.Equal(names, []string{"a", "t"}) {
		t.Fatalf("List = %v %v", names, err)
	}
	must(t, g.Close())
	if err := g.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("second Close = %v", err)
	}
}

func TestMemErrors(t *testing.T) {
	fs := NewStrictMem()
	must(t, fs.MkdirAll("/d/sub", 0o755))
	put(t, fs, "/d/f", []byte("x"), false)
	for _, tc := range []struct {
		name   string
		err    error
		target error
	}{
		{"Open missing", func() error { _, err := fs.Open("/d/nope"); return err }(), os.ErrNotExist},
		{"OpenReadWrite missing", func() error { _, err := fs.OpenReadWrite("/nope"); return err }(), os.ErrNotExist},
		{"Create in a missing dir", func() error { _, err := fs.Create("/x/f"); return err }(), os.ErrNotExist},
		{"Stat missing", func() error { _, err := fs.Stat("/d/nope"); return err }(), os.ErrNotExist},
		{"List missing", func() error { _, err := fs.List("/nope"); return err }(), os.ErrNotExist},
		{"Remove missing", fs.Remove("/d/nope"), os.ErrNotExist},
		{"Rename missing", fs.Rename("/d/nope", "/d/y"), os.ErrNotExist},
		{"Remove non-empty dir", fs.Remove("/d"), os.ErrExist},
		{"Rename dir over non-empty dir", func() error {
			must(t, fs.MkdirAll("/e/g", 0o755))
			return fs.Rename("/d/sub", "/e")
		}(), os.ErrExist},
		{"Create on a dir", func() error { _, err := fs.Create("/d"); return err }(), syscall.EISDIR},
		{"path through a file", func() error { _, err := fs.Open("/d/f/x"); return err }(), syscall.ENOTDIR},
		{"MkdirAll through a file", fs.MkdirAll("/d/f/x", 0o755), syscall.ENOTDIR},
		{"OpenDir on a file", func() error { _, err := fs.OpenDir("/d/f"); return err }(), syscall.ENOTDIR},
	} {
		if !errors.Is(tc.err, tc.target) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.target)
		}
		var pe *os.PathError
		var le *os.LinkError
		if !errors.As(tc.err, &pe) && !errors.As(tc.err, &le) {
			t.Errorf("%s: %T is no *os.PathError", tc.name, tc.err)
		}
	}
	if err := fs.RemoveAll("/nope/x"); err != nil {
		t.Errorf("RemoveAll missing = %v", err)
	}
}

func TestMemStaleHandles(t *testing.T) {
	fs := NewStrictMem()
	put(t, fs, "/f", []byte("data"), true)
	must(t, SyncDir(fs, "/"))
	f, err := fs.OpenReadWrite("/f")
	must(t, err)
	d, err := fs.OpenDir("/")
	must(t, err)
	fs.ResetToSyncedState()
	_, rerr := f.Read(make([]byte, 1))
	_, werr := f.Write([]byte("x"))
	for name, err := range map[string]error{
		"Read": rerr, "Write": werr, "Sync": f.Sync(), "Truncate": f.Truncate(0), "dir Sync": d.Sync(),
	} {
		if !errors.Is(err, os.ErrClosed) || !errors.Is(err, ErrCrashed) {
			t.Errorf("%s on a stale handle = %v", name, err)
		}
	}
	must(t, f.Close())
	if b, _ := content(t, fs, "/f"); string(b) != "data" {
		t.Fatalf("after reset = %q", b)
	}
}

// crashOf returns a MemFS holding /f with synced content base (synced in
// its directory), onto which the test then writes without syncing.
func crashOf(t *testing.T, base []byte) (*MemFS, File) {
	fs := NewStrictMem()
	f, err := fs.Create("/f")
	must(t, err)
	_, err = f.Write(base)
	must(t, err)
	must(t, f.Sync())
	must(t, SyncDir(fs, "/"))
	return fs, f
}

// writeAt writes data at off in name through a fresh handle (File has no
// Seek: the handle reads its way to off, growing the file first if short).
func writeAt(t *testing.T, fs FS, name string, off int, data []byte) {
	t.Helper()
	h, err := fs.OpenReadWrite(name)
	must(t, err)
	if sizeOf(t, fs, name) < int64(off) {
		must(t, h.Truncate(int64(off)))
	}
	_, err = io.ReadFull(h, make([]byte, off))
	must(t, err)
	_, err = h.Write(data)
	must(t, err)
	must(t, h.Close())
}

func TestMemCrashTearLastWrite(t *testing.T) {
	base := bytes.Repeat([]byte{'a'}, 3000)
	torn := 0
	for seed := range uint64(200) {
		fs, f := crashOf(t, base)
		rng := rand.New(rand.NewPCG(seed, 1))
		// Two unsynced writes; the second, at an unaligned offset that
		// overlaps the first, is the one torn.
		first := bytes.Repeat([]byte{'b'}, 1000)
		_, err := f.Write(first)
		must(t, err)
		before := append(slices.Clone(base), first...)
		off := 3700 + rng.IntN(200)
		second := bytes.Repeat([]byte{'c'}, 1+rng.IntN(3000))
		writeAt(t, fs, "/f", off, second)
		end := off + len(second)

		fs.Crash(CrashTearLastWrite, rng)
		got, ok := content(t, fs, "/f")
		if !ok {
			t.Fatalf("seed %d: /f gone", seed)
		}
		// got must be before overlaid with second[:k], k allowed.
		ks := []int{0, len(second)}
		for b := (off/SectorSize + 1) * SectorSize; b < end; b += SectorSize {
			ks = append(ks, b-off)
		}
		match := -1
		for _, k := range ks {
			want := slices.Clone(before)
			if off+k > len(want) {
				want = append(want, make([]byte, off+k-len(want))...)
			}
			copy(want[off:], second[:k])
			if bytes.Equal(got, want) {
				match = k
			}
		}
		if match < 0 {
			t.Fatalf("seed %d: write [%d,%d): result (size %d) is no sector-aligned prefix", seed, off, end, len(got))
		}
		if match > 0 && match < len(second) {
			torn++
		}
	}
	if torn == 0 {
		t.Fatal("no write was ever torn")
	}
}

func TestMemCrashTearKeepsTruncates(t *testing.T) {
	fs, f := crashOf(t, []byte("0123456789"))
	must(t, f.Truncate(4))
	fs.Crash(CrashTearLastWrite, rand.New(rand.NewPCG(1, 2)))
	if b, _ := content(t, fs, "/f"); string(b) != "0123" {
		t.Fatalf("= %q", b)
	}
}

func TestMemCrashRandomPages(t *testing.T) {
	sawOld, sawNew := false, false
	for seed := range uint64(100) {
		rng := rand.New(rand.NewPCG(seed, 7))
		base := make([]byte, 3*PageSize+100)
		for i := range base {
			base[i] = 'o'
		}
		fs, _ := crashOf(t, base)
		// Scattered unsynced writes, some past the synced end.
		for range 5 {
			writeAt(t, fs, "/f", rng.IntN(6*PageSize), bytes.Repeat([]byte{'n'}, 1+rng.IntN(2*PageSize)))
		}
		live, _ := content(t, fs, "/f")
		fs.Crash(CrashRandomPages, rng)
		got, _ := content(t, fs, "/f")
		if len(got) != len(base) && len(got) != len(live) {
			t.Fatalf("seed %d: size %d, want %d or %d", seed, len(got), len(base), len(live))
		}
		ext := max(len(live), len(base))
		for p := 0; p < len(got); p += PageSize {
			e := min(p+PageSize, len(got))
			gp := got[p:e]
			lp, op := pageOf(live, int64(p), int64(e)), pageOf(base, int64(p), int64(e))
			switch {
			case bytes.Equal(gp, lp) && bytes.Equal(gp, op):
			case bytes.Equal(gp, lp):
				sawNew = true
			case bytes.Equal(gp, op):
				sawOld = true
			default:
				t.Fatalf("seed %d: page at %d (of %d) is neither old nor new", seed, p, ext)
			}
		}
	}
	if !sawOld || !sawNew {
		t.Fatalf("old pages seen %v, new pages seen %v", sawOld, sawNew)
	}
}

func sizeOf(t *testing.T, fs FS, name string) int64 {
	fi, err := fs.Stat(name)
	must(t, err)
	return fi.Size()
}

func TestMemCrashClone(t *testing.T) {
	fs, f := crashOf(t, []byte("synced"))
	_, err := f.Write([]byte("+more"))
	must(t, err)
	c := fs.CrashClone(CrashDropUnsynced, nil)
	if b, _ := content(t, c, "/f"); string(b) != "synced" {
		t.Fatalf("clone = %q", b)
	}
	_, err = f.Write([]byte("!")) // the original's handles stay valid
	must(t, err)
	if b, _ := content(t, fs, "/f"); string(b) != "synced+more!" {
		t.Fatalf("original = %q", b)
	}
}

func TestMemConcurrent(t *testing.T) {
	fs := NewStrictMem()
	must(t, fs.MkdirAll("/d", 0o755))
	must(t, SyncDir(fs, "/")) // a crash must not take /d away
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			name := fmt.Sprintf("/d/f%d", g)
			for i := range 50 {
				f, err := fs.Create(name)
				if err != nil {
					t.Error(err)
					return
				}
				f.Write([]byte(fmt.Sprint(i)))
				f.SyncData()
				f.Close()
				SyncDir(fs, "/d")
				fs.List("/d")
				fs.Rename(name, name+".tmp")
				fs.Rename(name+".tmp", name)
				if i%10 == 0 {
					fs.Crash(CrashRandomPages, rand.New(rand.NewPCG(uint64(g), uint64(i))))
				}
				_ = fs.String()
			}
		})
	}
	wg.Wait()
}

func TestInjectENOSPC(t *testing.T) {
	fs := InjectErrors(NewStrictMem(), FailNth(OpWrite, 3, syscall.ENOSPC))
	f, err := fs.Create("/wal")
	must(t, err)
	for i := 1; i <= 4; i++ {
		_, err := f.Write([]byte{byte('0' + i)})
		if i == 3 {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("write 3 = %v, want ENOSPC", err)
			}
		} else {
			must(t, err)
		}
	}
	if b, _ := content(t, fs, "/wal"); string(b) != "124" {
		t.Fatalf("= %q (the failed write must not happen)", b)
	}

	// Every sync fails; other operations go through with their paths.
	var seen []string
	fs = InjectErrors(NewStrictMem(), func(op Op, path string) error {
		seen = append(seen, op.String()+" "+path)
		if op == OpSync || op == OpSyncData {
			return syscall.EIO
		}
		return nil
	})
	f, err = fs.Create("/x")
	must(t, err)
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Sync = %v", err)
	}
	if err := SyncDir(fs, "/"); !errors.Is(err, syscall.EIO) {
		t.Fatalf("SyncDir = %v", err)
	}
	want := []string{"create /x", "sync /x", "open-dir /", "sync /", "close /"}
	if !slices.Equal(seen, want) {
		t.Fatalf("ops = %q, want %q", seen, want)
	}
}
