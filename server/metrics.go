package server

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/readmode"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// metrics are one server's Prometheus collectors, on a registry of its own
// so that several servers can live in one process (tests, in-process bench
// clusters) without colliding.
type metrics struct {
	reg *prometheus.Registry

	requests    *prometheus.CounterVec   // method, code
	latency     *prometheus.HistogramVec // method
	reads       *prometheus.CounterVec   // mode
	inflight    prometheus.GaugeFunc
	raftSent    prometheus.Counter
	raftDropped prometheus.Counter
	snapshots   *prometheus.CounterVec // result
	// Injected faults (see faults.go).
	faultReadsDelayed prometheus.Counter
	faultStalls       prometheus.Counter
	// KV reads that ended because the caller cancelled them (a client
	// cancels the losing request of a hedged read), and the same count for
	// in-process readers (Server.ReadsCancelled).
	readsCancelled  prometheus.Counter
	readsCancelledN atomic.Uint64
	// Reads that clients marked as hedges (backup requests), those of them
	// cancelled, and reads refused as busy (ServerIsBusy).
	hedgeReads           prometheus.Counter
	hedgeReadsN          atomic.Uint64
	hedgeReadsCancelled  prometheus.Counter
	hedgeReadsCancelledN atomic.Uint64
	readsBusy            prometheus.Counter
	readsBusyN           atomic.Uint64
	// kvLatency is the latency of KV requests by operation (get,
	// batch_get, scan, put, delete), failures included; readLatency that
	// of reads served, by how they were served.
	kvLatency   *prometheus.HistogramVec // op
	readLatency *prometheus.HistogramVec // mode
	// What the store measures through its MetricsHook.
	readIndexRTT prometheus.Histogram
	writeTx      prometheus.Histogram
}

// latencyBuckets: from 50µs to ~37s: lease reads are sub-millisecond,
// reads across a simulated WAN or a stalled store take seconds. Buckets √2
// apart, so that a quantile interpolated from them (the benchmarks'
// server-side p99) is within ±41%.
func latencyBuckets() []float64 { return prometheus.ExponentialBuckets(50e-6, math.Sqrt2, 40) }

