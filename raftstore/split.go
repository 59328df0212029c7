package raftstore

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/bbolt"
)

// Split divides the region holding key at key, through a raft admin
// command every replica applies at the same log position. The left part
// keeps the region's ID; the right part is a new region whose peers start
// on the same stores and serve at once. It runs on the region's leader.
func (s *Store) Split(ctx context.Context, key []byte) (left, right region.Region, err error) {
	p, err := s.route(0, region.Epoch{}, key)
	if err != nil {
		return left, right, err
	}
	p.mu.Lock()
	r := p.region.Clone()
	p.mu.Unlock()
	if bytes.Equal(key, r.StartKey) {
		return left, right, fmt.Errorf("split key %q is already a region boundary: %w", key, ErrInvalidRequest)
	}
	newID, err := s.allocID()
	if err != nil {
		return left, right, err
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
// size is what overflowed).
func (s *Store) splitCheck() {
	t := time.NewTicker(s.cfg.SplitCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopc:
			return
		case <-t.C:
		}
		for _, st := range s.Regions() {
			if !st.IsLeader {
				continue
			}
			size, key, ok := s.eng.splitKey(st.Region, s.cfg.SplitMaxKeys, s.cfg.SplitMaxBytes)
			if p, found := s.peer(st.Region.ID); found {
				p.mu.Lock()
				p.size = size
				p.mu.Unlock()
			}
			if !ok {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			l, r, err := s.Split(ctx, key)
			cancel()
			if err != nil {
				s.log.Warn("automatic split failed", "region", st.Region.ID, "err", err)
				continue
			}
			s.log.Info("split region", "left", l.String(), "right", r.String())
		}
	}
}

// splitKey scans the region once, counting it, and returns the key to
// split at if the region is over either threshold.
func (e *engine) splitKey(r region.Region, maxKeys, maxBytes uint64) (size regionSize, key []byte, ok bool) {
	size = regionSize{version: r.Epoch.Version}
	err := e.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketData).Cursor()
		for k, v := c.Seek(r.StartKey); k != nil && (len(r.EndKey) == 0 || bytes.Compare(k, r.EndKey) < 0); k, v = c.Next() {
			size.keys++
			size.bytes += uint64(len(k) + len(v))
		}
		overKeys, overBytes := maxKeys > 0 && size.keys > maxKeys, maxBytes > 0 && size.bytes > maxBytes
		if !overKeys && !overBytes {
			return nil
		}
		var n, acc uint64
		for k, v := c.Seek(r.StartKey); k != nil; k, v = c.Next() {
			n++
			acc += uint64(len(k) + len(v))
			if (overKeys && n > size.keys/2) || (!overKeys && acc > size.bytes/2) {
				if !bytes.Equal(k, r.StartKey) {
					key, ok = append([]byte(nil), k...), true
				}
				return nil
			}
		}
		return nil
	})
	size.counted = err == nil
	return size, key, ok
}
