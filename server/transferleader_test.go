package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/region"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWithStoreTransferLeaderRefusals: a leadership transfer that cannot
// succeed is refused at once, with its cause, by whichever store is asked
// (issue 17): to a store that does not exist (NotFound), to a store with
// no replica of the region, and to a store that is down (both
// FailedPrecondition). None waits for the caller's deadline. A transfer
// to a live voter still goes through.
func TestWithStoreTransferLeaderRefusals(t *testing.T) {
	// Store 4 is in every address book but never started: down, and
	// without a replica of region 1 (stores 1-3 bootstrap it).
	c := newClusterWith(t, 3, map[uint64]string{4: deadAddr(t)}, nil, noBalancing)
	for _, s := range c.servers {
		if err := s.Start(); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	c.waitLeader(t)
	leader := c.leaderOf(t, 1)
	var victim, live uint64
	for id := uint64(1); id <= 3; id++ {
		switch {
		case id == leader:
		case victim == 0:
			victim = id
		default:
			live = id
		}
	}
	c.server(victim).Stop()

	cases := []struct {
		name string
		to   uint64
		code codes.Code
		want string
	}{
		{"no such store", 9, codes.NotFound, "store 9 does not exist"},
		{"no replica there", 4, codes.FailedPrecondition, "store 4 has no replica of region 1"},
		{"store down", victim, codes.FailedPrecondition, fmt.Sprintf("store %d is down", victim)},
	}
	for _, tc := range cases {
		for _, asked := range []uint64{leader, live} {
			t.Run(fmt.Sprintf("%s/asked store %d", tc.name, asked), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				start := time.Now()
				_, err := c.admin(t, asked).TransferLeader(ctx, &kvpb.TransferLeaderRequest{RegionId: 1, ToStoreId: tc.to})
				took := time.Since(start)
				if got := status.Code(err); got != tc.code || !strings.Contains(status.Convert(err).Message(), tc.want) {
					t.Fatalf("transfer to store %d after %v: %v; want %v saying %q", tc.to, took, err, tc.code, tc.want)
				}
				if kvpb.RegionErrorFromStatus(err) != nil {
					t.Errorf("refusal %v carries a region error: a client would retry it", err)
				}
				// At once: a status probe of the target (500ms at most), not
				// the caller's deadline.
				if took > 3*time.Second {
					t.Errorf("refused after %v, want at once", took)
				}
			})
		}
	}

	// A live voter is still a fine target.
	err := c.onLeader(t, 1, func(a kvpb.AdminClient) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := a.TransferLeader(ctx, &kvpb.TransferLeaderRequest{RegionId: 1, ToStoreId: live})
		return err
	})
	var nl *region.NotLeaderError
	if err != nil && !errors.As(kvpb.RegionErrorFromStatus(err).ToError(), &nl) {
		t.Fatalf("transfer to live store %d: %v", live, err)
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("region 1 led by store %d", live), func() bool {
		rs, ok := regionOn(c.server(live), 1)
		return ok && rs.IsLeader
	})
}
