package bench

// The scale scenario's report: results.json, report.md and its plots.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot/plotter"
)

func (st *scaleState) write() error {
	res, cfg := st.res, st.cfg
	if st.own != nil {
		_ = st.own.Close()
	}
	if res.Load != nil {
		res.Rows = append(res.Rows, res.Load.Row)
	}
	if res.Move != nil {
		res.Rows = append(res.Rows, res.Move.Row)
	}
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	if !cfg.NoPlots {
		var ps plotSet
		ps.add(st.throughputPlot())
		ps.add(st.latencyPlot())
		res.Plots = ps.files
		for _, e := range ps.errs {
			res.Errors = append(res.Errors, "plot: "+e.Error())
		}
	}
	details, err := json.MarshalIndent(res, "", "  ")
	if err == nil {
		err = writeFileAtomic(filepath.Join(res.Dir, "details.json"), append(details, '\n'))
	}
	report := st.report()
	if werr := WriteResults(res.Dir, Results{Scenario: "scale", Rows: res.Rows}, report); werr != nil {
		return errors.Join(err, werr)
	}
	fmt.Fprint(cfg.Out, st.summary())
	printWritten(cfg.Out, res.Dir, res.Plots)
	return err
}

func mb(b int64) string { return FormatFloat(float64(b)/1e6, 1) + " MB" }

func (st *scaleState) summary() string {
	res := st.res
	var b strings.Builder
	b.WriteString("\nscale\n")
	b.WriteString(RowsTable(res.Rows))
	fmt.Fprintf(&b, "regions: %d before, %d after the load, %d at the end\n", res.RegionsBefore, res.RegionsAfterLoad, res.RegionsEnd)
	mv := res.MoveInfo
	fmt.Fprintf(&b, "move: store %d ready %.1fs after its join; store %d's replicas moved %.1fs after RemoveStore, reported removed: %t (%.1fs in all, %.2f MB/s)\n",
		mv.Joined, mv.JoinReadyS, mv.Removed, mv.MovedS, mv.Done, mv.TotalS, mv.MBPerS)
	fmt.Fprintf(&b, "restart: store %d ready %.2fs after its start\n", res.Restart.Store, res.Restart.ReadyS)
	if res.Compare != nil && res.Compare.Ratios != nil {
		fmt.Fprintf(&b, "beside a small data set: %s\n", res.Compare.line())
	}
	if d := res.Delete; d != nil {
		fmt.Fprintf(&b, "delete everything: %d deleted (%d failed) in %.1fs; regions %d -> %d %.1fs after the last delete (target %d, settled: %t); %d keys left\n",
			d.Deleted, d.Failed, d.Seconds, d.RegionsBefore, d.RegionsEnd, d.MergeSeconds, d.Target, d.Settled, d.KeysLeft)
	}
	for _, e := range res.Errors {
		fmt.Fprintf(&b, "ERROR: %s\n", e)
	}
	return b.String()
}

