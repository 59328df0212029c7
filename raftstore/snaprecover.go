package raftstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// Open-time recovery of snapshot applies and range clears a stop, a
// crash or a disk failure left half-way (snapapply.go).

// resolve finishes or clears, from their markers, the applies and clears
// a stop, a crash or a disk failure left half-way, before any peer is
// loaded. A clear, or an apply of a peer destroyed (tombstone) or that is
// not its region's only apply (a superseded placeholder), is cleared; an
// apply is done again from its file and given the state its held Ready
// would have written; one whose file is unusable is cleared if the peer
// was a placeholder, and is an error otherwise (a leader may count on the
// log the peer had, which is gone).
func (ss *snapshots) resolve() error {
	all, perRegion, err := ss.readMarkers()
	if err != nil || len(all) == 0 {
		return err
	}
	var reapply []foundMarker
	for _, f := range all {
		var start, end []byte
		switch {
		case f.clear != nil:
			start, end = f.clear.Start, f.clear.End
		case ss.tombstoned(f.region, f.apply.Peer) || (!f.apply.WasInit && perRegion[f.region] > 1):
			start, end = f.apply.Region.StartKey, f.apply.Region.EndKey
		default:
			reapply = append(reapply, f)
			continue
		}
		if err := ss.clearResolved(f.key, start, end, 0); err != nil {
			return err
		}
	}
	for _, f := range reapply {
		if err := ss.redoApply(f); err != nil {
			return err
		}
	}
	return nil
}

// foundMarker is an apply or clear marker found at open.
type foundMarker struct {
	key    []byte
	region uint64
	apply  *applyMarker
	clear  *clearMarker
}

// readMarkers returns every apply and clear marker, and per region the
// applies of peers not destroyed.
func (ss *snapshots) readMarkers() ([]foundMarker, map[uint64]int, error) {
	var all []foundMarker
	perRegion := map[uint64]int{}
	err := ss.eng.db.View(func(tx *bbolt.Tx) error {
		st := tx.Bucket(bucketRaftState)
		c := st.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != 17 || (k[8] != suffixSnapApply && k[8] != suffixClear) {
				continue
			}
			f := foundMarker{key: bytes.Clone(k), region: binary.BigEndian.Uint64(k)}
			var err error
			if k[8] == suffixSnapApply {
				f.apply = &applyMarker{}
				err = json.Unmarshal(v, f.apply)
				if err == nil && st.Get(tombstoneKey(f.region, f.apply.Peer)) == nil {
					perRegion[f.region]++
				}
			} else {
				f.clear = &clearMarker{}
				err = json.Unmarshal(v, f.clear)
			}
			if err != nil {
				return fmt.Errorf("marker %x: %v: %w", k, err, errCorrupt)
			}
			all = append(all, f)
		}
		return nil
	})
	return all, perRegion, err
}

// redoApply applies f's snapshot again from its file and writes the state
// its held Ready would have; a file that cannot be used clears a
// placeholder's writes and is an error for a replica that held data.
func (ss *snapshots) redoApply(f foundMarker) error {
	noStop := func() error { return nil }
	m := f.apply
	path := filepath.Join(ss.dir, filepath.Base(m.File))
	claimed, err := ss.eng.persistedRanges(f.region)
	if err != nil {
		return err
	}
	base, err := ss.eng.applySnapshotFile(path, m.Region, claimed, noStop)
	if err != nil {
		if m.WasInit {
			return fmt.Errorf("region %d: snapshot apply at index %d cannot be finished from %s (%v); the replica's log is gone: remove the store's data and add it back", f.region, m.Index, path, err)
		}
		ss.log.Warn("an interrupted snapshot apply cannot be redone: cleared; the leader sends another", "region", f.region, "peer", m.Peer, "err", err)
		return ss.clearResolved(f.key, m.Region.StartKey, m.Region.EndKey, f.region)
	}
	err = ss.eng.update(func(tx *bbolt.Tx) error {
		st := tx.Bucket(bucketRaftState)
		var hs raftpb.HardState
		if m.HasHard {
			hs = raftpb.HardState{Term: m.HardTerm, Vote: m.HardVote, Commit: m.HardCommit}
		} else if v := st.Get(stateKey(f.region, suffixHardState)); v != nil {
			if err := hs.Unmarshal(v); err != nil {
				return fmt.Errorf("region %d hard state: %w", f.region, err)
			}
		}
		// The log ends at the snapshot: the held Ready's entries
		// after it were never acknowledged.
		hs.Commit = m.Index
		if hs.Term < m.Term {
			hs.Term, hs.Vote = m.Term, 0
		}
		if err := finishSnapshotTx(tx, m.Region, m.Index, m.Term, base); err != nil {
			return err
		}
		if err := putHardState(tx, f.region, hs); err != nil {
			return err
		}
		return st.Delete(f.key)
	})
	if err != nil {
		return fmt.Errorf("region %d: finish an interrupted snapshot apply: %w", f.region, err)
	}
	ss.log.Info("finished an interrupted snapshot apply from its file", "region", f.region, "peer", m.Peer, "index", m.Index)
	return nil
}

func (ss *snapshots) tombstoned(regionID, peerID uint64) bool {
	var t bool
	_ = ss.eng.db.View(func(tx *bbolt.Tx) error {
		t = tx.Bucket(bucketRaftState).Get(tombstoneKey(regionID, peerID)) != nil
		return nil
	})
	return t
}

// clearResolved clears [start, end) but what the persisted regions (less
// region except) hold, then deletes the marker key.
func (ss *snapshots) clearResolved(key, start, end []byte, except uint64) error {
	claimed, err := ss.eng.persistedRanges(except)
	if err != nil {
		return err
	}
	for _, iv := range freeRanges(start, end, claimed) {
		if err := ss.eng.clearUserRange(iv[0], iv[1], func() error { return nil }); err != nil {
			return err
		}
	}
	return ss.eng.update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketRaftState).Delete(key) })
}

// persistedRanges returns the ranges of the regions this store holds data
// of, as persisted, but region except's.
func (e *engine) persistedRanges(except uint64) ([]region.Region, error) {
	var out []region.Region
	err := e.db.View(func(tx *bbolt.Tx) error {
		st := tx.Bucket(bucketRaftState)
		c := st.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != 9 || k[8] != suffixRegion || binary.BigEndian.Uint64(k) == except {
				continue
			}
			as, err := decodeApplyState(st.Get(stateKey(binary.BigEndian.Uint64(k), suffixApplyState)))
			if err != nil || as.AppliedIndex == 0 {
				continue
			}
			var r region.Region
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decode region meta: %w", err)
			}
			out = append(out, r)
		}
		return nil
	})
	return out, err
}

// markerCount is for tests: the apply and clear markers on disk.
func (e *engine) markerCount() (applies, clears int) {
	_ = e.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketRaftState).Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if len(k) == 17 && k[8] == suffixSnapApply {
				applies++
			} else if len(k) == 17 && k[8] == suffixClear {
				clears++
			}
		}
		return nil
	})
	return applies, clears
}
