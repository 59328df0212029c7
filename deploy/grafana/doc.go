// Package grafana holds hedgekv's Grafana dashboard, hedgekv.json: the
// stores' Prometheus metrics (each store's status port, /metrics) for an
// operator. The package has no code; its test starts a real cluster,
// scrapes it, and fails naming any series the dashboard plots that the
// stores (or, for the client panels, client.Collector) do not export.
package grafana
