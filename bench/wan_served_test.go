package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/netsim"
	"github.com/hedgekv/hedgekv/raftstore"
)

// A store's own reads are not the workload's: the etcd API's lessor,
// promoted with the leader, reads its leases through the leader (a
// ReadView, by ReadIndex on a new leader), and under load that read could
// finish inside a measured run and count as a KV.Scan the leader served.
// Here such a read is made on purpose between two snapshots, beside one
// KV scan by a client in dc-b reading from its closest replica: only the
// scan may be counted, on dc-b's store.
func TestServedByCountsKVReadsOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := startWANCluster(ctx, netsim.Default(), "dc-a", quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	db, err := c.openZoneDB(ctx, "dc-b", client.ReadPolicy{Replica: client.ReplicaClosest})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()

	before := c.snap(ctx, "KV.Scan")
	leader := c.Server(c.leaderStore).Store()
	if _, err := leader.ReadView(ctx, raftstore.ReadOptions{}, []byte("x"), func(raftstore.StateView) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Scan(ctx, "usertable", "user", 10, nil); err != nil {
		t.Fatal(err)
	}
	d := c.delta(before, c.snap(ctx, "KV.Scan"))
	if got := c.servedBy(d); !strings.HasPrefix(got, "store 2 (dc-b) 100%: ") || d.reads[c.leaderStore] != 0 {
		t.Errorf("served by %s (reads by store %v), want the scan on store 2 only", got, d.reads)
	}
}

func TestParseLabelled(t *testing.T) {
	text := `# HELP hedgekv_server_reads_total Reads served.
# TYPE hedgekv_server_reads_total counter
hedgekv_server_reads_total{mode="follower-lease"} 7
hedgekv_server_reads_total{mode="lease"} 3
hedgekv_server_reads_total_other{mode="lease"} 99
hedgekv_server_reads_totalx 5
`
	got, err := parseLabelled(strings.NewReader(text), "hedgekv_server_reads_total", "mode")
	if err != nil || len(got) != 2 || got["follower-lease"] != 7 || got["lease"] != 3 {
		t.Errorf("got %v, %v", got, err)
	}
}

func TestReadsDeltaLeavesOutUnscrapedStores(t *testing.T) {
	before := map[uint64]map[string]uint64{1: {"lease": 5}}
	after := map[uint64]map[string]uint64{1: {"lease": 7, "read-index": 1}, 2: {"read-index": 40}}
	d := readsDelta(before, after)
	if len(d.reads) != 1 || d.reads[1] != 3 || d.byMode[1]["lease"] != 2 || d.byMode[1]["read-index"] != 1 {
		t.Errorf("reads %v by mode %v", d.reads, d.byMode)
	}
}
