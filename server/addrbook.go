package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
)

// peersFile is the address book's name inside the data directory.
const peersFile = "peers.json"

// addressBook maps every store this one knows, itself included, to its
// gRPC address. It starts from Config.Peers and what the data directory
// remembers, grows when stores join, and is written to
// <data-dir>/peers.json on every change, atomically, so a restarted store
// still knows the stores that joined while it ran.
type addressBook struct {
	path string // "" keeps the book in memory only

	mu    sync.RWMutex
	addrs map[uint64]string
}

// peersJSON is the file's shape: {"peers": {"1": "127.0.0.1:20161", ...}}.
type peersJSON struct {
	Peers map[string]string `json:"peers"`
}

// openAddressBook loads dir's address book (if any), lays configured over
// it (the operator's flags win for the stores they name) and writes the
// result back when that changed anything. dir "" keeps it in memory.
func openAddressBook(dir string, configured map[uint64]string) (*addressBook, error) {
	b := &addressBook{addrs: make(map[uint64]string)}
	if dir != "" {
		b.path = filepath.Join(dir, peersFile)
		loaded, err := readPeersFile(b.path)
		if err != nil {
			return nil, err
		}
		b.addrs = loaded
	}
	next := maps.Clone(b.addrs)
	for id, addr := range configured {
		if id != 0 && addr != "" {
			next[id] = addr
		}
	}
	if !maps.Equal(next, b.addrs) {
		if err := b.persist(next); err != nil {
			return nil, err
		}
		b.addrs = next
	}
	return b, nil
}

func readPeersFile(path string) (map[uint64]string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[uint64]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read address book: %w", err)
	}
	var f peersJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("address book %s: %w", path, err)
	}
	out := make(map[uint64]string, len(f.Peers))
	for k, addr := range f.Peers {
		id, err := strconv.ParseUint(k, 10, 64)
		if err != nil || id == 0 || addr == "" {
			return nil, fmt.Errorf("address book %s: bad entry %q: %q", path, k, addr)
		}
		out[id] = addr
	}
	return out, nil
}

// persist writes addrs to the file: a temporary file, synced, renamed over
// the old one, and the directory synced, so a crash leaves either book
// whole.
func (b *addressBook) persist(addrs map[uint64]string) error {
	if b.path == "" {
		return nil
	}
	f := peersJSON{Peers: make(map[string]string, len(addrs))}
	for id, addr := range addrs {
		f.Peers[strconv.FormatUint(id, 10)] = addr
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode address book: %w", err)
	}
	dir := filepath.Dir(b.path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	tmp, err := os.CreateTemp(dir, peersFile+".tmp*")
	if err != nil {
		return fmt.Errorf("write address book: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing left to remove
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write address book: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("sync address book: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write address book: %w", err)
	}
	if err := os.Rename(tmp.Name(), b.path); err != nil {
		return fmt.Errorf("replace address book: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		// Best effort: not every file system can sync a directory.
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// get returns store id's address.
func (b *addressBook) get(id uint64) (string, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	a, ok := b.addrs[id]
	return a, ok
}

// all returns a copy of the book.
func (b *addressBook) all() map[uint64]string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return maps.Clone(b.addrs)
}

// ids returns the known store ids in order.
func (b *addressBook) ids() []uint64 {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Sorted(maps.Keys(b.addrs))
}

// len is how many stores the book names.
func (b *addressBook) len() int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.addrs)
}

// update applies entries and persists the result. With overwrite false,
// stores the book knows keep their address. It returns the entries that
// changed; the book is unchanged if writing it fails.
func (b *addressBook) update(entries map[uint64]string, overwrite bool) (map[uint64]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	changed := make(map[uint64]string)
	for id, addr := range entries {
		if id == 0 || addr == "" {
			continue
		}
		old, known := b.addrs[id]
		if old == addr || (known && !overwrite) {
			continue
		}
		changed[id] = addr
	}
	if len(changed) == 0 {
		return changed, nil
	}
	next := maps.Clone(b.addrs)
	maps.Copy(next, changed)
	if err := b.persist(next); err != nil {
		return nil, err
	}
	b.addrs = next
	return changed, nil
}
