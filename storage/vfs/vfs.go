// Package vfs is the file-system seam below hedgekv's storage: every file
// the store writes itself (round-log segments, the checkpoint file,
// snapshot files, and the directories that hold them) goes through an FS,
// so a test can swap the real one for a strict in-memory one that forgets
// what was never synced (mem.go), as a power loss would. bbolt opens,
// locks and maps its own file and cannot go through it.
//
// The interface follows Pebble's vfs.FS, cut to what hedgekv uses.
package vfs

import (
	"io"
	"os"
)

// File is an open file. Writes are not durable until Sync or SyncData
// returns; a directory opened with OpenDir is synced to make the entries
// created, renamed or removed in it durable.
type File interface {
	io.Reader
	io.ReaderAt
	io.Writer
	io.Closer
	// Sync makes the file's data and metadata durable (fsync).
	Sync() error
	// SyncData makes the file's data, and the size needed to read it,
	// durable (fdatasync).
	SyncData() error
	// Truncate changes the file's size; durable only after a sync.
	Truncate(size int64) error
	Stat() (os.FileInfo, error)
}

// FS is a file system. Names are paths as the os package takes them.
type FS interface {
	// Create creates name, truncating it if it exists, for writing.
	Create(name string) (File, error)
	// Open opens name for reading.
	Open(name string) (File, error)
	// OpenReadWrite opens an existing name for reading and writing.
	OpenReadWrite(name string) (File, error)
	// OpenDir opens a directory so that it can be synced.
	OpenDir(name string) (File, error)
	// Remove removes a file or an empty directory.
	Remove(name string) error
	// RemoveAll removes name and everything under it.
	RemoveAll(name string) error
	// Rename renames oldname to newname, replacing newname if it exists.
	Rename(oldname, newname string) error
	// MkdirAll creates dir and any parents missing.
	MkdirAll(dir string, perm os.FileMode) error
	// List returns the names of dir's entries, sorted.
	List(dir string) ([]string, error)
	// Stat describes name.
	Stat(name string) (os.FileInfo, error)
}

// ReadFile reads the whole file name.
func ReadFile(fs FS, name string) ([]byte, error) {
	f, err := fs.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// SyncDir fsyncs the directory dir: the entries created, renamed or
// removed in it become durable.
func SyncDir(fs FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return err
	}
	return d.Close()
}
