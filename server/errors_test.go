package server

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestToStatusCodes(t *testing.T) {
	cases := []struct {
		err  error
		code codes.Code
	}{
		{nil, codes.OK},
		{fmt.Errorf("put: %w", raftstore.ErrProposalDropped), codes.Unavailable},
		{raftstore.ErrStopped, codes.Unavailable},
		{fmt.Errorf("no peer on store 9: %w", raftstore.ErrInvalidRequest), codes.InvalidArgument},
		{fmt.Errorf("read index: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		{status.Error(codes.PermissionDenied, "no"), codes.PermissionDenied},
		{errors.New("disk on fire"), codes.Internal},
	}
	for _, tc := range cases {
		if got := status.Code(toStatus(tc.err)); got != tc.code {
			t.Errorf("toStatus(%v) = %v, want %v", tc.err, got, tc.code)
		}
		if re := kvpb.RegionErrorFromStatus(toStatus(tc.err)); re != nil {
			t.Errorf("toStatus(%v) carries a region error %v", tc.err, re)
		}
	}
}

// TestToStatusRegionError: a region error the store returns, wrapped, leaves
// as kvpb.RegionErrorStatus makes it: its code and its typed detail.
func TestToStatusRegionError(t *testing.T) {
	err := fmt.Errorf("get: %w", &region.RegionNotFoundError{RegionID: 9})
	st := toStatus(err)
	if status.Code(st) != codes.NotFound || kvpb.RegionErrorFromStatus(st) == nil {
		t.Fatalf("toStatus(%v) = %v, want NotFound with a region error detail", err, st)
	}
}
