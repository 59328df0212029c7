package ycsbdb

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
)

func equalRecords(a, b map[string][]byte) bool {
	return maps.EqualFunc(a, b, bytes.Equal)
}

func TestRecordRoundTrip(t *testing.T) {
	cases := map[string]map[string][]byte{
		"empty record":     {},
		"nil map":          nil,
		"one field":        {"field0": []byte("hello")},
		"empty name":       {"": []byte("v")},
		"empty value":      {"f": {}},
		"nil value":        {"f": nil},
		"binary":           {"f\x00g": {0, 0xff, 0x80, 0x7f, 0}, "\xff": {0x80}},
		"unicode":          {"größe": []byte("日本語")},
		"ycsb record":      ycsbLike(10, 100),
		"many fields":      ycsbLike(1000, 3),
		"long name":        {strings.Repeat("n", 300): []byte("x")},
		"value over 127 B": {"f": bytes.Repeat([]byte{7}, 128)},
		"1 MiB value":      {"big": bytes.Repeat([]byte("abc"), 1<<20/3)},
	}
	for name, rec := range cases {
		t.Run(name, func(t *testing.T) {
			enc := EncodeRecord(rec)
			got, err := DecodeRecord(enc)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !equalRecords(got, rec) {
				t.Fatalf("round trip mismatch: got %d fields, want %d", len(got), len(rec))
			}
			for k, v := range got {
				if v == nil {
					t.Fatalf("field %q decoded as nil, want empty non-nil", k)
				}
			}
			// Canonical: encoding the decoded record gives the same bytes.
			if again := EncodeRecord(got); !bytes.Equal(again, enc) {
				t.Fatalf("re-encoding differs")
			}
		})
	}
}

func ycsbLike(fields, size int) map[string][]byte {
	m := make(map[string][]byte, fields)
	for i := range fields {
		m[fmt.Sprintf("field%d", i)] = bytes.Repeat([]byte{byte('a' + i%26)}, size)
	}
	return m
}

func TestEncodeDeterministic(t *testing.T) {
	rec := ycsbLike(20, 10)
	first := EncodeRecord(rec)
	for range 50 { // map iteration order is random; the bytes must not be
		if !bytes.Equal(first, EncodeRecord(maps.Clone(rec))) {
			t.Fatal("encoding depends on map order")
		}
	}
}

func TestEncodingIsCompact(t *testing.T) {
	rec := ycsbLike(10, 100)
	enc := EncodeRecord(rec)
	payload := 0
	for k, v := range rec {
		payload += len(k) + len(v)
	}
	// version + count + one byte per length for these sizes.
	if want := 2 + payload + 2*len(rec); len(enc) != want {
		t.Fatalf("encoded size %d, want %d", len(enc), want)
	}
}

func TestDecodeDoesNotAlias(t *testing.T) {
	enc := EncodeRecord(map[string][]byte{"f": []byte("value")})
	got, err := DecodeRecord(enc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range enc {
		enc[i] = 0
	}
	if string(got["f"]) != "value" {
		t.Fatalf("decoded value aliases the input: %q", got["f"])
	}
}

func TestDecodeFields(t *testing.T) {
	rec := ycsbLike(10, 8)
	enc := EncodeRecord(rec)
	got, err := DecodeFields(enc, []string{"field3", "field7", "missing"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"field3": rec["field3"], "field7": rec["field7"]}
	if !equalRecords(got, want) {
		t.Fatalf("got %v", got)
	}
	all, err := DecodeFields(enc, nil)
	if err != nil || !equalRecords(all, rec) {
		t.Fatalf("nil fields must decode everything: %v", err)
	}
}

func TestMergeRecord(t *testing.T) {
	old := EncodeRecord(map[string][]byte{"a": []byte("1"), "b": []byte("2")})
	merged, err := MergeRecord(old, map[string][]byte{"b": []byte("two"), "c": []byte("3")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRecord(merged)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"a": []byte("1"), "b": []byte("two"), "c": []byte("3")}
	if !equalRecords(got, want) {
		t.Fatalf("merge: got %q", got)
	}
	fresh, err := MergeRecord(nil, map[string][]byte{"x": []byte("y")})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := DecodeRecord(fresh); string(got["x"]) != "y" || len(got) != 1 {
		t.Fatalf("merge into nothing: %q", got)
	}
	if _, err := MergeRecord([]byte{9, 9}, nil); !errors.Is(err, ErrCorruptRecord) {
		t.Fatalf("merge into garbage: %v", err)
	}
}

func TestDecodeRejectsCorruptInput(t *testing.T) {
	valid := EncodeRecord(map[string][]byte{"field0": []byte("abc"), "field1": []byte("defg")})
	cases := map[string][]byte{
		"nil":             nil,
		"empty":           {},
		"bad version":     {2, 0},
		"version only":    {recordVersion},
		"trailing byte":   append(append([]byte{}, valid...), 0),
		"count too large": {recordVersion, 5, 0, 0},
		"huge count":      {recordVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
		"varint overflow": {recordVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02},
		"name too long":   {recordVersion, 1, 10, 'a', 0},
		"value too long":  {recordVersion, 1, 1, 'a', 0xff, 0xff, 0xff, 0xff, 0x0f, 'x'},
		"duplicate field": {recordVersion, 2, 1, 'a', 0, 1, 'a', 0},
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeRecord(in); !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("DecodeRecord(%x) = %v, want ErrCorruptRecord", in, err)
			}
			if _, err := DecodeFields(in, []string{"a"}); !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("DecodeFields(%x) = %v, want ErrCorruptRecord", in, err)
			}
		})
	}
	// Every strict prefix of a valid encoding is truncated.
	for i := range len(valid) {
		if _, err := DecodeRecord(valid[:i]); err == nil {
			t.Fatalf("prefix of length %d decoded without error", i)
		}
	}
}

