//go:build !unix

package vfstest

// buffer returns a buffer of length n, buf's storage if it is large enough.
func buffer(buf []byte, n int) []byte {
	if n <= cap(buf) {
		return buf[:n]
	}
	return make([]byte, n, max(n, 2*cap(buf)))
}

func release([]byte) {}
