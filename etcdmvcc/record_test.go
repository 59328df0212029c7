package etcdmvcc

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []Record{
		{CreateRev: 1, ModRev: 1, Version: 1},
		{CreateRev: 2, ModRev: 9, Version: 3, Lease: 7, Value: []byte("v")},
		{CreateRev: 1 << 58, ModRev: 1<<58 + 5, Version: 1, Lease: -1, Value: []byte{0, 0xff}},
		{CreateRev: math.MaxInt64, ModRev: math.MaxInt64, Version: math.MaxInt64, Lease: math.MinInt64},
	} {
		b := r.Encode()
		got, err := DecodeRecord(b)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip: %+v -> %x -> %+v", r, b, got)
		}
	}
	// Small etcd-style revisions stay small.
	if n := len((Record{CreateRev: 100, ModRev: 120, Version: 3}).Encode()); n != 5 {
		t.Fatalf("encoded record of small numbers: %d bytes, want 5", n)
	}
}

func TestHistRecordRoundTrip(t *testing.T) {
	for _, h := range []HistRecord{
		{Kind: KindDelete},
		{Kind: KindPut, CreateRev: 1, Version: 1},
		{Kind: KindPut, CreateRev: 1 << 60, Version: 42, Lease: 1 << 62, Value: []byte("value")},
	} {
		b := h.Encode()
		got, err := DecodeHistRecord(b)
		if err != nil {
			t.Fatalf("%+v: %v", h, err)
		}
		if !reflect.DeepEqual(got, h) {
			t.Fatalf("round trip: %+v -> %x -> %+v", h, b, got)
		}
	}
	if b := (HistRecord{Kind: KindDelete}).Encode(); !bytes.Equal(b, []byte{1, 2}) {
		t.Fatalf("a deletion encodes as %x", b)
	}
}

func TestDecodeCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		hist bool
	}{
		{"empty", nil, false},
		{"version 0", []byte{0, 1, 0, 1, 0}, false},
		{"version 2", []byte{2, 1, 0, 1, 0}, false},
		{"truncated", []byte{1, 1, 0}, false},
		{"truncated varint", []byte{1, 0x81}, false},
		{"non-minimal varint", []byte{1, 0x81, 0x00, 0, 1, 0}, false},
		{"varint overflow", []byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, false},
		{"create_rev 0", []byte{1, 0, 0, 1, 0}, false},
		{"create_rev > MaxInt64", []byte{1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 1, 0, 1, 0}, false},
		{"mod_rev overflow", append(append([]byte{1}, uvarint(math.MaxInt64)...), 1, 1, 0), false},
		{"version 0", []byte{1, 1, 0, 0, 0}, false},
		{"hist empty", nil, true},
		{"hist version", []byte{2, 2}, true},
		{"hist no kind", []byte{1}, true},
		{"hist kind 0", []byte{1, 0}, true},
		{"hist kind 3", []byte{1, 3}, true},
		{"hist delete with bytes", []byte{1, 2, 0}, true},
		{"hist put truncated", []byte{1, 1, 1}, true},
		{"hist put create 0", []byte{1, 1, 0, 1, 0}, true},
		{"hist put version 0", []byte{1, 1, 1, 0, 0}, true},
		{"hist put non-minimal", []byte{1, 1, 1, 1, 0x80, 0x00}, true},
	} {
		var err error
		if tc.hist {
			_, err = DecodeHistRecord(tc.b)
		} else {
			_, err = DecodeRecord(tc.b)
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s (%x): err %v, want ErrCorrupt", tc.name, tc.b, err)
		}
	}
}

func uvarint(v uint64) []byte {
	var b []byte
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func TestDecodeCopiesValue(t *testing.T) {
	b := (Record{CreateRev: 1, ModRev: 1, Version: 1, Value: []byte("abc")}).Encode()
	r, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] = 'X'
	if string(r.Value) != "abc" {
		t.Fatalf("value aliases the input: %q", r.Value)
	}
}

