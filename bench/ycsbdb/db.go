// Package ycsbdb is the go-ycsb binding of hedgekv: a ycsb.DB (and
// ycsb.BatchDB) over the hedgekv Go client, registered with go-ycsb's DB
// registry as "hedgekv". Importing the package (even for its side effect
// only) makes "hedgekv" available to go-ycsb's client and to bench.Run.
//
// # Properties
//
//	hedgekv.endpoints        comma-separated store addresses (default: the local cluster, 127.0.0.1:20161-20163)
//	hedgekv.zone             the client's zone label, used by the "closest" policy
//	hedgekv.read             leader | follower | mixed | closest | prefer-leader | round-robin (default leader)
//	hedgekv.max_staleness    Go duration; > 0 permits bounded-staleness reads (default 0: linearizable)
//	hedgekv.hedge            off | 10ms | p90 | p99 | p999 | min(p99,50ms) | max(p99,5ms) (default off)
//	hedgekv.hedge_budget     at most this fraction of reads hedged over the budget's window, in [0,1] (default 0.05)
//	hedgekv.hedge_window     Go duration: how long a read counts towards the budget (default 10s)
//	hedgekv.hedge_min_per_second  the budget's floor, hedges a second per store whatever the read rate (default 1)
//	hedgekv.busy_threshold   Go duration; > 0 lets a store whose estimated wait is longer refuse a read so it goes elsewhere (default 0)
//	hedgekv.dial_timeout     Go duration (default 5s)
//	hedgekv.request_timeout  Go duration, per operation (default 10s)
//	hedgekv.tls_cert, hedgekv.tls_key, hedgekv.tls_ca
//	                         PEM files: mutual TLS with the client's certificate, its key and the stores' CA (all three or none)
//
// # Data layout
//
// A record is stored under the key "TABLE/KEY" as one value holding all of
// its fields (see EncodeRecord). A scan of a table is bounded by the table
// prefix, so tables never bleed into each other.
//
// # Consistency of update
//
// YCSB's update replaces some fields of a record and keeps the others. hedgekv
// has no multi-key or compare-and-set transaction, so Update is a
// read-modify-write: a linearizable Get at the leader, a merge, then a Put.
// Two concurrent updates of different fields of the same record can lose one
// of them. go-ycsb's other plain KV bindings (tikv raw, etcd, redis, ...)
// make the same trade-off; it does not change the work YCSB measures. The read
// half of an update always goes to the leader whatever hedgekv.read says, so a
// stale read never feeds a write.
package ycsbdb

import (
	"context"
	"crypto/tls"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/magiconair/properties"
	"github.com/pingcap/go-ycsb/pkg/ycsb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgekv/hedgekv/client"
)

// Name is the name the binding is registered under in go-ycsb.
const Name = "hedgekv"

// Property names.
const (
	PropEndpoints      = "hedgekv.endpoints"
	PropZone           = "hedgekv.zone"
	PropRead           = "hedgekv.read"
	PropMaxStaleness   = "hedgekv.max_staleness"
	PropHedge          = "hedgekv.hedge"
	PropHedgeBudget    = "hedgekv.hedge_budget"
	PropBusyThreshold  = "hedgekv.busy_threshold"
	PropHedgeWindow    = "hedgekv.hedge_window"
	PropHedgeMinPerSec = "hedgekv.hedge_min_per_second"
	PropDialTimeout    = "hedgekv.dial_timeout"
	PropRequestTimeout = "hedgekv.request_timeout"
	PropTLSCert        = "hedgekv.tls_cert"
	PropTLSKey         = "hedgekv.tls_key"
	PropTLSCA          = "hedgekv.tls_ca"
)

// DefaultEndpoints are the local cluster's (scripts/cluster.sh).
const DefaultEndpoints = "127.0.0.1:20161,127.0.0.1:20162,127.0.0.1:20163"

// MaxScanLimit is the largest limit one Scan RPC accepts; longer YCSB scans
// are split into several RPCs.
const MaxScanLimit = 10000

// scanPage is the limit of one Scan RPC (a variable for tests).
var scanPage = MaxScanLimit

func init() {
	ycsb.RegisterDBCreator(Name, creator{})
}

// Options configures a DB.
type Options struct {
	Endpoints      []string
	Zone           string
	Read           client.ReadPolicy
	DialTimeout    time.Duration
	RequestTimeout time.Duration
	TLS            *tls.Config // nil: plaintext
}

