package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"

	"github.com/hedgekv/hedgekv/cluster"
)

// watch: many etcd watchers on one store while a writer changes the keys
// they watch at a fixed rate, over clientv3 as applications use it (a
// client per gRPC connection, its watches multiplexed on one stream per
// context). Every acknowledged write must reach every watcher of its key
// once, in revision order; the latency is from the write's acknowledgement
// to the event's arrival.

// WatchConfig configures RunWatch.
type WatchConfig struct {
	// Quick: 3 s of writes, 1,000 watchers. Explicit values still win.
	Quick bool
	// Watchers are the watcher counts to run, one run each (default
	// 10,000).
	Watchers []int
	// Clients is the number of clientv3 clients (gRPC connections) the
	// watchers are spread over (default 50), Streams the watch streams of
	// each (default 4: contexts with distinct metadata).
	Clients, Streams int
	Rate             float64       // writes/s (default 1,000)
	Duration         time.Duration // of the writes (default 10s; quick 3s)
	// InFlight bounds the writes outstanding at once (default 128); the
	// writer falls behind its schedule beyond it (reported).
	InFlight int
	// Drain bounds the wait, after the last write, for the watchers to
	// receive every event (default 30s).
	Drain time.Duration
	// Endpoints of a running cluster; none: three stores in this process.
	Endpoints []string
	// StatusAddrs are the running cluster's status addresses (in the
	// order of Endpoints), whose /metrics give the stores' CPU and RSS.
	StatusAddrs []string
	// WatchStore is the index in Endpoints of the store the watchers
	// call (default 0).
	WatchStore int
	OutDir     string // writes OutDir/watch
	Command    string
	Progress   io.Writer
	Logger     *slog.Logger
	Out        io.Writer
}

func (cfg *WatchConfig) setDefaults() error {
	if len(cfg.Watchers) == 0 {
		cfg.Watchers = []int{quickOr(cfg.Quick, 10000, 1000)}
	}
	for _, n := range cfg.Watchers {
		if n <= 0 {
			return fmt.Errorf("watcher count %d: want at least 1", n)
		}
	}
	setDefault(&cfg.Clients, 50)
	setDefault(&cfg.Streams, 4)
	setDefault(&cfg.Rate, 1000)
	setDefault(&cfg.Duration, quickOr(cfg.Quick, 10*time.Second, 3*time.Second))
	setDefault(&cfg.InFlight, 128)
	setDefault(&cfg.Drain, 30*time.Second)
	if len(cfg.Endpoints) > 0 && (cfg.WatchStore < 0 || cfg.WatchStore >= len(cfg.Endpoints)) {
		return fmt.Errorf("watch store %d: there are %d endpoints", cfg.WatchStore, len(cfg.Endpoints))
	}
	if len(cfg.StatusAddrs) > 0 && len(cfg.StatusAddrs) != len(cfg.Endpoints) {
		return fmt.Errorf("%d status addresses for %d endpoints", len(cfg.StatusAddrs), len(cfg.Endpoints))
	}
	setOutputDefaults(&cfg.OutDir, &cfg.Logger, &cfg.Out)
	return nil
}

