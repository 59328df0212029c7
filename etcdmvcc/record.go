package etcdmvcc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// A Revision names one change: Main is the revision of the request that made
// it, Sub its position among that request's changes (0, 1, ...), as etcd's
// mvcc.Revision (server/storage/mvcc/revision.go). A watch orders the events
// of one revision by Sub.
type Revision struct {
	Main, Sub int64
}

// Compare returns -1, 0 or +1 as r is before, equal to or after o.
func (r Revision) Compare(o Revision) int {
	switch {
	case r.Main < o.Main:
		return -1
	case r.Main > o.Main:
		return 1
	case r.Sub < o.Sub:
		return -1
	case r.Sub > o.Sub:
		return 1
	}
	return 0
}

func (r Revision) String() string { return fmt.Sprintf("%d.%d", r.Main, r.Sub) }

// RevisionLen is the length of an encoded Revision.
const RevisionLen = 16

// AppendRevision appends r as Main then Sub, 8 bytes each, big-endian, so
// encodings sort as revisions do. Both must be ≥ 0.
func AppendRevision(dst []byte, r Revision) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(r.Main))
	return binary.BigEndian.AppendUint64(dst, uint64(r.Sub))
}

// ParseRevision decodes what AppendRevision wrote.
func ParseRevision(b []byte) (Revision, error) {
	if len(b) != RevisionLen {
		return Revision{}, fmt.Errorf("etcdmvcc: revision of %d bytes, want %d", len(b), RevisionLen)
	}
	r := Revision{Main: int64(binary.BigEndian.Uint64(b)), Sub: int64(binary.BigEndian.Uint64(b[8:]))}
	if r.Main < 0 || r.Sub < 0 {
		return Revision{}, fmt.Errorf("etcdmvcc: negative revision %v", r)
	}
	return r, nil
}

// AppendHistoryKey appends the storage key of key's history record at r:
// key | r (AppendRevision). One key's records are then contiguous and in
// revision order, provided key is encoded so that no key is a prefix of
// another (hedgekv escapes it first, as its dedup keys do); the caller owns
// that encoding, and key here is whatever it chose.
func AppendHistoryKey(dst, key []byte, r Revision) []byte {
	dst = append(dst, key...)
	return AppendRevision(dst, r)
}

// SplitHistoryKey splits a history storage key into the key and revision.
// The key aliases b.
func SplitHistoryKey(b []byte) (key []byte, r Revision, err error) {
	if len(b) < RevisionLen {
		return nil, Revision{}, fmt.Errorf("etcdmvcc: history key of %d bytes, shorter than a revision", len(b))
	}
	n := len(b) - RevisionLen
	r, err = ParseRevision(b[n:])
	if err != nil {
		return nil, Revision{}, err
	}
	return b[:n:n], r, nil
}

// A Record is the state of a live key: its current value (what a Range
// without a revision reads), or its value as of some revision. The zero
// CreateRev means no record.
type Record struct {
	CreateRev int64 // revision of the put that created this generation of the key
	ModRev    int64 // revision of its last change
	Version   int64 // puts since creation: 1 at creation; a delete ends it
	Lease     int64 // lease ID, 0 for none
	Value     []byte
}

// KeyValue is r as etcd returns it for key.
func (r Record) KeyValue(key []byte) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{
		Key:            key,
		CreateRevision: r.CreateRev,
		ModRevision:    r.ModRev,
		Version:        r.Version,
		Lease:          r.Lease,
		Value:          r.Value,
	}
}

// Kind says what a history record did to its key.
type Kind uint8

const (
	KindPut    Kind = 1
	KindDelete Kind = 2
)

