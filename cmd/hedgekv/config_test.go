package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/server"
)

// writeConfig writes a TOML config file and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "server.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// parseServer parses a server command line (and its --config file) into
// the server's config without starting anything.
func parseServer(t *testing.T, args ...string) (server.Config, error) {
	t.Helper()
	f := &serverFlags{}
	cmd := serverCmd(&app{stdout: io.Discard, stderr: io.Discard}, f)
	if err := cmd.ParseFlags(args); err != nil {
		return server.Config{}, err
	}
	if err := f.loadConfigFile(cmd); err != nil {
		return server.Config{}, err
	}
	cfg, _, err := f.config()
	return cfg, err
}

var minimalServer = []string{"--id", "1", "--peers", "1=127.0.0.1:1,2=127.0.0.1:2,3=127.0.0.1:3", "--data-dir", "/d"}

func TestServerStoreFlags(t *testing.T) {
	cfg, err := parseServer(t, append(slices.Clone(minimalServer),
		"--tick", "20ms", "--election-ticks", "20", "--heartbeat-ticks", "3", "--lease-drift-margin", "0.2",
		"--max-clock-offset", "100ms", "--split-check-interval", "-1s", "--split-max-keys", "1000", "--split-max-bytes", "1048576",
		"--hibernate-after", "-1s", "--log-gc-threshold", "100", "--dedup-window", "5000",
		"--balance-interval", "2s", "--max-store-down-time", "1m", "--max-replicas", "5",
		"--follower-leases", "--follower-lease-duration", "200ms", "--follower-lease-stores", "2,3")...)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Store
	if s.TickInterval != 20*time.Millisecond || s.ElectionTicks != 20 || s.HeartbeatTicks != 3 || s.LeaseDriftMargin != 0.2 ||
		s.MaxClockOffset != 100*time.Millisecond || s.SplitCheckInterval != -time.Second || s.SplitMaxKeys != 1000 || s.SplitMaxBytes != 1<<20 ||
		s.HibernateAfter != -time.Second || s.LogGCThreshold != 100 || s.DedupWindow != 5000 ||
		s.BalanceInterval != 2*time.Second || s.MaxStoreDownTime != time.Minute || s.MaxReplicas != 5 ||
		!s.FollowerLeases || s.FollowerLeaseDuration != 200*time.Millisecond || !slices.Equal(s.FollowerLeaseStores, []uint64{2, 3}) {
		t.Errorf("store config %+v", s)
	}
	// Knobs not given stay zero: the store's defaults.
	cfg, err = parseServer(t, minimalServer...)
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Store; s.ElectionTicks != 0 || s.HeartbeatTicks != 0 || s.LeaseDriftMargin != 0 || s.MaxReplicas != 0 || s.HibernateAfter != 0 {
		t.Errorf("store config without knobs %+v, want zero knobs", s)
	}
}

func TestServerConfigFile(t *testing.T) {
	path := writeConfig(t, `
# every kind of value
id = 2
peers = ["1=127.0.0.1:1", "2=127.0.0.1:2", "3=127.0.0.1:3"]
data-dir = "/var/lib/hedgekv"
zone = "dc-b"
tick = "20ms"
election-ticks = 20
heartbeat-ticks = 4
lease-drift-margin = 0.2
split-max-keys = 1000
hibernate-after = "-1s"
max-replicas = 5
follower-leases = true
follower-lease-stores = [2, 3]
log-level = "warn"
`)
	cfg, err := parseServer(t, "--config", path)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Store
	if s.StoreID != 2 || s.DataDir != "/var/lib/hedgekv" || s.Zone != "dc-b" || cfg.ListenAddr != "127.0.0.1:2" ||
		s.TickInterval != 20*time.Millisecond || s.ElectionTicks != 20 || s.HeartbeatTicks != 4 || s.LeaseDriftMargin != 0.2 ||
		s.SplitMaxKeys != 1000 || s.HibernateAfter != -time.Second || s.MaxReplicas != 5 ||
		!s.FollowerLeases || !slices.Equal(s.FollowerLeaseStores, []uint64{2, 3}) {
		t.Errorf("config from file: %+v, store %+v", cfg, s)
	}

	// The command line wins over the file, key by key.
	cfg, err = parseServer(t, "--config", path, "--election-ticks", "30", "--zone", "dc-c", "--tick", "10ms")
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Store; s.ElectionTicks != 30 || s.Zone != "dc-c" || s.TickInterval != 10*time.Millisecond || s.HeartbeatTicks != 4 || s.StoreID != 2 {
		t.Errorf("flags over the file: store %+v, want election ticks 30, zone dc-c, tick 10ms, the rest from the file", s)
	}
	// A bad value in the file that a flag overrides is never looked at.
	bad := writeConfig(t, "id = 1\npeers = \"1=127.0.0.1:1\"\ndata-dir = \"/d\"\nelection-ticks = 1\n")
	if _, err := parseServer(t, "--config", bad, "--election-ticks", "12"); err != nil {
		t.Errorf("file's election-ticks overridden by the flag: %v", err)
	}
}