func newMetrics(inflightReads func() float64) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgekv_server_requests_total",
			Help: "gRPC requests handled, by method and status code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hedgekv_server_request_duration_seconds",
			Help:    "Server-side latency of gRPC requests, by method.",
			Buckets: latencyBuckets(),
		}, []string{"method"}),
		kvLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hedgekv_kv_request_duration_seconds",
			Help:    "Server-side latency of KV requests, by operation (get, batch_get, scan, put, delete), failed ones included.",
			Buckets: latencyBuckets(),
		}, []string{"op"}),
		readLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hedgekv_read_duration_seconds",
			Help:    "Server-side latency of reads served, by how they were served (lease, read-index, follower-lease, stale).",
			Buckets: latencyBuckets(),
		}, []string{"mode"}),
		readIndexRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hedgekv_store_read_index_rtt_seconds",
			Help:    "Time from issuing a ReadIndex batch (a leader's heartbeat round, a follower's request to its leader) to its answer.",
			Buckets: latencyBuckets(),
		}),
		writeTx: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hedgekv_store_write_tx_duration_seconds",
			Help:    "Duration of the Ready loop's bbolt write transaction (persist and apply of one round, commit and fsync included).",
			Buckets: latencyBuckets(),
		}),
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgekv_server_reads_total",
			Help: "Reads served, by how they were served (lease, read-index, stale, follower-lease).",
		}, []string{"mode"}),
		inflight: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hedgekv_server_inflight_reads",
			Help: "Reads being served right now.",
		}, inflightReads),
		raftSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hedgekv_raft_messages_sent_total",
			Help: "Raft messages handed to a stream to another store.",
		}),
		raftDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hedgekv_raft_messages_dropped_total",
			Help: "Raft messages dropped (queue full, peer unreachable, stream broken).",
		}),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgekv_raft_snapshots_sent_total",
			Help: "Raft snapshots sent to other stores, by result (ok, failed).",
		}, []string{"result"}),
		faultReadsDelayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hedgekv_fault_reads_delayed_total",
			Help: "KV reads held by an injected delay fault.",
		}),
		faultStalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hedgekv_fault_stalls_total",
			Help: "Stalls injected into this store.",
		}),
		readsCancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hedgekv_reads_cancelled_total",
			Help: "KV reads (Get, BatchGet, Scan) that ended because the caller cancelled them, such as the losing request of a hedged read.",
		}),
		hedgeReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hedgekv_hedge_reads_total",
			Help: "KV reads received that a client sent as a hedge (a backup request for a read answered late elsewhere).",
		}),
		hedgeReadsCancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hedgekv_hedge_reads_cancelled_total",
			Help: "Hedge reads that ended because the client cancelled them (the other attempt won).",
		}),
		readsBusy: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hedgekv_reads_refused_busy_total",
			Help: "KV reads refused with ServerIsBusy: the estimated wait exceeded the busy threshold the read carried.",
		}),
	}
	m.reg.MustRegister(m.requests, m.latency, m.reads, m.inflight, m.raftSent, m.raftDropped, m.snapshots,
		m.faultReadsDelayed, m.faultStalls, m.readsCancelled, m.hedgeReads, m.hedgeReadsCancelled, m.readsBusy,
		m.kvLatency, m.readLatency, m.readIndexRTT, m.writeTx,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Pre-create the labels dashboards break series down by (read modes,
	// ops, snapshot results) so they see zeros rather than gaps.
	for _, mode := range readmode.All {
		m.reads.WithLabelValues(modeLabel(mode))
		m.readLatency.WithLabelValues(modeLabel(mode))
	}
	for _, op := range kvOps {
		m.kvLatency.WithLabelValues(op)
	}
	for _, result := range []string{"ok", "failed"} {
		m.snapshots.WithLabelValues(result)
	}
	return m
}

// kvOps are the op labels of hedgekv_kv_request_duration_seconds, by gRPC
// method name.
var kvOps = map[string]string{"Get": "get", "BatchGet": "batch_get", "Scan": "scan", "Put": "put", "Delete": "delete"}

// observeRead counts a read served and how long it took to serve it.
func (m *metrics) observeRead(mode readmode.Mode, took time.Duration) {
	m.reads.WithLabelValues(modeLabel(mode)).Inc()
	m.readLatency.WithLabelValues(modeLabel(mode)).Observe(took.Seconds())
}

// storeHook turns the store's measurements into observations.
func (m *metrics) storeHook() raftstore.MetricsHook {
	return raftstore.MetricsHook{
		ReadIndexRTT: func(d time.Duration) { m.readIndexRTT.Observe(d.Seconds()) },
		WriteTx:      func(d time.Duration) { m.writeTx.Observe(d.Seconds()) },
	}
}

// observeReadStart counts a KV read received, as a hedge if so marked.
func (m *metrics) observeReadStart(hedge bool) {
	if hedge {
		m.hedgeReads.Inc()
		m.hedgeReadsN.Add(1)
	}
}

// observeReadBusy counts a read refused with ServerIsBusy.
func (m *metrics) observeReadBusy() {
	m.readsBusy.Inc()
	m.readsBusyN.Add(1)
}

// observeReadFailed counts a failed KV read whose context was cancelled:
// the caller gave up on it (context.Canceled, not a deadline), so the
// server stopped serving it.
func (m *metrics) observeReadFailed(ctx context.Context, hedge bool) {
	if !errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	m.readsCancelled.Inc()
	m.readsCancelledN.Add(1)
	if hedge {
		m.hedgeReadsCancelled.Inc()
		m.hedgeReadsCancelledN.Add(1)
	}
}

// unaryInterceptor records every request's code and latency and logs
// failures at debug level: failures such as NotLeader are routine in a
// Multi-Raft cluster, so they must not flood the log at info.
// It also keeps inflight, the count of requests being handled.
func unaryInterceptor(m *metrics, logger *slog.Logger, inflight *atomic.Int64) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		inflight.Add(1)
		start := time.Now()
		resp, err := handler(ctx, req)
		inflight.Add(-1)
		method := methodLabel(info.FullMethod)
		code := status.Code(err)
		m.requests.WithLabelValues(method, code.String()).Inc()
		took := time.Since(start).Seconds()
		m.latency.WithLabelValues(method).Observe(took)
		if name, ok := strings.CutPrefix(method, "KV."); ok {
			if op, ok := kvOps[name]; ok {
				m.kvLatency.WithLabelValues(op).Observe(took)
			}
		}
		if err != nil {
			logger.LogAttrs(ctx, slog.LevelDebug, "request failed",
				slog.String("method", method), slog.String("code", code.String()), slog.Any("err", err))
		}
		return resp, err
	}
}

