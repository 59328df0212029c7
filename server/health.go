package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/raftstore"
)

// health answers the status port's /healthz and /readyz.
//
// /healthz is liveness: 200 whenever the status port answers at all, so a
// supervisor restarts only a process that stopped serving.
//
// /readyz is readiness: 503 with a one-line reason until the store has
// caught up after it started (raftstore.Store.CaughtUp: every region it
// hosts knows a leader and has applied everything it learned is
// committed), then 200; and 503 again while the disk is failed
// (raftstore.ErrDiskFailed) and once a graceful shutdown has begun. Catching
// up is latched: a region that loses its leader later (an election
// elsewhere) does not make this store unready, since nothing the store
// could do would change that. A rolling restart waits for /readyz before
// it stops the next store, so no region is left with one caught-up voter.
type health struct {
	store *raftstore.Store
	// started: the store's Ready loop runs (StartContext finished).
	started atomic.Bool
	// caughtUp is latched by watch once CaughtUp first holds.
	caughtUp atomic.Bool
	// draining: Shutdown began; also makes the store refuse leadership
	// handed to it (drainingHandler).
	draining atomic.Bool
}

// readiness is how often watch looks at the store while it catches up.
const readinessPoll = 50 * time.Millisecond

// ready says whether the store is ready and, if not, why, in one line.
func (h *health) ready() (bool, string) {
	switch {
	case h.draining.Load():
		return false, "shutting down"
	case !h.started.Load():
		return false, "starting"
	}
	if err := h.store.DiskError(); err != nil {
		return false, oneLine(err.Error())
	}
	if !h.caughtUp.Load() {
		if ok, why := h.store.CaughtUp(); !ok {
			return false, "catching up: " + why
		}
		h.caughtUp.Store(true)
	}
	return true, ""
}

// watch latches caughtUp as soon as the store has caught up, whether or
// not anyone asks /readyz meanwhile, and logs how long it took; it returns
// then or when ctx ends.
func (h *health) watch(ctx context.Context, log func(msg string, args ...any)) {
	start := time.Now()
	t := time.NewTicker(readinessPoll)
	defer t.Stop()
	for {
		if ok, _ := h.store.CaughtUp(); ok || h.caughtUp.Load() {
			h.caughtUp.Store(true)
			log("caught up after start: ready", "took", time.Since(start).Round(time.Millisecond))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (h *health) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = fmt.Fprintln(w, "ok")
}

func (h *health) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	// Never cached: the answer changes with the store's state.
	w.Header().Set("Cache-Control", "no-store")
	if ok, why := h.ready(); !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready: %s\n", why)
		return
	}
	_, _ = fmt.Fprintln(w, "ready")
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// drainingHandler delivers inbound raft messages to the store, except that
// once the server is shutting down it drops MsgTimeoutNow: another store's
// balancer must not hand a region's leadership back to a store that just
// gave it away and is about to stop (raft abandons the transfer after an
// election timeout, and the region keeps its leader).
type drainingHandler struct {
	raftstore.Handler
	draining *atomic.Bool
}

func (h drainingHandler) HandleRaftMessage(m *raftstore.Message) error {
	if m.Msg.Type == raftpb.MsgTimeoutNow && h.draining.Load() {
		return nil
	}
	return h.Handler.HandleRaftMessage(m)
}

// ReceiveSnapshot hands a streamed snapshot to the store: without it the
// Raft service, finding no raftstore.SnapshotReceiver, read every snapshot
// whole into memory and the store applied it in one transaction (a store
// that received every region kept 751 MiB-4.25 GiB of heap at scale).
func (h drainingHandler) ReceiveSnapshot(m *raftstore.Message, r io.Reader) error {
	recv, ok := h.Handler.(raftstore.SnapshotReceiver)
	if !ok {
		return fmt.Errorf("region %d: the store cannot take a streamed snapshot", m.RegionID)
	}
	return recv.ReceiveSnapshot(m, r)
}

var _ raftstore.SnapshotReceiver = drainingHandler{}
