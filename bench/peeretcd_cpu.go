package bench

import (
	"context"
	"log/slog"
)

// servers is one peer-etcd system as the runs see it: the client
// endpoints, and the addresses of the members' /metrics when the members
// are processes of their own (etcd's, or a running hedgekv cluster's
// given with its status addresses).
//
// The servers' CPU per operation is the comparison the shared 2-core
// machine cannot blur: ops/s there depend on how much CPU the client
// (the same go-ycsb and clientv3 for both systems) leaves the servers,
// while CPU seconds per operation are each system's own cost.
type servers struct {
	endpoints []string
	metrics   []string
}

// cpuSnapshot is the servers' and this process's CPU seconds at one
// moment; ok is false when some member's could not be read.
type cpuSnapshot struct {
	server, self float64
	ok           bool
}

// cpu reads every member's process_cpu_seconds_total and this process's
// CPU time.
func (s servers) cpu(ctx context.Context, logger *slog.Logger) cpuSnapshot {
	if len(s.metrics) == 0 {
		return cpuSnapshot{}
	}
	snap := cpuSnapshot{ok: true}
	for _, addr := range s.metrics {
		c, _, err := scrapeProcess(ctx, addr)
		if err != nil {
			logger.Warn("peer-etcd: no server CPU for this run", "err", err)
			return cpuSnapshot{}
		}
		snap.server += c
	}
	snap.self = selfCPUSeconds()
	return snap
}

// chargeCPU sets the CPU per successful operation of res's phases (the
// load or the run: a Run measures one of them) from before and now.
func (s servers) chargeCPU(ctx context.Context, logger *slog.Logger, before cpuSnapshot, res *Result) {
	if !before.ok {
		return
	}
	after := s.cpu(ctx, logger)
	if !after.ok {
		return
	}
	for _, ph := range []*PhaseResult{res.Load, res.Run} {
		if ph == nil || ph.Row.Ops <= 0 {
			continue
		}
		ops := float64(ph.Row.Ops)
		server := round((after.server-before.server)*1000/ops, 3)
		client := round((after.self-before.self)*1000/ops, 3)
		ph.Row.ServerCPUMsPerOp, ph.Row.ClientCPUMsPerOp = &server, &client
	}
}

// cpuCell formats a CPU-per-operation figure ("–" when not measured).
func cpuCell(v *float64) string {
	if v == nil {
		return "–"
	}
	return FormatFloat(*v, 3)
}

// cpuRatio is a / b of two measured figures ("n/a" unless both are).
func cpuRatio(a, b *float64) string {
	if a == nil || b == nil || *b == 0 {
		return "n/a"
	}
	return FormatFloat(*a / *b, 2) + "×"
}