// WatchRow is what a watch run adds to its results row.
type WatchRow struct {
	Watchers int `json:"watchers"`
	Streams  int `json:"streams"`
	Writes   int `json:"writes"` // acknowledged
	// WritesFailed: writes that failed (their outcome is unknown: an
	// event of one is counted as unexpected, not as missing).
	WritesFailed int64 `json:"writes_failed"`
	Expected     int64 `json:"events_expected"`
	Delivered    int64 `json:"events_delivered"`
	Missing      int64 `json:"events_missing"`
	// Duplicated: events at or below the revision of an event the watcher
	// had already received (a duplicate, or out of order).
	Duplicated int64 `json:"events_duplicated"`
	Unexpected int64 `json:"events_unexpected"`
	// BeforeAck: events that arrived before their write's
	// acknowledgement (latency counted as 0).
	BeforeAck int64   `json:"events_before_ack"`
	MaxMs     float64 `json:"max_ms"`
	// MaxMsBySecond: the slowest delivery of the writes acknowledged in
	// each second of the run (a stall of the machine shows as one slow
	// second, a fan-out that cannot keep up as a rising line).
	MaxMsBySecond []float64 `json:"max_ms_by_second"`
	// FirstP99Ms: per write, the delay of the first of its events to
	// arrive (at any watcher), p99 over the writes. A high one is a delay
	// every watcher of a write shares (the store's apply, its feed, a
	// stalled sender), as against the spread of one write's fan-out.
	FirstP99Ms float64 `json:"first_event_p99_ms"`
	// WriterLagMs: how far the writer fell behind its schedule.
	WriterLagMs float64 `json:"writer_lag_ms"`
	// CPU seconds over the run (writes and drain) and peak RSS of the
	// watched store's server (in-process: the whole bench process), and
	// of all stores together.
	ServerCPUSec   float64 `json:"server_cpu_s"`
	ServerRSSMB    float64 `json:"server_rss_mb"`
	AllCPUSec      float64 `json:"all_stores_cpu_s,omitempty"`
	BenchCPUSec    float64 `json:"bench_cpu_s"`
	WallSec        float64 `json:"wall_s"`
	InProcess      bool    `json:"in_process"`
	CreateWatchSec float64 `json:"create_watchers_s"`
	// CreateRetries: watch creations refused and tried again.
	CreateRetries int64 `json:"create_retries"`
}

// WatchResult is what RunWatch measured: a row per watcher count.
type WatchResult struct {
	Rows       []Row
	Runs       []WatchRow
	Dir        string
	LoadBefore string
}

// RunWatch runs the scenario once per watcher count and writes
// OutDir/watch/{results.json,report.md}.
func RunWatch(ctx context.Context, cfg WatchConfig) (*WatchResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	started, load := time.Now(), loadAvg()
	prog := newProgress(cfg.Progress, "watch", 1+len(cfg.Watchers))
	defer prog.Done()
	endpoints, inProcess := cfg.Endpoints, len(cfg.Endpoints) == 0
	if inProcess {
		prog.Printf("watch: starting 3 stores in this process")
		lc, err := cluster.StartLocal(ctx, cluster.LocalConfig{NoSync: true, DisableSplit: true, Logger: quietStores(cfg.Logger)})
		if err != nil {
			return nil, fmt.Errorf("watch: %w", err)
		}
		defer lc.Stop()
		endpoints = lc.Endpoints
	}
	res := &WatchResult{Dir: filepath.Join(cfg.OutDir, "watch"), LoadBefore: load}
	var errs []error
	for i, n := range cfg.Watchers {
		w, err := cfg.run(ctx, endpoints, inProcess, fmt.Sprintf("bw%d-%d/", started.Unix(), i), n, prog)
		if w != nil {
			res.Runs = append(res.Runs, w.WatchRow)
			row := latencyRow("watch", w.param(cfg), w.hist, w.Delivered, w.Missing+w.Duplicated+w.Unexpected, time.Duration(w.WallSec*float64(time.Second)))
			wr := w.WatchRow
			row.Watch = &wr
			res.Rows = append(res.Rows, row)
			prog.Printf("%6d watchers: %d/%d events delivered, %d missing, %d duplicated; p50 %.2f ms, p99 %.2f ms, max %.2f ms; server CPU %.1f s, RSS %.0f MB",
				n, w.Delivered, w.Expected, w.Missing, w.Duplicated, row.P50Ms, row.P99Ms, w.MaxMs, w.ServerCPUSec, w.ServerRSSMB)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("watch: %d watchers: %w", n, err))
			if ctx.Err() != nil {
				break
			}
		}
	}
	prog.Done()
	return res, errors.Join(append(errs, cfg.write(res, started))...)
}

// watchRun is one run's measurements.
type watchRun struct {
	WatchRow
	hist *hdrhistogram.Histogram
}

