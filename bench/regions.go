package bench

// regions: what many idle regions cost a store (issue 32: 10,000 regions
// per store). Three `hedgekv server` processes (each store's CPU, RSS and
// files are its own), N regions made by splitting, then, once they have
// gone idle, each store's CPU over a window, RSS, open files and
// goroutines; a store's restart (until it serves, until /readyz); and
// optionally writes to 100 of the regions beside the same writes to a
// cluster of 100 regions in all.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
)

// RegionsConfig configures RunRegions.
type RegionsConfig struct {
	// Binary is the hedgekv binary whose `server` command runs the stores.
	Binary string
	// Counts: one run per count of regions, each on a fresh cluster
	// (default 10,000).
	Counts []int
	// SplitConcurrency: splits in flight at once (default 64).
	SplitConcurrency int
	// IdleWait bounds the wait for the regions to hibernate after the
	// splits (default 2m); the idle window starts once every store reports
	// all but a few hibernating, or when it expires.
	IdleWait time.Duration
	// Window is how long the idle CPU is measured (default 30s).
	Window time.Duration
	// Load: after the idle figures, write to LoadRegions of the regions for
	// LoadDuration from LoadThreads threads, and the same to a cluster of
	// LoadRegions regions in all (run first, as the baseline).
	Load         bool
	LoadRegions  int           // default 100
	LoadDuration time.Duration // default 20s
	LoadThreads  int           // default 32
	// ExtraArgs go to every server.
	ExtraArgs []string
	// Dir holds the stores' data and logs ("" a temporary directory each
	// run, removed at the end).
	Dir      string
	OutDir   string // results root: writes OutDir/regions
	Command  string
	Progress io.Writer
	Logger   *slog.Logger
	Out      io.Writer
}

func (cfg *RegionsConfig) setDefaults() error {
	if cfg.Binary == "" {
		return errors.New("no hedgekv binary given")
	}
	if len(cfg.Counts) == 0 {
		cfg.Counts = []int{10_000}
	}
	for _, n := range cfg.Counts {
		if n < 1 {
			return fmt.Errorf("region count %d: want at least 1", n)
		}
	}
	setDefault(&cfg.SplitConcurrency, 64)
	setDefault(&cfg.IdleWait, 2*time.Minute)
	setDefault(&cfg.Window, 30*time.Second)
	setDefault(&cfg.LoadRegions, 100)
	setDefault(&cfg.LoadDuration, 20*time.Second)
	setDefault(&cfg.LoadThreads, 32)
	setOutputDefaults(&cfg.OutDir, &cfg.Logger, &cfg.Out)
	return nil
}

// RegionsStore is one store's idle figures.
type RegionsStore struct {
	Store uint64 `json:"store"`
	PID   int    `json:"pid"`
	// CPUPercent is the process's CPU (user and system) over the window,
	// in % of one core.
	CPUPercent  float64 `json:"cpu_percent"`
	RSS         int64   `json:"rss"`
	RSSAnon     int64   `json:"rss_anon"`
	OpenFiles   int     `json:"open_files"`
	Goroutines  int     `json:"goroutines"`
	Regions     int     `json:"regions"`
	Hibernating int     `json:"hibernating"`
	Err         string  `json:"error,omitempty"`
}

// RegionsRun is one count's run.
type RegionsRun struct {
	Count int `json:"count"`
	// Baseline: the run made only as the load's baseline.
	Baseline bool `json:"baseline,omitempty"`
	// ClusterStartS: three fresh processes until they agree on region 1.
	ClusterStartS float64 `json:"cluster_start_s"`
	// CreateS: the splits, from the first until the last answered.
	CreateS     float64 `json:"create_s"`
	SplitErrors int     `json:"split_errors"`
	// IdleAfterS: the last split until the stores reported the regions
	// hibernating (or IdleWait expired: Idle false).
	IdleAfterS float64        `json:"idle_after_s"`
	Idle       bool           `json:"idle"`
	WindowS    float64        `json:"window_s"`
	LoadAvg    string         `json:"loadavg"` // /proc/loadavg at the window's end
	Stores     []RegionsStore `json:"stores"`
	// Restart of store 1 with every region: SIGTERM until exited, start
	// until it serves (/healthz: the store is open), until /readyz.
	StopS    float64 `json:"stop_s"`
	StartupS float64 `json:"startup_s"`
	ReadyS   float64 `json:"ready_s"`
	// AfterRestart: store 1's figures once ready again (no window: CPU 0).
	AfterRestart *RegionsStore `json:"after_restart,omitempty"`
	// IdleAgainS (with Load): from /readyz after the restart until the
	// regions hibernated again (IdleAgain false: IdleWait expired first).
	IdleAgainS float64 `json:"idle_again_s,omitempty"`
	IdleAgain  bool    `json:"idle_again,omitempty"`
	// Load: writes to LoadRegions regions.
	LoadOps    int64   `json:"load_ops,omitempty"`
	LoadFailed int64   `json:"load_failed,omitempty"`
	LoadQPS    float64 `json:"load_qps,omitempty"`
	LoadP99Ms  float64 `json:"load_p99_ms,omitempty"`
	// LoadRatio is LoadQPS over the baseline's.
	LoadRatio float64  `json:"load_ratio,omitempty"`
	Errors    []string `json:"errors,omitempty"`
}

