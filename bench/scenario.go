package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// What the scenarios (follower-read-dc, hot-region, peer-etcd, hedge-tail,
// overloaded-replica, node-kill, follower-lease) share around their own
// measurements: how their configs are defaulted, which variants run, the
// progress display, the timed YCSB run after a warm-up, and the frame of
// report.md and of what they print when they end.

// ---- defaults ---------------------------------------------------------------

// setDefault sets *p to def unless it is positive: in the scenarios'
// configs zero, and a negative count or duration, mean the default.
func setDefault[T int | int64 | float64 | time.Duration](p *T, def T) {
	if *p <= 0 {
		*p = def
	}
}

// setDefaultIfZero sets *p to def if it is zero; a negative value is kept
// (a negative warm-up means none, other values are checked by the caller).
func setDefaultIfZero[T int | int64 | uint64 | float64 | time.Duration](p *T, def T) {
	if *p == 0 {
		*p = def
	}
}

// quickOr is full, or quick for a --quick run.
func quickOr[T any](isQuick bool, full, quick T) T {
	if isQuick {
		return quick
	}
	return full
}

// setOutputDefaults fills in where a scenario's output goes: results under
// "results", log lines to slog's default logger, the final tables nowhere.
func setOutputDefaults(outDir *string, logger **slog.Logger, out *io.Writer) {
	if *outDir == "" {
		*outDir = "results"
	}
	if *logger == nil {
		*logger = slog.Default()
	}
	*out = discardIfNil(*out)
}

// discardIfNil returns w, or io.Discard for nil.
func discardIfNil(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// ---- variants ---------------------------------------------------------------

// chooseVariants returns the variants a scenario runs: those named, each
// checked against all, or every one of all when none is named.
func chooseVariants[V any](named []string, all []V, name func(V) string) ([]string, error) {
	if len(named) == 0 {
		return variantNames(all, name), nil
	}
	for _, n := range named {
		if !slices.ContainsFunc(all, func(v V) bool { return name(v) == n }) {
			return nil, fmt.Errorf("unknown variant %q", n)
		}
	}
	return named, nil
}

// pickVariants returns the variants of all whose names are in named, in
// all's order (the run order).
func pickVariants[V any](all []V, named []string, name func(V) string) []V {
	var out []V
	for _, v := range all {
		if slices.Contains(named, name(v)) {
			out = append(out, v)
		}
	}
	return out
}

// variantNames names every variant of all, in order: the plots give each
// its colour by its place here, so a variant keeps its colour in every plot.
func variantNames[V any](all []V, name func(V) string) []string {
	out := make([]string, len(all))
	for i, v := range all {
		out[i] = name(v)
	}
	return out
}

// closeDBs closes every DB of dbs that was opened (the others are nil):
// a scenario opens one per variant before it measures anything.
func closeDBs[DB interface {
	comparable
	Close() error
}](dbs []DB) {
	var none DB
	for _, db := range dbs {
		if db != none {
			_ = db.Close()
		}
	}
}

// ---- progress ---------------------------------------------------------------

// newProgress is the progress display of a scenario whose Progress writer
// is w: none (a nil *Progress, which ignores every call) if w is nil.
func newProgress(w io.Writer, title string, steps int) *Progress {
	if w == nil {
		return nil
	}
	return NewProgress(w, title, steps, 0)
}

// warmUp runs an unmeasured warm-up, if d is positive, labelled on p as
// label's warm-up until it ends.
func (p *Progress) warmUp(label string, d time.Duration, run func()) {
	if d <= 0 {
		return
	}
	p.SetLabel(label + " warm-up")
	run()
	p.SetLabel(label)
}

// reportProgress calls onProgress (if not nil) with the operations done
// (ok and failed) and failed so far every 100ms, from a goroutine of wg,
// until stop is closed.
func reportProgress(wg *sync.WaitGroup, stop <-chan struct{}, ok, failed *atomic.Int64, onProgress func(done, failed int64)) {
	if onProgress == nil {
		return
	}
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				onProgress(ok.Load()+failed.Load(), failed.Load())
			}
		}
	})
}

// ---- the timed YCSB run -----------------------------------------------------

