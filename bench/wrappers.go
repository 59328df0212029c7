package bench

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pingcap/go-ycsb/pkg/ycsb"
)

// genLock serializes go-ycsb's workload code while leaving database calls
// concurrent.
//
// go-ycsb v1.0.1's core workload shares its generators (operation, key,
// field and scan-length choosers) between all threads and updates their
// "last value" without synchronization: a data race, benign in practice but
// one the race detector reports. measuredWorkload holds the lock while the
// workload runs and measuredDB hands it back for the duration of each
// database call, so the generators are only ever touched under the lock and
// the calls themselves still overlap. The workload code between calls costs
// microseconds (choosing keys, filling values), far below the latency of any
// store measured here. (If core_workload_insertion_retry_limit is set, the
// workload's retry sleep happens under the lock.)
type genLock struct{ mu sync.Mutex }

// measuredWorkload wraps go-ycsb's workload: it times each YCSB operation
// (one DoInsert / DoTransaction call; a read-modify-write is one operation)
// for TOTAL, and holds the generator lock while the workload runs.
type measuredWorkload struct {
	ycsb.Workload
	rec *recorder
	gen *genLock
}

func (w measuredWorkload) do(ctx context.Context, f func() error) error {
	w.gen.mu.Lock()
	start := time.Now()
	err := f()
	w.gen.mu.Unlock()
	w.rec.recordTotal(ctx, start, err)
	return err
}

func (w measuredWorkload) DoInsert(ctx context.Context, db ycsb.DB) error {
	return w.do(ctx, func() error { return w.Workload.DoInsert(ctx, db) })
}

func (w measuredWorkload) DoBatchInsert(ctx context.Context, batchSize int, db ycsb.DB) error {
	return w.do(ctx, func() error { return w.Workload.DoBatchInsert(ctx, batchSize, db) })
}

func (w measuredWorkload) DoTransaction(ctx context.Context, db ycsb.DB) error {
	return w.do(ctx, func() error { return w.Workload.DoTransaction(ctx, db) })
}

func (w measuredWorkload) DoBatchTransaction(ctx context.Context, batchSize int, db ycsb.DB) error {
	return w.do(ctx, func() error { return w.Workload.DoBatchTransaction(ctx, batchSize, db) })
}

// measuredDB wraps a ycsb.DB, recording each call into a recorder. It is
// only called from inside measuredWorkload (which holds gen) and releases
// gen around the inner call. It implements ycsb.BatchDB whether or not the
// inner DB does (falling back to one call per key, as go-ycsb's DbWrapper
// does). When fixedScan > 0 every scan asks for exactly that many records,
// whatever length the workload drew: go-ycsb only draws scan lengths from
// uniform or zipfian distributions.
type measuredDB struct {
	inner     ycsb.DB
	rec       *recorder
	gen       *genLock
	fixedScan int
}

var (
	_ ycsb.DB      = (*measuredDB)(nil)
	_ ycsb.BatchDB = (*measuredDB)(nil)
)

// Close does nothing: the runner owns the inner DB.
func (m *measuredDB) Close() error { return nil }

func (m *measuredDB) InitThread(ctx context.Context, threadID, threadCount int) context.Context {
	ctx = context.WithValue(ctx, shardKey{}, &m.rec.shards[threadID%recorderShards])
	return m.inner.InitThread(ctx, threadID, threadCount)
}

func (m *measuredDB) CleanupThread(ctx context.Context) { m.inner.CleanupThread(ctx) }

// call runs f without the generator lock and records it as op. f gets
// the context the call runs under: ctx's values (the thread's), but the
// cancellation of the phase's operations (recorder.ops), not of its loop:
// when MaxDuration or Stop ends a phase, the calls in flight complete and
// are counted, instead of failing with context.Canceled (which go-ycsb
// would count as READ_ERROR and the recorder, as a stopped call, would
// not, so the two disagreed).
func (m *measuredDB) call(ctx context.Context, op string, f func(ctx context.Context) error) error {
	m.gen.mu.Unlock()
	defer m.gen.mu.Lock()
	ctx = m.rec.opContext(ctx)
	start := time.Now()
	err := f(ctx)
	m.rec.record(ctx, op, start, err)
	return err
}