// OptionsFromProperties reads the hedgekv.* properties.
func OptionsFromProperties(p *properties.Properties) (Options, error) {
	o := Options{
		Endpoints: SplitList(p.GetString(PropEndpoints, DefaultEndpoints)),
		Zone:      p.GetString(PropZone, ""),
	}
	if len(o.Endpoints) == 0 {
		return Options{}, fmt.Errorf("%s: no endpoints", PropEndpoints)
	}
	var err error
	if o.Read.Replica, err = client.ParseReplicaPolicy(p.GetString(PropRead, "leader")); err != nil {
		return Options{}, fmt.Errorf("%s: %w", PropRead, err)
	}
	if o.Read.MaxStaleness, err = durationProp(p, PropMaxStaleness, 0); err != nil {
		return Options{}, err
	}
	if o.Read.Hedge, err = client.ParseHedge(p.GetString(PropHedge, "off")); err != nil {
		return Options{}, fmt.Errorf("%s: %w", PropHedge, err)
	}
	budget, err := strconv.ParseFloat(strings.TrimSpace(p.GetString(PropHedgeBudget, strconv.FormatFloat(client.DefaultHedgeBudget, 'g', -1, 64))), 64)
	if err != nil || budget < 0 || budget > 1 {
		return Options{}, fmt.Errorf("%s: want a fraction in [0,1], got %q", PropHedgeBudget, p.GetString(PropHedgeBudget, ""))
	}
	if budget == 0 {
		budget = -1 // the client's "no hedges"; its zero means the default
	}
	o.Read.HedgeBudget = budget
	if o.Read.BusyThreshold, err = durationProp(p, PropBusyThreshold, 0); err != nil {
		return Options{}, err
	}
	if o.Read.HedgeWindow, err = durationProp(p, PropHedgeWindow, client.DefaultHedgeWindow); err != nil {
		return Options{}, err
	}
	minPerSec, err := strconv.ParseFloat(strings.TrimSpace(p.GetString(PropHedgeMinPerSec, strconv.FormatFloat(client.DefaultHedgeMinPerSecond, 'g', -1, 64))), 64)
	if err != nil || minPerSec < 0 {
		return Options{}, fmt.Errorf("%s: want a rate >= 0, got %q", PropHedgeMinPerSec, p.GetString(PropHedgeMinPerSec, ""))
	}
	if minPerSec == 0 {
		minPerSec = -1 // the client's "no floor"; its zero means the default
	}
	o.Read.HedgeMinPerSecond = minPerSec
	if o.DialTimeout, err = durationProp(p, PropDialTimeout, 5*time.Second); err != nil {
		return Options{}, err
	}
	if o.RequestTimeout, err = durationProp(p, PropRequestTimeout, 10*time.Second); err != nil {
		return Options{}, err
	}
	cert, key, ca := p.GetString(PropTLSCert, ""), p.GetString(PropTLSKey, ""), p.GetString(PropTLSCA, "")
	if cert != "" || key != "" || ca != "" {
		if cert == "" || key == "" || ca == "" {
			return Options{}, fmt.Errorf("%s, %s and %s go together", PropTLSCert, PropTLSKey, PropTLSCA)
		}
		if o.TLS, err = client.LoadTLS(cert, key, ca); err != nil {
			return Options{}, err
		}
	}
	return o, nil
}

// durationProp parses a Go duration ("250ms", "5s"); "0" means zero.
func durationProp(p *properties.Properties, key string, def time.Duration) (time.Duration, error) {
	s, ok := p.Get(key)
	if !ok || strings.TrimSpace(s) == "" {
		return def, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", key, err)
	}
	if d < 0 {
		return 0, fmt.Errorf("%s: negative duration %v", key, d)
	}
	return d, nil
}

// SplitList splits a comma-separated list, dropping blanks.
func SplitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

type creator struct{}

// Create implements ycsb.DBCreator.
func (creator) Create(p *properties.Properties) (ycsb.DB, error) {
	o, err := OptionsFromProperties(p)
	if err != nil {
		return nil, err
	}
	return Open(context.Background(), o)
}

// DB is a ycsb.DB over a hedgekv client.
type DB struct {
	cli     *client.Client
	owned   bool
	reads   *client.Session // the configured read policy
	current *client.Session // linearizable leader reads for read-modify-write
	// unregister takes the client's collector off Metrics.
	unregister func()
}

