// Package etcddb is a go-ycsb binding of etcd v3, registered as "etcdkv",
// that stores records exactly as the hedgekv binding (package ycsbdb) does,
// so the peer-etcd scenario compares the two stores and not two encodings.
//
// go-ycsb v1.0.1 ships its own etcd binding ("etcd", package
// github.com/pingcap/go-ycsb/db/etcd). Its Scan fails almost always: it
// checks RangeResponse.Count, which etcd sets to the number of keys in the
// whole range, not to the number returned under the limit, and the range
// it asks for (WithFromKey) runs to the end of the keyspace. This package
// also registers that binding with Scan corrected, as "etcd-goycsb"
// (GoYCSB), which bench.RunPeerEtcd uses for EtcdBinding "go-ycsb". It is
// not the default because:
//   - it cannot do serializable reads, which the scenario compares;
//   - its Update overwrites the whole record instead of merging fields, and it
//     encodes records as JSON, so its per-operation work differs from hedgekv's.
//
// # Properties
//
//	etcd.endpoints        comma-separated client URLs or host:port (default localhost:2379)
//	etcd.dial_timeout     Go duration (default 5s)
//	etcd.request_timeout  Go duration, per operation (default 10s)
//	etcd.read             linearizable | serializable (default linearizable)
//	etcd.hedgekv_read_mode       leader | follower | stale (default: none sent)
//	etcd.hedgekv_max_staleness   Go duration (default: none sent)
//
// Read, Scan and BatchRead honour etcd.read. Update is a read-modify-write
// whose read is always linearizable (not atomic across fields, as with
// hedgekv and go-ycsb's own etcd binding).
//
// The two hedgekv properties are for hedgekv's stores, which serve etcd's
// v3 API (server/etcdapi): the binding appends them to every request's
// context as the gRPC metadata hedgekv-read-mode and hedgekv-max-staleness
// (etcdapi.MetadataReadMode, etcdapi.MetadataMaxStaleness), the session's
// read mode for its linearizable Ranges (the read of an Update included);
// without them a store uses its default (--etcd-read-mode: leader). etcd
// ignores metadata it does not know, so they change nothing against etcd.
package etcddb

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/magiconair/properties"
	"github.com/pingcap/go-ycsb/pkg/ycsb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// Name is the name the binding is registered under in go-ycsb.
const Name = "etcdkv"

// Property names.
const (
	PropEndpoints      = "etcd.endpoints"
	PropDialTimeout    = "etcd.dial_timeout"
	PropRequestTimeout = "etcd.request_timeout"
	PropRead           = "etcd.read"
	// PropHedgeKVReadMode: the hedgekv-read-mode metadata of every request
	// (etcdapi.ReadLeader, ReadFollower or ReadStale).
	PropHedgeKVReadMode = "etcd.hedgekv_read_mode"
	// PropHedgeKVMaxStaleness: the hedgekv-max-staleness metadata of every
	// request (the bound of the stale mode).
	PropHedgeKVMaxStaleness = "etcd.hedgekv_max_staleness"
)

// Read consistency levels.
const (
	ReadLinearizable = "linearizable"
	ReadSerializable = "serializable"
)

// ErrNotFound is wrapped by Read and Update of a missing record.
var ErrNotFound = errors.New("etcd ycsb: record not found")

func init() {
	ycsb.RegisterDBCreator(Name, creator{})
}

type creator struct{}

// Create implements ycsb.DBCreator.
func (creator) Create(p *properties.Properties) (ycsb.DB, error) {
	o := Options{
		Endpoints: ycsbdb.SplitList(p.GetString(PropEndpoints, "localhost:2379")),
		Read:      p.GetString(PropRead, ReadLinearizable),
		// HedgeKVReadMode is checked by Open.
		HedgeKVReadMode: strings.TrimSpace(p.GetString(PropHedgeKVReadMode, "")),
	}
	var err error
	if o.DialTimeout, err = duration(p, PropDialTimeout, 5*time.Second); err != nil {
		return nil, err
	}
	if o.RequestTimeout, err = duration(p, PropRequestTimeout, 10*time.Second); err != nil {
		return nil, err
	}
	if o.HedgeKVMaxStaleness, err = duration(p, PropHedgeKVMaxStaleness, 0); err != nil {
		return nil, err
	}
	return Open(o)
}

func duration(p *properties.Properties, key string, def time.Duration) (time.Duration, error) {
	s, ok := p.Get(key)
	if !ok || strings.TrimSpace(s) == "" {
		return def, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", key, err)
	}
	return d, nil
}

