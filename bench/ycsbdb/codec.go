package ycsbdb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Record encoding.
//
// A YCSB record is a set of named fields (field0..field9 by default). hedgekv
// stores a whole record as ONE value, so a read of all fields is one Get and
// a scan returns whole records. The value is
//
//	version  byte    (recordVersion)
//	n        uvarint number of fields
//	n times:
//	  uvarint len(name), name bytes
//	  uvarint len(value), value bytes
//
// Fields are written in ascending name order, so the same record always
// encodes to the same bytes. The decoder accepts any order but rejects
// duplicate names, truncation, trailing bytes and lengths that run past the
// end of the buffer, without allocating more than the input can hold.

const recordVersion byte = 1

// ErrCorruptRecord is wrapped by every decoding error.
var ErrCorruptRecord = errors.New("ycsbdb: corrupt record")

// EncodeRecord encodes the fields of one record into a fresh value.
func EncodeRecord(values map[string][]byte) []byte {
	return AppendRecord(nil, values)
}

// AppendRecord appends the encoding of values to dst and returns the result.
func AppendRecord(dst []byte, values map[string][]byte) []byte {
	names := make([]string, 0, len(values))
	size := 1 + binary.MaxVarintLen64
	for name, v := range values {
		names = append(names, name)
		size += 2*binary.MaxVarintLen64 + len(name) + len(v)
	}
	slices.Sort(names)
	dst = slices.Grow(dst, size)
	dst = append(dst, recordVersion)
	dst = binary.AppendUvarint(dst, uint64(len(names)))
	for _, name := range names {
		v := values[name]
		dst = binary.AppendUvarint(dst, uint64(len(name)))
		dst = append(dst, name...)
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	return dst
}

// DecodeRecord decodes every field of an encoded record. Field values are
// copies: they do not alias b.
func DecodeRecord(b []byte) (map[string][]byte, error) {
	return decode(b, nil)
}

// DecodeFields decodes only the named fields (all of them when fields is
// empty), as YCSB's Read and Scan ask. Fields absent from the record are
// absent from the result. The whole record is still validated.
func DecodeFields(b []byte, fields []string) (map[string][]byte, error) {
	if len(fields) == 0 {
		return decode(b, nil)
	}
	want := make(map[string]struct{}, len(fields))
	for _, f := range fields {
		want[f] = struct{}{}
	}
	return decode(b, want)
}

func decode(b []byte, want map[string]struct{}) (map[string][]byte, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty value", ErrCorruptRecord)
	}
	if b[0] != recordVersion {
		return nil, fmt.Errorf("%w: unknown version %d", ErrCorruptRecord, b[0])
	}
	rest := b[1:]
	n, rest, err := readUvarint(rest)
	if err != nil {
		return nil, fmt.Errorf("%w: field count: %w", ErrCorruptRecord, err)
	}
	// Every field takes at least two bytes (two zero lengths), which bounds
	// n by the input before anything is allocated.
	if n > uint64(len(rest)/2) {
		return nil, fmt.Errorf("%w: %d fields cannot fit in %d bytes", ErrCorruptRecord, n, len(rest))
	}
	capHint := int(n)
	if want != nil {
		capHint = min(capHint, len(want))
	}
	out := make(map[string][]byte, capHint)
	var seen map[string]struct{}
	if want != nil {
		seen = make(map[string]struct{}, n)
	}
	// The values are copied into one buffer of the record's size: one
	// allocation per record instead of one per field (a scan decodes
	// thousands of records a second). Each value's capacity ends where it
	// does, so appending to one never overwrites the next.
	buf := make([]byte, 0, len(rest))
	for i := uint64(0); i < n; i++ {
		var name, value []byte
		if name, rest, err = readBytes(rest); err != nil {
			return nil, fmt.Errorf("%w: field %d name: %w", ErrCorruptRecord, i, err)
		}
		if value, rest, err = readBytes(rest); err != nil {
			return nil, fmt.Errorf("%w: field %q value: %w", ErrCorruptRecord, name, err)
		}
		if want == nil {
			if _, dup := out[string(name)]; dup {
				return nil, fmt.Errorf("%w: duplicate field %q", ErrCorruptRecord, name)
			}
			out[fieldName(name)], buf = keep(buf, value)
			continue
		}
		if _, dup := seen[string(name)]; dup {
			return nil, fmt.Errorf("%w: duplicate field %q", ErrCorruptRecord, name)
		}
		seen[fieldName(name)] = struct{}{}
		if _, ok := want[string(name)]; ok {
			out[fieldName(name)], buf = keep(buf, value)
		}
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorruptRecord, len(rest))
	}
	return out, nil
}

// keep copies v to the end of buf and returns the copy (never nil) and
// the grown buf.
func keep(buf, v []byte) ([]byte, []byte) {
	if len(v) == 0 {
		return []byte{}, buf
	}
	start := len(buf)
	buf = append(buf, v...)
	return buf[start:len(buf):len(buf)], buf
}

// fieldNames holds YCSB's own field names ("field0", "field1", ...), so
// that decoding a record does not allocate a string per field.
var fieldNames = func() map[string]string {
	m := make(map[string]string, 128)
	for i := range 128 {
		s := fmt.Sprintf("field%d", i)
		m[s] = s
	}
	return m
}()

// fieldName returns name as a string, without allocating for YCSB's field
// names (the map lookup with string(name) does not allocate).
func fieldName(name []byte) string {
	if s, ok := fieldNames[string(name)]; ok {
		return s
	}
	return string(name)
}

// MergeRecord decodes the record in old (if any), overwrites it with the
// fields in update and returns the new encoding. It is the "modify" of YCSB's
// update, which replaces only the fields it names.
func MergeRecord(old []byte, update map[string][]byte) ([]byte, error) {
	if len(old) == 0 {
		return EncodeRecord(update), nil
	}
	rec, err := DecodeRecord(old)
	if err != nil {
		return nil, err
	}
	for k, v := range update {
		rec[k] = v
	}
	return EncodeRecord(rec), nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

var (
	errTruncated = errors.New("truncated")
	errOverflow  = errors.New("varint overflows 64 bits")
)

func readUvarint(b []byte) (uint64, []byte, error) {
	v, n := binary.Uvarint(b)
	switch {
	case n == 0:
		return 0, nil, errTruncated
	case n < 0:
		return 0, nil, errOverflow
	}
	return v, b[n:], nil
}

func readBytes(b []byte) ([]byte, []byte, error) {
	l, rest, err := readUvarint(b)
	if err != nil {
		return nil, nil, err
	}
	if l > uint64(len(rest)) {
		return nil, nil, fmt.Errorf("length %d exceeds the %d bytes left: %w", l, len(rest), errTruncated)
	}
	return rest[:l], rest[l:], nil
}
