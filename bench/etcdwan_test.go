//go:build unix

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/netsim"
)

func TestEtcdWANConfigValidation(t *testing.T) {
	for _, cfg := range []EtcdWANConfig{
		{Variants: []string{"etcd-eventual"}},
		{LeaderZone: "dc-z"},
	} {
		cfg.Logger = quietLogger()
		if _, err := RunEtcdWAN(context.Background(), cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
	cfg := EtcdWANConfig{Quick: true}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.LeaderZone != "dc-a" || cfg.Threads != 1 || cfg.RunDuration != time.Second || cfg.Writes != 30 || len(cfg.Variants) != len(EtcdWANVariants) {
		t.Fatalf("quick defaults: %+v", cfg)
	}
}

// etcdForTest is the etcd binary the etcd half of a test runs: $ETCD_BIN,
// else etcd on PATH (CI installs Debian's etcd-server), else "" (the
// peer-etcd tests skip without one; etcd-wan's runs its hedgekv half).
func etcdForTest(t *testing.T) string {
	if p := os.Getenv("ETCD_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("ETCD_BIN=%s: %v", p, err)
		}
		return p
	}
	p, _ := exec.LookPath("etcd")
	return p
}

// TestEtcdWANQuick runs etcd-wan in quick mode, shortened further: every
// system as three processes behind the default topology (14 ms one way),
// every Range variant from every zone, every watch. The timing checks are
// the network's lower bounds (a read that needs a round trip to the leader
// cannot beat one; one served under a follower lease need not pay it),
// not the targets, which a loaded test machine may miss.
func TestEtcdWANQuick(t *testing.T) {
	t.Parallel()
	bin := hedgekvBinary(t)
	etcd := etcdForTest(t)
	var variants []string
	for _, v := range EtcdWANVariants {
		if v.Cluster != ewEtcd || etcd != "" {
			variants = append(variants, v.Name)
		}
	}
	if etcd == "" {
		t.Log("no etcd binary (ETCD_BIN, PATH): running the hedgekv variants only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	res, err := RunEtcdWAN(ctx, EtcdWANConfig{
		Quick: true, Binary: bin, EtcdBinary: etcd, Variants: variants,
		RunDuration: 500 * time.Millisecond, Warmup: 200 * time.Millisecond, Writes: 15,
		OutDir: dir, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	rtt := 2 * netsim.Default().Default.Latency
	rttMs := float64(rtt) / float64(time.Millisecond)
	reads := 0
	// Remote zones whose follower-lease reads beat a round trip, and
	// those whose did not: on a loaded machine (CI, beside other
	// packages under -race) a follower's lease may lapse for a short
	// run and its reads go the long way, so one zone is enough.
	var leased, lapsed []string
	for _, r := range res.Reads {
		reads++
		row := r.Row
		if row.Ops == 0 || row.Failed != 0 {
			t.Errorf("%s from %s: %+v (first error %q)", r.Variant.Name, r.Zone, row, r.FirstErr)
			continue
		}
		switch {
		case !r.Remote:
		case r.Variant.Name == "hedgekv-follower-lease" && row.P50Ms >= rttMs:
			lapsed = append(lapsed, fmt.Sprintf("%s: p50 %.2f ms (%s)", r.Zone, row.P50Ms, r.ServedBy))
		case r.Variant.Name == "hedgekv-follower-lease":
			leased = append(leased, r.Zone)
		case r.Variant.Linearizable && r.Variant.Name != "hedgekv-follower-lease" && row.P50Ms < rttMs:
			t.Errorf("%s from %s: p50 %.2f ms, under one round trip (%v) to the leader", r.Variant.Name, r.Zone, row.P50Ms, rtt)
		}
	}
	if len(lapsed) > 0 {
		t.Logf("follower-lease reads a round trip (%v) or more from %s", rtt, strings.Join(lapsed, "; "))
	}
	if len(leased) == 0 && len(lapsed) > 0 {
		t.Errorf("hedgekv-follower-lease: no remote zone served under the follower lease: %s", strings.Join(lapsed, "; "))
	}
	watched := map[string]int{}
	for _, w := range res.Watches {
		watched[w.Variant.Name]++
		if w.Missed != 0 || len(w.Lags) != 15 {
			t.Errorf("%s in %s: %d events, %d missed", w.Variant.Name, w.Zone, len(w.Lags), w.Missed)
		}
	}
	wantWatches, wantReads := 0, 0
	for _, v := range variants {
		if etcdWANIsWatch(v) {
			wantWatches++
		} else {
			wantReads += 3
		}
	}
	if reads != wantReads || len(watched) != wantWatches || len(res.Rows) != wantReads+3*wantWatches {
		t.Fatalf("%d reads (want %d), watches %v (want %d), %d rows", reads, wantReads, watched, wantWatches, len(res.Rows))
	}
	doc, err := ReadResults(filepath.Join(dir, "etcd-wan", "results.json"))
	if err != nil || doc.Scenario != "etcd-wan" || len(doc.Rows) != len(res.Rows) {
		t.Fatalf("results.json: %+v %v", doc, err)
	}
	report, err := os.ReadFile(filepath.Join(dir, "etcd-wan", "report.md"))
	if err != nil || !strings.Contains(string(report), "| hedgekv-follower-lease | dc-b (remote) |") ||
		!strings.Contains(string(report), "| watch-hedgekv-leases | dc-c | 14ms | 19 |") {
		t.Fatalf("report.md: %v\n%s", err, report)
	}
}

func etcdWANIsWatch(name string) bool {
	for _, v := range EtcdWANVariants {
		if v.Name == name {
			return v.Watch
		}
	}
	return false
}
