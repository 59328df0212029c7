package region

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// FormatKey renders a key (or value) as text, losslessly, the one way
// every place that shows keys to people or scripts does (ctl regions and
// its --json, get/scan -w json, the status page's /status):
//
//   - a key that is valid UTF-8, printable (unicode.IsPrint, space
//     included) and holds no backslash is itself;
//   - any other key is escaped: a backslash is written \\ and every byte
//     that is not part of a printable UTF-8 character is written \xHH
//     (two lower-case hex digits); printable characters stay as they are.
//
// So a string without a backslash is the key as it is, and a string with
// one is the escaped form: ParseKey undoes it, and two different keys
// never print the same (JSON's own \ufffd substitution of invalid UTF-8
// made "\xff" and "\xfe" look alike).
func FormatKey(key []byte) string {
	if plainKey(key) {
		return string(key)
	}
	var b strings.Builder
	b.Grow(len(key) + 8)
	for len(key) > 0 {
		r, size := utf8.DecodeRune(key)
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == utf8.RuneError && size <= 1, !unicode.IsPrint(r):
			for _, c := range key[:size] {
				fmt.Fprintf(&b, `\x%02x`, c)
			}
		default:
			b.Write(key[:size])
		}
		key = key[size:]
	}
	return b.String()
}

// plainKey reports whether FormatKey shows key as it is.
func plainKey(key []byte) bool {
	for len(key) > 0 {
		r, size := utf8.DecodeRune(key)
		if r == '\\' || (r == utf8.RuneError && size <= 1) || !unicode.IsPrint(r) {
			return false
		}
		key = key[size:]
	}
	return true
}

// ParseKey is the inverse of FormatKey. Only the escapes FormatKey writes
// (\\ and \xHH) are accepted; anything else after a backslash is an error.
func ParseKey(s string) ([]byte, error) {
	if !strings.Contains(s, `\`) {
		return []byte(s), nil
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			out = append(out, s[i])
			continue
		}
		switch {
		case i+1 < len(s) && s[i+1] == '\\':
			out = append(out, '\\')
			i++
		case i+3 < len(s) && s[i+1] == 'x':
			v, err := strconv.ParseUint(s[i+2:i+4], 16, 8)
			if err != nil {
				return nil, fmt.Errorf("parse key %q: bad escape %q at byte %d", s, s[i:i+4], i)
			}
			out = append(out, byte(v))
			i += 3
		default:
			return nil, fmt.Errorf("parse key %q: bad escape at byte %d (want \\\\ or \\xHH)", s, i)
		}
	}
	return out, nil
}
