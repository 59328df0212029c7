package raftstore

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/hedgekv/hedgekv/clock"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3/raftpb"
)

// Split divides the region holding key at key, through a raft admin
// command every replica applies at the same log position. The left part
// keeps the region's ID; the right part is a new region whose peers start
// on the same stores and serve at once. It runs on the region's leader.
//
// A key strictly inside a range of Config.KeepWhole is refused with a
// *KeptRangeError (an ErrInvalidRequest), whatever region holds it.
func (s *Store) Split(ctx context.Context, key []byte) (left, right region.Region, err error) {
	if kr, ok := keptRangeAt(s.cfg.KeepWhole, key); ok {
		return left, right, &KeptRangeError{Key: bytes.Clone(key), Range: kr}
	}
	p, err := s.route(0, region.Epoch{}, key)
	if err != nil {
		return left, right, err
	}
	p.mu.Lock()
	r := p.region.Clone()
	// Only the leader proposes a split: refused here, before it takes a
	// region ID that would then be a gap in the sequence.
	if !p.isLeaderLocked() {
		err := p.notLeaderLocked()
		p.mu.Unlock()
		return left, right, err
	}
	p.mu.Unlock()
	if bytes.Equal(key, r.StartKey) {
		return left, right, fmt.Errorf("split key %q is already a region boundary: %w", key, ErrInvalidRequest)
	}
	newID, err := s.newRegionID(ctx)
	if err != nil {
		return left, right, fmt.Errorf("split region %d at %q: %w", r.ID, key, err)
	}
	cmd := command{op: opSplit, key: key, value: encodeSplit(newID, r.Epoch)}
	if err := s.propose(ctx, WriteOptions{RegionID: r.ID, Epoch: r.Epoch}, cmd); err != nil {
		return left, right, fmt.Errorf("split region %d at %q: %w", r.ID, key, err)
	}
	p.mu.Lock()
	left = p.region.Clone()
	p.mu.Unlock()
	if np, ok := s.peer(newID); ok {
		np.mu.Lock()
		right = np.region.Clone()
		np.mu.Unlock()
	}
	return left, right, nil
}