// methodLabel turns "/hedgekv.KV/Get" into "KV.Get".
func methodLabel(full string) string {
	s := strings.TrimPrefix(full, "/")
	s = strings.TrimPrefix(s, "hedgekv.")
	return strings.Replace(s, "/", ".", 1)
}

// registerStoreStats exports the store's own counters: how reads were
// batched into ReadIndex rounds, proposals, snapshots, and bbolt commits.
func (m *metrics) registerStoreStats(stats func() raftstore.Stats) {
	counter := func(name, help string, get func(raftstore.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(get(stats())) })
	}
	m.reg.MustRegister(
		counter("hedgekv_store_read_index_batches_total", "ReadIndex requests issued; each carries one or more reads.",
			func(s raftstore.Stats) uint64 { return s.ReadIndexBatches }),
		counter("hedgekv_store_proposals_total", "Writes and admin commands proposed to raft by this store's leaders.",
			func(s raftstore.Stats) uint64 { return s.Proposals }),
		counter("hedgekv_store_snapshots_built_total", "Region snapshots built for followers.",
			func(s raftstore.Stats) uint64 { return s.SnapshotsBuilt }),
		counter("hedgekv_store_snapshots_applied_total", "Region snapshots received and applied.",
			func(s raftstore.Stats) uint64 { return s.SnapshotsApplied }),
		counter("hedgekv_store_ready_rounds_total", "Ready-loop rounds that committed a bbolt transaction.",
			func(s raftstore.Stats) uint64 { return s.ReadyRounds }),
		counter("hedgekv_store_votes_refused_total", "Vote requests ignored in the election timeout after a peer started (it may have forgotten the leader it acked).",
			func(s raftstore.Stats) uint64 { return s.VotesRefused }),
		counter("hedgekv_store_safe_points_refused_total", "Safe points refused because the leader's clock was ahead by more than the max clock offset.",
			func(s raftstore.Stats) uint64 { return s.SafePointsRefused }),
		counter("hedgekv_store_disk_failures_total", "Ready rounds whose disk write failed, each freezing the store until a write succeeded again.",
			func(s raftstore.Stats) uint64 { return s.DiskFailures }),
		counter("hedgekv_store_wal_records_total", "Round-log records written (one per Ready round that persisted raft state).",
			func(s raftstore.Stats) uint64 { return s.WALRecords }),
		counter("hedgekv_store_wal_syncs_total", "Round-log records fdatasynced (a record of commit indexes alone is not).",
			func(s raftstore.Stats) uint64 { return s.WALSyncs }),
		counter("hedgekv_store_batch_commits_total", "Commits of the Ready rounds' shared bbolt transaction (every 20 ms of writes and at checkpoints).",
			func(s raftstore.Stats) uint64 { return s.BatchCommits }),
		counter("hedgekv_store_batch_pages_written_total", "bbolt pages the commits of the rounds' shared transaction wrote (dirty pages and the meta page).",
			func(s raftstore.Stats) uint64 { return s.PagesWritten }),
		counter("hedgekv_store_merge_violations_total", "Merge commits applied where this store's replica of the source had not applied its freeze: a bug; the replicas may disagree.",
			func(s raftstore.Stats) uint64 { return s.MergeViolations }),
		counter("hedgekv_store_splits_over_snapshot_total", "Splits applied here that found their new region's snapshot under way (the snapshot admission rules it out): a bug; the replica may miss writes.",
			func(s raftstore.Stats) uint64 { return s.SplitsOverSnapshot }),
		counter("hedgekv_store_batches_rebuilt_total", "Uncommitted rounds lost with a failed round or commit and rebuilt from the WAL.",
			func(s raftstore.Stats) uint64 { return s.BatchesRebuilt }),
	)
	m.reg.MustRegister(&hibernationCollector{stats: stats})
	// One name, a cause label: transfer (the previous leader handed the
	// region over, raft's MsgTimeoutNow) or election (any other campaign:
	// an election timeout without a leader, a split-born region's first).
	const leadershipsHelp = "Leaderships this store's replicas took, by cause: transfer (handed over by the previous leader) or election (won after an election timeout, or a split-born region's first campaign)."
	for cause, get := range map[string]func(raftstore.Stats) uint64{
		"transfer": func(s raftstore.Stats) uint64 { return s.LeadershipsByTransfer },
		"election": func(s raftstore.Stats) uint64 { return s.LeadershipsByElection },
	} {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "hedgekv_store_leaderships_taken_total",
			Help:        leadershipsHelp,
			ConstLabels: prometheus.Labels{"cause": cause},
		}, func() float64 { return float64(get(stats())) }))
	}
}

