package main

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/server"
)

func TestParseFault(t *testing.T) {
	good := map[string]client.Fault{
		"delay=200ms,prob=0.01": {Delay: 200 * time.Millisecond, Prob: 0.01},
		"delay=1s":              {Delay: time.Second, Prob: 1},
		"stall=2s":              {Stall: 2 * time.Second},
		"clear":                 {Clear: true},
		"clear, delay=5ms":      {Clear: true, Delay: 5 * time.Millisecond, Prob: 1},
	}
	for spec, want := range good {
		got, err := parseFault(spec)
		if err != nil || got != want {
			t.Errorf("parseFault(%q) = %+v, %v; want %+v", spec, got, err, want)
		}
	}
	for _, spec := range []string{"", "delay", "delay=", "delay=-1s", "delay=0s", "delay=soon", "prob=0.5",
		"delay=1s,prob=2", "delay=1s,prob=0", "delay=1s,prob=NaN", "stall=-2s", "stall=x", "clear=1",
		"pause=1s", "delay=1s,delay=2s", "delay=1s,"} {
		if _, err := parseFault(spec); err == nil {
			t.Errorf("parseFault(%q) succeeded, want an error", spec)
		}
	}
}

func TestCtlFaultUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ctl", "fault", "1"}, "fault takes 2 argument(s) (STORE_ID SPEC)"},
		{[]string{"ctl", "fault", "x", "clear"}, "STORE_ID must be a positive integer"},
		{[]string{"ctl", "fault", "1", "delay=1s,prob=7"}, "prob wants a number in (0, 1]"},
		{[]string{"ctl", "fault", "1", "stall=-1s"}, "stall wants a positive duration"},
		{[]string{"ctl", "fault", "1", "slow"}, "unknown part"},
		// --allow-faults is a flag of server; the missing --peers is what fails.
		{[]string{"server", "--allow-faults", "--id", "1", "--data-dir", "/tmp/x"}, "--peers is required"},
	} {
		code, stdout, stderr := runCLI(t, tc.args...)
		if code != exitUsage || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q; want %d and nothing", tc.args, code, stdout, exitUsage)
		}
		oneLine(t, stderr)
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: stderr %q does not mention %q", tc.args, stderr, tc.want)
		}
	}
}

// startStore runs a one-store cluster in-process on 127.0.0.1.
func startStore(t *testing.T, allowFaults bool) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	srv, err := server.New(server.Config{
		Store: raftstore.Config{
			StoreID: 1, InitialStores: []uint64{1}, DataDir: t.TempDir(),
			NoSync: true, TickInterval: 10 * time.Millisecond,
		},
		Listener:    lis,
		Peers:       map[uint64]string{1: addr},
		AllowFaults: allowFaults,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func TestCtlFault(t *testing.T) {
	ep := "--endpoints=" + startStore(t, true)
	for _, spec := range []string{"delay=50ms,prob=1", "stall=100ms", "clear"} {
		code, stdout, stderr := runCLI(t, "ctl", "fault", "1", spec, ep)
		if code != exitOK || stdout != "OK\n" || stderr != "" {
			t.Errorf("ctl fault 1 %s: exit %d, stdout %q, stderr %q", spec, code, stdout, stderr)
		}
	}
	code, _, stderr := runCLI(t, "ctl", "fault", "9", "clear", ep)
	if code != exitFailure {
		t.Errorf("ctl fault on an unknown store: exit %d, want %d", code, exitFailure)
	}
	oneLine(t, stderr)
	if !strings.Contains(stderr, "store 9 is not in the cluster's store list") {
		t.Errorf("stderr %q", stderr)
	}

	code, _, stderr = runCLI(t, "ctl", "fault", "1", "stall=1s", "--endpoints="+startStore(t, false))
	if code != exitFailure {
		t.Errorf("ctl fault without --allow-faults: exit %d, want %d", code, exitFailure)
	}
	oneLine(t, stderr)
	if !strings.Contains(stderr, "PermissionDenied") || !strings.Contains(stderr, "--allow-faults") {
		t.Errorf("stderr %q, want PermissionDenied naming --allow-faults", stderr)
	}
}
