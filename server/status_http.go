package server

import (
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"
)

// statusHandler serves /metrics (this server's Prometheus registry),
// /status (the Admin Status answer as JSON), /healthz and /readyz
// (health.go) and /debug/pprof.
func (s *Server) statusHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.health.serveHealthz)
	mux.HandleFunc("GET /readyz", s.health.serveReadyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{Registry: s.metrics.reg}))
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		// Proto field names and zero values, so that "leader_store_id": 0
		// (no known leader) is visible rather than omitted.
		body, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(s.admin.localStatus())
		if err == nil {
			body, err = statusKeys(body) // keys as ctl regions shows them, not base64
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(body, '\n'))
	})
	// Profiles, on the status port only (loopback in every deployment here):
	// how the performance figures in the README were investigated.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
}
