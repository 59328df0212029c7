package region

import (
	"bytes"
	"testing"
)

func TestFormatKey(t *testing.T) {
	tests := []struct {
		key  []byte
		want string
	}{
		{nil, ""},
		{[]byte("user/ada"), "user/ada"},
		{[]byte("with space"), "with space"},
		{[]byte("héllo 世界"), "héllo 世界"},
		{[]byte{0xff, 0xfe}, `\xff\xfe`},
		{[]byte("a\\b"), `a\\b`},
		{[]byte("tab\there"), `tab\x09here`},
		{[]byte("nl\n"), `nl\x0a`},
		{[]byte("é\xff"), `é\xff`},
		{[]byte{0}, `\x00`},
		{[]byte(`\x41`), `\\x41`},
	}
	for _, tt := range tests {
		got := FormatKey(tt.key)
		if got != tt.want {
			t.Errorf("FormatKey(%q) = %q, want %q", tt.key, got, tt.want)
		}
		back, err := ParseKey(got)
		if err != nil || !bytes.Equal(back, tt.key) {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", got, back, err, tt.key)
		}
	}
	// The two keys JSON's \ufffd substitution made alike stay apart.
	if FormatKey([]byte{0xff}) == FormatKey([]byte{0xfe}) {
		t.Error(`\xff and \xfe print the same`)
	}
	for _, bad := range []string{`\`, `\q`, `\x4`, `\xzz`, `a\`} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) succeeded", bad)
		}
	}
}

// FuzzFormatKey: FormatKey is lossless, and its output with no backslash
// is the key itself.
func FuzzFormatKey(f *testing.F) {
	for _, s := range []string{"", "a", "\xff\xfe", `a\b`, "é\x00", "\u200b"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, key []byte) {
		s := FormatKey(key)
		back, err := ParseKey(s)
		if err != nil || !bytes.Equal(back, key) {
			t.Fatalf("FormatKey(%q) = %q, ParseKey gives %q, %v", key, s, back, err)
		}
		if !bytes.ContainsRune([]byte(s), '\\') && s != string(key) {
			t.Fatalf("FormatKey(%q) = %q has no escape but is not the key", key, s)
		}
	})
}
