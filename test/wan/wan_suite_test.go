// Package wan runs a three-store hedgekv cluster as separate processes
// behind the simulated WAN (`scripts/cluster.sh start --topology default`:
// `hedgekv netsim` with its toxiproxy links, every store in its own zone,
// 14 ms one way between zones) and checks the network the benchmarks stand
// on: a read from a remote zone pays the configured round trip while a
// bounded-stale read in the client's zone does not, and `cluster.sh
// partition` / `heal` cut and restore both Raft and client traffic.
//
// The binary comes from $HEDGEKV_BIN when set (the Makefile passes
// bin/hedgekv); otherwise the suite builds ./cmd/hedgekv into a temporary
// directory, so `go test ./test/wan/` works on its own. Every cluster runs
// in a temporary $CLUSTER_DIR on a block of free ports below the kernel's
// ephemeral range (the netsim's proxies and control address too), so a
// developer's own cluster is never touched, and is stopped after its spec,
// failed or not. Like test/smoke it is run
// without -race: the processes under test are the built binary.
package wan

import (
	"os/exec"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/test/testbin"
)

var (
	repoRoot string // absolute path of the repository
	binPath  string // the hedgekv binary under test
)

func TestWAN(t *testing.T) {
	RegisterFailHandler(Fail)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not found: the WAN specs drive scripts/cluster.sh")
	}
	b, err := testbin.Locate("hedgekv-wan-bin-")
	if err != nil {
		t.Fatalf("wan test setup: %v", err)
	}
	defer b.Close()
	repoRoot, binPath = b.RepoRoot, b.Path
	RunSpecs(t, "WAN Suite")
}
