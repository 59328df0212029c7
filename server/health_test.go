package server

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
)

// get answers GET path on h with its status code and body.
func get(h http.Handler, path string) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

// httpGetCode is GET url over the network, any status.
func httpGetCode(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// TestHealthReadiness: /readyz is 503 before start, 200 once caught up,
// 503 while the disk is failed and 200 again after; /healthz is 200
// throughout; a shutdown turns /readyz 503.
func TestHealthReadiness(t *testing.T) {
	c := newCluster(t, 1, nil, nil)
	s := c.server(1)
	h := s.statusHandler()
	if code, body := get(h, "/readyz"); code != http.StatusServiceUnavailable || body != "not ready: starting\n" {
		t.Fatalf("/readyz before start = %d %q", code, body)
	}
	if code, body := get(h, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz = %d %q", code, body)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	base := "http://" + s.StatusAddr()
	waitFor(t, 10*time.Second, "/readyz 200", func() bool {
		code, _ := httpGetCode(t, base+"/readyz")
		return code == http.StatusOK
	})
	if code, body := httpGetCode(t, base+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz = %d %q", code, body)
	}

	// A failed disk write freezes the store: not ready, saying why.
	s.Store().InjectDiskFailure(errors.New("injected: no space left on device"))
	kv := c.kv(t, 1)
	ctx := testCtx(t)
	_, _ = kv.Put(ctx, &kvpb.PutRequest{Key: []byte("k"), Value: []byte("v")})
	waitFor(t, 10*time.Second, "/readyz 503 with the disk failed", func() bool {
		code, _ := httpGetCode(t, base+"/readyz")
		return code == http.StatusServiceUnavailable
	})
	code, body := httpGetCode(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "disk write failed") || strings.Count(body, "\n") != 1 {
		t.Fatalf("/readyz with the disk failed = %d %q; want 503 and one line naming the disk", code, body)
	}
	if code, _ := httpGetCode(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz with the disk failed = %d; the process still serves", code)
	}
	s.Store().InjectDiskFailure(nil)
	waitFor(t, 10*time.Second, "/readyz 200 once the disk takes writes", func() bool {
		code, _ := httpGetCode(t, base+"/readyz")
		return code == http.StatusOK
	})

	s.health.draining.Store(true)
	if code, body := get(h, "/readyz"); code != http.StatusServiceUnavailable || body != "not ready: shutting down\n" {
		t.Fatalf("/readyz while shutting down = %d %q", code, body)
	}
}

// metricValue is the value of the first sample of /metrics whose line
// starts with prefix (name and labels), or -1.
func metricValue(body, prefix string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(prefix) + `\S* (\S+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return -1
	}
	return v
}

// TestMetricsScrape: after puts and reads of every mode, /metrics has the
// per-operation and per-mode latency histograms, the ReadIndex round trip,
// the write transaction histogram, the lag, region and file-size gauges;
// an idle region is counted hibernating.
func TestMetricsScrape(t *testing.T) {
	c := newCluster(t, 3, nil, func(cfg *raftstore.Config) { cfg.HibernateAfter = time.Second })
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
	}
	leader := c.waitLeader(t)
	follower := leader%3 + 1
	ctx := testCtx(t)
	lkv, fkv := c.kv(t, leader), c.kv(t, follower)
	for _, k := range []string{"a", "b", "c"} {
		if _, err := lkv.Put(ctx, &kvpb.PutRequest{Key: []byte(k), Value: []byte("1")}); err != nil {
			t.Fatalf("put: %v", err)
		}
	}
	if _, err := lkv.Delete(ctx, &kvpb.DeleteRequest{Key: []byte("c")}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if r, err := lkv.Get(ctx, &kvpb.GetRequest{Key: []byte("a")}); err != nil || r.GetReadInfo().GetMode() != kvpb.ReadMode_READ_MODE_LEASE {
		t.Fatalf("leader get: %v %v", r, err)
	}
	if _, err := lkv.BatchGet(ctx, &kvpb.BatchGetRequest{Keys: [][]byte{[]byte("a"), []byte("b")}}); err != nil {
		t.Fatalf("batch get: %v", err)
	}
	if _, err := lkv.Scan(ctx, &kvpb.ScanRequest{Limit: 10}); err != nil {
		t.Fatalf("scan: %v", err)
	}
	if r, err := fkv.Get(ctx, &kvpb.GetRequest{Key: []byte("a"), Context: &kvpb.ReadContext{ReplicaRead: true}}); err != nil || r.GetReadInfo().GetMode() != kvpb.ReadMode_READ_MODE_READ_INDEX {
		t.Fatalf("follower read: %v %v", r, err)
	}
	waitFor(t, 5*time.Second, "a stale read", func() bool {
		r, err := fkv.Get(ctx, &kvpb.GetRequest{Key: []byte("a"), Context: &kvpb.ReadContext{MaxStalenessMs: 10_000}})
		return err == nil && r.GetReadInfo().GetMode() == kvpb.ReadMode_READ_MODE_STALE
	})

	lbody := httpGet(t, "http://"+c.server(leader).StatusAddr()+"/metrics")
	fbody := httpGet(t, "http://"+c.server(follower).StatusAddr()+"/metrics")
	for _, want := range []struct {
		body, prefix string
		min          float64
	}{
		{lbody, `hedgekv_kv_request_duration_seconds_count{op="put"}`, 3},
		{lbody, `hedgekv_kv_request_duration_seconds_count{op="delete"}`, 1},
		{lbody, `hedgekv_kv_request_duration_seconds_count{op="get"}`, 1},
		{lbody, `hedgekv_kv_request_duration_seconds_count{op="batch_get"}`, 1},
		{lbody, `hedgekv_kv_request_duration_seconds_count{op="scan"}`, 1},
		{lbody, `hedgekv_kv_request_duration_seconds_bucket{op="put",le="+Inf"}`, 3},
		{lbody, `hedgekv_read_duration_seconds_count{mode="lease"}`, 3},
		{lbody, `hedgekv_read_duration_seconds_count{mode="follower-lease"}`, 0},
		{fbody, `hedgekv_read_duration_seconds_count{mode="read-index"}`, 1},
		{fbody, `hedgekv_read_duration_seconds_count{mode="stale"}`, 1},
		{fbody, `hedgekv_store_read_index_rtt_seconds_count`, 1},
		{lbody, `hedgekv_store_write_tx_duration_seconds_count`, 4},
		{fbody, `hedgekv_store_write_tx_duration_seconds_count`, 4},
		{lbody, `hedgekv_store_regions`, 1},
		{lbody, `hedgekv_store_leader_regions`, 1},
		{fbody, `hedgekv_store_leader_regions`, 0},
		{lbody, `hedgekv_store_apply_lag_entries`, 0},
		{lbody, `hedgekv_store_apply_lag_max_entries`, 0},
		{lbody, `hedgekv_store_db_file_size_bytes`, 1},
		{lbody, `hedgekv_store_disk_failures_total`, 0},
		{lbody, `hedgekv_store_leaderships_taken_total{cause="election"}`, 1},
		{lbody, `hedgekv_store_leaderships_taken_total{cause="transfer"}`, 0},
		{lbody, `hedgekv_server_ready`, 1},
	} {
		if v := metricValue(want.body, want.prefix); v < want.min {
			t.Errorf("/metrics: %s = %v, want >= %v", want.prefix, v, want.min)
		}
	}
	if t.Failed() {
		t.Logf("leader /metrics:\n%s", lbody)
	}

	// Left alone, the region hibernates on every store.
	waitFor(t, 20*time.Second, "hedgekv_store_hibernating_regions 1", func() bool {
		body := httpGet(t, "http://"+c.server(leader).StatusAddr()+"/metrics")
		return metricValue(body, "hedgekv_store_hibernating_regions") == 1
	})
}

// TestShutdownHandsOverLeadership: a leader shutting down hands its region
// to another store before it stops, so the region has a leader at once
// rather than after an election timeout, and writes go on through it.
func TestShutdownHandsOverLeadership(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.waitLeader(t)
	ctx := testCtx(t)
	before := map[uint64]raftstore.Stats{}
	for _, s := range c.servers {
		before[s.Store().ID()] = s.Store().Stats()
	}
	c.server(leader).Shutdown(ctx)

	var next uint64
	// Well inside the election timeout (40 ticks of 10ms): only a transfer
	// makes a leader this soon.
	waitFor(t, 200*time.Millisecond, "another store leading", func() bool {
		for _, s := range c.servers {
			if s.Store().ID() == leader {
				continue
			}
			if rs := s.Store().Regions(); len(rs) == 1 && rs[0].IsLeader {
				next = s.Store().ID()
				return true
			}
		}
		return false
	})
	if _, err := c.kv(t, next).Put(ctx, &kvpb.PutRequest{Key: []byte("after"), Value: []byte("1")}); err != nil {
		t.Fatalf("put on the new leader %d: %v", next, err)
	}
	// The new leader counts its leadership as handed over, not elected.
	waitFor(t, 5*time.Second, "the new leader's transfer counted", func() bool {
		return c.server(next).Store().Stats().LeadershipsByTransfer == before[next].LeadershipsByTransfer+1
	})
	if st := c.server(next).Store().Stats(); st.LeadershipsByElection != before[next].LeadershipsByElection {
		t.Fatalf("new leader %d counted %d leaderships by election, %d before the shutdown", next, st.LeadershipsByElection, before[next].LeadershipsByElection)
	}
	if code, _ := get(c.server(leader).statusHandler(), "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz of the stopped store = %d", code)
	}
}
