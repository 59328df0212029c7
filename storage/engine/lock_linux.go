package engine

import (
	"os"
	"path/filepath"
	"syscall"
)

// fdatasyncFile flushes f's data (and the size that reads of it need).
func fdatasyncFile(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// lockDir takes the data dir's lock file (store.lock) for as long as the
// engine is open: the checkpoint restore writes store.db before bbolt
// takes its own lock, so another process must be kept out first.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if err == syscall.EWOULDBLOCK {
			return nil, errDirLocked
		}
		return nil, err
	}
	return f, nil
}
