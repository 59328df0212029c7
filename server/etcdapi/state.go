package etcdapi

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"

	"github.com/hedgekv/hedgekv/etcdmvcc"
	"github.com/hedgekv/hedgekv/raftstore"
)

// The etcd keyspace's raw keys, all under Prefix, inside one region (the
// store keeps the range whole: no split cuts it):
//
//	Prefix "k/" key                  -> the key's current record (etcdmvcc.Record)
//	Prefix "h/" esc(key) rev(16)     -> its history record at rev (etcdmvcc.HistRecord)
//	Prefix "r/" rev(16)              -> the key changed at rev: history in revision order, for watchers
//	Prefix "m/rev"                   -> the current revision (8, big-endian; absent: 1)
//	Prefix "m/compact"               -> the compaction revision (8; absent: never)
//	Prefix "m/lease-id"              -> the last lease ID the applier chose (8; absent: 0)
//	Prefix "l/" id(8)                -> a lease: TTL(8) | granted revision(8) (leaseRecord)
//
// A lease's ID is stored as the uint64 of its int64, big-endian; its
// granted TTL is the one Grant stored (after the minimum was applied), its
// granted revision the keyspace's revision when it was granted (a grant
// makes no revision, as on etcd). The keys attached to a lease are the
// current records whose Lease is its ID: there is no index of them, so
// Revoke and TimeToLive scan the current records (leaseKeys).
//
// esc is order-preserving and prefix-free (every 0x00 becomes 0x00 0xff,
// and 0x00 0x01 ends it), so one key's history is contiguous and in
// revision order, and the history of the keys in [start, end) is the raw
// range [h/esc(start), h/esc(end)).
var (
	curPrefix   = []byte(Prefix + "k/")
	curEnd      = []byte(Prefix + "k0")
	histPrefix  = []byte(Prefix + "h/")
	histEnd     = []byte(Prefix + "h0")
	revPrefix   = []byte(Prefix + "r/")
	revEnd      = []byte(Prefix + "r0")
	revKey      = []byte(Prefix + "m/rev")
	compactKey  = []byte(Prefix + "m/compact")
	leaseIDKey  = []byte(Prefix + "m/lease-id")
	leasePrefix = []byte(Prefix + "l/")
	leaseEnd    = []byte(Prefix + "l0")
)

func curKey(key []byte) []byte {
	return append(append(make([]byte, 0, len(curPrefix)+len(key)), curPrefix...), key...)
}

// curSpan maps an etcd key range (end nil: no bound) to raw keys.
func curSpan(start, end []byte) ([]byte, []byte) {
	if end == nil {
		return curKey(start), curEnd
	}
	return curKey(start), curKey(end)
}

func appendEscaped(dst, key []byte) []byte {
	for _, c := range key {
		if c == 0 {
			dst = append(dst, 0, 0xff)
		} else {
			dst = append(dst, c)
		}
	}
	return append(dst, 0, 1)
}

// parseEscaped splits an escaped key off the front of b.
func parseEscaped(b []byte) (key, rest []byte, err error) {
	for i := 0; i+1 < len(b); i++ {
		if b[i] != 0 {
			key = append(key, b[i])
			continue
		}
		switch b[i+1] {
		case 0xff:
			key = append(key, 0)
			i++
		case 1:
			return key, b[i+2:], nil
		default:
			return nil, nil, fmt.Errorf("escaped key: bad escape %#x: %w", b[i+1], etcdmvcc.ErrCorrupt)
		}
	}
	return nil, nil, fmt.Errorf("escaped key: no terminator: %w", etcdmvcc.ErrCorrupt)
}

func histKey(key []byte, r etcdmvcc.Revision) []byte {
	b := appendEscaped(append([]byte(nil), histPrefix...), key)
	return etcdmvcc.AppendRevision(b, r)
}

// histSpan is the raw range of the history of the keys in [start, end).
func histSpan(start, end []byte) ([]byte, []byte) {
	lo := appendEscaped(append([]byte(nil), histPrefix...), start)
	if end == nil {
		return lo, histEnd
	}
	return lo, appendEscaped(append([]byte(nil), histPrefix...), end)
}

