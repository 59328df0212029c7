package controlplane

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The address book on its own: entries, zone addresses, removals, the
// file it keeps, and the dial rule.

func TestAddressBook(t *testing.T) {
	dir := t.TempDir()
	b, err := openAddressBook(dir, map[uint64]string{1: "h:1", 2: "h:2"})
	if err != nil {
		t.Fatal(err)
	}
	changed, err := b.update(map[uint64]string{2: "other:2", 4: "h:4"}, false)
	if err != nil || !maps.Equal(changed, map[uint64]string{4: "h:4"}) {
		t.Fatalf("update without overwrite: %v, %v", changed, err)
	}
	if changed, err = b.update(map[uint64]string{2: "new:2", 0: "x", 5: ""}, true); err != nil || !maps.Equal(changed, map[uint64]string{2: "new:2"}) {
		t.Fatalf("update with overwrite: %v, %v", changed, err)
	}
	want := map[uint64]string{1: "h:1", 2: "new:2", 4: "h:4"}
	if !maps.Equal(b.all(), want) || !slices.Equal(b.ids(), []uint64{1, 2, 4}) {
		t.Fatalf("book %v", b.all())
	}
	// Reopened: what joined is remembered; the configured stores win.
	b2, err := openAddressBook(dir, map[uint64]string{1: "moved:1"})
	if err != nil {
		t.Fatal(err)
	}
	want[1] = "moved:1"
	if !maps.Equal(b2.all(), want) {
		t.Fatalf("reopened book %v, want %v", b2.all(), want)
	}
	b3, err := openAddressBook(dir, nil)
	if err != nil || !maps.Equal(b3.all(), want) {
		t.Fatalf("reopened without configuration: %v, %v", b3.all(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != peersFile {
		t.Errorf("data dir holds %v, want only %s", entries, peersFile)
	}

	// In memory only.
	m, err := openAddressBook("", map[uint64]string{1: "h:1"})
	if err != nil || !maps.Equal(m.all(), map[uint64]string{1: "h:1"}) {
		t.Fatalf("in-memory book %v, %v", m.all(), err)
	}

	// A damaged file is refused rather than silently replaced.
	for _, bad := range []string{"{", `{"peers":{"x":"h:1"}}`, `{"peers":{"0":"h:1"}}`, `{"peers":{"1":""}}`} {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, peersFile), []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := openAddressBook(d, nil); err == nil {
			t.Errorf("address book %q opened", bad)
		}
	}
}

// TestAddressBookRemoving: the stores being removed survive a restart
// (peers.json), and a file naming store 0 is refused.
func TestAddressBookRemoving(t *testing.T) {
	dir := t.TempDir()
	b, err := openAddressBook(dir, map[uint64]string{1: "h:1", 2: "h:2"})
	if err != nil {
		t.Fatal(err)
	}
	if added, err := b.markRemoving(2, 2); err != nil || len(added) != 1 || added[0] != 2 {
		t.Fatalf("markRemoving(2, 2): %v, %v", added, err)
	}
	if added, err := b.markRemoving(2); err != nil || len(added) != 0 {
		t.Errorf("markRemoving(2) again: %v, %v; want nothing added", added, err)
	}
	if _, err := b.update(map[uint64]string{3: "h:3"}, false); err != nil {
		t.Fatal(err)
	}
	b2, err := openAddressBook(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !b2.isRemoving(2) || b2.isRemoving(1) || len(b2.removingIDs()) != 1 || b2.len() != 3 {
		t.Errorf("reopened book: removing %v, %d stores", b2.removingIDs(), b2.len())
	}
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, peersFile), []byte(`{"peers":{"1":"h:1"},"removing":[0]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := openAddressBook(bad, nil); err == nil {
		t.Error("a book removing store 0 was accepted")
	}
}

func TestDialAddr(t *testing.T) {
	za := map[string]string{"dc-a": "a:1", "dc-b": "b:1"}
	tests := []struct {
		zone  string
		zones map[string]string
		want  string
	}{
		{"dc-a", za, "a:1"},
		{"dc-b", za, "b:1"},
		{"dc-c", za, "direct:1"}, // no address for this zone
		{"", za, "direct:1"},     // a store without a zone
		{"dc-a", nil, "direct:1"},
		{"dc-a", map[string]string{"dc-a": ""}, "direct:1"},
	}
	for _, tt := range tests {
		if got := dialAddr(tt.zone, "direct:1", tt.zones); got != tt.want {
			t.Errorf("dialAddr(%q, direct:1, %v) = %q, want %q", tt.zone, tt.zones, got, tt.want)
		}
	}
}

func TestCheckZoneAddrs(t *testing.T) {
	good := []map[string]string{nil, {}, {"dc-a": "127.0.0.1:21101", "dc-b": "proxy.example:21201"}}
	for _, za := range good {
		if err := CheckZoneAddrs(za); err != nil {
			t.Errorf("CheckZoneAddrs(%v): %v", za, err)
		}
	}
	many := map[string]string{}
	for i := range maxZoneAddrs + 1 {
		many[fmt.Sprintf("z%d", i)] = "h:1"
	}
	bad := map[string]map[string]string{
		"empty zone":     {"": "h:1"},
		"not host:port":  {"dc-a": "h"},
		"no host":        {"dc-a": ":1"},
		"bad port":       {"dc-a": "h:x"},
		"port 0":         {"dc-a": "h:0"},
		"long zone":      {strings.Repeat("z", maxZoneLen+1): "h:1"},
		"long address":   {"dc-a": strings.Repeat("h", maxAddrLen) + ":1"},
		"too many zones": many,
	}
	for name, za := range bad {
		if err := CheckZoneAddrs(za); err == nil {
			t.Errorf("%s: CheckZoneAddrs accepted %d entries", name, len(za))
		}
	}
}

func TestAddressBookZones(t *testing.T) {
	dir := t.TempDir()
	b, err := openAddressBook(dir, map[uint64]string{1: "h:1", 2: "h:2"})
	if err != nil {
		t.Fatal(err)
	}
	za2 := map[string]string{"dc-a": "a:2", "dc-b": "b:2"}
	changed, err := b.updateZones(map[uint64]map[string]string{1: nil, 2: za2})
	if err != nil || len(changed) != 1 || changed[0] != 2 {
		t.Fatalf("updateZones: changed %v, %v", changed, err)
	}
	if changed, _ := b.updateZones(map[uint64]map[string]string{2: maps.Clone(za2)}); len(changed) != 0 {
		t.Errorf("the same zone addresses again changed %v", changed)
	}
	for _, tt := range []struct {
		id   uint64
		zone string
		want string
	}{{2, "dc-a", "a:2"}, {2, "dc-c", "h:2"}, {2, "", "h:2"}, {1, "dc-a", "h:1"}} {
		if got, ok := b.dialAddr(tt.id, tt.zone); !ok || got != tt.want {
			t.Errorf("dialAddr(%d, %q) = %q, %v; want %q", tt.id, tt.zone, got, ok, tt.want)
		}
	}
	if _, ok := b.dialAddr(9, "dc-a"); ok {
		t.Error("dialAddr of an unknown store")
	}

	// Remembered across a restart, beside the addresses; a file without
	// zone addresses (written before they existed) still opens.
	b2, err := openAddressBook(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := b2.allZoneAddrs(); len(got) != 1 || !maps.Equal(got[2], za2) {
		t.Errorf("reopened zone addresses %v", got)
	}
	if changed, _ := b2.updateZones(map[uint64]map[string]string{2: {}}); len(changed) != 1 || b2.zoneAddrs(2) != nil {
		t.Errorf("clearing store 2's zone addresses: changed %v, left %v", changed, b2.zoneAddrs(2))
	}
	data, err := os.ReadFile(filepath.Join(dir, peersFile))
	if err != nil || strings.Contains(string(data), "zone_addresses") {
		t.Errorf("book without zone addresses written as %s (%v)", data, err)
	}
	for _, bad := range []string{
		`{"peers":{"1":"h:1"},"zone_addresses":{"x":{"dc-a":"a:1"}}}`,
		`{"peers":{"1":"h:1"},"zone_addresses":{"1":{"":"a:1"}}}`,
		`{"peers":{"1":"h:1"},"zone_addresses":{"1":{"dc-a":""}}}`,
	} {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, peersFile), []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := openAddressBook(d, nil); err == nil {
			t.Errorf("address book %s opened", bad)
		}
	}
}