// Metrics holds the hedging counters of every client Open made (labelled
// client="1", "2", ... in the order they were opened), for a process that
// drives workloads to serve on /metrics (hedgekv bench ycsb
// --metrics-listen). A client leaves it when its DB is closed.
var Metrics = prometheus.NewRegistry()

var clientSeq atomic.Uint64

var (
	_ ycsb.DB      = (*DB)(nil)
	_ ycsb.BatchDB = (*DB)(nil)
)

// Open connects a new client; Close closes it.
func Open(ctx context.Context, o Options) (*DB, error) {
	cli, err := client.New(ctx, client.Config{
		Endpoints:      o.Endpoints,
		Zone:           o.Zone,
		DialTimeout:    o.DialTimeout,
		RequestTimeout: o.RequestTimeout,
		TLS:            o.TLS,
	})
	if err != nil {
		return nil, fmt.Errorf("hedgekv ycsb: connect to %v: %w", o.Endpoints, err)
	}
	db := New(cli, o.Read)
	db.owned = true
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"client": strconv.FormatUint(clientSeq.Add(1), 10)}, Metrics)
	col := cli.Collector()
	if err := reg.Register(col); err == nil {
		db.unregister = func() { reg.Unregister(col) }
	}
	return db, nil
}

// New returns a DB over an existing client with the given read policy. Its
// Close does not close cli.
func New(cli *client.Client, read client.ReadPolicy) *DB {
	return &DB{
		cli:     cli,
		reads:   cli.Session(read),
		current: cli.Session(client.ReadPolicy{Replica: client.ReplicaLeader}),
	}
}

// RowKey is the hedgekv key of a YCSB record.
func RowKey(table, key string) []byte {
	b := make([]byte, 0, len(table)+1+len(key))
	b = append(b, table...)
	b = append(b, '/')
	return append(b, key...)
}

// tableEnd is the first key after every key of table ("TABLE0": '0' follows '/').
func tableEnd(table string) []byte {
	return append([]byte(table), '/'+1)
}

// Close implements ycsb.DB.
func (db *DB) Close() error {
	if !db.owned {
		return nil
	}
	if db.unregister != nil {
		db.unregister()
	}
	if err := db.cli.Close(); err != nil {
		return fmt.Errorf("hedgekv ycsb: close client: %w", err)
	}
	return nil
}

// InitThread implements ycsb.DB; the client is shared by all threads.
func (db *DB) InitThread(ctx context.Context, _, _ int) context.Context { return ctx }

// CleanupThread implements ycsb.DB.
func (db *DB) CleanupThread(context.Context) {}

// Read implements ycsb.DB. A missing record is an error wrapping
// client.ErrNotFound, so YCSB counts it as a failed read.
func (db *DB) Read(ctx context.Context, table, key string, fields []string) (map[string][]byte, error) {
	v, err := db.reads.Get(ctx, RowKey(table, key))
	if err != nil {
		return nil, fmt.Errorf("hedgekv ycsb: read %s/%s: %w", table, key, err)
	}
	rec, err := DecodeFields(v, fields)
	if err != nil {
		return nil, fmt.Errorf("hedgekv ycsb: read %s/%s: %w", table, key, err)
	}
	return rec, nil
}

// BatchRead implements ycsb.BatchDB with one BatchGet. Missing records are
// nil entries, as in go-ycsb's tikv binding.
func (db *DB) BatchRead(ctx context.Context, table string, keys []string, fields []string) ([]map[string][]byte, error) {
	rowKeys := make([][]byte, len(keys))
	for i, k := range keys {
		rowKeys[i] = RowKey(table, k)
	}
	got, err := db.reads.BatchGet(ctx, rowKeys)
	if err != nil {
		return nil, fmt.Errorf("hedgekv ycsb: batch read of %d keys: %w", len(keys), err)
	}
	out := make([]map[string][]byte, len(keys))
	for i, k := range rowKeys {
		v, ok := got[string(k)]
		if !ok {
			continue
		}
		if out[i], err = DecodeFields(v, fields); err != nil {
			return nil, fmt.Errorf("hedgekv ycsb: batch read %s: %w", k, err)
		}
	}
	return out, nil
}

