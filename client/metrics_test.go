package client

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCollectorExportsHedgeStats(t *testing.T) {
	cl, c := newWarmClient(t)
	// The leader never answers a Get: every read is won by a hedge.
	cl.SetHook(slowStore(1, "Get", nil))
	s := c.Session(ReadPolicy{Replica: ReplicaLeader, Hedge: HedgeAfter(5 * time.Millisecond), HedgeBudget: 1})
	for range 4 {
		if _, err := s.Get(context.Background(), []byte("k")); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c.Collector()); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP hedgekv_client_hedges_won_total Backup requests that answered first.
# TYPE hedgekv_client_hedges_won_total counter
hedgekv_client_hedges_won_total 4
# HELP hedgekv_client_hedge_extra_request_ratio Backup requests sent per primary since the client started.
# TYPE hedgekv_client_hedge_extra_request_ratio gauge
hedgekv_client_hedge_extra_request_ratio 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hedgekv_client_hedges_won_total", "hedgekv_client_hedge_extra_request_ratio"); err != nil {
		t.Fatal(err)
	}
}
