package grafana_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
)

const dashboardFile = "hedgekv.json"

// dashboard is the part of a Grafana dashboard the test reads: panels
// (rows nest theirs when collapsed) and template variables, whose queries
// (label_values(...)) name series too.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int      `json:"id"`
	Type    string   `json:"type"`
	Title   string   `json:"title"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"`
}

type target struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

// query is one PromQL expression of the dashboard and where it is.
type query struct{ where, expr string }

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: not JSON a dashboard decodes from: %v", dashboardFile, err)
	}
	return d
}

// queries checks the dashboard's shape (a title, a uid, panels, and at
// least one target with an expression in every panel but rows) and
// returns every PromQL expression in it.
func queries(t *testing.T, d dashboard) []query {
	t.Helper()
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard has no title or uid")
	}
	var out []query
	var walk func([]panel)
	ids := map[int]bool{}
	plotted := 0
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel %q: id %d is used twice", p.Title, p.ID)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			plotted++
			if p.Title == "" {
				t.Errorf("panel %d has no title", p.ID)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no targets", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q, target %q: no expr", p.Title, tg.RefID)
					continue
				}
				out = append(out, query{fmt.Sprintf("panel %q, target %s", p.Title, tg.RefID), tg.Expr})
			}
		}
	}
	walk(d.Panels)
	if plotted == 0 {
		t.Errorf("dashboard has no panels")
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		var s string
		switch {
		case json.Unmarshal(v.Query, &s) == nil:
		case json.Unmarshal(v.Query, &q) == nil:
			s = q.Query
		}
		if s != "" {
			out = append(out, query{fmt.Sprintf("variable %q", v.Name), s})
		}
	}
	return out
}

// metricNames pulls the metric names out of a PromQL expression: the
// identifiers outside string literals that name hedgekv's, the Go
// runtime's or the process's series. Functions (rate,
// histogram_quantile), aggregations (sum by (le, op)), label names and
// Grafana's variables ($__rate_interval) are identifiers of other shapes
// and fall out.
func metricNames(expr string) []string {
	var names []string
	isStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isPart := func(c byte) bool { return isStart(c) || c >= '0' && c <= '9' }
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			// A string literal (a label value or regex): skip it.
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			i = j + 1
		case c == '$':
			// A Grafana variable: $name or ${name}.
			j := i + 1
			for j < len(expr) && (isPart(expr[j]) || expr[j] == '{' || expr[j] == '}') {
				j++
			}
			i = j
		case isStart(c):
			j := i
			for j < len(expr) && isPart(expr[j]) {
				j++
			}
			id := expr[i:j]
			for _, prefix := range []string{"hedgekv_", "go_", "process_"} {
				if strings.HasPrefix(id, prefix) {
					names = append(names, id)
					break
				}
			}
			i = j
		case c >= '0' && c <= '9':
			// A number or a duration (5m, 1e-3): not a name.
			j := i
			for j < len(expr) && isPart(expr[j]) {
				j++
			}
			i = j
		default:
			i++
		}
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`histogram_quantile(0.99, sum by (le, op) (rate(hedgekv_kv_request_duration_seconds_bucket{instance=~"$instance"}[$__rate_interval])))`,
			[]string{"hedgekv_kv_request_duration_seconds_bucket"}},
		{`rate(go_gc_duration_seconds_sum[5m]) / rate(go_gc_duration_seconds_count[5m])`,
			[]string{"go_gc_duration_seconds_sum", "go_gc_duration_seconds_count"}},
		{`sum by (mode) (rate(hedgekv_server_reads_total{mode="hedgekv_not_a_metric", code!='go_x'}[1m]))`,
			[]string{"hedgekv_server_reads_total"}},
		{`label_values(hedgekv_server_ready, instance)`, []string{"hedgekv_server_ready"}},
		{`rate(process_cpu_seconds_total{instance=~"${instance}"}[$__rate_interval]) + cargo_goroutines`,
			[]string{"process_cpu_seconds_total"}},
	} {
		if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%s) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// exported is the series names in a Prometheus text exposition (the
