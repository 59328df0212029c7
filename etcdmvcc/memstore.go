package etcdmvcc

import (
	"bytes"
	"math"

	"github.com/google/btree"
)

// MemStore is a View, Writer and Leases in memory: current records by key,
// history records by key then revision, the lease IDs granted, and the
// compaction revision. It is the reference the tests run Apply on, and the
// semantics a stored implementation must share. It copies what it is given
// and hands out what it holds, which the caller must not modify. It is not
// safe for concurrent use.
type MemStore struct {
	cur        *btree.BTreeG[curItem]
	hist       *btree.BTreeG[histItem]
	leases     map[int64]struct{}
	compactRev int64
}

type curItem struct {
	key []byte
	rec Record
}

type histItem struct {
	key []byte
	rev Revision
	rec HistRecord
}

// NewMemStore returns an empty store, never compacted.
func NewMemStore() *MemStore {
	return &MemStore{
		cur: btree.NewG(16, func(a, b curItem) bool { return bytes.Compare(a.key, b.key) < 0 }),
		hist: btree.NewG(16, func(a, b histItem) bool {
			if c := bytes.Compare(a.key, b.key); c != 0 {
				return c < 0
			}
			return a.rev.Compare(b.rev) < 0
		}),
		leases:     map[int64]struct{}{},
		compactRev: -1,
	}
}

var (
	_ View   = (*MemStore)(nil)
	_ Writer = (*MemStore)(nil)
	_ Leases = (*MemStore)(nil)
)

// Get implements View.
func (m *MemStore) Get(key []byte) (Record, bool, error) {
	it, ok := m.cur.Get(curItem{key: key})
	return it.rec, ok, nil
}

// Scan implements View.
func (m *MemStore) Scan(start, end []byte, fn func([]byte, Record) bool) error {
	m.cur.AscendGreaterOrEqual(curItem{key: start}, func(it curItem) bool {
		if end != nil && bytes.Compare(it.key, end) >= 0 {
			return false
		}
		return fn(it.key, it.rec)
	})
	return nil
}

// GetAt implements View.
func (m *MemStore) GetAt(key []byte, rev int64) (Record, bool, error) {
	var rec Record
	found := false
	m.hist.DescendLessOrEqual(histItem{key: key, rev: Revision{Main: rev, Sub: math.MaxInt64}}, func(it histItem) bool {
		if bytes.Equal(it.key, key) && it.rec.Kind == KindPut {
			rec, found = it.rec.Record(it.rev.Main), true
		}
		return false
	})
	return rec, found, nil
}

// ScanAt implements View.
func (m *MemStore) ScanAt(start, end []byte, rev int64, fn func([]byte, Record) bool) error {
	var last histItem // the newest record ≤ rev of the key being read
	have := false
	emit := func() bool {
		if !have || last.rec.Kind != KindPut {
			return true
		}
		return fn(last.key, last.rec.Record(last.rev.Main))
	}
	stopped := false
	m.hist.AscendGreaterOrEqual(histItem{key: start}, func(it histItem) bool {
		if end != nil && bytes.Compare(it.key, end) >= 0 {
			return false
		}
		if have && !bytes.Equal(it.key, last.key) {
			if !emit() {
				stopped = true
				return false
			}
			have = false
		}
		if it.rev.Main <= rev {
			last, have = it, true
		}
		return true
	})
	if !stopped {
		emit()
	}
	return nil
}

// CompactRev implements View.
func (m *MemStore) CompactRev() int64 { return m.compactRev }

// PutRecord implements Writer.
func (m *MemStore) PutRecord(key []byte, rec Record) error {
	rec.Value = bytes.Clone(rec.Value)
	m.cur.ReplaceOrInsert(curItem{key: bytes.Clone(key), rec: rec})
	return nil
}

// DeleteRecord implements Writer.
func (m *MemStore) DeleteRecord(key []byte) error {
	m.cur.Delete(curItem{key: key})
	return nil
}

// PutHistory implements Writer.
func (m *MemStore) PutHistory(key []byte, rev Revision, rec HistRecord) error {
	rec.Value = bytes.Clone(rec.Value)
	m.hist.ReplaceOrInsert(histItem{key: bytes.Clone(key), rev: rev, rec: rec})
	return nil
}

// GrantLease makes id a lease LeaseExists knows.
func (m *MemStore) GrantLease(id int64) { m.leases[id] = struct{}{} }

// RevokeLease forgets id. (Deleting the keys attached to it is a
// DeleteRange's work, the caller's.)
func (m *MemStore) RevokeLease(id int64) { delete(m.leases, id) }

// LeaseExists implements Leases.
func (m *MemStore) LeaseExists(id int64) bool {
	_, ok := m.leases[id]
	return ok
}

// Compact sets the compaction revision to rev and removes the history
// records CompactPrefix says it may, key by key. It does not check rev
// (CheckCompact does, as etcd), and never fails.
func (m *MemStore) Compact(rev int64) error {
	m.compactRev = rev
	var drop, group []histItem
	flush := func() {
		refs := make([]HistRef, len(group))
		for i, it := range group {
			refs[i] = HistRef{Rev: it.rev, Delete: it.rec.Kind == KindDelete}
		}
		drop = append(drop, group[:CompactPrefix(refs, rev)]...)
		group = group[:0]
	}
	m.hist.Ascend(func(it histItem) bool {
		if len(group) > 0 && !bytes.Equal(group[0].key, it.key) {
			flush()
		}
		group = append(group, it)
		return true
	})
	flush()
	for _, it := range drop {
		m.hist.Delete(it)
	}
	return nil
}

// HistoryLen is the number of history records held.
func (m *MemStore) HistoryLen() int { return m.hist.Len() }
