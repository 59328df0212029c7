package netsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Status is what GET /status answers.
type Status struct {
	Topology *Topology `json:"topology"`
	// PartitionMode is what a partition does when the request names no
	// mode.
	PartitionMode PartitionMode `json:"partition_mode"`
	Links         []LinkStatus  `json:"links"`
	// Partitioned are the partitioned stores, ascending (never null).
	Partitioned []uint64 `json:"partitioned"`
	// WANBytes: see Network.WANBytes.
	WANBytes uint64 `json:"wan_bytes"`
}

// LinkStatus is one (zone → store) link.
type LinkStatus struct {
	Zone      string   `json:"zone"` // where the traffic comes from
	Store     uint64   `json:"store"`
	StoreZone string   `json:"store_zone"`
	Address   string   `json:"address"`  // the proxy: what zone Zone dials
	Upstream  string   `json:"upstream"` // the store's own listen address
	Spec      LinkSpec `json:"spec"`
	WAN       bool     `json:"wan"` // Zone != StoreZone
	// Cut is how a partition cuts the link now, "" when it is open.
	Cut   PartitionMode `json:"cut,omitempty"`
	Bytes uint64        `json:"bytes"` // both directions, since Start
}

// Status reports the links, the partitions and the WAN bytes.
func (n *Network) Status() *Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := &Status{
		Topology:      n.topo,
		PartitionMode: n.opts.PartitionMode,
		Partitioned:   []uint64{},
	}
	for s := range n.partitioned {
		st.Partitioned = append(st.Partitioned, s)
	}
	slices.Sort(st.Partitioned)
	for _, l := range n.links {
		ls := LinkStatus{
			Zone: l.zone, Store: l.store, StoreZone: l.storeZone,
			Address: l.addr, Upstream: l.upstream, Spec: l.spec,
			WAN: l.wan(), Cut: l.cut, Bytes: l.gate.n.Load(),
		}
		if ls.WAN {
			st.WANBytes += ls.Bytes
		}
		st.Links = append(st.Links, ls)
	}
	return st
}

// Handler is the control API:
//
//	POST /partition?store=N[&mode=blackhole|disconnect]  cut store N off
//	POST /heal                                           end every partition
//	GET  /status                                         Status as JSON
//
// Partition and heal answer the Status after the change. Errors answer
// {"error": "one line"} with a 4xx or 5xx code.
func (n *Network) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /partition", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		s := q.Get("store")
		if s == "" {
			writeError(w, http.StatusBadRequest, "partition: the store parameter is missing (POST /partition?store=N)")
			return
		}
		store, err := strconv.ParseUint(s, 10, 64)
		if err != nil || store == 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("partition: store %q is not a positive integer", s))
			return
		}
		if _, ok := n.topo.ZoneOf(store); !ok {
			writeError(w, http.StatusNotFound, fmt.Sprintf("partition: store %d is not in the topology (stores %v)", store, n.topo.Stores()))
			return
		}
		mode := n.opts.PartitionMode
		if m := q.Get("mode"); m != "" {
			if mode, err = ParsePartitionMode(m); err != nil {
				writeError(w, http.StatusBadRequest, "partition: "+err.Error())
				return
			}
		}
		if err := n.PartitionWith(store, mode); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, n.Status())
	})
	mux.HandleFunc("POST /heal", func(w http.ResponseWriter, r *http.Request) {
		if err := n.Heal(); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, n.Status())
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, n.Status())
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// Serve serves the control API on addr (port 0 picks one) until Close and
// returns the address it listens on.
func (n *Network) Serve(addr string) (string, error) {
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return "", errors.New("netsim: the network is closed")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("netsim: control API: listen %s: %w", addr, unwrapOp(err))
	}
	srv := &http.Server{Handler: n.Handler(), ReadHeaderTimeout: 10 * time.Second}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		ln.Close()
		return "", errors.New("netsim: the network is closed")
	}
	n.servers = append(n.servers, srv)
	n.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), nil
}

// Control drives a running netsim through its control API.
type Control struct {
	Addr string       // host:port of the control API
	HTTP *http.Client // nil: http.DefaultClient; bound calls with ctx
}

// Partition cuts store off with the netsim's default mode.
func (c Control) Partition(ctx context.Context, store uint64) error {
	return c.PartitionWith(ctx, store, "")
}

// PartitionWith cuts store off with mode ("" for the netsim's default).
func (c Control) PartitionWith(ctx context.Context, store uint64, mode PartitionMode) error {
	q := url.Values{"store": {strconv.FormatUint(store, 10)}}
	if mode != "" {
		q.Set("mode", string(mode))
	}
	return c.do(ctx, http.MethodPost, "/partition?"+q.Encode(), nil)
}

// Heal ends every partition.
func (c Control) Heal(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/heal", nil)
}

// Status fetches the netsim's status.
func (c Control) Status(ctx context.Context) (*Status, error) {
	var st Status
	if err := c.do(ctx, http.MethodGet, "/status", &st); err != nil {
		return nil, err
	}
	return &st, nil
}

func (c Control) do(ctx context.Context, method, path string, out any) error {
	if c.Addr == "" {
		return errors.New("netsim control: no address")
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.Addr+path, nil)
	if err != nil {
		return fmt.Errorf("netsim control %s: %w", c.Addr, err)
	}
	req.Close = true // control calls are rare: no idle connection to a netsim that may be gone
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("netsim control %s: nothing listens there (is \"hedgekv netsim\" running?)", c.Addr)
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("netsim control %s: %w", c.Addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("netsim control %s: %w", c.Addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		msg = strings.Join(strings.Fields(msg), " ")
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		return fmt.Errorf("netsim control %s: %s (HTTP %d)", c.Addr, msg, resp.StatusCode)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("netsim control %s: bad status answer: %w", c.Addr, err)
		}
	}
	return nil
}
