package engine

import (
	"bytes"
	"sync"

	"github.com/google/btree"
)

// overlay holds the user writes applied since the engine's last bbolt
// commit (checkpoint.go): the Ready loop applies into one long write
// transaction that bbolt's readers cannot see until it commits, so every
// read of user data looks here first. It is what etcd's backend calls its
// read buffer. The engine's view lock guards it: rounds add to it and a
// commit empties it under the lock's write side; readers hold the read
// side across their bbolt transaction's start and their look here, so
// they see either the old file plus the overlay or the new file plus the
// overlay (the same data), never the new-but-one.
type overlay struct {
	t *btree.BTreeG[ovItem]
	// cloneMu: clones are taken under the view lock's read side, and
	// btree's Clone writes the tree's copy-on-write context, so two must
	// not run at once (the reads beside them touch only the nodes).
	cloneMu sync.Mutex
}

// ovItem is a key's latest value since the last commit, or its deletion.
type ovItem struct {
	key, val []byte
	del      bool
}

func ovLess(a, b ovItem) bool { return bytes.Compare(a.key, b.key) < 0 }

// overlayDegree: a few thousand writes per commit interval; any degree
// near bbolt's fan-out does.
const overlayDegree = 32

func newOverlay() *overlay {
	return &overlay{t: btree.NewG(overlayDegree, ovLess)}
}

func (o *overlay) len() int { return o.t.Len() }

// add records the writes of one round, in order (a later write of a key
// replaces an earlier one).
func (o *overlay) add(items []ovItem) {
	for _, it := range items {
		o.t.ReplaceOrInsert(it)
	}
}

// clone is a copy of the overlay as it is now, for a Snapshot: lazy
// (btree's copy-on-write), so it costs nothing until the overlay is next
// written, and then only the nodes that write changes. The caller holds
// the view lock's read side; the clone is read only.
func (o *overlay) clone() *overlay {
	o.cloneMu.Lock()
	defer o.cloneMu.Unlock()
	return &overlay{t: o.t.Clone()}
}

// get is the overlay's word on key: ok is false if it has none (read the
// file), del true if the key was deleted.
func (o *overlay) get(key []byte) (val []byte, del, ok bool) {
	it, ok := o.t.Get(ovItem{key: key})
	return it.val, it.del, ok
}

// rangeFrom copies the items of [start, end) (end empty: +inf) in key
// order until it holds limit live (not deleted) ones: with the file's
// pairs, enough to answer a scan of limit pairs. The slices are shared
// with the overlay, which never changes an item in place.
func (o *overlay) rangeFrom(start, end []byte, limit int) []ovItem {
	var out []ovItem
	live := 0
	o.t.AscendGreaterOrEqual(ovItem{key: start}, func(it ovItem) bool {
		if len(end) > 0 && bytes.Compare(it.key, end) >= 0 {
			return false
		}
		out = append(out, it)
		if !it.del {
			live++
		}
		return live < limit
	})
	return out
}

// mergeScan merges the overlay's items ov (key order, from rangeFrom)
// over the file's pairs, which next yields in key order (nil key: no
// more), into at most limit pairs (copies). An overlay item replaces or
// deletes the file's pair of the same key.
func mergeScan(ov []ovItem, next func() (k, v []byte, ok bool), limit int) []KV {
	var out []KV
	if limit <= 0 {
		return nil
	}
	mergeEach(ov, next, func(k, v []byte) bool {
		out = append(out, KV{Key: bytes.Clone(k), Value: bytes.Clone(v)})
		return len(out) < limit
	})
	return out
}

// mergeEach is mergeScan's merge: it calls fn with each live pair in key
// order, the overlay's item winning over the file's pair of its key and a
// deleted item hiding it, until fn returns false or both run out. k and v
// alias the overlay's or the file's memory.
func mergeEach(ov []ovItem, next func() (k, v []byte, ok bool), fn func(k, v []byte) bool) {
	fk, fv, fok := next()
	for fok || len(ov) > 0 {
		if fok && (len(ov) == 0 || bytes.Compare(fk, ov[0].key) < 0) {
			if !fn(fk, fv) {
				return
			}
			fk, fv, fok = next()
			continue
		}
		if fok && bytes.Equal(fk, ov[0].key) {
			fk, fv, fok = next() // replaced or deleted since the commit
		}
		it := ov[0]
		ov = ov[1:]
		if !it.del && !fn(it.key, it.val) {
			return
		}
	}
}

// KV is one key-value pair.
type KV struct {
	Key   []byte
	Value []byte
}
