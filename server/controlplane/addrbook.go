package controlplane

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
// gRPC address, and, for the stores that advertise them, to their address
// per zone (see Config.ZoneAddrs). It starts from Config.Peers and what the
// data directory remembers, grows when stores join, and is written to
// <data-dir>/peers.json on every change, atomically, so a restarted store
// still knows the stores that joined while it ran, and how to reach them
// from its zone. The zone addresses are what the stores last advertised,
// kept whether or not this store dials them (it does only when it is in
// the simulated WAN itself, see Plane.dialZone), and possibly stale after
// a restart: the learning loop (zoneaddrs.go) refreshes them at the plain
// addresses.
type addressBook struct {
	path string // "" keeps the book in memory only

	mu    sync.RWMutex
	addrs map[uint64]string
	// zones holds each store's address per zone; a store advertising
	// none has no entry. Never modified in place (replaced on change).
	zones map[uint64]map[string]string
	// removing holds the stores being removed from the cluster
	// (Admin.RemoveStore). A store stays in it for good: its id is not
	// reused. Never modified in place.
	removing map[uint64]bool
}

// peersJSON is the file's shape: {"peers": {"1": "127.0.0.1:20161", ...},
// "zone_addresses": {"1": {"dc-a": "127.0.0.1:21101", ...}, ...},
// "removing": [4]}. Files written before zone addresses (or removals)
// existed have no "zone_addresses" ("removing").
type peersJSON struct {
	Peers         map[string]string            `json:"peers"`
	ZoneAddresses map[string]map[string]string `json:"zone_addresses,omitempty"`
	Removing      []uint64                     `json:"removing,omitempty"`
}

// openAddressBook loads dir's address book (if any), lays configured over
// it (the operator's flags win for the stores they name) and writes the
// result back when that changed anything. dir "" keeps it in memory.
func openAddressBook(dir string, configured map[uint64]string) (*addressBook, error) {
	b := &addressBook{addrs: make(map[uint64]string), zones: make(map[uint64]map[string]string), removing: make(map[uint64]bool)}
	if dir != "" {
		b.path = filepath.Join(dir, peersFile)
		f, err := readPeersFile(b.path)
		if err != nil {
			return nil, err
		}
		b.addrs, b.zones, b.removing = f.addrs, f.zones, f.removing
	}
	next := maps.Clone(b.addrs)
	for id, addr := range configured {
		if id != 0 && addr != "" {
			next[id] = addr
		}
	}
	if !maps.Equal(next, b.addrs) {
		if err := b.persist(next, b.zones, b.removing); err != nil {
			return nil, err
		}
		b.addrs = next
	}
	return b, nil
}

// bookContents is an address book as read from its file.
type bookContents struct {
	addrs    map[uint64]string
	zones    map[uint64]map[string]string
	removing map[uint64]bool
}

func readPeersFile(path string) (bookContents, error) {
	out := bookContents{addrs: map[uint64]string{}, zones: map[uint64]map[string]string{}, removing: map[uint64]bool{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return bookContents{}, fmt.Errorf("read address book: %w", err)
	}
	var f peersJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return bookContents{}, fmt.Errorf("address book %s: %w", path, err)
	}
	for k, addr := range f.Peers {
		id, err := strconv.ParseUint(k, 10, 64)
		if err != nil || id == 0 || addr == "" {
			return bookContents{}, fmt.Errorf("address book %s: bad entry %q: %q", path, k, addr)
		}
		out.addrs[id] = addr
	}
	for k, za := range f.ZoneAddresses {
		id, err := strconv.ParseUint(k, 10, 64)
		if err != nil || id == 0 {
			return bookContents{}, fmt.Errorf("address book %s: bad zone_addresses entry %q", path, k)
		}
		for zone, addr := range za {
			if zone == "" || addr == "" {
				return bookContents{}, fmt.Errorf("address book %s: store %d: bad zone address %q: %q", path, id, zone, addr)
			}
		}
		if len(za) > 0 {
			out.zones[id] = za
		}
	}
	for _, id := range f.Removing {
		if id == 0 {
			return bookContents{}, fmt.Errorf("address book %s: store 0 in removing", path)
		}
		out.removing[id] = true
	}
	return out, nil
}