func parseHistKey(raw []byte) ([]byte, etcdmvcc.Revision, error) {
	if !bytes.HasPrefix(raw, histPrefix) {
		return nil, etcdmvcc.Revision{}, fmt.Errorf("history key %q: %w", raw, etcdmvcc.ErrCorrupt)
	}
	key, rest, err := parseEscaped(raw[len(histPrefix):])
	if err != nil {
		return nil, etcdmvcc.Revision{}, err
	}
	r, err := etcdmvcc.ParseRevision(rest)
	return key, r, err
}

func getInt(get func([]byte) ([]byte, bool, error), key []byte, absent int64) (int64, error) {
	v, ok, err := get(key)
	if err != nil || !ok {
		return absent, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%q holds %d bytes: %w", key, len(v), etcdmvcc.ErrCorrupt)
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// reader is what both views read through: a Get and an ordered scan of raw
// keys.
type reader struct {
	get  func(key []byte) ([]byte, bool, error)
	scan func(start, end []byte, fn func(k, v []byte) bool) error
}

// view is an etcdmvcc.View over raw keys.
type view struct {
	r reader
}

var _ etcdmvcc.View = view{}

func (v view) Get(key []byte) (etcdmvcc.Record, bool, error) {
	b, ok, err := v.r.get(curKey(key))
	if err != nil || !ok {
		return etcdmvcc.Record{}, false, err
	}
	rec, err := etcdmvcc.DecodeRecord(b)
	return rec, err == nil, err
}

func (v view) Scan(start, end []byte, fn func([]byte, etcdmvcc.Record) bool) error {
	lo, hi := curSpan(start, end)
	var derr error
	err := v.r.scan(lo, hi, func(k, b []byte) bool {
		rec, err := etcdmvcc.DecodeRecord(bytes.Clone(b))
		if err != nil {
			derr = err
			return false
		}
		return fn(bytes.Clone(k[len(curPrefix):]), rec)
	})
	if derr != nil {
		return derr
	}
	return err
}

func (v view) GetAt(key []byte, rev int64) (etcdmvcc.Record, bool, error) {
	var rec etcdmvcc.Record
	found := false
	var derr error
	err := v.r.scan(histKey(key, etcdmvcc.Revision{}), histKey(key, etcdmvcc.Revision{Main: rev + 1}), func(k, b []byte) bool {
		h, err := etcdmvcc.DecodeHistRecord(bytes.Clone(b))
		if err != nil {
			derr = err
			return false
		}
		_, r, err := parseHistKey(k)
		if err != nil {
			derr = err
			return false
		}
		rec, found = h.Record(r.Main), h.Kind == etcdmvcc.KindPut
		return true
	})
	if derr != nil {
		return etcdmvcc.Record{}, false, derr
	}
	return rec, found, err
}

func (v view) ScanAt(start, end []byte, rev int64, fn func([]byte, etcdmvcc.Record) bool) error {
	lo, hi := histSpan(start, end)
	var last []byte
	var lastRec etcdmvcc.Record
	have := false
	emit := func() bool {
		if !have {
			return true
		}
		have = false
		return fn(last, lastRec)
	}
	var derr error
	stopped := false
	err := v.r.scan(lo, hi, func(k, b []byte) bool {
		key, r, err := parseHistKey(k)
		if err != nil {
			derr = err
			return false
		}
		if last != nil && !bytes.Equal(key, last) {
			if !emit() {
				stopped = true
				return false
			}
			last = nil
		}
		if last == nil {
			last = bytes.Clone(key)
		}
		if r.Main > rev {
			return true
		}
		h, err := etcdmvcc.DecodeHistRecord(bytes.Clone(b))
		if err != nil {
			derr = err
			return false
		}
		lastRec, have = h.Record(r.Main), h.Kind == etcdmvcc.KindPut
		return true
	})
	if derr != nil {
		return derr
	}
	if err != nil {
		return err
	}
	if !stopped {
		emit()
	}
	return nil
}

func (v view) CompactRev() int64 {
	c, _ := v.compactRev()
	return c
}

func (v view) compactRev() (int64, error) { return getInt(v.r.get, compactKey, -1) }

// currentRev is the keyspace's revision: etcd starts at 1. While a
// restore is under way (restore.go) there is none: errRestoring.
func (v view) currentRev() (int64, error) {
	if _, restoring, err := v.r.get(restoreKey); err != nil || restoring {
		return 0, cmp.Or(err, errRestoring)
	}
	return getInt(v.r.get, revKey, 1)
}

// txView reads the round's transaction (an apply).
func txView(tx raftstore.StateTx) view {
	return view{reader{
		get: func(k []byte) ([]byte, bool, error) {
			b, ok := tx.Get(k)
			return b, ok, nil
		},
		scan: func(start, end []byte, fn func(k, v []byte) bool) error {
			tx.ForEachData(start, end, fn)
			return nil
		},
	}}
}

// readView reads a store's consistent read view (a Range).
func readView(ctx context.Context, sv raftstore.StateView) view {
	return view{reader{
		get: sv.Get,
		scan: func(start, end []byte, fn func(k, v []byte) bool) error {
			return sv.Scan(ctx, start, end, fn)
		},
	}}
}

// txWriter stores what an apply produced (etcdmvcc.Commit).
type txWriter struct{ tx raftstore.StateTx }

func (w txWriter) PutRecord(key []byte, rec etcdmvcc.Record) error {
	return w.tx.Put(curKey(key), rec.Encode())
}

func (w txWriter) DeleteRecord(key []byte) error { return w.tx.Delete(curKey(key)) }

func (w txWriter) PutHistory(key []byte, r etcdmvcc.Revision, rec etcdmvcc.HistRecord) error {
	if err := w.tx.Put(histKey(key, r), rec.Encode()); err != nil {
		return err
	}
	return w.tx.Put(revIndexKey(r), key)
}

func revIndexKey(r etcdmvcc.Revision) []byte {
	return etcdmvcc.AppendRevision(append([]byte(nil), revPrefix...), r)
}

func putInt(tx raftstore.StateTx, key []byte, v int64) error {
	return tx.Put(key, binary.BigEndian.AppendUint64(nil, uint64(v)))
}

// ---- leases ---------------------------------------------------------------------

func leaseKey(id int64) []byte {
	return binary.BigEndian.AppendUint64(append([]byte(nil), leasePrefix...), uint64(id))
}

// leaseRecord is a lease as the keyspace holds it.
type leaseRecord struct {
	ID         int64
	TTL        int64 // seconds, as granted
	GrantedRev int64 // the keyspace's revision at the grant
}

func (l leaseRecord) encode() []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 16), uint64(l.TTL))
	return binary.BigEndian.AppendUint64(b, uint64(l.GrantedRev))
}