// samples' names: a histogram's _bucket, _sum and _count) and the
// families' types from its # TYPE lines.
type exported struct {
	series map[string]bool
	types  map[string]string
}

func newExported() exported { return exported{series: map[string]bool{}, types: map[string]string{}} }

func (e exported) add(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			if f := strings.Fields(rest); len(f) == 2 {
				e.types[f[0]] = f[1]
			}
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		if end := strings.IndexAny(line, "{ "); end > 0 {
			e.series[line[:end]] = true
		}
	}
	return sc.Err()
}

// missing says why the dashboard's name is not an exported series.
func (e exported) missing(name string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && e.types[base] != "" {
			return fmt.Sprintf("%s is a %s, which exports no %s series", base, e.types[base], suffix)
		}
	}
	if typ := e.types[name]; typ == "histogram" || typ == "summary" {
		return fmt.Sprintf("%s is a %s: plot its _bucket, _sum or _count series", name, typ)
	}
	// A vector none of whose label values was ever used has no series and
	// no # TYPE line either: pre-create the labels (server/metrics.go).
	return "not exported (misspelt, or a vector whose labels are not pre-created)"
}

// TestDashboardSeriesExported starts three stores, reads and writes
// through the client in every way the dashboard breaks down (ops, read
// modes, hedges), scrapes every store's /metrics, and fails naming each
// series the dashboard plots that no store exports. The client panels'
// series (hedgekv_client_*) are held to client.Collector instead.
func TestDashboardSeriesExported(t *testing.T) {
	d := loadDashboard(t)
	qs := queries(t, d)
	if t.Failed() {
		t.FailNow()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := cluster.StartLocal(ctx, cluster.LocalConfig{
		Dir:            t.TempDir(),
		NoSync:         true,
		StatusHTTP:     true,
		FollowerLeases: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	cl, err := client.New(ctx, client.Config{Endpoints: c.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	for i := range 20 {
		if err := cl.Put(ctx, fmt.Appendf(nil, "k%02d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.Delete(ctx, []byte("k19")); err != nil {
		t.Fatal(err)
	}
	sessions := []*client.Session{
		cl.Session(client.ReadPolicy{Replica: client.ReplicaLeader}),
		cl.Session(client.ReadPolicy{Replica: client.ReplicaFollower}),
		cl.Session(client.ReadPolicy{Replica: client.ReplicaFollower, MaxStaleness: time.Minute}),
		cl.Session(client.ReadPolicy{Replica: client.ReplicaMixed, Hedge: client.HedgeAfter(time.Microsecond), HedgeBudget: 1}),
	}
	for _, s := range sessions {
		for i := range 10 {
			if _, err := s.Get(ctx, fmt.Appendf(nil, "k%02d", i)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.BatchGet(ctx, [][]byte{[]byte("k01"), []byte("k02")}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Scan(ctx, []byte("k"), nil, 5); err != nil {
			t.Fatal(err)
		}
	}

	stores := newExported()
	for _, id := range c.StoreIDs() {
		scrape(t, "http://"+c.StatusAddr(id)+"/metrics", stores)
	}
	clients := newExported()
	reg := prometheus.NewRegistry()
	reg.MustRegister(cl.Collector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		clients.series[f.GetName()] = true
		clients.types[f.GetName()] = strings.ToLower(f.GetType().String())
	}

	checked := map[string]bool{}
	for _, q := range qs {
		names := metricNames(q.expr)
		if len(names) == 0 {
			t.Errorf("%s: no hedgekv_, go_ or process_ series in %s", q.where, q.expr)
		}
		for _, name := range names {
			checked[name] = true
			from, what := stores, "the stores' /metrics"
			if strings.HasPrefix(name, "hedgekv_client_") {
				from, what = clients, "client.Collector"
			}
			if !from.series[name] {
				t.Errorf("%s plots %s, which %s does not export: %s", q.where, name, what, from.missing(name))
			}
		}
	}
	t.Logf("%d expressions, %d series names checked against %d store series", len(qs), len(checked), len(stores.series))
}

func scrape(t *testing.T, url string, into exported) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := into.add(resp.Body); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
