package server

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// faultInjector holds the faults an operator injected into this store with
// the Admin Fault call (server started with AllowFaults). They live in the
// process only, never on disk.
//
//   - delay=D,prob=P: each KV read (Get, BatchGet, Scan) is, with
//     probability P, held for D before it is served; a read whose context
//     ends meanwhile stops waiting.
//   - stall=D: for D the store answers nothing: every gRPC call but Fault
//     waits at the gate (stallInterceptors), inbound raft batches are held
//     (raftService) and outbound raft messages are dropped (transport), as
//     in a GC or compaction pause. Raft resends what was lost once the
//     stall ends.
//   - clear ends both, waking whatever waits.
//
// The hot path (no fault set) is one atomic load.
type faultInjector struct {
	state atomic.Pointer[faultState]
	mu    sync.Mutex // serialises updates

	readsDelayed   func() // metrics hooks; never nil after newFaultInjector
	stallsInjected func()
}

// faultState is one immutable setting. wake is closed when the setting is
// replaced, so waiters re-read it (a clear ends their wait early).
type faultState struct {
	delay      time.Duration
	prob       float64
	stallUntil time.Time
	wake       chan struct{}
}

func newFaultInjector(m *metrics) *faultInjector {
	f := &faultInjector{readsDelayed: func() {}, stallsInjected: func() {}}
	if m != nil {
		f.readsDelayed = m.faultReadsDelayed.Inc
		f.stallsInjected = m.faultStalls.Inc
	}
	f.state.Store(&faultState{wake: make(chan struct{})})
	return f
}

// checkFaultRequest validates a Fault request: InvalidArgument for negative
// durations, a probability outside [0, 1], a delay without a probability
// (or the reverse), or a request that asks for nothing.
func checkFaultRequest(req *kvpb.FaultRequest) error {
	d, p, st := req.GetDelayNanos(), req.GetProb(), req.GetStallNanos()
	switch {
	case d < 0:
		return status.Errorf(codes.InvalidArgument, "fault: negative delay %v", time.Duration(d))
	case st < 0:
		return status.Errorf(codes.InvalidArgument, "fault: negative stall %v", time.Duration(st))
	case math.IsNaN(p) || p < 0 || p > 1:
		return status.Errorf(codes.InvalidArgument, "fault: probability %v is outside [0, 1]", p)
	case d > 0 && p == 0:
		return status.Error(codes.InvalidArgument, "fault: a delay needs a probability in (0, 1]")
	case d == 0 && p > 0:
		return status.Error(codes.InvalidArgument, "fault: a probability needs a delay")
	case !req.GetClear() && d == 0 && st == 0:
		return status.Error(codes.InvalidArgument, "fault: nothing to inject: give a delay and probability, a stall, or clear")
	}
	return nil
}

// apply sets the faults req asks for (checked by checkFaultRequest): clear
// first ends every fault, then a delay replaces the delay and a stall
// starts now and replaces any stall in progress.
func (f *faultInjector) apply(req *kvpb.FaultRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old := f.state.Load()
	next := &faultState{delay: old.delay, prob: old.prob, stallUntil: old.stallUntil, wake: make(chan struct{})}
	if req.GetClear() {
		next.delay, next.prob, next.stallUntil = 0, 0, time.Time{}
	}
	if d := req.GetDelayNanos(); d > 0 {
		next.delay, next.prob = time.Duration(d), req.GetProb()
	}
	if st := req.GetStallNanos(); st > 0 {
		next.stallUntil = time.Now().Add(time.Duration(st))
		f.stallsInjected()
	}
	f.state.Store(next)
	close(old.wake)
}

// stalled reports whether a stall is in progress.
func (f *faultInjector) stalled() bool {
	st := f.state.Load()
	return !st.stallUntil.IsZero() && time.Now().Before(st.stallUntil)
}

// waitStall returns once no stall is in progress, or with ctx's error as a
// gRPC status if ctx ends first.
func (f *faultInjector) waitStall(ctx context.Context) error {
	for {
		st := f.state.Load()
		if st.stallUntil.IsZero() {
			return nil
		}
		left := time.Until(st.stallUntil)
		if left <= 0 {
			return nil
		}
		if err := sleepCtx(ctx, left, st.wake); err != nil {
			return err
		}
	}
}

// delayRead holds a read for the injected delay, with the injected
// probability. A clear ends the wait; so does ctx, whose error it returns.
func (f *faultInjector) delayRead(ctx context.Context) error {
	st := f.state.Load()
	if st.delay <= 0 || st.prob <= 0 {
		return nil
	}
	if st.prob < 1 && rand.Float64() >= st.prob {
		return nil
	}
	f.readsDelayed()
	return sleepCtx(ctx, st.delay, st.wake)
}

// sleepCtx waits d, or until wake is closed (nil error for both), or until
// ctx ends (its error, as a gRPC status).
func sleepCtx(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-wake:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// stallInterceptors hold every call but Fault while a stall is in
// progress: Fault must get through, or a stall could not be cleared.
func (f *faultInjector) stallInterceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != kvpb.Admin_Fault_FullMethodName {
			if err := f.waitStall(ctx); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := f.waitStall(ss.Context()); err != nil {
			return err
		}
		return handler(srv, ss)
	}
	return unary, stream
}

// Fault sets this store's injected faults; see faultInjector.
func (s *adminService) Fault(ctx context.Context, req *kvpb.FaultRequest) (*kvpb.FaultResponse, error) {
	if !s.srv.cfg.AllowFaults {
		return nil, status.Errorf(codes.PermissionDenied, "store %d does not allow fault injection (start it with --allow-faults)", s.srv.cfg.Store.StoreID)
	}
	if err := checkFaultRequest(req); err != nil {
		return nil, err
	}
	s.srv.faults.apply(req)
	s.srv.logger.Warn("fault injected", "delay", time.Duration(req.GetDelayNanos()), "prob", req.GetProb(),
		"stall", time.Duration(req.GetStallNanos()), "clear", req.GetClear())
	return &kvpb.FaultResponse{}, nil
}