func (w *watchRun) param(cfg WatchConfig) string {
	return fmt.Sprintf("%d watchers, %d streams, %g writes/s", w.Watchers, w.Streams, cfg.Rate)
}

// watchLayout is which keys the watchers watch: K keys in groups of 10
// (prefix watchers watch a group), the first H of them hot.
//
//	watcher i < N/2:        key i mod K, exactly (every key has one)
//	N/2 <= i < 3N/4:        the prefix of group i mod G (10 keys)
//	i >= 3N/4:              hot key i mod H, exactly (many watchers each)
type watchLayout struct {
	prefix  string
	n, k, g int
	h       int
}

const watchGroup = 10

func newWatchLayout(prefix string, n int) watchLayout {
	k := max(n/4, 1)
	return watchLayout{prefix: prefix, n: n, k: k, g: (k + watchGroup - 1) / watchGroup, h: min(10, k)}
}

func (l watchLayout) key(i int) string {
	return fmt.Sprintf("%s%06d/%d", l.prefix, i/watchGroup, i%watchGroup)
}

func (l watchLayout) groupPrefix(g int) string { return fmt.Sprintf("%s%06d/", l.prefix, g) }

// watched is watcher i's keys: one key (exact), or a group (prefix).
func (l watchLayout) watched(i int) (key int, group int) {
	switch {
	case i < l.n/2 || l.n < 4:
		return i % l.k, -1
	case i < 3*l.n/4:
		return -1, i % l.g
	}
	return i % l.h, -1
}

// watchWrite is one write: its key, revision and acknowledgement (ns
// since the run started); rev 0: it failed.
type watchWrite struct {
	key int32
	rev int64
	ack int64
}

// watchEvent is an event a watcher received: its revision, and when (ns
// since the run started).
type watchEvent struct {
	rev, at int64
}

