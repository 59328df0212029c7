package raftstore

import "github.com/hedgekv/hedgekv/storage/engine"

// CorruptForTest exists for tests only: it writes key=value (nil value:
// deletes key) straight into this store's user data, behind raft's back,
// leaving the applied index alone, so that the replica check (digest.go)
// can be shown to catch a replica whose data diverged. Never call it
// outside tests: the replica no longer matches its log.
func (s *Store) CorruptForTest(key, value []byte) error {
	return s.eng.Update(func(tx *engine.Tx) error {
		if value == nil {
			return tx.Delete(key)
		}
		return tx.Put(key, value)
	})
}