// splitCheck runs in the background: each region this store leads is
// counted (its key count and size are what Regions reports as its
// approximate size), and one that holds more than SplitMaxKeys keys or
// SplitMaxBytes bytes is split at its middle key (by count, or by size when
// size is what overflowed). A region whose applied index and epoch have
// not moved since its last count, and which was under both thresholds
// then (or could not be split: it lies in a kept range), is not counted
// again: its count still holds. No split cuts a kept range
// (Config.KeepWhole, keepwhole.go).
func (s *Store) splitCheck(t clock.Ticker) {
	defer t.Stop()
	type counted struct{ applied, version uint64 }
	last := map[uint64]counted{}
	for {
		select {
		case <-s.stopc:
			return
		case <-t.C():
		}
		led := map[uint64]bool{}
		for _, lr := range s.ledRegions() {
			r := lr.region
			led[r.ID] = true
			now := counted{lr.applied, r.Epoch.Version}
			if c, ok := last[r.ID]; ok && c == now {
				continue
			}
			delete(last, r.ID)
			size, key, ok := splitKey(s.eng, r, s.cfg.SplitMaxKeys, s.cfg.SplitMaxBytes, s.cfg.KeepWhole, s.stopc)
			p, found := s.peer(r.ID)
			if !found {
				continue
			}
			p.mu.Lock()
			p.size = size
			current := p.region.Epoch.Version == size.version
			p.mu.Unlock()
			if size.counted && !ok {
				last[r.ID] = now
			}
			// The count spans several read transactions: a region split
			// meanwhile is counted again next time, not split at a key
			// chosen for its old range.
			if !ok || !current {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			left, right, err := s.Split(ctx, key)
			cancel()
			if err != nil {
				s.log.Warn("automatic split failed", "region", r.ID, "err", err)
				continue
			}
			s.log.Info("split region", "left", left.String(), "right", right.String())
		}
		for id := range last {
			if !led[id] {
				delete(last, id)
			}
		}
	}
}

// The split check reads a region in batches of splitCheckBatch keys, one
// short read transaction each: a long read transaction holds back bbolt's
// remaps (every commit that grows the file past the mapping waits for it,
// and so does every later reader) and the reuse of the pages freed while it
// is open. A batch of 4096 keys takes about 0.1 ms (warm cache).
const splitCheckBatch = 4096

// The check keeps a sample of the keys it counts, with the keys and bytes
// before each, and splits at a sample: one read of the region, not two.
// A sample every splitSampleKeys keys or splitSampleBytes bytes (or a
// sixteenth of the thresholds, if less) puts the split key within that much
// of the middle.
const (
	splitSampleKeys  = 128
	splitSampleBytes = 256 << 10
)

// sampleEvery returns how often the split check samples under a threshold
// (0: none).
func sampleEvery(threshold, most uint64) uint64 {
	if threshold == 0 {
		return most
	}
	return max(1, min(most, threshold/16))
}

// splitKey counts the region, and returns the key to split at if it is
// over either threshold. It gives up (size not counted) if stop closes.
// The key is never strictly inside a range of keep (sorted, none
// overlapping): a middle inside one moves to whichever of the range's
// start and end lies strictly inside the region and is nearer the middle
// (by count, or by size when size is what overflowed); if neither does,
// the region is not split (ok false, size counted).
func splitKey(e *engine.Engine, r region.Region, maxKeys, maxBytes uint64, keep []KeepRange, stop <-chan struct{}) (size regionSize, key []byte, ok bool) {
	size = regionSize{version: r.Epoch.Version}
	type sample struct {
		key         []byte
		keys, bytes uint64 // counted before key
	}
	var samples []sample
	var sampledKeys, sampledBytes uint64 // at the last sample
	everyKeys, everyBytes := sampleEvery(maxKeys, splitSampleKeys), sampleEvery(maxBytes, splitSampleBytes)
	// The kept ranges' bounds inside the region, with the keys and bytes
	// counted before each: where a split key inside a kept range may go.
	bounds := keptBoundsInside(keep, r)
	atBound := make([]sample, len(bounds))
	nextBound := 0
	from := r.StartKey
	for {
		select {
		case <-stop:
			return size, nil, false
		default:
		}
		var next []byte
		err := e.View(func(tx *engine.Tx) error {
			n := 0
			tx.ForEachData(from, r.EndKey, func(k, v []byte) bool {
				if n == splitCheckBatch {
					next = bytes.Clone(k)
					return false
				}
				n++
				for nextBound < len(bounds) && bytes.Compare(k, bounds[nextBound]) >= 0 {
					atBound[nextBound] = sample{key: bounds[nextBound], keys: size.keys, bytes: size.bytes}
					nextBound++
				}
				if size.keys > 0 && (size.keys-sampledKeys >= everyKeys || size.bytes-sampledBytes >= everyBytes) {
					samples = append(samples, sample{key: bytes.Clone(k), keys: size.keys, bytes: size.bytes})
					sampledKeys, sampledBytes = size.keys, size.bytes
				}
				size.keys++
				size.bytes += uint64(len(k) + len(v))
				return true
			})
			return nil
		})
		if err != nil {
			return size, nil, false
		}
		if next == nil {
			break
		}
		from = next
	}
	for ; nextBound < len(bounds); nextBound++ {
		atBound[nextBound] = sample{key: bounds[nextBound], keys: size.keys, bytes: size.bytes}
	}
	size.counted = true
	overKeys, overBytes := maxKeys > 0 && size.keys > maxKeys, maxBytes > 0 && size.bytes > maxBytes
	if !overKeys && !overBytes {
		return size, nil, false
	}
	for _, sm := range samples {
		if (overKeys && sm.keys >= size.keys/2) || (!overKeys && sm.bytes >= size.bytes/2) {
			key, ok = sm.key, true
			break
		}
	}
	if n := len(samples); !ok && n > 0 { // the middle lies after the last sample
		key, ok = samples[n-1].key, true
	}
	if !ok {
		return size, nil, false
	}
	kr, inside := keptRangeAt(keep, key)
	if !inside {
		return size, key, true
	}
	// Off the middle, to the nearer end of the kept range in the region.
	dist := func(sm sample) uint64 {
		if overKeys {
			return absDiff(sm.keys, size.keys/2)
		}
		return absDiff(sm.bytes, size.bytes/2)
	}
	var best *sample
	for i := range atBound {
		b := &atBound[i]
		if (bytes.Equal(b.key, kr.Start) || bytes.Equal(b.key, kr.End)) && (best == nil || dist(*b) < dist(*best)) {
			best = b
		}
	}
	if best == nil { // the region lies in the kept range: it stays whole
		return size, nil, false
	}
	return size, bytes.Clone(best.key), true
}

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// answerSplitCampaign runs on a follower of the parent region once it has
// started c, the new region's peer here. The new region's peer on the
// parent leader's store campaigned when its store applied the split
// (startSplitPeer), and its pre-vote often reached this store before this
// store applied the split: a store refuses votes for a region it does not
// know, and raft asks again only after a randomized election timeout
// (0.5-1 s at the defaults), the new region taking no writes meanwhile
// (issue 18). TiKV keeps such a first vote and hands it to the peer the
// split creates; here the request is rebuilt, since the split fixes it:
// every split-born peer starts from the same log (raftInitTerm,
// raftInitIndex), so the candidate's first pre-vote is for raftInitTerm+1
// from there. It takes the inbound path the original would have taken, so
// raft grants or refuses it by the usual rules (a pre-vote changes no
// state), and a grant reaches the candidate now. A candidate that is not
// campaigning (a duplicate answer, or leadership moved) ignores it.
func (s *Store) answerSplitCampaign(c createdRegion, parentLead uint64) {
	r := c.region
	cand, ok := r.PeerByID(parentLead) // split-born peers keep their parent's peer IDs
	self, mine := r.PeerOnStore(s.cfg.StoreID)
	// A later term or a vote came from a placeholder here, which was
	// there to answer the candidate itself.
	if !ok || !mine || cand.StoreID == s.cfg.StoreID || cand.IsLearner || self.IsLearner || c.hard.Term != raftInitTerm || c.hard.Vote != 0 {
		return
	}
	m := &Message{RegionID: r.ID, FromStore: cand.StoreID, ToStore: s.cfg.StoreID, FromConfVer: r.Epoch.ConfVer,
		Msg: raftpb.Message{Type: raftpb.MsgPreVote, From: cand.ID, To: self.ID, Term: raftInitTerm + 1, LogTerm: raftInitTerm, Index: raftInitIndex}}
	if err := s.HandleRaftMessage(m); err != nil {
		s.log.Debug("split: answering the new region's campaign failed", "region", r.ID, "err", err)
	}
}
