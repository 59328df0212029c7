package client

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/hedgekv/hedgekv/kvpb"
)

// maxScanPage is the most keys one ScanRequest may ask for (the server's
// limit); longer scans are paged.
const maxScanPage = 10000

// Session reads with one ReadPolicy. Its only state of its own is its
// hedging (budget and counters, see HedgeStats); it is safe for concurrent
// use.
type Session struct {
	c      *Client
	policy ReadPolicy
	hedger *hedger // nil when the policy never hedges
}

// HedgeStats returns the session's hedging counters so far.
func (s *Session) HedgeStats() HedgeStats {
	if s.hedger == nil {
		return HedgeStats{}
	}
	return s.hedger.stats.snapshot()
}

// Get reads key under the session's policy. A missing key is ErrNotFound.
func (s *Session) Get(ctx context.Context, key []byte) ([]byte, error) {
	v, _, err := s.GetWithInfo(ctx, key)
	return v, err
}

// GetWithInfo is Get that also says which store served the read, how, and
// after how many attempts. The info is filled for ErrNotFound too.
func (s *Session) GetWithInfo(ctx context.Context, key []byte) ([]byte, ReadInfo, error) {
	if len(key) == 0 {
		return nil, ReadInfo{}, fmt.Errorf("get: %w", errEmptyKey)
	}
	req := &regionRequest{
		op:     "get",
		key:    key,
		policy: s.policy,
		hedger: s.hedger,
		rpc: func(ctx context.Context, cc grpc.ClientConnInterface, a *attempt) (*kvpb.Load, error) {
			r, err := kvpb.NewKVClient(cc).Get(ctx, &kvpb.GetRequest{Context: a.readContext(), Key: key})
			if err != nil {
				return nil, err
			}
			a.resp, a.info = r, r.GetReadInfo()
			return r.GetLoad(), nil
		},
	}
	res, err := s.c.send(ctx, req)
	if err != nil {
		return nil, ReadInfo{Attempts: res.attempts, Hedge: req.hedgeInfo}, err
	}
	resp, _ := res.final.resp.(*kvpb.GetResponse)
	info := readInfo(resp.GetReadInfo(), res)
	info.Hedge = req.hedgeInfo
	if resp.GetNotFound() {
		return nil, info, ErrNotFound
	}
	return resp.GetValue(), info, nil
}

// readInfo converts what the store said about a read; a store that said
// nothing is taken to be the one the request went to.
func readInfo(ri *kvpb.ReadInfo, res result) ReadInfo {
	info := ReadInfo{
		StoreID:        ri.GetStoreId(),
		Mode:           ri.GetMode().ToReadMode(),
		StalenessBound: time.Duration(ri.GetStalenessBoundMs()) * time.Millisecond,
		Attempts:       res.attempts,
	}
	if res.final != nil {
		if info.StoreID == 0 {
			info.StoreID = res.final.storeID
		}
		info.HedgeWon = res.final.hedge
	}
	return info
}

// BatchGet reads keys under the session's policy and returns the ones that
// exist. Keys are grouped by region and the groups read in parallel, one
// BatchGetRequest each. Each attempt sends only the keys its region (as
// routed) contains, so after a split the keys left over are regrouped and
// read in another round; no key is lost or read twice into the result.
func (s *Session) BatchGet(ctx context.Context, keys [][]byte) (map[string][]byte, error) {
	ctx, cancel := s.c.withTimeout(ctx)
	defer cancel()
	out := make(map[string][]byte, len(keys))
	pending := make([][]byte, 0, len(keys))
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if len(k) == 0 {
			return nil, fmt.Errorf("batch get: %w", errEmptyKey)
		}
		if !seen[string(k)] {
			seen[string(k)] = true
			pending = append(pending, k)
		}
	}
	for len(pending) > 0 {
		groups := s.groupByRegion(ctx, pending)
		var (
			mu       sync.Mutex
			wg       sync.WaitGroup
			firstErr error
			served   = make(map[string]bool, len(pending))
		)
		for _, g := range groups {
			wg.Go(func() {
				pairs, done, err := s.batchGetRegion(ctx, g)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					return
				}
				for _, k := range done {
					served[string(k)] = true
				}
				for _, p := range pairs {
					out[string(p.GetKey())] = p.GetValue()
				}
			})
		}
		wg.Wait()
		if firstErr != nil {
			return nil, firstErr
		}
		next := pending[:0:0]
		for _, k := range pending {
			if !served[string(k)] {
				next = append(next, k)
			}
		}
		pending = next
	}
	return out, nil
}

