//go:build !linux

package vfs

import "os"

func fdatasync(f *os.File) error { return f.Sync() }
