package engine

import (
	"bytes"
	"testing"
)

// FuzzDecodeApplyState: the 32-byte apply state record. Every 32-byte input
// is a state, and the encoding is a bijection.
func FuzzDecodeApplyState(f *testing.F) {
	f.Add(ApplyState{AppliedIndex: 5, AppliedTerm: 5, TruncatedIndex: 5, TruncatedTerm: 5}.Encode())
	f.Add(ApplyState{AppliedIndex: 1 << 40, AppliedTerm: 3, TruncatedIndex: 1 << 39, TruncatedTerm: 2}.Encode())
	f.Add(make([]byte, 31))
	f.Add(make([]byte, 33))
	f.Add([]byte(nil))

	f.Fuzz(func(t *testing.T, b []byte) {
		as, err := DecodeApplyState(b)
		if len(b) != 32 {
			if err == nil {
				t.Fatalf("DecodeApplyState accepted %d bytes", len(b))
			}
			return
		}
		if err != nil {
			t.Fatalf("DecodeApplyState(32 bytes): %v", err)
		}
		if got := as.Encode(); !bytes.Equal(got, b) {
			t.Fatalf("Encode(Decode(%x)) = %x", b, got)
		}
	})
}