// groupByRegion splits keys by the cached region holding each (loading
// regions as needed), keeping the keys' order within a group.
func (s *Session) groupByRegion(ctx context.Context, keys [][]byte) [][][]byte {
	var (
		groups [][][]byte
		index  = make(map[uint64]int)
	)
	for _, k := range keys {
		r, err := s.c.cache.locateKey(ctx, k)
		if err != nil {
			// Let the group's own retry loop deal with it: it backs off and
			// retries within the deadline, which locating here does not.
			groups = append(groups, [][]byte{k})
			continue
		}
		i, ok := index[r.ID]
		if !ok {
			i = len(groups)
			index[r.ID] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], k)
	}
	return groups
}

// batchGetRegion reads the keys of one group that lie in the region the
// group's first key routes to. It returns the found pairs and the keys it
// covered.
func (s *Session) batchGetRegion(ctx context.Context, keys [][]byte) ([]*kvpb.KvPair, [][]byte, error) {
	type answer struct {
		pairs []*kvpb.KvPair
		sent  [][]byte
	}
	res, err := s.c.send(ctx, &regionRequest{
		op:     "batch get",
		key:    keys[0],
		policy: s.policy,
		hedger: s.hedger,
		rpc: func(ctx context.Context, cc grpc.ClientConnInterface, a *attempt) (*kvpb.Load, error) {
			in := make([][]byte, 0, len(keys))
			for _, k := range keys {
				if a.region.Contains(k) {
					in = append(in, k)
				}
			}
			r, err := kvpb.NewKVClient(cc).BatchGet(ctx, &kvpb.BatchGetRequest{Context: a.readContext(), Keys: in})
			if err != nil {
				return nil, err
			}
			a.resp, a.info = answer{r.GetPairs(), in}, r.GetReadInfo()
			return r.GetLoad(), nil
		},
	})
	if err != nil {
		return nil, nil, err
	}
	ans, _ := res.final.resp.(answer)
	return ans.pairs, ans.sent, nil
}

// Scan returns up to limit pairs with start <= key < end in key order. An
// empty end means no upper bound; limit <= 0 means no limit. A scan spans
// regions: each ScanRequest covers one region (the store clamps the range
// to it and says where it ends), and the next continues where it ended.
// Pages are at most maxScanPage keys.
func (s *Session) Scan(ctx context.Context, start, end []byte, limit int) ([]KV, error) {
	ctx, cancel := s.c.withTimeout(ctx)
	defer cancel()
	var out []KV
	cur := append([]byte(nil), start...)
	for {
		if len(end) > 0 && bytes.Compare(cur, end) >= 0 {
			return out, nil
		}
		page := maxScanPage
		if limit > 0 {
			page = min(page, limit-len(out))
		}
		res, err := s.c.send(ctx, &regionRequest{
			op:     "scan",
			key:    cur,
			policy: s.policy,
			hedger: s.hedger,
			rpc: func(ctx context.Context, cc grpc.ClientConnInterface, a *attempt) (*kvpb.Load, error) {
				r, err := kvpb.NewKVClient(cc).Scan(ctx, &kvpb.ScanRequest{
					Context:  a.readContext(),
					StartKey: cur,
					EndKey:   end,
					Limit:    uint32(page),
				})
				if err != nil {
					return nil, err
				}
				a.resp, a.info = r, r.GetReadInfo()
				return r.GetLoad(), nil
			},
		})
		if err != nil {
			return nil, err
		}
		resp, _ := res.final.resp.(*kvpb.ScanResponse)
		pairs := resp.GetPairs()
		for _, p := range pairs {
			// Defensive: a store must clamp to [cur, end), but a pair out
			// of range or order would corrupt the merged result.
			if bytes.Compare(p.GetKey(), cur) < 0 || (len(end) > 0 && bytes.Compare(p.GetKey(), end) >= 0) {
				continue
			}
			if n := len(out); n > 0 && bytes.Compare(p.GetKey(), out[n-1].Key) <= 0 {
				continue
			}
			out = append(out, KV{Key: p.GetKey(), Value: p.GetValue()})
		}
		if limit > 0 && len(out) >= limit {
			return out[:limit], nil
		}
		var next []byte
		if len(pairs) >= page && len(pairs) > 0 {
			// The page was full: the region may hold more. Continue right
			// after the last key, in whatever region holds it.
			next = append(append([]byte(nil), pairs[len(pairs)-1].GetKey()...), 0)
		} else {
			next = resp.GetRegionEndKey()
			if len(next) == 0 {
				return out, nil
			}
		}
		// Each step must move forward, or a confused store would keep the
		// scan looping until its deadline.
		if bytes.Compare(next, cur) <= 0 {
			return nil, fmt.Errorf("scan: store answered a continuation %q not after %q", next, cur)
		}
		cur = append([]byte(nil), next...)
	}
}
