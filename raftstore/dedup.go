package raftstore

import "github.com/hedgekv/hedgekv/storage/engine"

// Exactly-once writes.
//
// A client retries a write whose outcome it never learned (a timeout, a
// leader that stepped down after proposing). Re-applying it would not be
// harmless even for a put: put(x,1), put(x,2), then the retried put(x,1)
// applied again lets readers see 1, 2, 1 — not linearizable. So every write
// carries a request ID that the client keeps across retries (with the same
// key: a retry is the same write), and the state machine remembers the
// (key, ID) pairs it applied: a repeat within DedupWindow entries of the
// original is acknowledged without being applied again.
//
// # Records live in the key space, like the data
//
// The engine keeps the records (storage/engine, dedup.go) keyed by user
// key, so the records of a region are a key range of the table, the way
// its data is a key range of the data. Whatever region holds a key on
// this store holds its records, and moving a key range between regions
// moves nothing:
//
//   - a split writes one value (the new region's clock base) and touches no
//     record: the new region owns the records of its range because it owns
//     the range (splits cost the same whatever the region holds; issue 18
//     measured 11.8 s for moving 100,000 records);
//   - a snapshot carries the records of its region's range, in key order
//     (so the receiver inserts them sorted), and its apply replaces that
//     range of the bucket, as it replaces that range of the data;
//   - destroying a replica deletes its range of the bucket with its data.
//
// # The clock: counted in the region's lineage log
//
// A record holds the clock of the entry it was applied at. A region's
// clock at its entry e is e + base. Region 1 starts with base 0. A split
// applied at the parent's entry at gives the new region the base
// clock(at) - raftInitIndex, so its clock goes on from the parent's clock
// at the split: the clock counts the entries of the region's log and of its
// ancestors' logs before the split that made it. Both halves share the
// records' clocks up to the split, which is why nothing is re-based.
//
// # Every replica decides the same
//
// The write at entry e of a region (clock c = e + base) with request ID id
// and key k is a duplicate iff there is a record (k, id) at clock r with
//
//	r < c and c - r <= DedupWindow
//
// That is a function of the log alone: records are written only by
// applying entries (same entries, same clocks on every replica), a base
// only by a split entry or a snapshot, and a snapshot carries its region's
// base and records as of its index. Trimming never decides anything: it
// removes only records with r + DedupWindow <= clock(applied), which no
// entry after applied could judge seen, so how a replica batches entries
// into apply rounds, how far its bounded trimming got, or whether it
// trimmed at all, never changes an answer.
//
// Trimming sweeps: each apply round of a region looks at the next few
// records of its range (a budget growing with the entries the round
// applied), deletes the dead ones, and remembers where it stopped (in
// memory: it decides nothing); at the end of the range it starts over. A
// region that applies E entries a round sweeps at least 4E records, so
// dead records are found within about a quarter of the table's size in
// entries and the table stays within a small factor of the live records.

// Sweep budget per apply round: dedupSweepMin plus dedupSweepPerEntry for
// every entry the round applied, at most dedupSweepMax records.
const (
	dedupSweepMin      = 32
	dedupSweepPerEntry = 4
	dedupSweepMax      = 4096
)

// trimDedupTx is one apply round's trimming of region regionID, which
// applied n entries up to applied: it sweeps on from where the region's
// last sweep stopped and forgets the dead records it meets (clock + window
// <= the clock at applied). It decides nothing (see above).
func (s *Store) trimDedupTx(tx *engine.Tx, p *Peer, applied uint64, n int) error {
	p.mu.Lock()
	r := p.region
	p.mu.Unlock()
	window := s.cfg.DedupWindow
	now := tx.DedupClock(p.regionID, applied)
	if now < window {
		return nil
	}
	budget := min(dedupSweepMin+dedupSweepPerEntry*n, dedupSweepMax)
	from := s.eng.SweepFrom(p.regionID)
	next, err := tx.SweepDedup(r.StartKey, r.EndKey, from, now-window, budget)
	if err != nil {
		return err
	}
	s.eng.SetSweepFrom(p.regionID, next)
	return nil
}