// Options configures a DB.
type Options struct {
	Endpoints      []string
	DialTimeout    time.Duration
	RequestTimeout time.Duration
	Read           string // ReadLinearizable or ReadSerializable
	// HedgeKVReadMode, if set, is sent with every request as the gRPC
	// metadata hedgekv-read-mode: hedgekv's session read mode
	// (etcdapi.ReadLeader, ReadFollower or ReadStale).
	HedgeKVReadMode string
	// HedgeKVMaxStaleness, if > 0, is sent with every request as
	// hedgekv-max-staleness (the bound of the stale read mode).
	HedgeKVMaxStaleness time.Duration
}

// DB is a ycsb.DB over an etcd v3 client.
type DB struct {
	cli     *clientv3.Client
	readOps []clientv3.OpOption
	timeout time.Duration
	// md: key/value pairs appended to every request's outgoing metadata.
	md []string
}

var (
	_ ycsb.DB      = (*DB)(nil)
	_ ycsb.BatchDB = (*DB)(nil)
)

// Open connects to etcd.
func Open(o Options) (*DB, error) {
	if len(o.Endpoints) == 0 {
		return nil, fmt.Errorf("%s: no endpoints", PropEndpoints)
	}
	var readOps []clientv3.OpOption
	switch o.Read {
	case "", ReadLinearizable:
	case ReadSerializable:
		readOps = append(readOps, clientv3.WithSerializable())
	default:
		return nil, fmt.Errorf("%s: unknown read consistency %q (want %s or %s)", PropRead, o.Read, ReadLinearizable, ReadSerializable)
	}
	var md []string
	switch o.HedgeKVReadMode {
	case "":
	case etcdapi.ReadLeader, etcdapi.ReadFollower, etcdapi.ReadStale:
		md = append(md, etcdapi.MetadataReadMode, o.HedgeKVReadMode)
	default:
		return nil, fmt.Errorf("%s: unknown hedgekv read mode %q (want %s, %s or %s)", PropHedgeKVReadMode, o.HedgeKVReadMode,
			etcdapi.ReadLeader, etcdapi.ReadFollower, etcdapi.ReadStale)
	}
	switch {
	case o.HedgeKVMaxStaleness < 0:
		return nil, fmt.Errorf("%s: %v is negative", PropHedgeKVMaxStaleness, o.HedgeKVMaxStaleness)
	case o.HedgeKVMaxStaleness > 0:
		md = append(md, etcdapi.MetadataMaxStaleness, o.HedgeKVMaxStaleness.String())
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   o.Endpoints,
		DialTimeout: o.DialTimeout,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd ycsb: connect to %v: %w", o.Endpoints, err)
	}
	return &DB{cli: cli, readOps: readOps, timeout: o.RequestTimeout, md: md}, nil
}

// opContext is the context of one operation: its timeout, and the hedgekv
// metadata.
func (db *DB) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if len(db.md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, db.md...)
	}
	if db.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, db.timeout)
}

func rowKey(table, key string) string { return table + "/" + key }
func tableEnd(table string) string    { return table + "0" } // '0' follows '/'

// Close implements ycsb.DB.
func (db *DB) Close() error {
	if err := db.cli.Close(); err != nil {
		return fmt.Errorf("etcd ycsb: close: %w", err)
	}
	return nil
}

// InitThread implements ycsb.DB.
func (db *DB) InitThread(ctx context.Context, _, _ int) context.Context { return ctx }

// CleanupThread implements ycsb.DB.
func (db *DB) CleanupThread(context.Context) {}

// Read implements ycsb.DB.
func (db *DB) Read(ctx context.Context, table, key string, fields []string) (map[string][]byte, error) {
	ctx, cancel := db.opContext(ctx)
	defer cancel()
	k := rowKey(table, key)
	resp, err := db.cli.Get(ctx, k, db.readOps...)
	if err != nil {
		return nil, fmt.Errorf("etcd ycsb: read %s: %w", k, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("etcd ycsb: read %s: %w", k, ErrNotFound)
	}
	rec, err := ycsbdb.DecodeFields(resp.Kvs[0].Value, fields)
	if err != nil {
		return nil, fmt.Errorf("etcd ycsb: read %s: %w", k, err)
	}
	return rec, nil
}

// BatchRead implements ycsb.BatchDB with one transaction of Gets; missing
// records are nil entries.
func (db *DB) BatchRead(ctx context.Context, table string, keys []string, fields []string) ([]map[string][]byte, error) {
	ctx, cancel := db.opContext(ctx)
	defer cancel()
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpGet(rowKey(table, k), db.readOps...)
	}
	resp, err := db.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("etcd ycsb: batch read of %d keys: %w", len(keys), err)
	}
	out := make([]map[string][]byte, len(keys))
	for i, r := range resp.Responses {
		kvs := r.GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			continue
		}
		if out[i], err = ycsbdb.DecodeFields(kvs[0].Value, fields); err != nil {
			return nil, fmt.Errorf("etcd ycsb: batch read %s: %w", kvs[0].Key, err)
		}
	}
	return out, nil
}

