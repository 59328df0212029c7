package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/hedgekv/hedgekv/kvpb"
)

// Fault is a fault to inject into one store (see the Admin Fault call; the
// store must run with --allow-faults). Delay with Prob delays that
// fraction of the store's reads; Stall makes the store stop answering for
// that long; Clear ends both.
type Fault struct {
	Delay time.Duration
	Prob  float64
	Stall time.Duration
	Clear bool
}

// Fault injects f into the store with id storeID, found in the cluster's
// store list (reloaded if the store is not in it, so a store that just
// joined is found). A stalled store answers no admin call but Fault, so
// to clear a stall, give the client other stores' endpoints too.
func (c *Client) Fault(ctx context.Context, storeID uint64, f Fault) error {
	if storeID == 0 {
		return fmt.Errorf("fault: store id must be non-zero")
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	stub, addr, err := c.adminOn(ctx, storeID)
	if err != nil {
		return fmt.Errorf("fault: %w", err)
	}
	_, err = stub.Fault(ctx, &kvpb.FaultRequest{
		DelayNanos: int64(f.Delay),
		Prob:       f.Prob,
		StallNanos: int64(f.Stall),
		Clear:      f.Clear,
	})
	if err != nil {
		return fmt.Errorf("fault: %w", &storeError{storeID: storeID, addr: addr, err: err})
	}
	return nil
}

// adminOn returns the Admin stub of the store with id storeID, found in the
// cluster's store list (reloaded once if the store is not in it).
func (c *Client) adminOn(ctx context.Context, storeID uint64) (kvpb.AdminClient, string, error) {
	s, ok := c.cache.store(storeID)
	if !ok {
		if err := c.cache.refreshStores(ctx); err != nil {
			return nil, "", err
		}
		s, ok = c.cache.store(storeID)
	}
	if !ok {
		return nil, "", fmt.Errorf("store %d is not in the cluster's store list", storeID)
	}
	stub, err := c.conns.admin(s.addr)
	if err != nil {
		return nil, s.addr, err
	}
	return stub, s.addr, nil
}

// RegionDigest asks store storeID for the digest of its replica of
// regionID (see package replicacheck).
func (c *Client) RegionDigest(ctx context.Context, storeID, regionID uint64) (*kvpb.RegionDigestResponse, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	stub, addr, err := c.adminOn(ctx, storeID)
	if err != nil {
		return nil, fmt.Errorf("region digest: %w", err)
	}
	resp, err := stub.RegionDigest(ctx, &kvpb.RegionDigestRequest{RegionId: regionID})
	if err != nil {
		return nil, fmt.Errorf("region digest: %w", &storeError{storeID: storeID, addr: addr, err: err})
	}
	return resp, nil
}

// RegionDump asks store storeID for every pair of its replica of regionID,
// with the applied index they are read at.
func (c *Client) RegionDump(ctx context.Context, storeID, regionID uint64) (*kvpb.RegionDumpResponse, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	stub, addr, err := c.adminOn(ctx, storeID)
	if err != nil {
		return nil, fmt.Errorf("region dump: %w", err)
	}
	resp, err := stub.RegionDump(ctx, &kvpb.RegionDumpRequest{RegionId: regionID}, grpc.MaxCallRecvMsgSize(maxDumpBytes))
	if err != nil {
		return nil, fmt.Errorf("region dump: %w", &storeError{storeID: storeID, addr: addr, err: err})
	}
	return resp, nil
}

// maxDumpBytes bounds a region dump: a region splits at 64 MiB.
const maxDumpBytes = 256 << 20