// RegionsResult is what RunRegions measured.
type RegionsResult struct {
	Runs    []RegionsRun `json:"runs"`
	Dir     string       `json:"-"`
	PIDs    []int        `json:"-"`
	started time.Time
}

// RunRegions runs the regions scenario and writes OutDir/regions.
func RunRegions(ctx context.Context, cfg RegionsConfig) (*RegionsResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("regions: %w", err)
	}
	res := &RegionsResult{Dir: filepath.Join(cfg.OutDir, "regions"), started: time.Now()}
	prog := newProgress(cfg.Progress, "regions", 3)
	defer prog.Done()
	var baseQPS float64
	counts := cfg.Counts
	if cfg.Load {
		counts = append([]int{cfg.LoadRegions}, counts...)
	}
	var err error
	for i, n := range counts {
		if ctx.Err() != nil {
			err = errors.Join(err, fmt.Errorf("interrupted: %w", context.Cause(ctx)))
			break
		}
		run, rerr := runRegionsOnce(ctx, cfg, n, prog, res)
		run.Baseline = cfg.Load && i == 0
		if rerr != nil {
			run.Errors = append(run.Errors, rerr.Error())
			err = errors.Join(err, fmt.Errorf("%d regions: %w", n, rerr))
		}
		if run.Baseline {
			baseQPS = run.LoadQPS
		}
		if cfg.Load && baseQPS > 0 {
			run.LoadRatio = round(run.LoadQPS/baseQPS, 3)
		}
		res.Runs = append(res.Runs, run)
	}
	if werr := writeRegions(cfg, res); werr != nil {
		err = errors.Join(err, werr)
	}
	if err != nil {
		return res, fmt.Errorf("regions: %w", err)
	}
	return res, nil
}

// regionKey is the i-th split point: region i (from 1) starts there.
func regionKey(i int) []byte { return fmt.Appendf(nil, "r%08d", i) }

