package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/magiconair/properties"
	"github.com/pingcap/go-ycsb/pkg/ycsb"
)

// memDB is an in-memory ycsb.DB for tests: records in a sorted key list.
type memDB struct {
	mu      sync.RWMutex
	keys    []string // sorted "table/key"
	records map[string]map[string][]byte

	reads, scans, updates, inserts, deletes atomic.Int64
	scanLens                                sync.Map // int -> struct{}
}

var errMemNotFound = errors.New("memdb: not found")

func newMemDB() *memDB { return &memDB{records: map[string]map[string][]byte{}} }

func (db *memDB) Close() error                                             { return nil }
func (db *memDB) InitThread(ctx context.Context, _, _ int) context.Context { return ctx }
func (db *memDB) CleanupThread(context.Context)                            {}

func project(rec map[string][]byte, fields []string) map[string][]byte {
	if len(fields) == 0 {
		return maps.Clone(rec)
	}
	out := map[string][]byte{}
	for _, f := range fields {
		if v, ok := rec[f]; ok {
			out[f] = v
		}
	}
	return out
}

func (db *memDB) Read(_ context.Context, table, key string, fields []string) (map[string][]byte, error) {
	db.reads.Add(1)
	db.mu.RLock()
	defer db.mu.RUnlock()
	rec, ok := db.records[table+"/"+key]
	if !ok {
		return nil, fmt.Errorf("read %s/%s: %w", table, key, errMemNotFound)
	}
	return project(rec, fields), nil
}

func (db *memDB) Scan(_ context.Context, table, startKey string, count int, fields []string) ([]map[string][]byte, error) {
	db.scans.Add(1)
	db.scanLens.Store(count, struct{}{})
	db.mu.RLock()
	defer db.mu.RUnlock()
	i := sort.SearchStrings(db.keys, table+"/"+startKey)
	var out []map[string][]byte
	for ; i < len(db.keys) && len(out) < count; i++ {
		out = append(out, project(db.records[db.keys[i]], fields))
	}
	return out, nil
}

func (db *memDB) Update(_ context.Context, table, key string, values map[string][]byte) error {
	db.updates.Add(1)
	db.mu.Lock()
	defer db.mu.Unlock()
	rec, ok := db.records[table+"/"+key]
	if !ok {
		return fmt.Errorf("update %s/%s: %w", table, key, errMemNotFound)
	}
	for k, v := range values {
		rec[k] = slices.Clone(v) // go-ycsb reuses value buffers
	}
	return nil
}

func (db *memDB) Insert(_ context.Context, table, key string, values map[string][]byte) error {
	db.inserts.Add(1)
	rec := make(map[string][]byte, len(values))
	for k, v := range values {
		rec[k] = slices.Clone(v)
	}
	k := table + "/" + key
	db.mu.Lock()
	defer db.mu.Unlock()
	if _, ok := db.records[k]; !ok {
		i := sort.SearchStrings(db.keys, k)
		db.keys = slices.Insert(db.keys, i, k)
	}
	db.records[k] = rec
	return nil
}

func (db *memDB) Delete(_ context.Context, table, key string) error {
	db.deletes.Add(1)
	k := table + "/" + key
	db.mu.Lock()
	defer db.mu.Unlock()
	if _, ok := db.records[k]; ok {
		delete(db.records, k)
		i := sort.SearchStrings(db.keys, k)
		db.keys = slices.Delete(db.keys, i, i+1)
	}
	return nil
}

func (db *memDB) len() int {
	db.mu.RLock()
	defer db.mu.RUnlock()
	return len(db.records)
}

// failingDB fails every operation.
type failingDB struct{ *memDB }

var errInjected = errors.New("injected failure")

func (*failingDB) Read(context.Context, string, string, []string) (map[string][]byte, error) {
	return nil, errInjected
}
func (*failingDB) Insert(context.Context, string, string, map[string][]byte) error {
	return errInjected
}

// Registered names for the registry path of Run.
const (
	memDBName     = "bench-test-memory"
	failingDBName = "bench-test-failing"
)

type memCreator struct{}

func (memCreator) Create(p *properties.Properties) (ycsb.DB, error) {
	if p.GetString("memdb.fail_create", "") != "" {
		return nil, errors.New("memdb: create failed as asked")
	}
	return newMemDB(), nil
}

type failingCreator struct{}

func (failingCreator) Create(*properties.Properties) (ycsb.DB, error) {
	return &failingDB{memDB: newMemDB()}, nil
}

func init() {
	ycsb.RegisterDBCreator(memDBName, memCreator{})
	ycsb.RegisterDBCreator(failingDBName, failingCreator{})
}
