package main

import (
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/server"
)

// startInProcess runs stores 1..running of a cluster whose region 1 has
// voters on stores 1, 2 and 3, in-process on 127.0.0.1 without balancing;
// stores running+1..known are known to every store but down (nothing
// listens at their addresses). It returns the running stores' endpoints,
// comma-separated.
func startInProcess(t *testing.T, running, known uint64, electionTicks int) string {
	t.Helper()
	peers := map[uint64]string{}
	var lis []net.Listener
	var eps []string
	for id := uint64(1); id <= known; id++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		peers[id] = l.Addr().String()
		if id <= running {
			lis = append(lis, l)
			eps = append(eps, peers[id])
		} else if err := l.Close(); err != nil { // nothing listens there
			t.Fatal(err)
		}
	}
	// The data directories are made before the stop is registered:
	// cleanups run last in, first out, so the stores stop before their
	// directories are removed (else a store still writing fails the
	// removal).
	dirs := make([]string, len(lis))
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	var servers []*server.Server
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, s := range servers {
			wg.Go(s.Stop)
		}
		wg.Wait()
	})
	for i, l := range lis {
		srv, err := server.New(server.Config{
			Store: raftstore.Config{
				StoreID: uint64(i + 1), InitialStores: []uint64{1, 2, 3}, DataDir: dirs[i],
				NoSync: true, TickInterval: 10 * time.Millisecond, ElectionTicks: electionTicks,
				Logger: slog.New(slog.DiscardHandler), // a down store's raft stream failing is expected
			},
			Listener:         l,
			Peers:            peers,
			DisableBalancing: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		servers = append(servers, srv)
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
	}
	return strings.Join(eps, ",")
}

// TestCtlTransferLeaderRefused: ctl transfer-leader to a store that is
// down, does not exist or holds no replica of the region fails at once
// (not after --timeout), exit 1, with the cause on one line (issue 17).
func TestCtlTransferLeaderRefused(t *testing.T) {
	// Store 3, a voter of region 1, is down from the start; store 4 is
	// known to every store but down and holds no replica.
	ep := "--endpoints=" + startInProcess(t, 2, 4, 40)
	// Stores 1 and 2 elect a leader of region 1 between them.
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, stdout, stderr := runCLI(t, "ctl", "transfer-leader", "1", "1", ep, "--timeout", "5s")
		if code == exitOK && stdout == "OK\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("transfer-leader 1 1: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, tc := range []struct {
		store string
		want  []string
	}{
		{"3", []string{"FailedPrecondition", "store 3 is down"}},
		{"9", []string{"NotFound", "store 9 does not exist"}},
		{"4", []string{"FailedPrecondition", "store 4 has no replica of region 1"}},
	} {
		start := time.Now()
		code, stdout, stderr := runCLI(t, "ctl", "transfer-leader", "1", tc.store, ep, "--timeout", "10s")
		took := time.Since(start)
		if code != exitFailure || stdout != "" {
			t.Errorf("transfer-leader 1 %s: exit %d, stdout %q; want %d and nothing", tc.store, code, stdout, exitFailure)
		}
		t.Logf("transfer-leader 1 %s: %s", tc.store, strings.TrimSpace(stderr))
		oneLine(t, stderr)
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("transfer-leader 1 %s: stderr %q does not say %q", tc.store, stderr, w)
			}
		}
		if strings.Contains(stderr, "gave up") || took > 3*time.Second {
			t.Errorf("transfer-leader 1 %s: took %v (stderr %q), want a refusal at once, not retries until --timeout", tc.store, took, stderr)
		}
	}
}
