package client

import (
	"context"
	"fmt"
	"time"

	"github.com/hedgekv/hedgekv/server/pb"
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
	s, ok := c.cache.store(storeID)
	if !ok {
		if err := c.cache.refreshStores(ctx); err != nil {
			return fmt.Errorf("fault: %w", err)
		}
		s, ok = c.cache.store(storeID)
	}
	if !ok {
		return fmt.Errorf("fault: store %d is not in the cluster's store list", storeID)
	}
	stub, err := c.conns.admin(s.addr)
	if err != nil {
		return fmt.Errorf("fault: %w", err)
	}
	_, err = stub.Fault(ctx, &pb.FaultRequest{
		DelayNanos: int64(f.Delay),
		Prob:       f.Prob,
		StallNanos: int64(f.Stall),
		Clear:      f.Clear,
	})
	if err != nil {
		return fmt.Errorf("fault: %w", &storeError{storeID: storeID, addr: s.addr, err: err})
	}
	return nil
}