func (cfg *WatchConfig) run(ctx context.Context, endpoints []string, inProcess bool, prefix string, n int, prog *Progress) (*watchRun, error) {
	lay := newWatchLayout(prefix, n)
	streams := min(cfg.Clients*cfg.Streams, n)
	clients := min(cfg.Clients, streams)
	out := &watchRun{WatchRow: WatchRow{Watchers: n, Streams: streams, InProcess: inProcess}, hist: newHist()}
	nop := zap.NewNop()
	writer, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second, Logger: nop})
	if err != nil {
		return nil, fmt.Errorf("writer client: %w", err)
	}
	defer func() { _ = writer.Close() }()
	// The watchers start at the revision after this one: each sees
	// exactly the run's writes to its keys.
	first, err := writer.Put(ctx, prefix+"start", "")
	if err != nil {
		return nil, fmt.Errorf("first write: %w", err)
	}
	startRev := first.Header.Revision + 1

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	clis := make([]*clientv3.Client, clients)
	defer func() {
		for _, c := range clis {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	for i := range clis {
		if clis[i], err = clientv3.New(clientv3.Config{Endpoints: []string{endpoints[cfg.WatchStore]}, DialTimeout: 10 * time.Second, Logger: nop}); err != nil {
			return nil, fmt.Errorf("watch client: %w", err)
		}
	}
	prog.Step(fmt.Sprintf("%d watchers: create", n), int64(n), 0)
	created := time.Now()
	events := make([][]watchEvent, n)
	lastRev := make([]atomic.Int64, n) // the last revision each watcher received
	var received atomic.Int64
	var runStart atomic.Int64 // UnixNano the writes start at
	var wg sync.WaitGroup
	var createErr error
	var createMu sync.Mutex
	var createRetries atomic.Int64
	// Watchers of one stream are created one after another (clientv3
	// waits for each creation), streams in parallel.
	var cg sync.WaitGroup
	for s := range streams {
		cli := clis[s%clients]
		sctx := metadata.AppendToOutgoingContext(wctx, "bench-watch-stream", strconv.Itoa(s))
		cg.Go(func() {
			for i := s; i < n; i += streams {
				key, group := lay.watched(i)
				var ch clientv3.WatchChan
				for attempt := 0; ; attempt++ {
					if group >= 0 {
						ch = cli.Watch(sctx, lay.groupPrefix(group), clientv3.WithPrefix(), clientv3.WithRev(startRev), clientv3.WithCreatedNotify())
					} else {
						ch = cli.Watch(sctx, lay.key(key), clientv3.WithRev(startRev), clientv3.WithCreatedNotify())
					}
					wr, ok := <-ch
					if ok && wr.Created && !wr.Canceled && wr.Err() == nil {
						break
					}
					// A store refuses a watch while the etcd keyspace's
					// region is being split off (after its first write):
					// try again, as an application would.
					if attempt < 10 && ctx.Err() == nil {
						createRetries.Add(1)
						time.Sleep(200 * time.Millisecond)
						continue
					}
					createMu.Lock()
					createErr = cmpErr(createErr, fmt.Errorf("create watcher %d: %v (closed: %v)", i, wr.Err(), !ok))
					createMu.Unlock()
					return
				}
				prog.Update(received.Add(1), 0)
				wg.Go(func() {
					for wr := range ch {
						at := time.Now().UnixNano() - runStart.Load()
						for _, ev := range wr.Events {
							events[i] = append(events[i], watchEvent{rev: ev.Kv.ModRevision, at: at})
						}
						if len(wr.Events) > 0 {
							lastRev[i].Store(wr.Events[len(wr.Events)-1].Kv.ModRevision)
						}
						received.Add(int64(len(wr.Events)))
					}
				})
			}
		})
	}
	cg.Wait()
	if createErr != nil {
		return nil, createErr
	}
	out.CreateWatchSec = round(time.Since(created).Seconds(), 2)
	out.CreateRetries = createRetries.Load()
	received.Store(0)

	// The writes, at cfg.Rate, open loop up to InFlight outstanding.
	total := int(cfg.Rate * cfg.Duration.Seconds())
	writes := make([]watchWrite, total)
	prog.Step(fmt.Sprintf("%d watchers: %d writes", n, total), int64(total), cfg.Duration)
	before := cfg.sample(ctx, inProcess)
	peak := newPeakSampler(ctx, cfg, inProcess)
	t0 := time.Now()
	runStart.Store(t0.UnixNano())
	var failed, done atomic.Int64
	var firstErr atomic.Value
	sem := make(chan struct{}, cfg.InFlight)
	var ww sync.WaitGroup
	var lag time.Duration
	rng := rand.New(rand.NewPCG(uint64(t0.UnixNano()), 7))
	for i := range total {
		due := time.Duration(float64(i) / cfg.Rate * float64(time.Second))
		if d := due - time.Since(t0); d > 0 {
			time.Sleep(d)
		}
		sem <- struct{}{}
		lag = max(lag, time.Since(t0)-due)
		key := rng.IntN(lay.k)
		ww.Go(func() {
			defer func() { <-sem }()
			r, err := writer.Put(ctx, lay.key(key), strconv.Itoa(i))
			at := time.Now().UnixNano() - t0.UnixNano()
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
				writes[i] = watchWrite{key: int32(key)}
				return
			}
			writes[i] = watchWrite{key: int32(key), rev: r.Header.Revision, ack: at}
			prog.Update(done.Add(1), failed.Load())
		})
		if ctx.Err() != nil {
			break
		}
	}
	ww.Wait()
	out.WriterLagMs = round(float64(lag.Microseconds())/1000, 1)
	out.WritesFailed = failed.Load()
	if s, ok := firstErr.Load().(string); ok {
		cfg.Logger.Warn("watch: a write failed", "first", s, "failed", out.WritesFailed)
	}

	// Expected events: per key the revisions written to it.
	byKey := make([][]int64, lay.k)
	for _, w := range writes {
		if w.rev != 0 {
			byKey[w.key] = append(byKey[w.key], w.rev)
			out.Writes++
		}
	}
	for _, revs := range byKey {
		slices.Sort(revs)
	}
	expected := func(i int) []int64 {
		key, group := lay.watched(i)
		if group < 0 {
			return byKey[key]
		}
		var revs []int64
		for k := group * watchGroup; k < min((group+1)*watchGroup, lay.k); k++ {
			revs = append(revs, byKey[k]...)
		}
		slices.Sort(revs)
		return revs
	}
	wantLast := make([]int64, n)
	for i := range n {
		want := expected(i)
		out.Expected += int64(len(want))
		if len(want) > 0 {
			wantLast[i] = want[len(want)-1]
		}
	}
	// Drained: every watcher has received its last expected revision (or
	// a later one: an event of a write that failed, but was applied).
	behind := func() int64 {
		var b int64
		for i := range n {
			if lastRev[i].Load() < wantLast[i] {
				b++
			}
		}
		return b
	}
	prog.Step(fmt.Sprintf("%d watchers: drain", n), int64(n), cfg.Drain)
	for deadline := time.Now().Add(cfg.Drain); time.Now().Before(deadline) && ctx.Err() == nil; {
		b := behind()
		prog.Update(int64(n)-b, 0)
		if b == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	wall := time.Since(t0)
	after := cfg.sample(ctx, inProcess)
	out.ServerRSSMB = peak.stop()
	stopWatch()
	wg.Wait()

	// Every watcher's events against its writes; latencies by revision.
	ackOf := make(map[int64]int64, len(writes))
	for _, w := range writes {
		if w.rev != 0 {
			ackOf[w.rev] = w.ack
		}
	}
	var maxLat int64
	firstLat := make(map[int64]int64, len(ackOf)) // per revision, its first event's latency
	var perSec []int64                            // the slowest delivery of the writes acknowledged in each second
	for i := range n {
		want := expected(i)
		got := events[i]
		var last int64
		j := 0
		for _, ev := range got {
			if ev.rev <= last {
				out.Duplicated++
				continue
			}
			last = ev.rev
			for j < len(want) && want[j] < ev.rev {
				j++ // missing: counted below
			}
			if j >= len(want) || want[j] != ev.rev {
				out.Unexpected++
				continue
			}
			j++
			out.Delivered++
			lat := ev.at - ackOf[ev.rev]
			if lat < 0 {
				out.BeforeAck++
				lat = 0
			}
			maxLat = max(maxLat, lat)
			if f, ok := firstLat[ev.rev]; !ok || lat < f {
				firstLat[ev.rev] = lat
			}
			recordLatency(out.hist, time.Duration(lat))
			if sec := int(ackOf[ev.rev] / 1e9); sec >= 0 {
				for len(perSec) <= sec {
					perSec = append(perSec, 0)
				}
				perSec[sec] = max(perSec[sec], lat)
			}
		}
	}
	out.Missing = out.Expected - out.Delivered
	firstMs := make([]float64, 0, len(firstLat))
	for _, l := range firstLat {
		firstMs = append(firstMs, float64(l)/1e6)
	}
	slices.Sort(firstMs)
	out.FirstP99Ms = round(lagQuantile(firstMs, 0.99), 2)
	out.MaxMs = round(float64(maxLat)/1e6, 3)
	for _, l := range perSec {
		out.MaxMsBySecond = append(out.MaxMsBySecond, round(float64(l)/1e6, 1))
	}
	out.WallSec = round(wall.Seconds(), 2)
	out.ServerCPUSec, out.AllCPUSec, out.BenchCPUSec = after.diff(before, cfg.WatchStore)
	if out.Missing > 0 || out.Duplicated > 0 {
		return out, fmt.Errorf("%d of %d events missing, %d duplicated or out of order", out.Missing, out.Expected, out.Duplicated)
	}
	return out, nil
}

func cmpErr(old, err error) error {
	if old != nil {
		return old
	}
	return err
}

// cpuSample is CPU seconds: of each store (from its /metrics; in-process:
// none) and of this process.
type cpuSample struct {
	stores []float64
	self   float64
}

func (cfg *WatchConfig) sample(ctx context.Context, inProcess bool) cpuSample {
	s := cpuSample{self: selfCPUSeconds()}
	if !inProcess {
		for _, a := range cfg.StatusAddrs {
			cpu, _, err := scrapeProcess(ctx, a)
			if err != nil {
				cfg.Logger.Warn("watch: scrape a store's CPU", "status", a, "err", err)
			}
			s.stores = append(s.stores, cpu)
		}
	}
	return s
}

// diff is the watched store's CPU seconds between b and s (in-process:
// this process's), all stores', and this process's.
func (s cpuSample) diff(b cpuSample, watched int) (server, all, self float64) {
	self = round(s.self-b.self, 2)
	if len(s.stores) == 0 || len(s.stores) != len(b.stores) {
		return self, 0, self
	}
	for i := range s.stores {
		all += s.stores[i] - b.stores[i]
	}
	return round(s.stores[watched]-b.stores[watched], 2), round(all, 2), self
}

// peakSampler samples the watched store's RSS (in-process: this
// process's) every 250ms until stop, which returns the peak in MB.
type peakSampler struct {
	stopc chan struct{}
	done  chan struct{}
	peak  float64
}

func newPeakSampler(ctx context.Context, cfg *WatchConfig, inProcess bool) *peakSampler {
	p := &peakSampler{stopc: make(chan struct{}), done: make(chan struct{})}
	read := func() float64 {
		if inProcess || len(cfg.StatusAddrs) == 0 {
			return selfRSSBytes()
		}
		_, rss, _ := scrapeProcess(ctx, cfg.StatusAddrs[cfg.WatchStore])
		return rss
	}
	go func() {
		defer close(p.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			p.peak = max(p.peak, read())
			select {
			case <-p.stopc:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return p
}

func (p *peakSampler) stop() float64 {
	close(p.stopc)
	<-p.done
	return round(p.peak/(1<<20), 1)
}

// scrapeProcess reads a store's process_cpu_seconds_total and
// process_resident_memory_bytes from its /metrics.
func scrapeProcess(ctx context.Context, statusAddr string) (cpu, rss float64, err error) {
	err = fetchMetrics(ctx, statusAddr, 5*time.Second, func(r io.Reader) (err error) {
		cpu, rss, err = parseProcessMetrics(r)
		return err
	})
	return cpu, rss, err
}

func parseProcessMetrics(r io.Reader) (cpu, rss float64, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		switch name {
		case "process_cpu_seconds_total":
			cpu, err = strconv.ParseFloat(strings.TrimSpace(value), 64)
		case "process_resident_memory_bytes":
			rss, err = strconv.ParseFloat(strings.TrimSpace(value), 64)
		}
		if err != nil {
			return 0, 0, fmt.Errorf("parse %q: %w", sc.Text(), err)
		}
	}
	return cpu, rss, sc.Err()
}

// selfRSSBytes is this process's resident set (0 where /proc is absent).
func selfRSSBytes() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseFloat(f[0], 64)
				return kb * 1024
			}
		}
	}
	return 0
}

