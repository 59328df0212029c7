package raftstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hedgekv/hedgekv/region"
)

// Ranges kept whole (Config.KeepWhole). Another layer may need a range of
// keys in one region: the etcd API layer keeps its whole keyspace in one,
// so that its revisions are one region's counter, as etcd's are. No split
// may cut such a range:
//
//   - the split check (splitCheck, splitKey) never picks a key strictly
//     inside one: a middle that falls inside moves to the range's start or
//     end, whichever is strictly inside the region and splits it more
//     evenly, and if neither is, the region is not split (it is the kept
//     range, or lies inside it);
//   - Split refuses a key strictly inside one (*KeptRangeError);
//   - EnsureBoundaries splits at a range's ends, so that it becomes a
//     region of its own.
//
// It is the proposing leader's policy, checked when a split is proposed,
// not when one applies (apply must not depend on a store's config): stores
// that disagree on it for a while (a rolling restart) lose nothing but a
// split one of them would have refused. A merge never cuts a range, and
// the automatic merge check leaves a kept range's bounds alone (merge.go),
// so a kept range made a region of its own stays one unless merged by
// hand.

// KeepRange is a key range [Start, End) that no split may cut. End is
// exclusive and not empty (a kept range has an end), and sorts after
// Start; an empty Start is the key space's start.
type KeepRange struct {
	Start, End []byte
}

func (kr KeepRange) String() string {
	return fmt.Sprintf("[%s, %s)", region.FormatKey(kr.Start), region.FormatKey(kr.End))
}

// cutBy reports whether a split at key would cut kr: key lies strictly
// inside it (its start and its end are boundaries a split may make).
func (kr KeepRange) cutBy(key []byte) bool {
	return bytes.Compare(kr.Start, key) < 0 && bytes.Compare(key, kr.End) < 0
}

// KeptRangeError refuses a split at Key, which lies strictly inside Range,
// a range of Config.KeepWhole. It is an ErrInvalidRequest (errors.Is).
type KeptRangeError struct {
	Key   []byte
	Range KeepRange
}

func (e *KeptRangeError) Error() string {
	return fmt.Sprintf("split key %s lies inside %s, a range no split may cut (Config.KeepWhole); split at its start or its end: %v",
		region.FormatKey(e.Key), e.Range, ErrInvalidRequest)
}

func (e *KeptRangeError) Unwrap() error { return ErrInvalidRequest }

// keptRangeAt returns the range of keep (sorted, none overlapping) that a
// split at key would cut.
func keptRangeAt(keep []KeepRange, key []byte) (KeepRange, bool) {
	// The last range starting before key is the only one that can hold it.
	i, _ := slices.BinarySearchFunc(keep, key, func(kr KeepRange, k []byte) int {
		if bytes.Compare(kr.Start, k) < 0 {
			return -1
		}
		return 1
	})
	if i > 0 && keep[i-1].cutBy(key) {
		return keep[i-1], true
	}
	return KeepRange{}, false
}

// checkKeepWhole checks Config.KeepWhole: every range has an end after
// its start, and no two overlap.
func checkKeepWhole(keep []KeepRange) error {
	for _, kr := range keep {
		if len(kr.End) == 0 {
			return &ConfigError{"KeepWhole", kr, "a kept range needs an end (End is exclusive; empty would be the key space's end)"}
		}
		if bytes.Compare(kr.Start, kr.End) >= 0 {
			return &ConfigError{"KeepWhole", kr, "End must sort after Start"}
		}
	}
	sorted := sortedKeepRanges(keep)
	for i := 1; i < len(sorted); i++ {
		if bytes.Compare(sorted[i].Start, sorted[i-1].End) < 0 {
			return &ConfigError{"KeepWhole", keep, fmt.Sprintf("ranges %s and %s overlap", sorted[i-1], sorted[i])}
		}
	}
	return nil
}

// sortedKeepRanges is a deep copy of keep sorted by Start: the store keeps
// its own, which the caller's slices cannot change.
func sortedKeepRanges(keep []KeepRange) []KeepRange {
	if len(keep) == 0 {
		return nil
	}
	out := make([]KeepRange, len(keep))
	for i, kr := range keep {
		out[i] = KeepRange{Start: bytes.Clone(kr.Start), End: bytes.Clone(kr.End)}
		if out[i].Start == nil {
			out[i].Start = []byte{}
		}
	}
	slices.SortFunc(out, func(a, b KeepRange) int { return bytes.Compare(a.Start, b.Start) })
	return out
}

// keptBoundsInside returns the starts and ends of the kept ranges (sorted,
// none overlapping) that lie strictly inside r, in key order, each once:
// the keys the split check may move a split key to.
func keptBoundsInside(keep []KeepRange, r region.Region) [][]byte {
	var out [][]byte
	add := func(b []byte) {
		if bytes.Compare(r.StartKey, b) < 0 && (len(r.EndKey) == 0 || bytes.Compare(b, r.EndKey) < 0) &&
			(len(out) == 0 || !bytes.Equal(out[len(out)-1], b)) {
			out = append(out, b)
		}
	}
	for _, kr := range keep {
		add(kr.Start)
		add(kr.End)
	}
	return out
}

