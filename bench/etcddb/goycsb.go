package etcddb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/magiconair/properties"
	_ "github.com/pingcap/go-ycsb/db/etcd" // go-ycsb's own etcd binding, "etcd"
	"github.com/pingcap/go-ycsb/pkg/ycsb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// GoYCSBName is the name of go-ycsb's own etcd binding with its Scan
// corrected (see GoYCSB).
const GoYCSBName = "etcd-goycsb"

// goYCSBInner is the name go-ycsb v1.0.1 registers its etcd binding under.
const goYCSBInner = "etcd"

func init() {
	ycsb.RegisterDBCreator(GoYCSBName, goYCSBCreator{})
}

// GoYCSB is go-ycsb v1.0.1's etcd binding (package
// github.com/pingcap/go-ycsb/db/etcd, registered as "etcd") with one method
// replaced: Scan. Read, Insert, Update and Delete are go-ycsb's, unchanged
// (records as JSON under "TABLE:KEY", linearizable reads, an update
// overwrites the record), and it takes go-ycsb's properties etcd.endpoints
// and etcd.dial_timeout (plain http: it refuses https endpoints, whose TLS
// properties go-ycsb's binding reads but its Scan's client would not).
//
// go-ycsb's Scan fails whenever the range holds more keys than asked for,
// that is almost always: it asks for the keys from the start key to the end
// of the whole keyspace (WithFromKey) with a limit, then requires
// RangeResponse.Count, which etcd sets to the number of keys in the whole
// range and not to the number returned under the limit, to equal the
// limit. (It also returns count nil records ahead of the decoded ones.)
// GoYCSB's Scan reads the same records with its own client: a range from
// the start key to the end of the table, limit count, the records decoded
// from go-ycsb's JSON. It returns fewer than count records when the table
// ends first, as every other binding does.
type GoYCSB struct {
	ycsb.DB // go-ycsb's binding
	cli     *clientv3.Client
}

var _ ycsb.DB = (*GoYCSB)(nil)

type goYCSBCreator struct{}

// Create implements ycsb.DBCreator: go-ycsb's binding and a client of the
// same endpoints for Scan.
func (goYCSBCreator) Create(p *properties.Properties) (ycsb.DB, error) {
	inner := ycsb.GetDBCreator(goYCSBInner)
	if inner == nil {
		return nil, fmt.Errorf("%s: go-ycsb's %q binding is not registered", GoYCSBName, goYCSBInner)
	}
	endpoints := p.GetString("etcd.endpoints", "localhost:2379")
	cfg := clientv3.Config{
		Endpoints:   strings.Split(endpoints, ","),
		DialTimeout: p.GetDuration("etcd.dial_timeout", 2*time.Second),
		Logger:      zap.NewNop(),
	}
	if strings.Contains(endpoints, "https") { // how go-ycsb decides on TLS
		return nil, fmt.Errorf("%s: https endpoints are not supported (%s)", GoYCSBName, endpoints)
	}
	db, err := inner.Create(p)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("%s: connect to %s: %w", GoYCSBName, endpoints, err)
	}
	return &GoYCSB{DB: db, cli: cli}, nil
}

// goYCSBKey is go-ycsb's row key.
func goYCSBKey(table, key string) string { return table + ":" + key }

// Scan implements ycsb.DB: up to count records of table from startKey on,
// in key order (';' is the byte after ':', so "TABLE;" ends the table).
func (db *GoYCSB) Scan(ctx context.Context, table, startKey string, count int, fields []string) ([]map[string][]byte, error) {
	start := goYCSBKey(table, startKey)
	resp, err := db.cli.Get(ctx, start, clientv3.WithRange(table+";"), clientv3.WithLimit(int64(count)))
	if err != nil {
		return nil, fmt.Errorf("etcd scan from %s: %w", start, err)
	}
	out := make([]map[string][]byte, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r map[string][]byte
		if err := json.NewDecoder(bytes.NewReader(kv.Value)).Decode(&r); err != nil {
			return nil, fmt.Errorf("etcd scan: key %q: %w", kv.Key, err)
		}
		if len(fields) > 0 {
			sel := make(map[string][]byte, len(fields))
			for _, f := range fields {
				if v, ok := r[f]; ok {
					sel[f] = v
				}
			}
			r = sel
		}
		out = append(out, r)
	}
	return out, nil
}

// Close implements ycsb.DB.
func (db *GoYCSB) Close() error {
	return errors.Join(db.DB.Close(), db.cli.Close())
}