func (cfg *WatchConfig) table(res *WatchResult) string {
	var cells [][]string
	for i, w := range res.Runs {
		row := res.Rows[i]
		cpu := fmt.Sprintf("%.1f s (%.0f%%)", w.ServerCPUSec, 100*w.ServerCPUSec/max(w.WallSec, 0.001))
		cells = append(cells, []string{strconv.Itoa(w.Watchers), strconv.Itoa(w.Streams), strconv.Itoa(w.Writes),
			strconv.FormatInt(w.Expected, 10), strconv.FormatInt(w.Delivered, 10), strconv.FormatInt(w.Missing, 10), strconv.FormatInt(w.Duplicated, 10),
			FormatFloat(row.P50Ms, 2), FormatFloat(row.P99Ms, 2), FormatFloat(w.MaxMs, 2), FormatFloat(w.FirstP99Ms, 2), cpu, FormatFloat(w.ServerRSSMB, 0)})
	}
	return MarkdownTable([]string{"watchers", "streams", "writes", "events expected", "delivered", "missing", "duplicated",
		"p50 ms", "p99 ms", "max ms", "first event p99 ms", "server CPU", "server RSS MB"}, cells)
}

func (cfg *WatchConfig) write(res *WatchResult, started time.Time) error {
	if len(res.Runs) == 0 {
		return nil
	}
	table := cfg.table(res)
	err := WriteResults(res.Dir, Results{Scenario: "watch", Rows: res.Rows}, cfg.report(res, started, table))
	fmt.Fprintf(cfg.Out, "\n%s", table)
	printWritten(cfg.Out, res.Dir, nil)
	return err
}