func runRegionsOnce(ctx context.Context, cfg RegionsConfig, n int, prog *Progress, res *RegionsResult) (run RegionsRun, err error) {
	run.Count = n
	dir := cfg.Dir
	if dir != "" {
		dir = filepath.Join(dir, strconv.Itoa(n))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return run, err
		}
	}
	prog.Printf("regions: starting three `%s server` processes for %d regions", cfg.Binary, n)
	t0 := time.Now()
	c, err := cluster.StartProcesses(ctx, cluster.ProcessesConfig{
		Binary: cfg.Binary, Dir: dir, ExtraArgs: cfg.ExtraArgs, ReadyTimeout: time.Minute, Logger: cfg.Logger,
	})
	if err != nil {
		return run, fmt.Errorf("start the cluster: %w", err)
	}
	defer func() {
		c.Stop()
		res.PIDs = append(res.PIDs, c.PIDs()...)
	}()
	run.ClusterStartS = round(time.Since(t0).Seconds(), 3)
	cli, err := client.New(ctx, client.Config{Endpoints: c.Endpoints, RequestTimeout: 30 * time.Second, Logger: quietClientLogger(cfg.Logger)})
	if err != nil {
		return run, fmt.Errorf("client: %w", err)
	}
	defer cli.Close()

	t1 := time.Now()
	run.SplitErrors, err = splitInto(ctx, cli, n, cfg.SplitConcurrency, prog)
	run.CreateS = round(time.Since(t1).Seconds(), 3)
	if err != nil {
		return run, err
	}
	prog.Printf("regions: %d regions in %.1fs; waiting for them to hibernate", n, run.CreateS)

	t2 := time.Now()
	run.Idle = waitHibernating(ctx, c, n, cfg.IdleWait)
	run.IdleAfterS = round(time.Since(t2).Seconds(), 3)
	prog.Printf("regions: idle after %.1fs (all hibernating: %t); measuring %v", run.IdleAfterS, run.Idle, cfg.Window)
	run.Stores, run.WindowS = measureIdle(ctx, c, cfg.Window)
	run.LoadAvg = loadAvg()

	if err := restartStore(ctx, c, &run); err != nil {
		run.Errors = append(run.Errors, err.Error())
	} else {
		prog.Printf("regions: store 1 restarted: serving after %.2fs, ready after %.2fs", run.StartupS, run.ReadyS)
	}
	if cfg.Load {
		// The load is measured against idle regions, as before the
		// restart: a restarted store's regions are awake (ticking,
		// electing) until they hibernate again, which at 10,000 regions
		// would be most of what the writes were measured against.
		t3 := time.Now()
		run.IdleAgain = waitHibernating(ctx, c, n, cfg.IdleWait)
		run.IdleAgainS = round(time.Since(t3).Seconds(), 3)
		prog.Printf("regions: idle again %.1fs after the restart (all hibernating: %t)", run.IdleAgainS, run.IdleAgain)
		prog.Printf("regions: writing to %d of %d regions for %v", min(cfg.LoadRegions, n), n, cfg.LoadDuration)
		loadRegions(ctx, cli, n, cfg, &run)
	}
	return run, nil
}

// splitInto splits region 1 into n regions at regionKey(1..n-1), bisecting
// level by level: the splits in flight at once are in distinct regions, so
// none waits for another's epoch. A failed split is retried a few times.
func splitInto(ctx context.Context, cli *client.Client, n, conc int, prog *Progress) (failed int, err error) {
	type span struct{ lo, hi int } // split keys lo..hi-1 still to make
	level := []span{{1, n}}
	done := atomic.Int64{}
	prog.Step(fmt.Sprintf("split into %d regions", n), int64(n-1), 0)
	for len(level) > 0 {
		var next []span
		var mu sync.Mutex
		var firstErr error
		sem := make(chan struct{}, conc)
		var wg sync.WaitGroup
		for _, s := range level {
			if s.lo >= s.hi {
				continue
			}
			mid := (s.lo + s.hi) / 2
			next = append(next, span{s.lo, mid}, span{mid + 1, s.hi})
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				var err error
				for attempt := range 5 {
					_, _, err = cli.Split(ctx, regionKey(mid))
					if err != nil && strings.Contains(err.Error(), "already a region boundary") {
						// An earlier attempt split it after all (its answer
						// timed out, or was lost).
						err = nil
					}
					if err == nil || ctx.Err() != nil {
						break
					}
					// The new half may still be electing its leader.
					sleepCtx(ctx, time.Duration(attempt+1)*200*time.Millisecond)
				}
				if err != nil {
					mu.Lock()
					failed++
					if firstErr == nil {
						firstErr = fmt.Errorf("split at %s: %w", regionKey(mid), err)
					}
					mu.Unlock()
				}
				prog.Update(done.Add(1), 0)
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return failed, ctx.Err()
		}
		if firstErr != nil && failed > n/100 {
			return failed, firstErr
		}
		level = next
	}
	return failed, nil
}

// storeGauges scrapes a store's /metrics for the figures this scenario
// reports.
func storeGauges(ctx context.Context, addr string) (regions, hibernating, goroutines int, err error) {
	const (
		regionsMetric     = "hedgekv_store_regions"
		hibernatingMetric = "hedgekv_store_hibernating_regions"
		goroutinesMetric  = "go_goroutines"
	)
	m, err := scrapeMetrics(ctx, addr, 10*time.Second, regionsMetric, hibernatingMetric, goroutinesMetric)
	if err != nil {
		return 0, 0, 0, err
	}
	return int(m[regionsMetric]), int(m[hibernatingMetric]), int(m[goroutinesMetric]), nil
}