// opCtx is a database call's context: the cancellation (Done, Err,
// Deadline) of Context, the values of values.
type opCtx struct {
	context.Context
	values context.Context
}

func (c opCtx) Value(key any) any { return c.values.Value(key) }

func (m *measuredDB) Read(ctx context.Context, table, key string, fields []string) (v map[string][]byte, err error) {
	err = m.call(ctx, OpRead, func(ctx context.Context) (err error) {
		v, err = m.inner.Read(ctx, table, key, fields)
		return err
	})
	return v, err
}

func (m *measuredDB) Scan(ctx context.Context, table, startKey string, count int, fields []string) (v []map[string][]byte, err error) {
	if m.fixedScan > 0 {
		count = m.fixedScan
	}
	err = m.call(ctx, OpScan, func(ctx context.Context) (err error) {
		v, err = m.inner.Scan(ctx, table, startKey, count, fields)
		return err
	})
	return v, err
}

func (m *measuredDB) Update(ctx context.Context, table, key string, values map[string][]byte) error {
	return m.call(ctx, OpUpdate, func(ctx context.Context) error { return m.inner.Update(ctx, table, key, values) })
}

func (m *measuredDB) Insert(ctx context.Context, table, key string, values map[string][]byte) error {
	return m.call(ctx, OpInsert, func(ctx context.Context) error { return m.inner.Insert(ctx, table, key, values) })
}

func (m *measuredDB) Delete(ctx context.Context, table, key string) error {
	return m.call(ctx, OpDelete, func(ctx context.Context) error { return m.inner.Delete(ctx, table, key) })
}

func (m *measuredDB) BatchRead(ctx context.Context, table string, keys []string, fields []string) (out []map[string][]byte, err error) {
	b, ok := m.inner.(ycsb.BatchDB)
	if ok {
		err = m.call(ctx, OpBatchRead, func(ctx context.Context) (err error) {
			out, err = b.BatchRead(ctx, table, keys, fields)
			return err
		})
		return out, err
	}
	out = make([]map[string][]byte, len(keys))
	for i, k := range keys {
		if out[i], err = m.Read(ctx, table, k, fields); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (m *measuredDB) BatchUpdate(ctx context.Context, table string, keys []string, values []map[string][]byte) error {
	if b, ok := m.inner.(ycsb.BatchDB); ok {
		return m.call(ctx, OpBatchUpdate, func(ctx context.Context) error { return b.BatchUpdate(ctx, table, keys, values) })
	}
	var errs []error
	for i, k := range keys {
		errs = append(errs, m.Update(ctx, table, k, values[i]))
	}
	return errors.Join(errs...)
}

func (m *measuredDB) BatchInsert(ctx context.Context, table string, keys []string, values []map[string][]byte) error {
	if b, ok := m.inner.(ycsb.BatchDB); ok {
		return m.call(ctx, OpBatchInsert, func(ctx context.Context) error { return b.BatchInsert(ctx, table, keys, values) })
	}
	var errs []error
	for i, k := range keys {
		errs = append(errs, m.Insert(ctx, table, k, values[i]))
	}
	return errors.Join(errs...)
}

func (m *measuredDB) BatchDelete(ctx context.Context, table string, keys []string) error {
	if b, ok := m.inner.(ycsb.BatchDB); ok {
		return m.call(ctx, OpBatchDelete, func(ctx context.Context) error { return b.BatchDelete(ctx, table, keys) })
	}
	var errs []error
	for _, k := range keys {
		errs = append(errs, m.Delete(ctx, table, k))
	}
	return errors.Join(errs...)
}
