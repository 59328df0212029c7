package raftstore

import (
	"bytes"

	"go.etcd.io/raft/v3/raftpb"
)

// pendingWrites records, for a peer's log entries past its applied index,
// which keys each writes, so that a follower-lease read of a key waits for
// exactly the entries that write it and writes of other keys never hold it
// back. An entry that is not a put or delete (a split, a conf change, an
// Applier's command, which may write any key of the region, anything
// undecodable) writes every key. Guarded by the peer's mu.
type pendingWrites struct {
	entries []pendingEntry // in index order
	byKey   map[string]uint64
	all     uint64 // highest index of an entry that writes every key; 0: none
}

type pendingEntry struct {
	index uint64
	key   []byte // nil with all
	all   bool
	// span: stands for every entry up to index (coverAll), not one entry;
	// a truncation shortens it instead of dropping it.
	span bool
}

// maxPendingScanKeys bounds the work a scan spends matching pending keys
// against its range; past it, the scan waits for the last pending entry.
const maxPendingScanKeys = 1024

// append records entries as they reach the log. Entries at or past the
// first one replace whatever was recorded there (raft truncated a
// conflicting tail).
func (w *pendingWrites) append(ents []raftpb.Entry, applied uint64) {
	if len(ents) == 0 {
		return
	}
	if n := len(w.entries); n > 0 && w.entries[n-1].index >= ents[0].Index {
		keep := w.entries[:0]
		for _, e := range w.entries {
			if e.span && e.index >= ents[0].Index {
				e.index = ents[0].Index - 1
			}
			if e.index < ents[0].Index {
				keep = append(keep, e)
			}
		}
		w.entries = keep
		w.rebuild()
	}
	for i := range ents {
		e := &ents[i]
		if e.Index <= applied {
			continue
		}
		pe := pendingEntry{index: e.Index}
		switch e.Type {
		case raftpb.EntryNormal:
			if len(e.Data) == 0 {
				continue // a new leader's empty entry writes nothing
			}
			cmd, err := decodeCommand(e.Data)
			if err == nil && (cmd.op == opPut || cmd.op == opDelete) {
				pe.key = append([]byte(nil), cmd.key...)
			} else {
				pe.all = true
			}
		default:
			pe.all = true
		}
		w.entries = append(w.entries, pe)
		w.note(pe)
	}
}

func (w *pendingWrites) note(pe pendingEntry) {
	if pe.all {
		w.all = max(w.all, pe.index)
		return
	}
	if w.byKey == nil {
		w.byKey = map[string]uint64{}
	}
	if pe.index > w.byKey[string(pe.key)] {
		w.byKey[string(pe.key)] = pe.index
	}
}

func (w *pendingWrites) rebuild() {
	w.byKey, w.all = nil, 0
	for _, pe := range w.entries {
		w.note(pe)
	}
}

// trim forgets entries applied up to applied.
func (w *pendingWrites) trim(applied uint64) {
	i := 0
	for i < len(w.entries) && w.entries[i].index <= applied {
		pe := w.entries[i]
		if pe.all {
			if w.all <= applied {
				w.all = 0
			}
		} else if w.byKey[string(pe.key)] <= applied {
			delete(w.byKey, string(pe.key))
		}
		i++
	}
	if i > 0 {
		w.entries = append(w.entries[:0], w.entries[i:]...)
	}
}

// coverAll records that every key may be written by an entry up to index
// (entries in the log that were never seen one by one).
func (w *pendingWrites) coverAll(index uint64) {
	pe := pendingEntry{index: index, all: true, span: true}
	w.entries = append(w.entries, pe)
	w.note(pe)
}

// reset forgets everything (a snapshot replaced the log).
func (w *pendingWrites) reset() { *w = pendingWrites{} }

// waitIndex is the index a read of keys, or of the range [start, end) when
// scan is set (empty end: unbounded), must see applied: the highest
// pending entry that writes what it reads, 0 if none.
func (w *pendingWrites) waitIndex(keys [][]byte, scan bool, start, end []byte) uint64 {
	idx := w.all
	if scan {
		if len(w.byKey) > maxPendingScanKeys {
			if n := len(w.entries); n > 0 {
				return max(idx, w.entries[n-1].index)
			}
			return idx
		}
		for k, i := range w.byKey {
			kb := []byte(k)
			if bytes.Compare(kb, start) >= 0 && (len(end) == 0 || bytes.Compare(kb, end) < 0) {
				idx = max(idx, i)
			}
		}
		return idx
	}
	for _, k := range keys {
		idx = max(idx, w.byKey[string(k)])
	}
	return idx
}