// waitHibernating waits until every store hosts n regions, all but 1% of
// them hibernating, or wait has passed (false).
func waitHibernating(ctx context.Context, c *cluster.Processes, n int, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for {
		all := true
		for _, addr := range c.StatusAddrs {
			r, h, _, err := storeGauges(ctx, addr)
			if err != nil || r < n || h < n-n/100 {
				all = false
				break
			}
		}
		if all {
			return true
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, time.Second) {
			return false
		}
	}
}

// procCPUTicks is a process's user plus system time in clock ticks
// (/proc/PID/stat fields 14 and 15).
func procCPUTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields count from its end.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return u + st, nil
}

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

func openFiles(pid int) (int, error) {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(es), err
}

// measureIdle takes every store's CPU over window, then its memory, files
// and goroutines.
func measureIdle(ctx context.Context, c *cluster.Processes, window time.Duration) ([]RegionsStore, float64) {
	ids := c.StoreIDs()
	out := make([]RegionsStore, len(ids))
	before := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = RegionsStore{Store: id, PID: c.PID(id)}
		var err error
		if before[i], err = procCPUTicks(out[i].PID); err != nil {
			out[i].Err = err.Error()
		}
	}
	t0 := time.Now()
	sleepCtx(ctx, window)
	secs := time.Since(t0).Seconds()
	for i := range ids {
		s := &out[i]
		if s.Err == "" {
			after, err := procCPUTicks(s.PID)
			if err != nil {
				s.Err = err.Error()
			} else {
				s.CPUPercent = round(100*float64(after-before[i])/clockTicks/secs, 2)
			}
		}
		fillStore(ctx, c.StatusAddrs[i], s)
	}
	return out, round(secs, 3)
}

// fillStore adds memory, files and the store's gauges to s.
func fillStore(ctx context.Context, statusAddr string, s *RegionsStore) {
	m := readStoreMem(s.PID)
	s.RSS, s.RSSAnon = m.RSS, m.Anon
	var errs []error
	if m.Err != "" {
		errs = append(errs, errors.New(m.Err))
	}
	var err error
	if s.OpenFiles, err = openFiles(s.PID); err != nil {
		errs = append(errs, err)
	}
	if s.Regions, s.Hibernating, s.Goroutines, err = storeGauges(ctx, statusAddr); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		s.Err = strings.TrimSpace(s.Err + " " + err.Error())
	}
}

// waitHealthz polls http://addr/healthz until it answers 200: the store
// is open and serving.
func waitHealthz(ctx context.Context, addr string) error {
	hc := &http.Client{Timeout: time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return fmt.Errorf("%s/healthz never answered 200: %w", addr, ctx.Err())
		}
	}
}

// restartStore stops store 1 gracefully and starts it again.
func restartStore(ctx context.Context, c *cluster.Processes, run *RegionsRun) error {
	id := c.StoreIDs()[0]
	t0 := time.Now()
	if err := c.StopStore(id, time.Minute); err != nil {
		return fmt.Errorf("stop store %d: %w", id, err)
	}
	run.StopS = round(time.Since(t0).Seconds(), 3)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	t1 := time.Now()
	if err := c.Start(id); err != nil {
		return fmt.Errorf("start store %d: %w", id, err)
	}
	addr := c.StatusAddr(id)
	if err := waitHealthz(rctx, addr); err != nil {
		return fmt.Errorf("restart store %d: %w", id, err)
	}
	run.StartupS = round(time.Since(t1).Seconds(), 3)
	if err := waitReadyz(rctx, addr); err != nil {
		return fmt.Errorf("restart store %d: %w", id, err)
	}
	run.ReadyS = round(time.Since(t1).Seconds(), 3)
	s := RegionsStore{Store: id, PID: c.PID(id)}
	fillStore(ctx, addr, &s)
	run.AfterRestart = &s
	return nil
}