func (st *scaleState) report() string {
	res, cfg := st.res, st.cfg
	var b strings.Builder
	writeReportHeader(&b, "scale: a real data set", res.started, cfg.Command)
	fc, fl := cfg.fields()
	fmt.Fprintf(&b, "Three `hedgekv server` processes (%s), loaded with %d records of %d bytes (go-ycsb, %d fields of %d bytes, hashed keys) by %d threads through the hedgekv go-ycsb binding; intervals of %v; an operation over %v is a stall. ",
		filepath.Base(cfg.Binary), cfg.Records, cfg.ValueSize, fc, fl, cfg.Threads, cfg.Interval, cfg.StallThreshold)
	fmt.Fprintf(&b, "Servers: split at %s, split check every %s, balance every %s. Logical data: %s (keys and encoded values of the inserts that succeeded).\n",
		orDefault(cfg.SplitMaxBytes > 0, mb(int64(cfg.SplitMaxBytes)), "64 MiB (default)"),
		orDefault(cfg.SplitCheckInterval != 0, cfg.SplitCheckInterval.String(), "10s (default)"),
		orDefault(cfg.BalanceInterval != 0, cfg.BalanceInterval.String(), "5s (default)"), mb(res.LogicalBytes))
	if cfg.Quick {
		b.WriteString("\n**--quick run**: a small data set with small regions, to check the scenario end to end; its figures say little about a store at scale.\n")
	}

	b.WriteString("\n## Summary\n\n")
	b.WriteString(RowsTable(res.Rows))
	b.WriteString("\n`failed` counts every operation that returned an error (go-ycsb's `*_ERROR` lines); latencies are of the successful ones.\n")
	if len(res.Errors) > 0 {
		b.WriteString("\n## Errors\n\n")
		for _, e := range res.Errors {
			fmt.Fprintf(&b, "- %s\n", inlineCode(e))
		}
	}

	b.WriteString("\n## Load\n\n")
	st.writePhase(&b, res.Load)
	fmt.Fprintf(&b, "\n### Splits\n\nRegions: **%d** before the load, **%d** right after it (%d splits), %d at the end of the scenario.\n",
		res.RegionsBefore, res.RegionsAfterLoad, res.RegionsAfterLoad-res.RegionsBefore, res.RegionsEnd)
	writeSplits(&b, res.Load)

	if res.Compare != nil {
		res.Compare.write(&b, cfg.Threads)
	}

	st.writeMove(&b)

	b.WriteString("\n## Restart with all the data\n\n")
	rs := res.Restart
	fmt.Fprintf(&b, "Store %d (a replica of every region) stopped with SIGTERM (%.2f s to exit), then started again with the same flags and data: **%.2f s** until its `/readyz` answered 200; %.2f s until every store agreed on every region's leader and had applied its commit index.\n",
		rs.Store, rs.StopS, rs.ReadyS, rs.SettledS)
	if rs.Err != "" {
		fmt.Fprintf(&b, "\nError: %s\n", inlineCode(rs.Err))
	}
	writeCheck(&b, res.Check)
	writeDelete(&b, res.Delete, cfg.MergeWait, cfg.mergeMaxBytes())

	st.writeMemAndDisk(&b)

	writePlots(&b, res.Plots)
	return b.String()
}

// writeMove writes the join and remove under load.
func (st *scaleState) writeMove(b *strings.Builder) {
	res, cfg := st.res, st.cfg
	b.WriteString("\n## Join and remove under load\n\n")
	mv := res.MoveInfo
	fmt.Fprintf(b, "Store %d joined (`server --join`); once its `/readyz` answered, store %d was removed (`Admin.RemoveStore`, what `ctl remove-store` sends) and the stores' balancers moved its replicas; done when no region had a replica on it and the stores reported it removed (`ctl remove-store --wait`). Meanwhile %d threads ran YCSB workload A (half reads, half updates) at %g ops/s.\n\n",
		mv.Joined, mv.Removed, cfg.MoveThreads, cfg.MoveRate)
	rows := [][]string{
		{"join until ready", fmt.Sprintf("%.1f s", mv.JoinReadyS)},
		{"remove until no region lists a replica on the store", fmt.Sprintf("%.1f s", mv.MovedS)},
		{"remove until the stores report it removed", orDefault(mv.Done, fmt.Sprintf("%.1f s", mv.RemoveS), "**never** (see Errors)")},
		{"join until removed (until moved if never reported removed)", fmt.Sprintf("%.1f s", mv.TotalS)},
		{"reported removed", strconv.FormatBool(mv.Done)},
		{"logical bytes on the new store", mb(mv.MovedLogicalBytes)},
		{"its store.db", mb(mv.MovedFileBytes)},
		{"MB/s (logical, join until removed)", FormatFloat(mv.MBPerS, 2)},
	}
	if res.Move != nil {
		rows = append(rows,
			[]string{"foreground p99 during the move", fmt.Sprintf("%.2f ms", res.Move.Row.P99Ms)},
			[]string{"foreground failed", strconv.FormatInt(res.Move.Row.Failed, 10)})
	}
	if mv.Err != "" {
		rows = append(rows, []string{"error", inlineCode(mv.Err)})
	}
	b.WriteString(MarkdownTable([]string{"what", "measured"}, rows))
	if len(mv.LeftTimeline) > 0 {
		b.WriteString("\nReplicas left on the removed store: ")
		var parts []string
		for _, p := range mv.LeftTimeline {
			parts = append(parts, fmt.Sprintf("%d at %.1fs", p.Left, p.T))
		}
		b.WriteString(strings.Join(parts, ", ") + ".\n")
	}
	b.WriteString("\n### The foreground load during the move\n\n")
	st.writePhase(b, res.Move)
}