// hibernationCollector exports the store's hibernation counters
// (raftstore.Stats.HibernateRefusals and Wakes), one series per label the
// store has counted: which condition kept idle regions awake, and what
// woke sleeping ones.
type hibernationCollector struct {
	stats func() raftstore.Stats
}

var (
	hibernateRefusalsDesc = prometheus.NewDesc("hedgekv_store_hibernate_refusals_total",
		"Times an idle leader here could not hibernate yet, or a follower here refused its leader's hibernate notice, by the condition that failed.",
		[]string{"reason"}, nil)
	hibernateWakesDesc = prometheus.NewDesc("hedgekv_store_hibernate_wakes_total",
		"Times a hibernating replica here woke, by what woke it (a request, an admin command, a notice, or a raft message type).",
		[]string{"cause"}, nil)
)

func (c *hibernationCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- hibernateRefusalsDesc
	ch <- hibernateWakesDesc
}

func (c *hibernationCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	for why, n := range st.HibernateRefusals {
		ch <- prometheus.MustNewConstMetric(hibernateRefusalsDesc, prometheus.CounterValue, float64(n), why)
	}
	for cause, n := range st.Wakes {
		ch <- prometheus.MustNewConstMetric(hibernateWakesDesc, prometheus.CounterValue, float64(n), cause)
	}
}

// registerStoreGauges exports the store's state (raftstore.Gauges) and
// whether the server is ready (health.go).
func (m *metrics) registerStoreGauges(gauges func() raftstore.Gauges, ready func() bool) {
	m.reg.MustRegister(&storeGaugeCollector{gauges: gauges}, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hedgekv_server_ready",
		Help: "1 while /readyz answers 200 (caught up after start, disk working, not shutting down), else 0.",
	}, func() float64 {
		if ready() {
			return 1
		}
		return 0
	}))
}

// storeGaugeCollector reads raftstore.Gauges once per scrape (it locks
// every peer in turn) and reports each field.
type storeGaugeCollector struct {
	gauges func() raftstore.Gauges
}

var storeGaugeDescs = struct {
	regions, leaders, hibernating, lagSum, lagMax, dbSize *prometheus.Desc
}{
	regions:     prometheus.NewDesc("hedgekv_store_regions", "Regions with an initialized replica on this store.", nil, nil),
	leaders:     prometheus.NewDesc("hedgekv_store_leader_regions", "Regions this store leads.", nil, nil),
	hibernating: prometheus.NewDesc("hedgekv_store_hibernating_regions", "Regions whose replica here hibernates (stopped ticking for lack of traffic).", nil, nil),
	lagSum:      prometheus.NewDesc("hedgekv_store_apply_lag_entries", "Entries known committed but not yet applied, summed over this store's regions.", nil, nil),
	lagMax:      prometheus.NewDesc("hedgekv_store_apply_lag_max_entries", "Entries known committed but not yet applied, in the region furthest behind.", nil, nil),
	dbSize:      prometheus.NewDesc("hedgekv_store_db_file_size_bytes", "Size of the store's bbolt file.", nil, nil),
}

func (c *storeGaugeCollector) Describe(ch chan<- *prometheus.Desc) {
	d := storeGaugeDescs
	for _, desc := range []*prometheus.Desc{d.regions, d.leaders, d.hibernating, d.lagSum, d.lagMax, d.dbSize} {
		ch <- desc
	}
}

func (c *storeGaugeCollector) Collect(ch chan<- prometheus.Metric) {
	g, d := c.gauges(), storeGaugeDescs
	for _, v := range []struct {
		desc *prometheus.Desc
		val  float64
	}{
		{d.regions, float64(g.Regions)},
		{d.leaders, float64(g.Leaders)},
		{d.hibernating, float64(g.Hibernating)},
		{d.lagSum, float64(g.ApplyLagSum)},
		{d.lagMax, float64(g.ApplyLagMax)},
		{d.dbSize, float64(g.DBFileBytes)},
	} {
		ch <- prometheus.MustNewConstMetric(v.desc, prometheus.GaugeValue, v.val)
	}
}

// modeLabel is a read mode's metric label ("unknown" for none).
func modeLabel(mode readmode.Mode) string {
	if mode == "" {
		return string(readmode.Unknown)
	}
	return string(mode)
}
