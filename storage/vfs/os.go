package vfs

import (
	"os"
	"slices"
)

// Default is the operating system's file system.
var Default FS = osFS{}

type osFS struct{}

type osFile struct{ *os.File }

func (f osFile) SyncData() error { return fdatasync(f.File) }

func wrap(f *os.File, err error) (File, error) {
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Create(name string) (File, error) {
	return wrap(os.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600))
}

func (osFS) Open(name string) (File, error) { return wrap(os.Open(name)) }

func (osFS) OpenReadWrite(name string) (File, error) { return wrap(os.OpenFile(name, os.O_RDWR, 0)) }

func (osFS) OpenDir(name string) (File, error) { return wrap(os.Open(name)) }

func (osFS) Remove(name string) error { return os.Remove(name) }

func (osFS) RemoveAll(name string) error { return os.RemoveAll(name) }

func (osFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

func (osFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }

func (osFS) List(dir string) ([]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(des))
	for i, de := range des {
		names[i] = de.Name()
	}
	slices.Sort(names)
	return names, nil
}

func (osFS) Stat(name string) (os.FileInfo, error) { return os.Stat(name) }