// runTimed runs spec's run phase as the WAN and lease scenarios measure it,
// shown on prog as label: first an unmeasured warm-up of the same workload
// for warmup (at least spec.Threads operations, at most a tenth of the
// run's; none if warmup is not positive), then the measured run for
// duration, or until maxOps operations if maxOps > 0. mark, if not nil, is
// called just before the measured run starts (to snapshot counters). It
// returns the measured phase (nil if there was none) and Run's error.
func runTimed(ctx context.Context, spec Spec, label string, maxOps int64, warmup, duration time.Duration, prog *Progress, mark func()) (*PhaseResult, error) {
	ops := maxOps
	if ops <= 0 {
		ops = 1 << 40
	}
	prog.Step(label, maxOps, max(warmup, 0)+duration)
	var werr error
	prog.warmUp(label, warmup, func() {
		w := spec
		w.Ops, w.MaxDuration = max(int64(spec.Threads), ops/10), warmup
		if _, err := Run(ctx, w); err != nil && ctx.Err() != nil {
			werr = err
		}
	})
	if werr != nil {
		return nil, werr
	}
	spec.Ops, spec.MaxDuration, spec.OnProgress = ops, duration, prog.Update
	if mark != nil {
		mark()
	}
	r, err := Run(ctx, spec)
	if r == nil || r.Run == nil {
		return nil, err
	}
	return r.Run, err
}

// ---- report.md and the final lines ------------------------------------------

// writeReportHeader starts a scenario's report.md: its title, when, where
// and how long it ran, and the command line (if known).
func writeReportHeader(b *strings.Builder, title string, started time.Time, command string) {
	host, _ := os.Hostname()
	fmt.Fprintf(b, "# %s\n\n", title)
	fmt.Fprintf(b, "Run %s on %s (%d CPUs, %s), in %v.\n\n", started.UTC().Format(time.RFC3339), host, runtime.NumCPU(),
		runtime.Version(), time.Since(started).Round(time.Second))
	if command != "" {
		fmt.Fprintf(b, "```\n%s\n```\n\n", command)
	}
}

// writeVariantList writes heading, then a line naming and describing each
// variant of all that named holds, in all's order.
func writeVariantList[V any](b *strings.Builder, heading string, all []V, named []string, nameDoc func(V) (name, doc string)) {
	fmt.Fprintf(b, "\n%s\n\n", heading)
	for _, v := range all {
		if name, doc := nameDoc(v); slices.Contains(named, name) {
			fmt.Fprintf(b, "- `%s`: %s.\n", name, doc)
		}
	}
}

// writeNotes writes a Notes section of one item per note.
func writeNotes(b *strings.Builder, notes []string) {
	b.WriteString("\n## Notes\n\n")
	for _, n := range notes {
		fmt.Fprintf(b, "- %s\n", n)
	}
}

// writePhaseDetail describes a YCSB run phase: how long it ran with how
// many threads, its operations, and each one's first error.
func writePhaseDetail(b *strings.Builder, p *PhaseResult) {
	fmt.Fprintf(b, "%v with %d threads", p.Elapsed.Round(time.Millisecond), p.Threads)
	if p.Stopped {
		b.WriteString(", stopped by the time limit")
	}
	b.WriteString(".\n\n")
	b.WriteString(OpsTable(p.Ops))
	for _, o := range p.Ops {
		if o.FirstErr != "" {
			fmt.Fprintf(b, "\nFirst %s error: %s\n", o.Op, inlineCode(o.FirstErr))
		}
	}
}

// writePlots ends a report with its plots, if it has any.
func writePlots(b *strings.Builder, plots []string) {
	if len(plots) == 0 {
		return
	}
	b.WriteString("\n## Plots\n\n")
	for _, p := range plots {
		fmt.Fprintf(b, "![%s](%s)\n\n", p, p)
	}
}

// inlineCode quotes s (an error message) as Markdown code, its backquotes
// turned into quotes.
func inlineCode(s string) string {
	return "`" + strings.ReplaceAll(s, "`", "'") + "`"
}

// printWritten ends what a scenario prints: the results.json and report.md
// it wrote in dir, and its plots.
func printWritten(out io.Writer, dir string, plots []string) {
	fmt.Fprintf(out, "\nwrote %s, %s", filepath.Join(dir, "results.json"), filepath.Join(dir, "report.md"))
	if len(plots) > 0 {
		fmt.Fprintf(out, " and %s", strings.Join(plots, ", "))
	}
	fmt.Fprintln(out)
}

// plotSet collects the plots a scenario drew and the errors of those it
// could not.
type plotSet struct {
	files []string
	errs  []error
}

// add records what a plot function returned: a file ("" when the plot
// had nothing to draw) or an error.
func (s *plotSet) add(file string, err error) {
	if err != nil {
		s.errs = append(s.errs, err)
	} else if file != "" {
		s.files = append(s.files, file)
	}
}
