package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Server-side latency comes from the stores' own Prometheus histogram,
// hedgekv_server_request_duration_seconds{method}, read from each store's
// /metrics before and after a run. A quantile is interpolated inside its
// bucket as Prometheus's histogram_quantile does, so it is exact to within
// that bucket (the stores' buckets are √2 apart: ±41%).

const serverLatencyMetric = "hedgekv_server_request_duration_seconds_bucket"

// ServerHist is a cumulative Prometheus histogram: Counts[i] requests took
// at most Bounds[i] seconds (the last bound is +Inf).
type ServerHist struct {
	Bounds []float64
	Counts []float64
}

// Sub returns h minus an earlier snapshot of the same histogram.
func (h ServerHist) Sub(before ServerHist) ServerHist {
	out := ServerHist{Bounds: slices.Clone(h.Bounds), Counts: slices.Clone(h.Counts)}
	if slices.Equal(h.Bounds, before.Bounds) {
		for i := range out.Counts {
			out.Counts[i] -= before.Counts[i]
		}
	}
	return out
}

// Add returns the sum of two histograms with the same buckets (or the
// non-empty one).
func (h ServerHist) Add(o ServerHist) ServerHist {
	switch {
	case len(h.Bounds) == 0:
		return o
	case len(o.Bounds) == 0:
		return h
	case !slices.Equal(h.Bounds, o.Bounds):
		return h
	}
	out := ServerHist{Bounds: slices.Clone(h.Bounds), Counts: slices.Clone(h.Counts)}
	for i := range out.Counts {
		out.Counts[i] += o.Counts[i]
	}
	return out
}

// Count is the number of requests in the histogram.
func (h ServerHist) Count() float64 {
	if len(h.Counts) == 0 {
		return 0
	}
	return h.Counts[len(h.Counts)-1]
}

// Quantile returns the q-quantile (0 < q < 1) in milliseconds, linearly
// interpolated inside its bucket; ok is false for an empty histogram.
func (h ServerHist) Quantile(q float64) (ms float64, ok bool) {
	total := h.Count()
	if total <= 0 {
		return 0, false
	}
	rank := q * total
	for i, c := range h.Counts {
		if c < rank {
			continue
		}
		lower, prev := 0.0, 0.0
		if i > 0 {
			lower, prev = h.Bounds[i-1], h.Counts[i-1]
		}
		upper := h.Bounds[i]
		if math.IsInf(upper, 1) {
			// Beyond the last finite bucket: its lower bound is all we know.
			return lower * 1000, true
		}
		if c == prev {
			return upper * 1000, true
		}
		return (lower + (upper-lower)*(rank-prev)/(c-prev)) * 1000, true
	}
	return h.Bounds[len(h.Bounds)-1] * 1000, true
}

// ScrapeServerHist reads one store's latency histogram of method (e.g.
// "KV.Scan") from its status address.
func ScrapeServerHist(ctx context.Context, statusAddr, method string) (ServerHist, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+statusAddr+"/metrics", nil)
	if err != nil {
		return ServerHist{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ServerHist{}, fmt.Errorf("scrape %s: %w", statusAddr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ServerHist{}, fmt.Errorf("scrape %s: %s", statusAddr, resp.Status)
	}
	return parseServerHist(resp.Body, method)
}

// parseServerHist picks method's buckets out of the Prometheus text format.
func parseServerHist(r io.Reader, method string) (ServerHist, error) {
	type bucket struct{ le, n float64 }
	var buckets []bucket
	want := `method="` + method + `"`
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, serverLatencyMetric+"{") || !strings.Contains(line, want) {
			continue
		}
		labels, value, ok := strings.Cut(line[len(serverLatencyMetric)+1:], "} ")
		if !ok {
			continue
		}
		var le string
		for _, l := range strings.Split(labels, ",") {
			if v, ok := strings.CutPrefix(l, `le="`); ok {
				le = strings.TrimSuffix(v, `"`)
			}
		}
		bound, err1 := strconv.ParseFloat(le, 64)
		n, err2 := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err := errors.Join(err1, err2); err != nil {
			return ServerHist{}, fmt.Errorf("parse %q: %w", line, err)
		}
		buckets = append(buckets, bucket{bound, n})
	}
	if err := sc.Err(); err != nil {
		return ServerHist{}, err
	}
	slices.SortStableFunc(buckets, func(a, b bucket) int {
		switch {
		case a.le < b.le:
			return -1
		case a.le > b.le:
			return 1
		}
		return 0
	})
	var h ServerHist
	for _, b := range buckets {
		h.Bounds = append(h.Bounds, b.le)
		h.Counts = append(h.Counts, b.n)
	}
	return h, nil
}

// scrapeCluster sums method's histogram over the given status addresses;
// a store that does not answer is skipped and reported in err.
func scrapeCluster(ctx context.Context, addrs []string, method string) (ServerHist, error) {
	var sum ServerHist
	var errs []error
	for _, a := range addrs {
		if a == "" {
			continue
		}
		h, err := ScrapeServerHist(ctx, a, method)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sum = sum.Add(h)
	}
	return sum, errors.Join(errs...)
}

// fetchMetrics GETs a store's /metrics, waiting at most timeout, and
// hands the body to parse.
func fetchMetrics(ctx context.Context, statusAddr string, timeout time.Duration, parse func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+statusAddr+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", statusAddr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("scrape %s: %s", statusAddr, resp.Status)
	}
	return parse(resp.Body)
}

// scrapeMetrics reads the values of the unlabelled samples named from a
// store's /metrics, waiting at most timeout.
func scrapeMetrics(ctx context.Context, statusAddr string, timeout time.Duration, names ...string) (map[string]float64, error) {
	out := map[string]float64{}
	err := fetchMetrics(ctx, statusAddr, timeout, func(r io.Reader) error {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			name, value, ok := strings.Cut(sc.Text(), " ")
			if !ok || !slices.Contains(names, name) {
				continue
			}
			if n, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
				out[name] = n
			}
		}
		return sc.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// scrapeLabelled reads the samples of the counter or gauge name from a
// store's /metrics, by the value of its one label, waiting at most
// timeout.
func scrapeLabelled(ctx context.Context, statusAddr string, timeout time.Duration, name, label string) (map[string]float64, error) {
	var out map[string]float64
	err := fetchMetrics(ctx, statusAddr, timeout, func(r io.Reader) (err error) {
		out, err = parseLabelled(r, name, label)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// parseLabelled picks the samples of name labelled `label="v"` (and
// nothing else) out of the Prometheus text format, by v.
func parseLabelled(r io.Reader, name, label string) (map[string]float64, error) {
	out := map[string]float64{}
	prefix := name + "{" + label + `="`
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		v, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("parse %s{%s=%q}: %w", name, label, v, err)
		}
		out[v] = n
	}
	return out, sc.Err()
}