// writeMemAndDisk writes the stores' memory, their files on disk and the
// raft log's share of the restarted store's file.
func (st *scaleState) writeMemAndDisk(b *strings.Builder) {
	res, rs := st.res, st.res.Restart
	b.WriteString("\n## Memory\n\n")
	var mrows [][]string
	for _, m := range res.Mem {
		if m.Err != "" {
			mrows = append(mrows, []string{strconv.FormatUint(m.Store, 10), m.When, "n/a", "", "", inlineCode(m.Err)})
			continue
		}
		mrows = append(mrows, []string{strconv.FormatUint(m.Store, 10), m.When, mb(m.RSS), mb(m.Anon), mb(m.File), mb(m.Shmem)})
	}
	b.WriteString(MarkdownTable([]string{"store", "when", "RSS", "anonymous (RssAnon)", "file-backed (RssFile)", "shmem"}, mrows))
	b.WriteString("\nFrom `/proc/PID/status`. Anonymous is the Go heap and stacks; file-backed is mostly bbolt's mmap of `store.db` (pages the kernel may drop and read again) and the binary.\n")

	b.WriteString("\n## Disk\n\n")
	var drows [][]string
	for _, d := range res.Disk {
		drows = append(drows, []string{strconv.FormatUint(d.Store, 10), d.When, mb(d.Bytes), FormatFloat(d.PerLogical, 2)})
	}
	b.WriteString(MarkdownTable([]string{"store", "when", "store.db", "bytes per logical byte"}, drows))
	fmt.Fprintf(b, "\nLogical bytes: %s loaded (keys and encoded values); the leaders' own counts at the end: %s over %d of %d regions. Every store holds a replica of every region, so a store's file over the logical bytes is its space amplification (bbolt's free pages, the raft log, the dedup table, page fill).\n",
		mb(res.LogicalBytes), mb(res.ApproxBytesEnd), res.SizeKnownEnd, res.RegionsEnd)

	b.WriteString("\n### Raft log after compaction\n\n")
	b.WriteString("The status endpoint (`/status`, `/metrics`) does not expose the raft log's size. It was read from the stopped store's `store.db` (bbolt, read-only) before the restart, bucket by bucket:\n\n")
	var brows [][]string
	for _, bk := range rs.Buckets {
		brows = append(brows, []string{bk.Name, strconv.Itoa(bk.Keys), mb(bk.Bytes)})
	}
	if len(brows) == 0 {
		b.WriteString("(not read: see Errors)\n")
	} else {
		b.WriteString(MarkdownTable([]string{"bucket", "keys", "bytes in use"}, brows))
	}
}

func orDefault(set bool, v, def string) string {
	if set {
		return v
	}
	return def
}