func TestRevisionAndHistoryKey(t *testing.T) {
	revs := []Revision{{0, 0}, {1, 0}, {1, 1}, {1, 255}, {256, 0}, {1 << 58, 3}, {math.MaxInt64, math.MaxInt64}}
	for i, r := range revs {
		b := AppendRevision(nil, r)
		if len(b) != RevisionLen {
			t.Fatalf("%v: %d bytes", r, len(b))
		}
		got, err := ParseRevision(b)
		if err != nil || got != r {
			t.Fatalf("%v -> %x -> %v, %v", r, b, got, err)
		}
		if i > 0 {
			if bytes.Compare(AppendRevision(nil, revs[i-1]), b) >= 0 {
				t.Fatalf("%v does not encode before %v", revs[i-1], r)
			}
			if revs[i-1].Compare(r) >= 0 || r.Compare(revs[i-1]) <= 0 || r.Compare(r) != 0 {
				t.Fatalf("Compare(%v, %v)", revs[i-1], r)
			}
		}
		hk := AppendHistoryKey([]byte("pre"), []byte("key"), r)
		key, rev, err := SplitHistoryKey(hk[3:])
		if err != nil || string(key) != "key" || rev != r {
			t.Fatalf("history key %x: %q %v %v", hk, key, rev, err)
		}
	}
	if _, err := ParseRevision(make([]byte, 15)); err == nil {
		t.Fatal("15 bytes parsed")
	}
	if _, err := ParseRevision(append([]byte{0x80}, make([]byte, 15)...)); err == nil {
		t.Fatal("a negative revision parsed")
	}
	if _, _, err := SplitHistoryKey([]byte("short")); err == nil {
		t.Fatal("a short history key split")
	}
	// One key's history is contiguous: no other key's record sorts inside it
	// when keys are prefix-free (here: all of one length).
	a1 := AppendHistoryKey(nil, []byte("ka"), Revision{1, 0})
	a9 := AppendHistoryKey(nil, []byte("ka"), Revision{9, 9})
	b0 := AppendHistoryKey(nil, []byte("kb"), Revision{0, 0})
	if !(bytes.Compare(a1, a9) < 0 && bytes.Compare(a9, b0) < 0) {
		t.Fatal("history keys out of order")
	}
}

// FuzzDecodeRecord feeds both decoders arbitrary bytes: they must not
// panic, and whatever they accept must encode back to the same bytes (the
// codecs are canonical).
func FuzzDecodeRecord(f *testing.F) {
	f.Add((Record{CreateRev: 2, ModRev: 5, Version: 2, Lease: 7, Value: []byte("v")}).Encode())
	f.Add((HistRecord{Kind: KindPut, CreateRev: 3, Version: 1, Value: []byte("x")}).Encode())
	f.Add((HistRecord{Kind: KindDelete}).Encode())
	f.Add([]byte{1, 0x81, 0x00, 0, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeRecord(b); err == nil {
			if got := r.Encode(); !bytes.Equal(got, b) {
				t.Fatalf("record %x decodes to %+v, which encodes to %x", b, r, got)
			}
			if r.CreateRev < 1 || r.ModRev < r.CreateRev || r.Version < 1 {
				t.Fatalf("record %x decodes to an invalid %+v", b, r)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("record %x: %v is not ErrCorrupt", b, err)
		}
		if h, err := DecodeHistRecord(b); err == nil {
			if got := h.Encode(); !bytes.Equal(got, b) {
				t.Fatalf("history record %x decodes to %+v, which encodes to %x", b, h, got)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("history record %x: %v is not ErrCorrupt", b, err)
		}
		if len(b) >= RevisionLen {
			if _, r, err := SplitHistoryKey(b); err == nil {
				if got := AppendRevision(nil, r); !bytes.Equal(got, b[len(b)-RevisionLen:]) {
					t.Fatalf("revision %x parses to %v, which encodes to %x", b[len(b)-RevisionLen:], r, got)
				}
			}
		}
	})
}
