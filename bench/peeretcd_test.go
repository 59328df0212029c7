package bench

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPeerEtcdWithoutEtcdBinary(t *testing.T) {
	_, err := RunPeerEtcd(context.Background(), PeerEtcdConfig{
		EtcdBinary: "no-such-etcd-binary-for-hedgekv-tests",
		OutDir:     t.TempDir(),
		Logger:     quietLogger(),
	})
	if !errors.Is(err, ErrEtcdNotFound) || !strings.Contains(err.Error(), "apt-get install etcd-server") {
		t.Fatalf("err = %v", err)
	}
}

func TestPeerEtcdConfigValidation(t *testing.T) {
	for _, cfg := range []PeerEtcdConfig{
		{Workloads: []string{"q"}},
		{Variants: []string{"etcd-eventual"}},
		{EtcdBinding: "grpc-proxy"},
	} {
		cfg.Logger = quietLogger()
		if _, err := RunPeerEtcd(context.Background(), cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
	cfg := PeerEtcdConfig{Quick: true, EtcdBinding: EtcdBindingGoYCSB}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.Records != 2000 || cfg.MaxDuration != 5*time.Second || strings.Contains(strings.Join(cfg.Variants, ","), "etcd-serializable") {
		t.Fatalf("quick defaults: %+v", cfg)
	}
}

// TestPeerEtcdHedgeKVOnly runs the scenario's hedgekv half against an
// in-process cluster (no etcd needed) and checks what it writes.
func TestPeerEtcdHedgeKVOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	res, err := RunPeerEtcd(ctx, PeerEtcdConfig{
		Records: 100, Ops: 200, Threads: 4, Workloads: []string{"a", "c"},
		Variants: []string{"hedgekv-leader", "hedgekv-follower"},
		OutDir:   dir, Logger: quietLogger(), ProgressInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 4 || res.Loads[SystemHedgeKV] == nil {
		t.Fatalf("rows %+v", res.Rows)
	}
	for _, r := range res.Rows {
		if r.Ops != 200 || r.Failed != 0 || r.QPS <= 0 {
			t.Errorf("row %+v", r)
		}
	}
	doc, err := ReadResults(filepath.Join(dir, "peer-etcd", "results.json"))
	if err != nil || doc.Scenario != "peer-etcd" || len(doc.Rows) != 4 || doc.Rows[0].Variant != "hedgekv-leader" || doc.Rows[0].Param != "a" {
		t.Fatalf("results.json: %+v %v", doc, err)
	}
	report, err := os.ReadFile(filepath.Join(dir, "peer-etcd", "report.md"))
	if err != nil || !strings.Contains(string(report), "| c | hedgekv | follower (ReadIndex) |") {
		t.Fatalf("report.md: %v\n%s", err, report)
	}
}

// TestPeerEtcdWithEtcd runs the whole scenario, tiny, when an etcd binary is
// installed; it is skipped otherwise.
func TestPeerEtcdWithEtcd(t *testing.T) {
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("no etcd on PATH (apt-get install etcd-server)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	res, err := RunPeerEtcd(ctx, PeerEtcdConfig{
		Records: 100, Ops: 200, Threads: 4, Workloads: []string{"b", "scan"},
		Variants: []string{"etcd-linearizable", "etcd-serializable", "hedgekv-leader"},
		OutDir:   dir, Logger: quietLogger(), ProgressInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 6 {
		t.Fatalf("rows %+v", res.Rows)
	}
	for _, r := range res.Rows {
		if r.Ops != 200 || r.Failed != 0 {
			t.Errorf("row %+v", r)
		}
	}
	report, err := os.ReadFile(filepath.Join(dir, "peer-etcd", "report.md"))
	if err != nil || !strings.Contains(string(report), "hedgekv-leader vs etcd-linearizable") {
		t.Fatalf("report.md: %v\n%s", err, report)
	}
}
