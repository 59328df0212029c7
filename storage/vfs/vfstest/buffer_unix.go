//go:build unix

package vfstest

import "syscall"

// buffer returns a buffer of length n, buf's storage if it is large
// enough, else new anonymous memory (off the Go heap; buf's is unmapped).
func buffer(buf []byte, n int) []byte {
	if n <= cap(buf) {
		return buf[:n]
	}
	size := max(n, 2*cap(buf), 1<<20)
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return make([]byte, n)
	}
	if cap(buf) > 0 {
		_ = syscall.Munmap(buf[:cap(buf)])
	}
	return b[:n]
}

// release unmaps buf's storage if buffer mapped it.
func release(buf []byte) {
	if cap(buf) > 0 {
		_ = syscall.Munmap(buf[:cap(buf)])
	}
}
