package raftstore

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/hedgekv/hedgekv/storage/engine"
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
		if err := ss.clearResolved(f.marker, start, end, 0); err != nil {
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
	marker engine.Marker
	region uint64
	apply  *applyMarker
	clear  *clearMarker
}

// readMarkers returns every apply and clear marker, and per region the
// applies of peers not destroyed.
func (ss *snapshots) readMarkers() ([]foundMarker, map[uint64]int, error) {
	var all []foundMarker
	perRegion := map[uint64]int{}
	err := ss.eng.View(func(tx *engine.Tx) error {
		return tx.ForEachMarker(func(m engine.Marker, v []byte) error {
			f := foundMarker{marker: m, region: m.RegionID}
			var err error
			if m.Kind == engine.MarkerSnapApply {
				f.apply = &applyMarker{}
				err = json.Unmarshal(v, f.apply)
				if err == nil && !tx.Tombstoned(f.region, f.apply.Peer) {
					perRegion[f.region]++
				}
			} else {
				f.clear = &clearMarker{}
				err = json.Unmarshal(v, f.clear)
			}
			if err != nil {
				return fmt.Errorf("marker %+v: %v: %w", m, err, errCorrupt)
			}
			all = append(all, f)
			return nil
		})
	})
	return all, perRegion, err
}

// persistedClaims is Store.claimed at open, from what is on disk: the
// ranges of the regions there but region except and those frozen for a
// merge into it, whose pairs except's snapshot replaces.
func (ss *snapshots) persistedClaims(except uint64) ([]engine.Span, error) {
	spans, err := ss.eng.PersistedRanges(except)
	if err != nil {
		return nil, err
	}
	out := spans[:0]
	err = ss.eng.View(func(tx *engine.Tx) error {
		for _, sp := range spans {
			r, err := decodeRegion(tx.RegionMeta(sp.ID))
			if err == nil && r.Merge != nil && r.Merge.Target == except {
				continue
			}
			out = append(out, sp)
		}
		return nil
	})
	return out, err
}

// redoApply applies f's snapshot again from its file and writes the state
// its held Ready would have; a file that cannot be used clears a
// placeholder's writes and is an error for a replica that held data.
func (ss *snapshots) redoApply(f foundMarker) error {
	noStop := func() error { return nil }
	m := f.apply
	path := filepath.Join(ss.dir, filepath.Base(m.File))
	claimed, err := ss.persistedClaims(f.region)
	if err != nil {
		return err
	}
	base, err := ss.eng.ApplySnapshotFile(path, spanOf(m.Region), claimed, noStop)
	if err != nil {
		if m.WasInit {
			return fmt.Errorf("region %d: snapshot apply at index %d cannot be finished from %s (%v); the replica's log is gone: remove the store's data and add it back", f.region, m.Index, path, err)
		}
		ss.log.Warn("an interrupted snapshot apply cannot be redone: cleared; the leader sends another", "region", f.region, "peer", m.Peer, "err", err)
		return ss.clearResolved(f.marker, m.Region.StartKey, m.Region.EndKey, f.region)
	}
	err = ss.eng.Update(func(tx *engine.Tx) error {
		var hs raftpb.HardState
		if m.HasHard {
			hs = raftpb.HardState{Term: m.HardTerm, Vote: m.HardVote, Commit: m.HardCommit}
		} else {
			var err error
			if hs, _, err = tx.HardState(f.region); err != nil {
				return err
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
		if err := tx.PutHardState(f.region, hs); err != nil {
			return err
		}
		return tx.DeleteMarker(f.marker)
	})
	if err != nil {
		return fmt.Errorf("region %d: finish an interrupted snapshot apply: %w", f.region, err)
	}
	ss.log.Info("finished an interrupted snapshot apply from its file", "region", f.region, "peer", m.Peer, "index", m.Index)
	return nil
}

func (ss *snapshots) tombstoned(regionID, peerID uint64) bool {
	var t bool
	_ = ss.eng.View(func(tx *engine.Tx) error {
		t = tx.Tombstoned(regionID, peerID)
		return nil
	})
	return t
}

// clearResolved clears [start, end) but what the persisted regions (less
// region except) hold, then deletes the marker.
func (ss *snapshots) clearResolved(m engine.Marker, start, end []byte, except uint64) error {
	claimed, err := ss.eng.PersistedRanges(except)
	if err != nil {
		return err
	}
	for _, iv := range engine.FreeRanges(start, end, claimed) {
		if err := ss.eng.ClearUserRange(iv[0], iv[1], func() error { return nil }); err != nil {
			return err
		}
	}
	return ss.eng.Update(func(tx *engine.Tx) error { return tx.DeleteMarker(m) })
}