// TestServerConfigErrors: every bad value, on the command line or in the
// file, is one line naming it, exit 2, before anything starts.
func TestServerConfigErrors(t *testing.T) {
	base := "id = 1\npeers = \"1=127.0.0.1:1\"\ndata-dir = \"/d\"\n"
	tests := []struct {
		name string
		args []string
		file string // appended to base, if set
		want string
	}{
		{"flag: election within heartbeat", []string{"--election-ticks", "2"}, "", "--election-ticks 2: must exceed --heartbeat-ticks (2)"},
		{"flag: heartbeat too long", []string{"--heartbeat-ticks", "10"}, "", "--election-ticks 10: must exceed --heartbeat-ticks (10)"},
		{"flag: negative election ticks", []string{"--election-ticks", "-5"}, "", "--election-ticks -5: must not be negative"},
		{"flag: drift margin", []string{"--lease-drift-margin", "1.5"}, "", "--lease-drift-margin 1.5: must be a fraction in [0, 1)"},
		{"flag: negative clock offset", []string{"--max-clock-offset", "-1ms"}, "", "--max-clock-offset -1ms: must not be negative"},
		{"flag: negative down time", []string{"--max-store-down-time", "-1s"}, "", "--max-store-down-time -1s: must not be negative"},
		{"flag: negative replicas", []string{"--max-replicas", "-1"}, "", "--max-replicas -1: must not be negative"},
		{"flag: hibernate within a tick", []string{"--hibernate-after", "1ms"}, "", "--hibernate-after 1ms: is shorter than one tick (--tick 50ms)"},
		{"flag: follower lease too long", []string{"--follower-leases", "--follower-lease-duration", "1s", "--election-ticks", "20"}, "",
			"--follower-lease-duration 1s: is longer than the leader lease (810ms: --election-ticks 20 less 2"},
		{"flag: split max keys not a number", []string{"--split-max-keys", "-3"}, "", "--split-max-keys"},

		{"file: election within heartbeat", nil, "election-ticks = 2\n", "config FILE: election-ticks = 2: must exceed --heartbeat-ticks (2)"},
		{"file: both ticks", nil, "election-ticks = 3\nheartbeat-ticks = 3\n", "config FILE: election-ticks = 3: must exceed heartbeat-ticks (3)"},
		{"file: flag's heartbeat against the file's election", []string{"--heartbeat-ticks", "5"}, "election-ticks = 5\n", "config FILE: election-ticks = 5: must exceed --heartbeat-ticks (5)"},
		{"file: drift margin", nil, "lease-drift-margin = -0.1\n", "config FILE: lease-drift-margin = -0.1: must be a fraction in [0, 1)"},
		{"file: negative uint", nil, "dedup-window = -1\n", "config FILE: dedup-window: -1: must not be negative"},
		{"file: duration as integer", nil, "tick = 50\n", "config FILE: tick: want a duration as a string such as \"50ms\""},
		{"file: bad duration", nil, "balance-interval = \"soon\"\n", "config FILE: balance-interval = soon:"},
		{"file: integer as string", nil, "election-ticks = \"ten\"\n", "config FILE: election-ticks: want an integer, got string \"ten\""},
		{"file: unknown key", nil, "electionticks = 10\n", "config FILE: unknown key \"electionticks\""},
		{"file: client flag", nil, "endpoints = \"a:1\"\n", "config FILE: unknown key \"endpoints\""},
		{"file: table", nil, "[raft]\nelection-ticks = 10\n", "config FILE: [raft]: no tables"},
		{"file: syntax", nil, "election-ticks = = 3\n", "config FILE: line 4:"},
		{"file: lease without leases", nil, "follower-lease-duration = \"100ms\"\n", "follower-lease-duration in FILE and --follower-lease-stores need --follower-leases"},
		{"file: tick zero", nil, "tick = \"0s\"\n", "tick in FILE must be positive, got 0s"},
		{"missing file", []string{"--config", "/no/such/hedgekv.toml"}, "", "config /no/such/hedgekv.toml: open /no/such/hedgekv.toml: no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"server"}, tt.args...)
			want := tt.want
			if tt.file != "" {
				path := writeConfig(t, base+tt.file)
				args = append(args, "--config", path)
				want = strings.ReplaceAll(want, "FILE", path)
			} else if !slices.Contains(tt.args, "--config") {
				args = append(args, minimalServer...)
			}
			code, stdout, stderr := runCLI(t, args...)
			if code != exitUsage || stdout != "" {
				t.Errorf("exit %d, stdout %q; want exit %d and no output", code, stdout, exitUsage)
			}
			oneLine(t, stderr)
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr %q, want %q", stderr, want)
			}
		})
	}
}

// TestServerExampleConfig: the example file documents every key and is a
// valid config as it stands (given the flags it leaves to the command
// line).
func TestServerExampleConfig(t *testing.T) {
	path := filepath.Join("..", "..", "scripts", "server.example.toml")
	cfg, err := parseServer(t, "--config", path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if cfg.Store.StoreID == 0 || cfg.Store.DataDir == "" {
		t.Errorf("example config: store %+v", cfg.Store)
	}
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f := &serverFlags{}
	cmd := serverCmd(&app{}, f)
	for name := range fileKeys(cmd) {
		if !strings.Contains(string(text), name+" =") {
			t.Errorf("%s does not mention the key %s", path, name)
		}
	}
}
