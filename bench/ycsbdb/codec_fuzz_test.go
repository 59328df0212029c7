package ycsbdb

import (
	"errors"
	"strings"
	"testing"
)

// FuzzDecodeFields: a stored record (a value read back from hedgekv, which
// any writer may have put there) decoded for a subset of fields, as YCSB's
// Read and Scan ask. It must agree with the full decode (the same fields,
// the same values, the same verdict on corruption) and never panic; and
// MergeRecord over it must keep every field it did not update.
// fields is a comma-separated list of names; update sets one field.
func FuzzDecodeFields(f *testing.F) {
	rec := EncodeRecord(ycsbLike(3, 5))
	f.Add(rec, "field0,field2", "field1", []byte("new"))
	f.Add(rec, "", "field9", []byte(nil))
	f.Add(rec, "nope", "", []byte{})
	f.Add(rec[:len(rec)-1], "field0", "field0", []byte("x"))
	f.Add([]byte{recordVersion, 2, 1, 'a', 0, 1, 'a', 0}, "a", "a", []byte("dup"))
	f.Add([]byte{recordVersion + 1, 0}, "a", "b", []byte("v"))
	f.Add([]byte{}, "a", "b", []byte("v"))
	f.Add([]byte{recordVersion, 1, 0x80}, "", "", []byte(nil))

	f.Fuzz(func(t *testing.T, b []byte, fields, updName string, updValue []byte) {
		var names []string
		if fields != "" {
			names = strings.Split(fields, ",")
		}
		full, ferr := DecodeRecord(b)
		part, perr := DecodeFields(b, names)
		if (ferr == nil) != (perr == nil) {
			t.Fatalf("DecodeRecord err %v, DecodeFields err %v", ferr, perr)
		}
		for _, err := range []error{ferr, perr} {
			if err != nil && !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("error %v does not wrap ErrCorruptRecord", err)
			}
		}
		merged, merr := MergeRecord(b, map[string][]byte{updName: updValue})
		if ferr != nil {
			if len(b) > 0 && merr == nil {
				t.Fatalf("MergeRecord accepted a corrupt record: %v", ferr)
			}
			return
		}
		want := full
		if len(names) > 0 {
			want = map[string][]byte{}
			for _, n := range names {
				if v, ok := full[n]; ok {
					want[n] = v
				}
			}
		}
		if !equalRecords(part, want) {
			t.Fatalf("DecodeFields(%q) = %q, want %q", names, part, want)
		}
		if merr != nil {
			t.Fatalf("MergeRecord: %v", merr)
		}
		got, err := DecodeRecord(merged)
		if err != nil {
			t.Fatalf("merged record does not decode: %v", err)
		}
		full[updName] = nonNil(updValue)
		if !equalRecords(got, full) {
			t.Fatalf("merge of %q=%q: %q, want %q", updName, updValue, got, full)
		}
	})
}
