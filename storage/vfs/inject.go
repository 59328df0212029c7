package vfs

import (
	"fmt"
	"os"
	"sync/atomic"
)

// Op names an FS or File operation for InjectErrors.
type Op int

const (
	OpCreate Op = iota
	OpOpen
	OpOpenReadWrite
	OpOpenDir
	OpRemove
	OpRemoveAll
	OpRename
	OpMkdirAll
	OpList
	OpStat
	OpRead
	OpReadAt
	OpWrite
	OpSync
	OpSyncData
	OpTruncate
	OpFileStat
	OpClose
)

var opNames = [...]string{
	OpCreate:        "create",
	OpOpen:          "open",
	OpOpenReadWrite: "open-read-write",
	OpOpenDir:       "open-dir",
	OpRemove:        "remove",
	OpRemoveAll:     "remove-all",
	OpRename:        "rename",
	OpMkdirAll:      "mkdir-all",
	OpList:          "list",
	OpStat:          "stat",
	OpRead:          "read",
	OpReadAt:        "read-at",
	OpWrite:         "write",
	OpSync:          "sync",
	OpSyncData:      "sync-data",
	OpTruncate:      "truncate",
	OpFileStat:      "file-stat",
	OpClose:         "close",
}

func (o Op) String() string {
	if o >= 0 && int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// InjectErrors wraps fs so that inject is called before every operation with
// the operation and its path (a File's operations get the name it was opened
// with; Rename gets oldname). A non-nil error is returned in place of the
// operation, which then does not happen, except Close: the file is closed
// anyway, so a failed Close leaks nothing, and the error is returned.
// inject may be called from several goroutines at once.
func InjectErrors(fs FS, inject func(op Op, path string) error) FS {
	return &injectFS{fs: fs, inject: inject}
}

// FailNth returns an inject function for InjectErrors that fails the nth
// (1-based) call of op with err, and only that one. It is safe for
// concurrent use.
func FailNth(op Op, n int64, err error) func(Op, string) error {
	var count atomic.Int64
	return func(o Op, _ string) error {
		if o == op && count.Add(1) == n {
			return err
		}
		return nil
	}
}

type injectFS struct {
	fs     FS
	inject func(Op, string) error
}

type injectFile struct {
	f    File
	name string
	fs   *injectFS
}

func (i *injectFS) file(name string, f File, err error) (File, error) {
	if err != nil {
		return nil, err
	}
	return &injectFile{f: f, name: name, fs: i}, nil
}

func (i *injectFS) Create(name string) (File, error) {
	if err := i.inject(OpCreate, name); err != nil {
		return nil, err
	}
	f, err := i.fs.Create(name)
	return i.file(name, f, err)
}

func (i *injectFS) Open(name string) (File, error) {
	if err := i.inject(OpOpen, name); err != nil {
		return nil, err
	}
	f, err := i.fs.Open(name)
	return i.file(name, f, err)
}

func (i *injectFS) OpenReadWrite(name string) (File, error) {
	if err := i.inject(OpOpenReadWrite, name); err != nil {
		return nil, err
	}
	f, err := i.fs.OpenReadWrite(name)
	return i.file(name, f, err)
}

func (i *injectFS) OpenDir(name string) (File, error) {
	if err := i.inject(OpOpenDir, name); err != nil {
		return nil, err
	}
	f, err := i.fs.OpenDir(name)
	return i.file(name, f, err)
}

func (i *injectFS) Remove(name string) error {
	if err := i.inject(OpRemove, name); err != nil {
		return err
	}
	return i.fs.Remove(name)
}

func (i *injectFS) RemoveAll(name string) error {
	if err := i.inject(OpRemoveAll, name); err != nil {
		return err
	}
	return i.fs.RemoveAll(name)
}

func (i *injectFS) Rename(oldname, newname string) error {
	if err := i.inject(OpRename, oldname); err != nil {
		return err
	}
	return i.fs.Rename(oldname, newname)
}

func (i *injectFS) MkdirAll(dir string, perm os.FileMode) error {
	if err := i.inject(OpMkdirAll, dir); err != nil {
		return err
	}
	return i.fs.MkdirAll(dir, perm)
}

func (i *injectFS) List(dir string) ([]string, error) {
	if err := i.inject(OpList, dir); err != nil {
		return nil, err
	}
	return i.fs.List(dir)
}

func (i *injectFS) Stat(name string) (os.FileInfo, error) {
	if err := i.inject(OpStat, name); err != nil {
		return nil, err
	}
	return i.fs.Stat(name)
}

func (f *injectFile) Read(p []byte) (int, error) {
	if err := f.fs.inject(OpRead, f.name); err != nil {
		return 0, err
	}
	return f.f.Read(p)
}

func (f *injectFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.fs.inject(OpReadAt, f.name); err != nil {
		return 0, err
	}
	return f.f.ReadAt(p, off)
}

func (f *injectFile) Write(p []byte) (int, error) {
	if err := f.fs.inject(OpWrite, f.name); err != nil {
		return 0, err
	}
	return f.f.Write(p)
}

func (f *injectFile) Close() error {
	ierr := f.fs.inject(OpClose, f.name)
	err := f.f.Close()
	if ierr != nil {
		return ierr
	}
	return err
}

func (f *injectFile) Sync() error {
	if err := f.fs.inject(OpSync, f.name); err != nil {
		return err
	}
	return f.f.Sync()
}

func (f *injectFile) SyncData() error {
	if err := f.fs.inject(OpSyncData, f.name); err != nil {
		return err
	}
	return f.f.SyncData()
}

func (f *injectFile) Truncate(size int64) error {
	if err := f.fs.inject(OpTruncate, f.name); err != nil {
		return err
	}
	return f.f.Truncate(size)
}

func (f *injectFile) Stat() (os.FileInfo, error) {
	if err := f.fs.inject(OpFileStat, f.name); err != nil {
		return nil, err
	}
	return f.f.Stat()
}