// Scan implements ycsb.DB: up to count records of table from startKey on,
// in key order. Scans longer than MaxScanLimit take several RPCs.
// A count below 1 returns nothing.
func (db *DB) Scan(ctx context.Context, table, startKey string, count int, fields []string) ([]map[string][]byte, error) {
	if count <= 0 {
		return nil, nil
	}
	start, end := RowKey(table, startKey), tableEnd(table)
	out := make([]map[string][]byte, 0, min(count, scanPage))
	for len(out) < count {
		limit := min(count-len(out), scanPage)
		kvs, err := db.reads.Scan(ctx, start, end, limit)
		if err != nil {
			return nil, fmt.Errorf("hedgekv ycsb: scan %s from %q: %w", table, startKey, err)
		}
		for _, kv := range kvs {
			rec, err := DecodeFields(kv.Value, fields)
			if err != nil {
				return nil, fmt.Errorf("hedgekv ycsb: scan %s: key %q: %w", table, kv.Key, err)
			}
			out = append(out, rec)
		}
		if len(kvs) < limit {
			break // the table has no more records
		}
		start = append(append([]byte(nil), kvs[len(kvs)-1].Key...), 0)
	}
	return out, nil
}

// Update implements ycsb.DB as a read-modify-write (see the package doc).
// Updating a record that does not exist is an error wrapping
// client.ErrNotFound, as in YCSB's Java KV bindings.
func (db *DB) Update(ctx context.Context, table, key string, values map[string][]byte) error {
	k := RowKey(table, key)
	old, err := db.current.Get(ctx, k)
	if err != nil {
		return fmt.Errorf("hedgekv ycsb: update %s/%s: read: %w", table, key, err)
	}
	merged, err := MergeRecord(old, values)
	if err != nil {
		return fmt.Errorf("hedgekv ycsb: update %s/%s: %w", table, key, err)
	}
	if err := db.cli.Put(ctx, k, merged); err != nil {
		return fmt.Errorf("hedgekv ycsb: update %s/%s: write: %w", table, key, err)
	}
	return nil
}

// BatchUpdate implements ycsb.BatchDB: one BatchGet at the leader, then one
// Put per record.
func (db *DB) BatchUpdate(ctx context.Context, table string, keys []string, values []map[string][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("hedgekv ycsb: batch update: %d keys but %d values", len(keys), len(values))
	}
	rowKeys := make([][]byte, len(keys))
	for i, k := range keys {
		rowKeys[i] = RowKey(table, k)
	}
	old, err := db.current.BatchGet(ctx, rowKeys)
	if err != nil {
		return fmt.Errorf("hedgekv ycsb: batch update: read: %w", err)
	}
	for i, k := range rowKeys {
		prev, ok := old[string(k)]
		if !ok {
			return fmt.Errorf("hedgekv ycsb: batch update %s: %w", k, client.ErrNotFound)
		}
		merged, err := MergeRecord(prev, values[i])
		if err != nil {
			return fmt.Errorf("hedgekv ycsb: batch update %s: %w", k, err)
		}
		if err := db.cli.Put(ctx, k, merged); err != nil {
			return fmt.Errorf("hedgekv ycsb: batch update %s: write: %w", k, err)
		}
	}
	return nil
}

// Insert implements ycsb.DB: one Put of the whole record.
func (db *DB) Insert(ctx context.Context, table, key string, values map[string][]byte) error {
	if err := db.cli.Put(ctx, RowKey(table, key), EncodeRecord(values)); err != nil {
		return fmt.Errorf("hedgekv ycsb: insert %s/%s: %w", table, key, err)
	}
	return nil
}

// BatchInsert implements ycsb.BatchDB with one Put per record.
func (db *DB) BatchInsert(ctx context.Context, table string, keys []string, values []map[string][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("hedgekv ycsb: batch insert: %d keys but %d values", len(keys), len(values))
	}
	for i, k := range keys {
		if err := db.Insert(ctx, table, k, values[i]); err != nil {
			return err
		}
	}
	return nil
}

// Delete implements ycsb.DB.
func (db *DB) Delete(ctx context.Context, table, key string) error {
	if err := db.cli.Delete(ctx, RowKey(table, key)); err != nil {
		return fmt.Errorf("hedgekv ycsb: delete %s/%s: %w", table, key, err)
	}
	return nil
}

// BatchDelete implements ycsb.BatchDB with one Delete per record.
func (db *DB) BatchDelete(ctx context.Context, table string, keys []string) error {
	for _, k := range keys {
		if err := db.Delete(ctx, table, k); err != nil {
			return err
		}
	}
	return nil
}