// persist writes addrs, zones and removing to the file: a temporary file,
// synced, renamed over the old one, and the directory synced, so a crash
// leaves either book whole.
func (b *addressBook) persist(addrs map[uint64]string, zones map[uint64]map[string]string, removing map[uint64]bool) error {
	if b.path == "" {
		return nil
	}
	f := peersJSON{Peers: make(map[string]string, len(addrs)), Removing: slices.Sorted(maps.Keys(removing))}
	for id, addr := range addrs {
		f.Peers[strconv.FormatUint(id, 10)] = addr
	}
	if len(zones) > 0 {
		f.ZoneAddresses = make(map[string]map[string]string, len(zones))
		for id, za := range zones {
			f.ZoneAddresses[strconv.FormatUint(id, 10)] = za
		}
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
	if err := b.persist(next, b.zones, b.removing); err != nil {
		return nil, err
	}
	b.addrs = next
	return changed, nil
}

// zoneAddrs returns store id's address per zone (nil if it advertises
// none). The map is shared: do not modify it.
func (b *addressBook) zoneAddrs(id uint64) map[string]string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.zones[id]
}

// allZoneAddrs returns a copy of every store's address per zone.
func (b *addressBook) allZoneAddrs() map[uint64]map[string]string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := make(map[uint64]map[string]string, len(b.zones))
	for id, za := range b.zones {
		out[id] = maps.Clone(za)
	}
	return out
}

// dialAddr is the address a store in zone reaches store id at: its
// address for that zone if it advertises one, else its address. ok is
// false if the book does not know store id.
func (b *addressBook) dialAddr(id uint64, zone string) (string, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	addr, ok := b.addrs[id]
	if !ok {
		return "", false
	}
	return dialAddr(zone, addr, b.zones[id]), true
}

// updateZones replaces the zone addresses of the stores entries names (an
// empty map: the store advertises none) and persists the result. It
// returns the ids whose entry changed; the book is unchanged if writing it
// fails.
func (b *addressBook) updateZones(entries map[uint64]map[string]string) ([]uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var changed []uint64
	next := maps.Clone(b.zones)
	if next == nil {
		next = make(map[uint64]map[string]string)
	}
	for id, za := range entries {
		if id == 0 || maps.Equal(za, b.zones[id]) {
			continue
		}
		if len(za) == 0 {
			delete(next, id)
		} else {
			next[id] = maps.Clone(za)
		}
		changed = append(changed, id)
	}
	if len(changed) == 0 {
		return nil, nil
	}
	if err := b.persist(b.addrs, next, b.removing); err != nil {
		return nil, err
	}
	b.zones = next
	slices.Sort(changed)
	return changed, nil
}

// isRemoving reports whether store id is being removed from the cluster.
func (b *addressBook) isRemoving(id uint64) bool {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.removing[id]
}

// removingIDs lists the stores being removed, in order.
func (b *addressBook) removingIDs() []uint64 {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Sorted(maps.Keys(b.removing))
}

// markRemoving records ids as being removed and persists the result. It
// returns the ids that were not marked before; the book is unchanged if
// writing it fails.
func (b *addressBook) markRemoving(ids ...uint64) ([]uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var added []uint64
	next := maps.Clone(b.removing)
	if next == nil {
		next = make(map[uint64]bool)
	}
	for _, id := range ids {
		if id != 0 && !next[id] {
			next[id] = true
			added = append(added, id)
		}
	}
	if len(added) == 0 {
		return nil, nil
	}
	if err := b.persist(b.addrs, b.zones, next); err != nil {
		return nil, err
	}
	b.removing = next
	slices.Sort(added)
	return added, nil
}

// dialAddr is the rule by which a store in zone (or a client) picks the
// address to reach a store at: the store's address for that zone when
// it advertises one (zones, from --advertise-zone-addrs), else its plain
// address. Zone "" always gets the plain address: a store passes it when
// it has no zone, or no zone addresses of its own (it is not in the
// simulated WAN, see Plane.dialZone).
func dialAddr(zone, addr string, zones map[string]string) string {
	if zone != "" {
		if a := zones[zone]; a != "" {
			return a
		}
	}
	return addr
}
