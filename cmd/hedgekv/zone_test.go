package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/client/clienttest"
)

func TestParseZoneAddrs(t *testing.T) {
	good := []struct {
		in   string
		want map[string]string
	}{
		{"", nil},
		{"  ", nil},
		{"dc-a=127.0.0.1:21101", map[string]string{"dc-a": "127.0.0.1:21101"}},
		{"dc-a=127.0.0.1:21101, dc-b = 127.0.0.1:21201,dc-c=[::1]:21301", map[string]string{"dc-a": "127.0.0.1:21101", "dc-b": "127.0.0.1:21201", "dc-c": "[::1]:21301"}},
		{"dc-a=proxy.example:9", map[string]string{"dc-a": "proxy.example:9"}},
	}
	for _, tt := range good {
		got, err := parseZoneAddrs(tt.in)
		if err != nil || !maps.Equal(got, tt.want) {
			t.Errorf("parseZoneAddrs(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	bad := []struct{ in, want string }{
		{"dc-a", `"dc-a" is not ZONE=HOST:PORT`},
		{"=127.0.0.1:1", `"=127.0.0.1:1" is not ZONE=HOST:PORT`},
		{"dc-a=", `"dc-a=" is not ZONE=HOST:PORT`},
		{"dc-a=h:1,", `"" is not ZONE=HOST:PORT`},
		{"dc-a=127.0.0.1", `zone dc-a: "127.0.0.1" is not HOST:PORT`},
		{"dc-a=:21101", `zone dc-a: ":21101" is not HOST:PORT`},
		{"dc-a=h:port", `port "port"`},
		{"dc-a=h:0", `port "0"`},
		{"dc-a=h:70000", `port "70000"`},
		{"dc-a=0.0.0.0:1", "wildcard"},
		{"dc a=h:1", "white space"},
		{"dc-a=h:1,dc-a=h:2", "zone dc-a listed twice"},
	}
	for _, tt := range bad {
		_, err := parseZoneAddrs(tt.in)
		if err == nil || !strings.HasPrefix(err.Error(), "--advertise-zone-addrs: ") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseZoneAddrs(%q) = %v, want an error about %s", tt.in, err, tt.want)
		}
	}
}

// TestServerZoneAddrsFlag: the flag reaches the server's config in both
// kinds of start, and a bad value is one usage line naming the flag.
func TestServerZoneAddrsFlag(t *testing.T) {
	want := map[string]string{"dc-a": "127.0.0.1:21101", "dc-b": "127.0.0.1:21201"}
	for _, f := range []serverFlags{
		{id: 1, peers: "1=h:1", dataDir: "/d", tick: time.Millisecond, logLevel: "info", zoneAddrs: "dc-a=127.0.0.1:21101,dc-b=127.0.0.1:21201"},
		{id: 4, join: "h:1", listen: "127.0.0.1:4", dataDir: "/d", tick: time.Millisecond, logLevel: "info", zoneAddrs: "dc-a=127.0.0.1:21101,dc-b=127.0.0.1:21201"},
	} {
		cfg, _, err := f.config()
		if err != nil || !maps.Equal(cfg.ZoneAddrs, want) {
			t.Errorf("config with --advertise-zone-addrs: zone addrs %v, %v", cfg.ZoneAddrs, err)
		}
	}
	if cfg, _, err := (&serverFlags{id: 1, peers: "1=h:1", dataDir: "/d", tick: time.Millisecond, logLevel: "info"}).config(); err != nil || cfg.ZoneAddrs != nil {
		t.Errorf("config without --advertise-zone-addrs: zone addrs %v, %v", cfg.ZoneAddrs, err)
	}
	for _, args := range [][]string{
		{"server", "--id", "1", "--peers", "1=h:1", "--data-dir", "d", "--advertise-zone-addrs", "dc-a"},
		{"server", "--id", "4", "--join", "h:1", "--listen", "h:4", "--data-dir", "d", "--advertise-zone-addrs", "dc-a=h:1,dc-a=h:2"},
	} {
		code, stdout, stderr := runCLI(t, args...)
		if code != exitUsage || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q", args, code, stdout)
		}
		oneLine(t, stderr)
		if !strings.Contains(stderr, "--advertise-zone-addrs: ") {
			t.Errorf("%v: stderr %q does not name the flag", args, stderr)
		}
	}
}

// TestCLIZone: `--zone` makes the CLI's client dial the stores' addresses
// for that zone (after bootstrapping through --endpoints), and `ctl
// stores` shows the zone addresses, in the table and as an added JSON
// field.
func TestCLIZone(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	var dcB []*clienttest.Forwarder
	for i, addr := range cl.Endpoints() {
		f := clienttest.NewForwarder(t, addr)
		dcB = append(dcB, f)
		cl.Store(uint64(i + 1)).SetZoneAddrs(map[string]string{"dc-a": "127.0.0.1:1", "dc-b": f.Addr()})
	}
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")
	value := strings.Repeat("v", 32<<10)
	if code, _, stderr := runCLI(t, "put", "k", value, ep); code != exitOK {
		t.Fatalf("put: exit %d, %s", code, stderr)
	}
	if code, stdout, stderr := runCLI(t, "get", "k", ep, "--zone", "dc-b"); code != exitOK || stdout != value+"\n" {
		t.Fatalf("get --zone dc-b: exit %d, %d bytes, %s", code, len(stdout), stderr)
	}
	if got := dcB[0].BytesDown(); got < int64(len(value)) {
		t.Errorf("get --zone dc-b read %d bytes through store 1's dc-b address, want the %d byte value", got, len(value))
	}

	code, stdout, stderr := runCLI(t, "ctl", "stores", "--json", ep, "--zone", "dc-b")
	if code != exitOK {
		t.Fatalf("ctl stores --json: exit %d, %s", code, stderr)
	}
	var stores []storeJSON
	if err := json.Unmarshal([]byte(stdout), &stores); err != nil {
		t.Fatalf("ctl stores --json: %v\n%s", err, stdout)
	}
	if len(stores) != 3 || stores[1].Address != cl.Store(2).Addr() || stores[1].ZoneAddresses["dc-b"] != dcB[1].Addr() || stores[1].ZoneAddresses["dc-a"] != "127.0.0.1:1" {
		t.Errorf("ctl stores --json: %s", stdout)
	}
	code, stdout, _ = runCLI(t, "ctl", "stores", ep)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != exitOK || len(lines) != 4 || !strings.Contains(lines[0], "ZONE ADDRESSES") || !strings.Contains(lines[2], "dc-a=127.0.0.1:1,dc-b="+dcB[1].Addr()) {
		t.Errorf("ctl stores: exit %d\n%s", code, stdout)
	}

	// The JSON adds the field only for stores that advertise zone
	// addresses; the contract's fields are unchanged.
	var buf bytes.Buffer
	if err := writeStoresJSON(&buf, []client.StoreInfo{
		{ID: 1, Address: "a:1", Zone: "dc-a", Up: true, ZoneAddresses: map[string]string{"dc-b": "b:1", "dc-a": "a:11"}},
		{ID: 2, Address: "a:2"},
	}); err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	want := `[{"id":1,"address":"a:1","zone":"dc-a","up":true,"leader_count":0,"region_count":0,"zone_addresses":{"dc-a":"a:11","dc-b":"b:1"}},` +
		`{"id":2,"address":"a:2","zone":"","up":false,"leader_count":0,"region_count":0}]`
	if compact.String() != want {
		t.Errorf("got  %s\nwant %s", compact.String(), want)
	}
}