func (st *scaleState) writePhase(b *strings.Builder, p *ScalePhase) {
	if p == nil {
		b.WriteString("(did not run)\n")
		return
	}
	fmt.Fprintf(b, "%.1f s; %d operations, %d failed, %.1f ops/s; p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms.\n\n",
		p.Elapsed, p.Row.Ops, p.Row.Failed, p.Row.QPS, p.Row.P50Ms, p.Row.P99Ms, p.Row.P999Ms)
	b.WriteString(OpsTable(p.Ops))
	if len(p.YCSBErrors) > 0 {
		var parts []string
		for _, k := range sortedKeys(p.YCSBErrors) {
			parts = append(parts, fmt.Sprintf("%s_ERROR %d", k, p.YCSBErrors[k]))
		}
		fmt.Fprintf(b, "\ngo-ycsb's own error counts: %s.\n", strings.Join(parts, ", "))
	}
	for _, k := range sortedKeys(p.FirstErrors) {
		fmt.Fprintf(b, "\nFirst %s error: %s\n", k, inlineCode(p.FirstErrors[k]))
	}
	fmt.Fprintf(b, "\n#### Per interval (%v)\n\n", st.cfg.Interval)
	var rows [][]string
	for _, iv := range p.Intervals {
		reg := ""
		if iv.Regions > 0 {
			reg = strconv.Itoa(iv.Regions)
		}
		rows = append(rows, []string{FormatFloat(iv.T, 0), strconv.FormatInt(iv.OK, 10), strconv.FormatInt(iv.Failed, 10), FormatFloat(iv.QPS, 0),
			FormatFloat(iv.P50Ms, 2), FormatFloat(iv.P99Ms, 2), FormatFloat(iv.P999Ms, 2), FormatFloat(iv.MaxMs, 1), strconv.FormatInt(iv.Stalls, 10), reg})
	}
	b.WriteString(MarkdownTable([]string{"t s", "ok", "failed", "ops/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "stalls", "regions"}, rows))
	fmt.Fprintf(b, "\n#### Stalls (over %v)\n\n%d operations took longer than %v", st.cfg.StallThreshold, p.Stalls, st.cfg.StallThreshold)
	if len(p.Worst) == 0 {
		b.WriteString(".\n")
		return
	}
	fmt.Fprintf(b, "; the %d slowest:\n\n", len(p.Worst))
	var srows [][]string
	for _, s := range p.Worst {
		srows = append(srows, []string{s.At.UTC().Format("15:04:05.000"), FormatFloat(s.T, 1), s.Op, s.Key, FormatFloat(s.Ms, 1), s.Err})
	}
	b.WriteString(MarkdownTable([]string{"at (UTC)", "t s", "op", "key", "ms", "error"}, srows))
}

// ---- plots ------------------------------------------------------------------

var scaleSeries = []string{"load", "move", "load p99", "load p99.9", "load max", "move p99", "move p99.9", "move max"}

func (st *scaleState) throughputPlot() (string, error) {
	p := newPlot("scale: throughput per interval", "seconds since start", "ops/s")
	var ss []series
	for _, ph := range []*ScalePhase{st.res.Load, st.res.Move} {
		if ph == nil || len(ph.Intervals) == 0 {
			continue
		}
		var xys plotter.XYs
		for _, iv := range ph.Intervals {
			xys = append(xys, plotter.XY{X: iv.T, Y: iv.QPS})
		}
		ss = append(ss, series{name: ph.Name, xys: xys})
	}
	if len(ss) == 0 {
		return "", nil
	}
	if err := addSeries(p, scaleSeries, ss, true); err != nil {
		return "", err
	}
	return savePlot(p, st.res.Dir, "throughput.png")
}

func (st *scaleState) latencyPlot() (string, error) {
	p := newPlot("scale: latency per interval (successful operations)", "seconds since start", "ms (log)")
	var ss []series
	lo, hi := 1e9, 0.0
	for _, ph := range []*ScalePhase{st.res.Load, st.res.Move} {
		if ph == nil {
			continue
		}
		var p99, p999, pmax plotter.XYs
		for _, iv := range ph.Intervals {
			if iv.OK == 0 {
				continue
			}
			p99 = append(p99, plotter.XY{X: iv.T, Y: max(iv.P99Ms, 0.001)})
			p999 = append(p999, plotter.XY{X: iv.T, Y: max(iv.P999Ms, 0.001)})
			pmax = append(pmax, plotter.XY{X: iv.T, Y: max(iv.MaxMs, 0.001)})
			lo, hi = min(lo, iv.P99Ms), max(hi, iv.MaxMs)
		}
		if len(p99) > 0 {
			ss = append(ss, series{name: ph.Name + " p99", xys: p99}, series{name: ph.Name + " p99.9", xys: p999}, series{name: ph.Name + " max", xys: pmax})
		}
	}
	if len(ss) == 0 {
		return "", nil
	}
	logAxis(&p.Y, lo, hi)
	if err := addSeries(p, scaleSeries, ss, true); err != nil {
		return "", err
	}
	return savePlot(p, st.res.Dir, "latency.png")
}
