package engine

import (
	"bytes"

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
// more), into at most limit pairs. An overlay item replaces or deletes
// the file's pair of the same key.
func mergeScan(ov []ovItem, next func() (k, v []byte, ok bool), limit int) []KV {
	var out []KV
	fk, fv, fok := next()
	for len(out) < limit && (fok || len(ov) > 0) {
		if fok && (len(ov) == 0 || bytes.Compare(fk, ov[0].key) < 0) {
			out = append(out, KV{Key: bytes.Clone(fk), Value: bytes.Clone(fv)})
			fk, fv, fok = next()
			continue
		}
		if fok && bytes.Equal(fk, ov[0].key) {
			fk, fv, fok = next() // replaced or deleted since the commit
		}
		if !ov[0].del {
			out = append(out, KV{Key: bytes.Clone(ov[0].key), Value: bytes.Clone(ov[0].val)})
		}
		ov = ov[1:]
	}
	return out
}

// KV is one key-value pair.
type KV struct {
	Key   []byte
	Value []byte
}