func (k Kind) String() string {
	switch k {
	case KindPut:
		return "put"
	case KindDelete:
		return "delete"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// A HistRecord is one change of one key, stored under the key and the
// Revision of the change (AppendHistoryKey). A deletion carries nothing
// else: the key's record before it is the history record just before it.
type HistRecord struct {
	Kind      Kind
	CreateRev int64 // KindPut only
	Version   int64 // KindPut only
	Lease     int64 // KindPut only
	Value     []byte
}

// Record is the key's state after h, a put made at revision main.
func (h HistRecord) Record(main int64) Record {
	return Record{CreateRev: h.CreateRev, ModRev: main, Version: h.Version, Lease: h.Lease, Value: h.Value}
}

// Codec version byte, first in every encoded record.
const codecV1 = 1

// ErrCorrupt is wrapped by every decoding error.
var ErrCorrupt = errors.New("etcdmvcc: corrupt record")

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// Encode returns r's storage form:
//
//	1 | uvarint create_rev | uvarint mod_rev - create_rev | uvarint version | varint lease | value
//
// Varints keep etcd-style small revisions and versions to a few bytes; mod
// is stored as its distance from create, which is small for keys that change
// little. The value runs to the end.
func (r Record) Encode() []byte {
	b := make([]byte, 0, 1+4*binary.MaxVarintLen64+len(r.Value))
	b = append(b, codecV1)
	b = binary.AppendUvarint(b, uint64(r.CreateRev))
	b = binary.AppendUvarint(b, uint64(r.ModRev-r.CreateRev))
	b = binary.AppendUvarint(b, uint64(r.Version))
	b = binary.AppendVarint(b, r.Lease)
	return append(b, r.Value...)
}

// DecodeRecord decodes what Record.Encode wrote. It is strict: an encoding
// Encode would not produce (a non-minimal varint, an unknown version,
// create_rev or version < 1, mod_rev < create_rev or overflowing) is an
// error wrapping ErrCorrupt, so Encode(DecodeRecord(b)) == b whenever it
// succeeds. The value is copied out of b.
func DecodeRecord(b []byte) (Record, error) {
	d := decoder{b: b}
	if v := d.byte(); v != codecV1 {
		return Record{}, d.fail("record: version %d", v)
	}
	create := d.uvarint("create_rev")
	delta := d.uvarint("mod_rev")
	version := d.uvarint("version")
	lease := d.varint("lease")
	if d.err != nil {
		return Record{}, d.err
	}
	if create < 1 || create > math.MaxInt64 {
		return Record{}, corrupt("record: create_rev %d", create)
	}
	if delta > math.MaxInt64-create {
		return Record{}, corrupt("record: mod_rev overflows (create %d + %d)", create, delta)
	}
	if version < 1 || version > math.MaxInt64 {
		return Record{}, corrupt("record: version %d", version)
	}
	return Record{
		CreateRev: int64(create),
		ModRev:    int64(create + delta),
		Version:   int64(version),
		Lease:     lease,
		Value:     d.rest(),
	}, nil
}

// Encode returns h's storage form:
//
//	1 | kind | (put:) uvarint create_rev | uvarint version | varint lease | value
//
// A deletion is the two bytes 1 | 2.
func (h HistRecord) Encode() []byte {
	if h.Kind != KindPut {
		return []byte{codecV1, byte(h.Kind)}
	}
	b := make([]byte, 0, 2+3*binary.MaxVarintLen64+len(h.Value))
	b = append(b, codecV1, byte(KindPut))
	b = binary.AppendUvarint(b, uint64(h.CreateRev))
	b = binary.AppendUvarint(b, uint64(h.Version))
	b = binary.AppendVarint(b, h.Lease)
	return append(b, h.Value...)
}

// DecodeHistRecord decodes what HistRecord.Encode wrote, as strictly as
// DecodeRecord: an unknown kind, a deletion with trailing bytes or a put
// with create_rev or version < 1 is an error wrapping ErrCorrupt.
func DecodeHistRecord(b []byte) (HistRecord, error) {
	d := decoder{b: b}
	if v := d.byte(); v != codecV1 {
		return HistRecord{}, d.fail("history record: version %d", v)
	}
	switch k := Kind(d.byte()); {
	case d.err != nil:
		return HistRecord{}, d.err
	case k == KindDelete:
		if len(d.b) != 0 {
			return HistRecord{}, corrupt("history record: %d bytes after a deletion", len(d.b))
		}
		return HistRecord{Kind: KindDelete}, nil
	case k != KindPut:
		return HistRecord{}, corrupt("history record: kind %d", uint8(k))
	}
	create := d.uvarint("create_rev")
	version := d.uvarint("version")
	lease := d.varint("lease")
	if d.err != nil {
		return HistRecord{}, d.err
	}
	if create < 1 || create > math.MaxInt64 {
		return HistRecord{}, corrupt("history record: create_rev %d", create)
	}
	if version < 1 || version > math.MaxInt64 {
		return HistRecord{}, corrupt("history record: version %d", version)
	}
	return HistRecord{
		Kind:      KindPut,
		CreateRev: int64(create),
		Version:   int64(version),
		Lease:     lease,
		Value:     d.rest(),
	}, nil
}

// decoder reads fields off b, remembering the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) error {
	if d.err != nil {
		return d.err
	}
	return corrupt(format, args...)
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = corrupt("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = corrupt("%s: bad varint", field)
		return 0
	}
	if n != varintLen(v) {
		d.err = corrupt("%s: non-minimal varint", field)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(field string) int64 {
	u := d.uvarint(field)
	// binary.Varint's zigzag, on the minimal uvarint just read.
	x := int64(u >> 1)
	if u&1 != 0 {
		x = ^x
	}
	return x
}

func (d *decoder) rest() []byte {
	if len(d.b) == 0 {
		return nil
	}
	return append([]byte(nil), d.b...)
}

func varintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
