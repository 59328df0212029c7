//go:build !linux

package engine

import (
	"os"
	"path/filepath"
)

func fdatasyncFile(f *os.File) error { return f.Sync() }

// lockDir: bbolt's own file lock only (no checkpoint restore races on
// these platforms' tests).
func lockDir(dir string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
}