// Scan implements ycsb.DB, bounded by the table's key prefix.
func (db *DB) Scan(ctx context.Context, table, startKey string, count int, fields []string) ([]map[string][]byte, error) {
	ctx, cancel := db.opContext(ctx)
	defer cancel()
	opts := append([]clientv3.OpOption{clientv3.WithRange(tableEnd(table)), clientv3.WithLimit(int64(count))}, db.readOps...)
	resp, err := db.cli.Get(ctx, rowKey(table, startKey), opts...)
	if err != nil {
		return nil, fmt.Errorf("etcd ycsb: scan %s from %q: %w", table, startKey, err)
	}
	out := make([]map[string][]byte, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		rec, err := ycsbdb.DecodeFields(kv.Value, fields)
		if err != nil {
			return nil, fmt.Errorf("etcd ycsb: scan %s: key %q: %w", table, kv.Key, err)
		}
		out = append(out, rec)
	}
	return out, nil
}

// Update implements ycsb.DB as a read-modify-write.
func (db *DB) Update(ctx context.Context, table, key string, values map[string][]byte) error {
	ctx, cancel := db.opContext(ctx)
	defer cancel()
	k := rowKey(table, key)
	resp, err := db.cli.Get(ctx, k)
	if err != nil {
		return fmt.Errorf("etcd ycsb: update %s: read: %w", k, err)
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("etcd ycsb: update %s: %w", k, ErrNotFound)
	}
	merged, err := ycsbdb.MergeRecord(resp.Kvs[0].Value, values)
	if err != nil {
		return fmt.Errorf("etcd ycsb: update %s: %w", k, err)
	}
	if _, err := db.cli.Put(ctx, k, string(merged)); err != nil {
		return fmt.Errorf("etcd ycsb: update %s: write: %w", k, err)
	}
	return nil
}

// BatchUpdate implements ycsb.BatchDB with one Update per record.
func (db *DB) BatchUpdate(ctx context.Context, table string, keys []string, values []map[string][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("etcd ycsb: batch update: %d keys but %d values", len(keys), len(values))
	}
	for i, k := range keys {
		if err := db.Update(ctx, table, k, values[i]); err != nil {
			return err
		}
	}
	return nil
}

// Insert implements ycsb.DB.
func (db *DB) Insert(ctx context.Context, table, key string, values map[string][]byte) error {
	ctx, cancel := db.opContext(ctx)
	defer cancel()
	k := rowKey(table, key)
	if _, err := db.cli.Put(ctx, k, string(ycsbdb.EncodeRecord(values))); err != nil {
		return fmt.Errorf("etcd ycsb: insert %s: %w", k, err)
	}
	return nil
}

// BatchInsert implements ycsb.BatchDB with one transaction of Puts.
func (db *DB) BatchInsert(ctx context.Context, table string, keys []string, values []map[string][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("etcd ycsb: batch insert: %d keys but %d values", len(keys), len(values))
	}
	ctx, cancel := db.opContext(ctx)
	defer cancel()
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpPut(rowKey(table, k), string(ycsbdb.EncodeRecord(values[i])))
	}
	if _, err := db.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("etcd ycsb: batch insert of %d records: %w", len(keys), err)
	}
	return nil
}

// Delete implements ycsb.DB.
func (db *DB) Delete(ctx context.Context, table, key string) error {
	ctx, cancel := db.opContext(ctx)
	defer cancel()
	k := rowKey(table, key)
	if _, err := db.cli.Delete(ctx, k); err != nil {
		return fmt.Errorf("etcd ycsb: delete %s: %w", k, err)
	}
	return nil
}

// BatchDelete implements ycsb.BatchDB with one transaction of Deletes.
func (db *DB) BatchDelete(ctx context.Context, table string, keys []string) error {
	ctx, cancel := db.opContext(ctx)
	defer cancel()
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpDelete(rowKey(table, k))
	}
	if _, err := db.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("etcd ycsb: batch delete of %d records: %w", len(keys), err)
	}
	return nil
}