func (cfg *WatchConfig) report(res *WatchResult, started time.Time, table string) string {
	var b strings.Builder
	writeReportHeader(&b, "watch: many etcd watchers on one store", started, cfg.Command)
	b.WriteString(loadNote(res.LoadBefore))
	if len(cfg.Endpoints) == 0 {
		b.WriteString("- Three stores in this process on loopback ports (no fsync, splits off). **Server CPU and RSS are this whole process's**: the stores and the benchmark's clients together.\n")
	} else {
		fmt.Fprintf(&b, "- A running cluster: %s. Server CPU and RSS are those of the store the watchers call (%s), from its `/metrics` (`process_cpu_seconds_total`, peak `process_resident_memory_bytes` sampled every 250 ms).\n",
			strings.Join(cfg.Endpoints, ", "), cfg.Endpoints[cfg.WatchStore])
	}
	fmt.Fprintf(&b, "- Watchers: all on one store, over clientv3: %d clients (gRPC connections), %d watch streams each (contexts with distinct metadata), watchers dealt to streams in turn. "+
		"A quarter of the keys (10 per group); half the watchers watch one key each (every key has one), a quarter a group's prefix (10 keys), a quarter one of 10 hot keys. "+
		"All start at the revision after a first write, so each should see exactly the run's writes to its keys.\n", cfg.Clients, cfg.Streams)
	fmt.Fprintf(&b, "- Writer: one clientv3 client on every endpoint, %g puts/s of uniformly chosen keys for %v, an open loop with at most %d outstanding. "+
		"Latency is from a put's acknowledgement to the event's arrival at the watcher (an event that arrives first counts 0). "+
		"*First event p99*: per write, the latency of the first of its events to arrive at any watcher, p99 over the writes: a delay all of a write's watchers share (the store's apply, its feed) rather than its fan-out.\n", cfg.Rate, cfg.Duration, cfg.InFlight)
	fmt.Fprintf(&b, "- After the last write the watchers get up to %v to receive everything; CPU is counted from the first write to the end of that wait.\n", cfg.Drain)
	b.WriteString("\n## Results\n\n")
	b.WriteString(table)
	var notes []string
	for _, w := range res.Runs {
		cpu := fmt.Sprintf("the benchmark process's CPU %.1f s", w.BenchCPUSec)
		if !w.InProcess {
			cpu = fmt.Sprintf("all stores' CPU %.1f s, the benchmark process's %.1f s", w.AllCPUSec, w.BenchCPUSec)
		}
		bySec := make([]string, len(w.MaxMsBySecond))
		for i, ms := range w.MaxMsBySecond {
			bySec[i] = FormatFloat(ms, 0)
		}
		notes = append(notes, fmt.Sprintf("%d watchers: created in %.1f s (%d refused and retried); the writer fell at most %.1f ms behind; %d writes failed; %d events unexpected (of failed writes), %d arrived before their ack; %s, in %.1f s. Slowest delivery of each second's writes, ms: %s.",
			w.Watchers, w.CreateWatchSec, w.CreateRetries, w.WriterLagMs, w.WritesFailed, w.Unexpected, w.BeforeAck, cpu, w.WallSec, strings.Join(bySec, " ")))
	}
	writeNotes(&b, notes)
	return b.String()
}
