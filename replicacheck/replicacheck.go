// Package replicacheck checks that the replicas of every region on running
// stores agree (hedgekv ctl check, make chaos): for each region it asks
// every store hosting a replica for its digest (data, metadata and live
// dedup records at one applied index, read in one transaction), compares
// the digests once they are at the same applied index, and when two
// replicas disagree dumps both to name the first differing key. It is the
// live-cluster form of the check the in-process specs run after every
// spec (raftstoretest.CheckReplicas), with the same poll loop and
// comparison (replica.Poll, replica.Compare).
package replicacheck

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/replica"
)

// Report is what a check found.
type Report struct {
	// Agreed are the regions whose replicas were compared and agree, with
	// the applied index and the stores compared.
	Agreed []Agreement
	// Pending are the regions that could not be compared before the
	// deadline, with the reason (replicas never at one applied index, a
	// store down or without its replica yet).
	Pending map[uint64]string
	// SkippedStores are stores reported down, whose replicas were not
	// compared.
	SkippedStores []uint64
}

// Agreement is one region found in agreement.
type Agreement struct {
	RegionID     uint64
	AppliedIndex uint64
	Stores       []uint64
	Keys         uint64
}

// Check compares every region's replicas, polling every poll until each
// region was compared or ctx ends. It returns a *replica.MismatchError
// (with the first differing key when the dumps could be taken) as soon as
// one region's replicas disagree; an error listing the regions left
// uncompared if ctx ends first; nil once every region agrees.
func Check(ctx context.Context, cli *client.Client, poll time.Duration) (Report, error) {
	rep := Report{Pending: map[uint64]string{}}
	up := map[uint64]bool{}
	regions := func(ctx context.Context) ([]region.Region, error) {
		stores, err := cli.Stores(ctx)
		if err != nil {
			return nil, fmt.Errorf("list stores: %w", err)
		}
		clear(up)
		rep.SkippedStores = rep.SkippedStores[:0]
		for _, s := range stores {
			up[s.ID] = s.Up
			if !s.Up {
				rep.SkippedStores = append(rep.SkippedStores, s.ID)
			}
		}
		infos, err := cli.Regions(ctx)
		if err != nil {
			return nil, fmt.Errorf("list regions: %w", err)
		}
		out := make([]region.Region, len(infos))
		for i, info := range infos {
			out[i] = info.Region
		}
		return out, nil
	}
	pending, err := replica.Poll(ctx, poll, regions,
		func(ctx context.Context, r region.Region) ([]replica.Digest, string) {
			return digests(ctx, cli, r, up)
		},
		func(r region.Region, ds []replica.Digest) {
			a := Agreement{RegionID: r.ID}
			if len(ds) > 0 {
				a.AppliedIndex, a.Keys = ds[0].AppliedIndex, ds[0].Keys
			}
			for _, d := range ds {
				a.Stores = append(a.Stores, d.StoreID)
			}
			sort.Slice(a.Stores, func(i, j int) bool { return a.Stores[i] < a.Stores[j] })
			rep.Agreed = append(rep.Agreed, a)
		})
	sort.Slice(rep.Agreed, func(i, j int) bool { return rep.Agreed[i].RegionID < rep.Agreed[j].RegionID })
	if pending != nil {
		rep.Pending = pending
	}
	var mismatch *replica.MismatchError
	switch {
	case err == nil:
		return rep, nil
	case errors.As(err, &mismatch):
		nameFirstDifference(ctx, cli, mismatch)
		return rep, mismatch
	case ctx.Err() != nil && len(rep.Pending) > 0:
		return rep, fmt.Errorf("check: %d region(s) not compared before the deadline: %s", len(rep.Pending), pendingString(rep.Pending))
	}
	return rep, fmt.Errorf("check: %w", err)
}

// digests collects the digest of every replica of r on a store that is up:
// every voter must have one (it may still wait for its snapshot: poll
// again); a learner is compared once it has one.
func digests(ctx context.Context, cli *client.Client, r region.Region, up map[uint64]bool) ([]replica.Digest, string) {
	var ds []replica.Digest
	for _, p := range r.Peers {
		if !up[p.StoreID] {
			continue
		}
		resp, err := cli.RegionDigest(ctx, p.StoreID, r.ID)
		if isNotFound(err) {
			if p.IsLearner {
				continue
			}
			return nil, fmt.Sprintf("store %d has no initialized replica yet", p.StoreID)
		}
		if err != nil {
			return nil, fmt.Sprintf("store %d: %v", p.StoreID, err)
		}
		d, err := kvpb.ToDigest(resp)
		if err != nil {
			return nil, err.Error()
		}
		if d.Region.ID != r.ID {
			return nil, fmt.Sprintf("store %d answered for region %d", p.StoreID, d.Region.ID)
		}
		ds = append(ds, d)
	}
	if len(ds) == 0 {
		return nil, "no replica on a store that is up"
	}
	return ds, ""
}

func isNotFound(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if s, ok := status.FromError(e); ok && s.Code() == codes.NotFound {
			return true
		}
	}
	return false
}

// nameFirstDifference dumps the two largest disagreeing groups' first
// stores and names the first differing key; the dumps must be at the
// mismatch's applied index, which a quiet cluster keeps.
func nameFirstDifference(ctx context.Context, cli *client.Client, e *replica.MismatchError) {
	if len(e.Groups) < 2 {
		return
	}
	a, b := e.Groups[0][0], e.Groups[1][0]
	da, err := cli.RegionDump(ctx, a, e.RegionID)
	if err != nil {
		e.DiffNote = fmt.Sprintf("no first differing key: %v", err)
		return
	}
	db, err := cli.RegionDump(ctx, b, e.RegionID)
	if err != nil {
		e.DiffNote = fmt.Sprintf("no first differing key: %v", err)
		return
	}
	if da.GetAppliedIndex() != e.AppliedIndex || db.GetAppliedIndex() != e.AppliedIndex {
		e.DiffNote = fmt.Sprintf("no first differing key: the dumps are at applied indexes %d and %d, not %d (the region moved on)",
			da.GetAppliedIndex(), db.GetAppliedIndex(), e.AppliedIndex)
		return
	}
	if d, ok := replica.Diff(e.AppliedIndex, a, toKVs(da.GetPairs()), b, toKVs(db.GetPairs())); ok {
		e.Diff = &d
	}
}

func toKVs(ps []*kvpb.KvPair) []replica.KV {
	out := make([]replica.KV, len(ps))
	for i, p := range ps {
		out[i] = replica.KV{Key: p.GetKey(), Value: p.GetValue()}
	}
	return out
}

func pendingString(m map[uint64]string) string {
	ids := make([]uint64, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("region %d: %s", id, m[id])
	}
	return strings.Join(parts, "; ")
}
