package raftstore

import "time"

// TestingKnobs change what one store does, for tests only (CockroachDB's
// TestingKnobs). Every store the binary starts has the zero value, which
// changes nothing. They are per store, not package variables, so tests
// that run stores side by side never see each other's hooks.
type TestingKnobs struct {
	// ApplyFilter, if set, sees each user-data write this store applies
	// (del: a delete) and returns what to write instead. A test makes one
	// replica diverge from its peers with it, as a bug or a bad disk
	// would, to show that the replica check names the difference.
	ApplyFilter func(regionID uint64, key, value []byte, del bool) (newValue []byte, newDel bool)
	// AfterTick, if set, runs on the Ready loop after each tick and the
	// round it started: a test stepping a manual clock (Config.Clock)
	// waits for it before the next step, so no tick is dropped and each
	// tick's effects are in place when it looks.
	AfterTick func()
	// MergeSettleAfter, if set, replaces how long a region stays frozen
	// for a merge before the merge check settles it (mergeSettleAfter).
	MergeSettleAfter time.Duration
	// TickVisits, if set, is told at each tick how many peers it visits:
	// the awake ones only (hibernate.go), which a test counts to show that
	// a store of sleeping regions ticks nothing.
	TickVisits func(visited int)

	// afterPersist runs in every round between its write and its
	// publish: a message a test hands the store there lands in the window
	// where the round's acks are decided but not yet sent.
	afterPersist func(s *Store, batch []*readyPeer)
	// beforeShapeCheckpoint runs in a round that changed the shape of
	// the regions shaped, after their apply and before the checkpoint
	// that makes it durable (a test holds a freeze there, applied and
	// not yet durable).
	beforeShapeCheckpoint func(s *Store, shaped []uint64)
	// beforeApplyBatch runs before each transaction of a snapshot apply
	// (stop or crash a store half-way).
	beforeApplyBatch func(regionID uint64)
}
