package client

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the client's hedging counters (every session's, as
// Client.HedgeStats sums them) for a Prometheus registry, so a process that
// embeds the client can serve them on its /metrics beside its own. The
// stores count the other half: hedgekv_hedge_reads_total and
// hedgekv_hedge_reads_cancelled_total.
func (c *Client) Collector() prometheus.Collector { return &clientCollector{c: c} }

var (
	descPrimaries = prometheus.NewDesc("hedgekv_client_hedge_primaries_total",
		"Reads sent under a hedging policy (first attempts; a retry after a region error counts again).", nil, nil)
	descHedgesSent = prometheus.NewDesc("hedgekv_client_hedges_sent_total",
		"Backup requests sent because a read was late.", nil, nil)
	descHedgesWon = prometheus.NewDesc("hedgekv_client_hedges_won_total",
		"Backup requests that answered first.", nil, nil)
	descHedgesDenied = prometheus.NewDesc("hedgekv_client_hedges_denied_total",
		"Backup requests not sent because the hedge budget had no token.", nil, nil)
	descExtraRatio = prometheus.NewDesc("hedgekv_client_hedge_extra_request_ratio",
		"Backup requests sent per primary since the client started.", nil, nil)
)

type clientCollector struct{ c *Client }

func (cc *clientCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPrimaries, descHedgesSent, descHedgesWon, descHedgesDenied, descExtraRatio} {
		ch <- d
	}
}

func (cc *clientCollector) Collect(ch chan<- prometheus.Metric) {
	st := cc.c.HedgeStats()
	ch <- prometheus.MustNewConstMetric(descPrimaries, prometheus.CounterValue, float64(st.Primaries))
	ch <- prometheus.MustNewConstMetric(descHedgesSent, prometheus.CounterValue, float64(st.HedgesSent))
	ch <- prometheus.MustNewConstMetric(descHedgesWon, prometheus.CounterValue, float64(st.HedgesWon))
	ch <- prometheus.MustNewConstMetric(descHedgesDenied, prometheus.CounterValue, float64(st.DeniedByBudget))
	ch <- prometheus.MustNewConstMetric(descExtraRatio, prometheus.GaugeValue, st.ExtraRequestRatio())
}