// TestRandomRecords round-trips many random records and checks that random
// single-byte corruptions either fail cleanly or decode to something that
// re-encodes consistently.
func TestRandomRecords(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 2000 {
		rec := make(map[string][]byte)
		for range r.IntN(12) {
			name := make([]byte, r.IntN(20))
			for i := range name {
				name[i] = byte(r.UintN(256))
			}
			val := make([]byte, r.IntN(300))
			for i := range val {
				val[i] = byte(r.UintN(256))
			}
			rec[string(name)] = val
		}
		enc := EncodeRecord(rec)
		got, err := DecodeRecord(enc)
		if err != nil || !equalRecords(got, rec) {
			t.Fatalf("iteration %d: round trip failed: %v", iter, err)
		}
		mut := bytes.Clone(enc)
		mut[r.IntN(len(mut))] ^= byte(1 + r.UintN(255))
		checkDecodeConsistent(t, mut)
	}
}

func checkDecodeConsistent(t *testing.T, in []byte) {
	t.Helper()
	rec, err := DecodeRecord(in)
	if err != nil {
		if !errors.Is(err, ErrCorruptRecord) {
			t.Fatalf("decode error %v does not wrap ErrCorruptRecord", err)
		}
		return
	}
	again, err := DecodeRecord(EncodeRecord(rec))
	if err != nil || !equalRecords(again, rec) {
		t.Fatalf("decoded record does not survive re-encoding: %v", err)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{recordVersion, 0})
	f.Add(EncodeRecord(ycsbLike(3, 5)))
	f.Add([]byte{recordVersion, 2, 1, 'a', 0, 1, 'a', 0})
	f.Add([]byte{recordVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, in []byte) {
		checkDecodeConsistent(t, in)
	})
}

func FuzzRoundTrip(f *testing.F) {
	f.Add("field0", []byte("v0"), "field1", []byte{})
	f.Add("", []byte{0xff}, "\x00", []byte(nil))
	f.Fuzz(func(t *testing.T, k1 string, v1 []byte, k2 string, v2 []byte) {
		rec := map[string][]byte{k1: v1, k2: v2}
		got, err := DecodeRecord(EncodeRecord(rec))
		if err != nil {
			t.Fatal(err)
		}
		if !equalRecords(got, rec) {
			t.Fatalf("round trip mismatch: %q vs %q", got, rec)
		}
	})
}

// BenchmarkDecodeRow decodes one YCSB row of 10 fields × 100 bytes, what a
// scan does per row.
func BenchmarkDecodeRow(b *testing.B) {
	enc := EncodeRecord(ycsbLike(10, 100))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeFields(enc, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDecodedValuesDoNotOverlap: values share one buffer, so appending to
// one must not reach into the next.
func TestDecodedValuesDoNotOverlap(t *testing.T) {
	rec, err := DecodeRecord(EncodeRecord(map[string][]byte{"field0": []byte("aaa"), "field1": []byte("bbb"), "x": {}}))
	if err != nil {
		t.Fatal(err)
	}
	_ = append(rec["field0"], 'Z', 'Z', 'Z')
	_ = append(rec["x"], 'Z')
	if string(rec["field1"]) != "bbb" || string(rec["field0"]) != "aaa" || len(rec["x"]) != 0 || rec["x"] == nil {
		t.Fatalf("values overlap: %q", rec)
	}
}