// ensureAttempts bounds how often EnsureBoundaries looks again at a key
// whose region is changing under it (a concurrent split, this store
// publishing one), a tick apart, before it returns what it last met.
const ensureAttempts = 20

// EnsureBoundaries makes each of keys a region boundary (the start key of
// a region), splitting the region that holds one at it if it is not one
// yet. Called with a kept range's start and end (Config.KeepWhole), it
// makes that range a region of its own. Boundaries are permanent (regions
// never merge): once a key is one it stays one, so the call is idempotent.
//
// It is meant to be called on every store, concurrently and as often as
// wanted (at start-up, until it returns nil): only the leader of the
// region holding a key splits there. For each key, this store
//
//   - does nothing if the key is a boundary in its view (the empty key
//     always is);
//   - splits at the key if it leads the region holding it, and returns
//     once the split has applied here;
//   - returns a *region.NotLeaderError (with the leader, if it knows it)
//     if it does not lead that region;
//   - returns a *region.RegionNotFoundError if it hosts no replica (or only
//     one still waiting for its data) of a region holding the key, after
//     looking again for a few ticks (a split may be being published).
//
// NotLeader is retryable: the call returns nil on a follower once its
// leader has split and it has applied the split. So a caller loops on
// every store while the error is retryable (NotLeader, ErrProposalDropped,
// a context deadline), and stops at nil; RegionNotFound says this store
// has no part in the work (its replica may come later, with the split
// applied), and a caller that needs the boundaries seen here waits on
// something else. A key strictly inside a kept range is refused
// (*KeptRangeError), as Split refuses it.
//
// Keys are split from the highest down: a split leaves its left part (the
// lower keys) with the region's ID and leader, so the next, lower key is
// split by the same leader with no election between. Every key is tried;
// the errors of those that failed are returned joined (errors.Join: test
// them with errors.As and errors.Is).
func (s *Store) EnsureBoundaries(ctx context.Context, keys ...[]byte) error {
	sorted := make([][]byte, 0, len(keys))
	for _, k := range keys {
		if len(k) > 0 {
			sorted = append(sorted, k)
		}
	}
	slices.SortFunc(sorted, func(a, b []byte) int { return bytes.Compare(b, a) })
	sorted = slices.CompactFunc(sorted, bytes.Equal)
	var errs []error
	for _, k := range sorted {
		if err := s.ensureBoundary(ctx, k); err != nil {
			errs = append(errs, fmt.Errorf("boundary at %s: %w", region.FormatKey(k), err))
		}
	}
	return errors.Join(errs...)
}

// ensureBoundary makes key (not empty) a region boundary, as
// EnsureBoundaries does for each of its keys.
func (s *Store) ensureBoundary(ctx context.Context, key []byte) error {
	if kr, ok := keptRangeAt(s.cfg.KeepWhole, key); ok {
		return &KeptRangeError{Key: bytes.Clone(key), Range: kr}
	}
	var last error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if attempt >= ensureAttempts {
				return last
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
			case <-s.stopc:
				return ErrStopped
			case <-time.After(s.cfg.TickInterval):
			}
		}
		if s.stopped() {
			return ErrStopped
		}
		done, final, err := s.boundaryHere(key)
		switch {
		case done:
			return nil
		case err != nil && final:
			return err // another store leads: its split is for it to make
		case err != nil:
			last = err // no region here, or this store is publishing a split: look again
			continue
		}
		_, _, err = s.Split(ctx, key)
		var nl *region.NotLeaderError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &nl), errors.Is(err, ErrProposalDropped), errors.Is(err, ErrStopped), ctx.Err() != nil:
			return err
		case region.IsRegionError(err), errors.Is(err, ErrInvalidRequest):
			// Another split got there first: a concurrent call's at this
			// key (a boundary now: "already a region boundary", or the
			// epoch it was proposed at is stale) or one elsewhere in the
			// region. Look again.
			last = err
		default:
			return err
		}
	}
}

// boundaryHere looks at the region holding key on this store: done if key
// is its start key; otherwise err is nil if this store leads it (it may
// split), and else says why not: final set for a NotLeader, which the
// caller returns, unset for what may pass (no region here holds key, or the
// one found no longer does: a split being published).
func (s *Store) boundaryHere(key []byte) (done, final bool, err error) {
	s.mu.RLock()
	r, ok := s.ranges.Lookup(key)
	var p *Peer
	if ok {
		p = s.peers[r.ID]
	}
	s.mu.RUnlock()
	if p == nil {
		return false, false, &region.RegionNotFoundError{RegionID: r.ID}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkServingLocked(region.Epoch{}, key); err != nil {
		return false, false, err
	}
	if bytes.Equal(p.region.StartKey, key) {
		return true, false, nil
	}
	if !p.isLeaderLocked() {
		return false, true, p.notLeaderLocked()
	}
	return false, false, nil
}