func decodeLease(k, v []byte) (leaseRecord, error) {
	if len(k) != len(leasePrefix)+8 || !bytes.HasPrefix(k, leasePrefix) || len(v) != 16 {
		return leaseRecord{}, fmt.Errorf("lease record %q of %d bytes: %w", k, len(v), etcdmvcc.ErrCorrupt)
	}
	return leaseRecord{
		ID:         int64(binary.BigEndian.Uint64(k[len(leasePrefix):])),
		TTL:        int64(binary.BigEndian.Uint64(v[:8])),
		GrantedRev: int64(binary.BigEndian.Uint64(v[8:])),
	}, nil
}

// lease reads lease id's record.
func (v view) lease(id int64) (leaseRecord, bool, error) {
	k := leaseKey(id)
	b, ok, err := v.r.get(k)
	if err != nil || !ok {
		return leaseRecord{}, false, err
	}
	l, err := decodeLease(k, b)
	return l, err == nil, err
}

// leases calls fn with every lease, in the order of their raw keys (IDs
// ascending as uint64: the positive ones first).
func (v view) leases(fn func(leaseRecord) bool) error {
	var derr error
	err := v.r.scan(leasePrefix, leaseEnd, func(k, b []byte) bool {
		l, err := decodeLease(k, b)
		if err != nil {
			derr = err
			return false
		}
		return fn(l)
	})
	if derr != nil {
		return derr
	}
	return err
}

// LeaseExists implements etcdmvcc.Leases: Apply refuses a put with a lease
// the keyspace does not hold. Only an apply's view (txView, whose reads
// do not fail) asks it; a read that failed answers false.
func (v view) LeaseExists(id int64) bool {
	_, ok, err := v.lease(id)
	return ok && err == nil
}

var _ etcdmvcc.Leases = view{}

// leaseKeys returns the keys attached to lease id, in key order: a scan of
// every current record (there is no index of a lease's keys).
func (v view) leaseKeys(id int64) ([][]byte, error) {
	var keys [][]byte
	err := v.Scan(nil, nil, func(key []byte, rec etcdmvcc.Record) bool {
		if rec.Lease == id {
			keys = append(keys, key)
		}
		return true
	})
	return keys, err
}
