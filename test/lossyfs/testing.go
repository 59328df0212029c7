package lossyfs

import (
	"os"
	"testing"
)

// NoFUSEEnv, set to 1, makes MountT skip a test that cannot mount (no
// /dev/fuse, not root, no fusermount3) instead of failing it.
const NoFUSEEnv = "HEDGEKV_NO_FUSE"

// MountT mounts backingDir at mountPoint for a test and unmounts it in
// t.Cleanup (lazily if it is busy), also when the test fails. A mount that
// fails fails the test with the error, loudly, unless HEDGEKV_NO_FUSE=1 is
// set: then the test is skipped with the reason.
func MountT(t testing.TB, backingDir, mountPoint string, opts Options) *FS {
	t.Helper()
	f, err := Mount(backingDir, mountPoint, opts)
	if err != nil {
		if os.Getenv(NoFUSEEnv) == "1" {
			t.Skipf("%s=1 and FUSE cannot mount here: %v", NoFUSEEnv, err)
		}
		t.Fatalf("FUSE mount failed (this test needs /dev/fuse, root and fusermount3; "+
			"set %s=1 to skip it explicitly): %v", NoFUSEEnv, err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("lossyfs: %v", err)
		}
		if Mounted(f.MountPoint()) {
			t.Errorf("lossyfs: %s is still mounted after Unmount", f.MountPoint())
		}
	})
	return f
}
