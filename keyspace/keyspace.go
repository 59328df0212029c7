// Package keyspace names the ranges of the raw key space that belong to a
// layer other than the KV API, in one place every layer can import.
//
// The raw key space is one: the KV API (package server's KV service) and
// the etcd v3 API layer both keep their keys in it, through the same
// regions. The etcd layer keeps its whole keyspace under EtcdPrefix, in
// one region (so that its revisions are one region's counter, as etcd's
// are); the KV API refuses those keys and hides them from scans, so a KV
// client can neither read nor write past the etcd layer's back.
//
// Why a package of its own: the range is policy about what keys mean,
// shared by the server (which refuses it), the etcd layer (which owns it)
// and tools (which may show it). Package region is the model of a
// replicated range and knows nothing of what its keys mean; raftstore
// learns ranges to keep whole only through Config.KeepWhole, a mechanism
// with no opinion on whose they are. This package imports nothing of
// hedgekv and sits at the bottom of the layout (docs/design.md), so any
// layer can import it without a cycle.
package keyspace

import "bytes"

// The etcd API's keyspace: every key with the prefix EtcdPrefix, the range
// [EtcdPrefix, EtcdEnd). EtcdEnd is the prefix's end (its last byte, '/',
// plus one): the first key after every key with the prefix.
const (
	EtcdPrefix = "\xffetcd/"
	EtcdEnd    = "\xffetcd0"
)

// IsEtcd reports whether key lies in the etcd API's keyspace.
func IsEtcd(key []byte) bool {
	return bytes.HasPrefix(key, []byte(EtcdPrefix))
}

// EtcdRange returns the etcd API's keyspace as [start, end), fresh slices
// the caller may keep or change.
func EtcdRange() (start, end []byte) {
	return []byte(EtcdPrefix), []byte(EtcdEnd)
}
