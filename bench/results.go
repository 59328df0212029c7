package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Row is one line of a scenario's results.json (docs/BENCHMARKS.md).
// Latencies are those of successful operations; failed operations are
// counted in Failed and in Ops. QPS is successful operations per second of
// the phase's wall-clock time.
type Row struct {
	Variant string  `json:"variant"`
	Param   string  `json:"param"`
	Ops     int64   `json:"ops"`
	QPS     float64 `json:"qps"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	P999Ms  float64 `json:"p999_ms"`
	P9999Ms float64 `json:"p9999_ms"`
	Failed  int64   `json:"failed"`

	// Only where they apply.
	// P95Ms: overloaded-replica (ScyllaDB quotes p95 beside p99).
	P95Ms             *float64        `json:"p95_ms,omitempty"`
	ServerP99Ms       *float64        `json:"server_p99_ms,omitempty"`
	ExtraRequestRatio *float64        `json:"extra_request_ratio,omitempty"`
	HedgesWon         *int64          `json:"hedges_won,omitempty"`
	Timeline          []TimelinePoint `json:"timeline,omitempty"`
	// WANBytesPerOp: bytes that crossed the simulated WAN between zones
	// during the run, per successful operation (follower-read-dc,
	// hot-region).
	WANBytesPerOp *float64 `json:"wan_bytes_per_op,omitempty"`
	// ServerCPUMsPerOp and ClientCPUMsPerOp: CPU milliseconds (user and
	// system) the servers, all members together, and the benchmark's own
	// process spent per successful operation (peer-etcd, where the
	// servers are processes of their own).
	ServerCPUMsPerOp *float64 `json:"server_cpu_ms_per_op,omitempty"`
	ClientCPUMsPerOp *float64 `json:"client_cpu_ms_per_op,omitempty"`
	// ServedBy: which stores served the run's reads, and how.
	ServedBy string `json:"served_by,omitempty"`
	// MaxStallMs: the longest time no operation completed while some were
	// outstanding (follower-lease's write rows: a dead lease holder holds
	// commits back until its lease ends).
	MaxStallMs *float64 `json:"max_stall_ms,omitempty"`
	// Watch: the watch scenario's delivery counts and server costs.
	Watch *WatchRow `json:"watch,omitempty"`
}

// TimelinePoint counts the operations that completed in [t_ms, t_ms+step).
type TimelinePoint struct {
	TMs    int64 `json:"t_ms"`
	OK     int64 `json:"ok"`
	Failed int64 `json:"failed"`
}

// Results is a scenario's results.json.
type Results struct {
	Scenario string `json:"scenario"`
	Rows     []Row  `json:"rows"`
}

// RowFromStats turns TOTAL stats into a results row.
func RowFromStats(variant, param string, total OpStats) Row {
	return Row{
		Variant: variant,
		Param:   param,
		Ops:     total.Ops + total.Failed,
		QPS:     total.QPS,
		P50Ms:   total.P50Ms,
		P99Ms:   total.P99Ms,
		P999Ms:  total.P999Ms,
		P9999Ms: total.P9999Ms,
		Failed:  total.Failed,
	}
}

// latencyRow is the results row of a run of ok successful operations,
// whose latencies (µs) h holds, and failed others, in elapsed.
func latencyRow(variant, param string, h *hdrhistogram.Histogram, ok, failed int64, elapsed time.Duration) Row {
	row := Row{
		Variant: variant, Param: param, Ops: ok + failed, Failed: failed,
		P50Ms: quantileMs(h, 50), P99Ms: quantileMs(h, 99), P999Ms: quantileMs(h, 99.9), P9999Ms: quantileMs(h, 99.99),
	}
	if secs := elapsed.Seconds(); secs > 0 {
		row.QPS = round(float64(ok)/secs, 1)
	}
	return row
}

// ReadResults reads a results.json; a missing file is not an error and
// yields empty Results.
func ReadResults(path string) (Results, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Results{}, nil
	}
	if err != nil {
		return Results{}, fmt.Errorf("read results: %w", err)
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return Results{}, fmt.Errorf("parse %s: %w", path, err)
	}
	return r, nil
}

// MergeRows returns old with every row of update replacing the row of the
// same (variant, param), and new rows appended, in order.
func MergeRows(old, update []Row) []Row {
	out := append([]Row(nil), old...)
	for _, u := range update {
		replaced := false
		for i := range out {
			if out[i].Variant == u.Variant && out[i].Param == u.Param {
				out[i], replaced = u, true
				break
			}
		}
		if !replaced {
			out = append(out, u)
		}
	}
	return out
}

// WriteResults writes dir/results.json and dir/report.md (creating dir).
// Each file is written to a temporary name and renamed into place.
func WriteResults(dir string, res Results, report string) error {
	if res.Rows == nil {
		res.Rows = []Row{}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, "results.json"), append(js, '\n')); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "report.md"), []byte(report))
}

func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// MarkdownTable renders a GitHub-flavoured Markdown table. Cells containing
// '|' are escaped.
func MarkdownTable(header []string, rows [][]string) string {
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for _, c := range cells {
			b.WriteString(" ")
			b.WriteString(strings.ReplaceAll(c, "|", `\|`))
			b.WriteString(" |")
		}
		b.WriteString("\n")
	}
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---"
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
	return b.String()
}

// RowsTable renders results rows as a Markdown table.
func RowsTable(rows []Row) string {
	cells := make([][]string, 0, len(rows))
	for _, r := range rows {
		cells = append(cells, []string{
			r.Variant, r.Param, strconv.FormatInt(r.Ops, 10), FormatFloat(r.QPS, 1),
			FormatFloat(r.P50Ms, 3), FormatFloat(r.P99Ms, 3), FormatFloat(r.P999Ms, 3), FormatFloat(r.P9999Ms, 3),
			strconv.FormatInt(r.Failed, 10),
		})
	}
	return MarkdownTable([]string{"variant", "param", "ops", "ops/s", "p50 ms", "p99 ms", "p99.9 ms", "p99.99 ms", "failed"}, cells)
}

// OpsTable renders per-operation stats as a Markdown table.
func OpsTable(ops []OpStats) string {
	cells := make([][]string, 0, len(ops))
	for _, o := range ops {
		cells = append(cells, []string{
			o.Op, strconv.FormatInt(o.Ops, 10), strconv.FormatInt(o.Failed, 10), FormatFloat(o.QPS, 1),
			FormatFloat(o.MeanMs, 3), FormatFloat(o.P50Ms, 3), FormatFloat(o.P99Ms, 3), FormatFloat(o.P999Ms, 3),
			FormatFloat(o.P9999Ms, 3), FormatFloat(o.MaxMs, 3),
		})
	}
	return MarkdownTable([]string{"op", "ok", "failed", "ops/s", "mean ms", "p50 ms", "p99 ms", "p99.9 ms", "p99.99 ms", "max ms"}, cells)
}

// FormatFloat formats v with the given number of decimals.
func FormatFloat(v float64, decimals int) string {
	return strconv.FormatFloat(v, 'f', decimals, 64)
}
