// Package vfstest holds test helpers for code below the vfs seam.
package vfstest

import (
	"bytes"
	"math/rand/v2"
	"os"
	"sync"
)

// OSFile models what a power loss leaves of a file that cannot go through
// vfs (bbolt's, which bbolt opens, locks and maps itself): the file as of
// its last sync, with each page written since then kept or lost
// independently. Whoever syncs the file calls Synced right after; a power
// loss is PowerLoss, once the file is closed.
type OSFile struct {
	Path string

	mu     sync.Mutex
	synced []byte
	live   []byte // Image's scratch
}

// Synced records that the file was just made durable: a copy of it now is
// what a power loss keeps at the least. It is safe for concurrent use.
func (m *OSFile) Synced() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b, err := readInto(m.synced, m.Path); err == nil {
		m.synced = b
	}
}

// readInto reads the file at path into buf's storage, grown if need be
// (bbolt's file is 16 MB from its first open and tens of MB in a cluster
// spec, read at every sync). The storage is off the Go heap where it can
// be (buffer): the race detector would check every byte a read writes
// into heap memory, which made a cluster spec several times slower.
func readInto(buf []byte, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	n := int(fi.Size())
	buf = buffer(buf, n)
	if _, err := f.ReadAt(buf, 0); err != nil && n > 0 {
		return nil, err
	}
	return buf, nil
}

// Image is what a power loss would leave of the file now: each page
// written since the last sync kept or lost, independently (nil if the
// file cannot be read).
func (m *OSFile) Image(rng *rand.Rand) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	live, err := readInto(m.live, m.Path)
	if err != nil {
		return nil
	}
	m.live = live
	const page = 4096
	for off := 0; off < len(live); off += page {
		end := min(off+page, len(live))
		var old []byte
		if off < len(m.synced) {
			old = m.synced[off:min(end, len(m.synced))]
		}
		if bytes.Equal(live[off:end], old) || rng.IntN(2) == 0 {
			continue
		}
		clear(live[off:end])
		copy(live[off:end], old)
	}
	return append([]byte(nil), live...)
}

// PowerLoss writes Image over the file: a power loss, taken while nothing
// has the file open. A file that was never created stays so.
func (m *OSFile) PowerLoss(rng *rand.Rand) error {
	if _, err := os.Stat(m.Path); os.IsNotExist(err) {
		return nil
	}
	return os.WriteFile(m.Path, m.Image(rng), 0o600)
}

// Release frees the model's buffers; the model may be used again after.
func (m *OSFile) Release() {
	m.mu.Lock()
	defer m.mu.Unlock()
	release(m.synced)
	release(m.live)
	m.synced, m.live = nil, nil
}