// loadRegions writes random keys of LoadRegions regions, spread over the
// n, from LoadThreads threads for LoadDuration.
func loadRegions(ctx context.Context, cli *client.Client, n int, cfg RegionsConfig, run *RegionsRun) {
	k := min(cfg.LoadRegions, n)
	starts := make([]int, k) // the first split key's index of each region written
	for j := range k {
		starts[j] = j * n / k
	}
	hist := newHist()
	var mu sync.Mutex
	var ok, failed atomic.Int64
	lctx, cancel := context.WithTimeout(ctx, cfg.LoadDuration)
	defer cancel()
	value := make([]byte, 100)
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range cfg.LoadThreads {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 32))
			for lctx.Err() == nil {
				// Region 0 starts at "", the others at their split key.
				key := fmt.Appendf(regionKey(starts[rng.IntN(k)]), "/%08d", rng.IntN(1e8))
				begin := time.Now()
				err := cli.Put(lctx, key, value)
				lat := time.Since(begin)
				if err != nil {
					if lctx.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				ok.Add(1)
				mu.Lock()
				recordLatency(hist, lat)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	secs := time.Since(t0).Seconds()
	run.LoadOps, run.LoadFailed = ok.Load(), failed.Load()
	run.LoadQPS = round(float64(run.LoadOps)/secs, 1)
	run.LoadP99Ms = quantileMs(hist, 99)
}

// ---- the report -----------------------------------------------------------

func writeRegions(cfg RegionsConfig, res *RegionsResult) error {
	var rows []Row
	for _, r := range res.Runs {
		if r.LoadOps > 0 {
			rows = append(rows, Row{Variant: "write-100-regions", Param: strconv.Itoa(r.Count), Ops: r.LoadOps + r.LoadFailed,
				QPS: r.LoadQPS, P99Ms: r.LoadP99Ms, Failed: r.LoadFailed})
		}
	}
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	details, err := json.MarshalIndent(res.Runs, "", "  ")
	if err == nil {
		err = writeFileAtomic(filepath.Join(res.Dir, "details.json"), append(details, '\n'))
	}
	table := regionsTable(res)
	var b strings.Builder
	writeReportHeader(&b, "regions: many idle regions per store", res.started, cfg.Command)
	fmt.Fprintf(&b, "Three stores, N regions made by splitting, each replicated on every store; "+
		"idle CPU over %v once the regions hibernate.\n\n", cfg.Window)
	b.WriteString(table)
	if werr := WriteResults(res.Dir, Results{Scenario: "regions", Rows: rows}, b.String()); werr != nil {
		return errors.Join(err, werr)
	}
	fmt.Fprint(cfg.Out, "\nregions\n"+table)
	printWritten(cfg.Out, res.Dir, nil)
	return err
}

func regionsTable(res *RegionsResult) string {
	header := []string{"regions", "store", "CPU % of a core", "RSS MiB", "anon MiB", "open files", "goroutines", "hibernating"}
	var rows [][]string
	for _, r := range res.Runs {
		for _, s := range r.Stores {
			rows = append(rows, []string{strconv.Itoa(r.Count), strconv.FormatUint(s.Store, 10), FormatFloat(s.CPUPercent, 2),
				FormatFloat(float64(s.RSS)/(1<<20), 1), FormatFloat(float64(s.RSSAnon)/(1<<20), 1),
				strconv.Itoa(s.OpenFiles), strconv.Itoa(s.Goroutines), strconv.Itoa(s.Hibernating)})
		}
	}
	var b strings.Builder
	b.WriteString(MarkdownTable(header, rows))
	b.WriteString("\n")
	header = []string{"regions", "cluster start s", "splits s", "split errors", "idle after s", "restart: serving s", "restart: ready s", "idle again s", "load avg", "writes/s", "ratio"}
	rows = nil
	for _, r := range res.Runs {
		qps, ratio, again := "-", "-", "-"
		if r.LoadOps > 0 {
			qps = FormatFloat(r.LoadQPS, 0)
			ratio = FormatFloat(r.LoadRatio, 2)
			again = FormatFloat(r.IdleAgainS, 1)
			if !r.IdleAgain {
				again = "> " + again
			}
		}
		rows = append(rows, []string{strconv.Itoa(r.Count), FormatFloat(r.ClusterStartS, 2), FormatFloat(r.CreateS, 1),
			strconv.Itoa(r.SplitErrors), FormatFloat(r.IdleAfterS, 1), FormatFloat(r.StartupS, 2), FormatFloat(r.ReadyS, 2),
			again, r.LoadAvg, qps, ratio})
	}
	b.WriteString(MarkdownTable(header, rows))
	for _, r := range res.Runs {
		for _, e := range r.Errors {
			fmt.Fprintf(&b, "ERROR (%d regions): %s\n", r.Count, e)
		}
	}
	return b.String()
}
