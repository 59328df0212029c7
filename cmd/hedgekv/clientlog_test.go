package main

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/client/clienttest"
)

// TestClientLogOnlyOnFailure: the client library warns when it cannot
// load the store list (every store refuses Stores here). A command that
// succeeds all the same says nothing on stderr; one that fails keeps its
// one error line, with the client's warning in it.
func TestClientLogOnlyOnFailure(t *testing.T) {
	cl := clienttest.NewCluster(t, "dc-a", "dc-b", "dc-c")
	cl.Put("a", "1")
	var failGet atomic.Bool
	cl.SetHook(func(ctx context.Context, s uint64, m string) error {
		switch {
		case m == "Stores":
			return status.Error(codes.Unavailable, "no store list today")
		case m == "Get" && failGet.Load():
			return status.Error(codes.Internal, "broken")
		}
		return nil
	})
	ep := "--endpoints=" + strings.Join(cl.Endpoints(), ",")
	code, stdout, stderr := runCLI(t, "get", "a", ep)
	if code != exitOK || stdout != "1\n" {
		t.Fatalf("get: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if stderr != "" {
		t.Errorf("get succeeded but stderr is %q, want nothing", stderr)
	}
	failGet.Store(true)
	code, _, stderr = runCLI(t, "get", "a", ep)
	if code == exitOK {
		t.Fatalf("get with Get failing: exit 0")
	}
	oneLine(t, stderr)
	if !strings.Contains(stderr, "broken") || !strings.Contains(stderr, "could not load the store list") {
		t.Errorf("stderr %q: want the error and the client's warning", stderr)
	}
}
