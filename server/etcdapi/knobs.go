package etcdapi

import "time"

// TestingKnobs change what one Service does, for tests only (as
// raftstore.TestingKnobs do a store's). Every store the binary starts has
// none. They are per Service, not package variables, so tests that run
// stores side by side never see each other's.
type TestingKnobs struct {
	// WatchBuffer, if positive, replaces watchBuffer: how many events of
	// a synced watcher the stream's sender may hold unsent before the
	// watcher drops back to reading history.
	WatchBuffer int
	// ProgressEvery, if positive, replaces progressEvery: how long a
	// watcher that asked for progress notifications waits idle for one.
	ProgressEvery time.Duration
	// BeforeJoin, if set, runs between a watcher's last read of history
	// and its join to the feed: a pause there lets the feed move on.
	BeforeJoin func()
	// OnJoin, if set, is told of each watcher that joined the feed;
	// readRest: it found the feed ahead and read the rest of its history
	// holding the feed's lock.
	OnJoin func(readRest bool)
	// OnFallback, if set, is told of each synced watcher that fell behind
	// and dropped back to reading history.
	OnFallback func()
	// OnWatchUpstream, if set, is told of each upstream stream a watch
	// proxy (a store with no replica of the keyspace) opened: from the
	// proxy's store to store to; cut breaks that stream, as a connection
	// lost would.
	OnWatchUpstream func(from, to uint64, cut func())
	// OnWatchProxy, if set, is told when a watch proxy on store starts
	// (delta 1) and when it has stopped everything it started (-1).
	OnWatchProxy func(store uint64, delta int)
	// BackendBatch, if positive, replaces backendBatch: the entries one
	// transaction of a snapshot file holds.
	BackendBatch int
}

// knobs is the Service's knobs, never nil.
func (s *Service) knobs() *TestingKnobs {
	if s.cfg.Knobs == nil {
		return &noKnobs
	}
	return s.cfg.Knobs
}

var noKnobs TestingKnobs
