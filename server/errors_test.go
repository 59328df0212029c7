package server

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/server/pb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRegionErrorStatusRoundTrip: a region error turned into a gRPC status
// by the server comes back out of pb's converters as the same typed error.
func TestRegionErrorStatusRoundTrip(t *testing.T) {
	leader := region.Peer{ID: 12, StoreID: 2}
	cases := []struct {
		err  error
		code codes.Code
	}{
		{&region.NotLeaderError{RegionID: 1, Leader: &leader}, codes.FailedPrecondition},
		{&region.NotLeaderError{RegionID: 1}, codes.FailedPrecondition},
		{&region.EpochNotMatchError{RegionID: 1, Current: []region.Region{
			{ID: 1, EndKey: []byte("m"), Epoch: region.Epoch{ConfVer: 1, Version: 2}, Peers: []region.Peer{{ID: 1, StoreID: 1}, {ID: 2, StoreID: 2}}},
			{ID: 4, StartKey: []byte("m"), Epoch: region.Epoch{ConfVer: 1, Version: 2}, Peers: []region.Peer{{ID: 5, StoreID: 1}, {ID: 6, StoreID: 2}}},
		}}, codes.FailedPrecondition},
		{&region.RegionNotFoundError{RegionID: 99}, codes.NotFound},
		{&region.KeyNotInRegionError{Key: []byte("z"), RegionID: 1, StartKey: []byte("a"), EndKey: []byte("m")}, codes.FailedPrecondition},
		{&region.DataIsNotReadyError{RegionID: 3, PeerID: 7, SafeAge: 1500}, codes.Unavailable},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%T", tc.err), func(t *testing.T) {
			// Wrapped, as the store may return it.
			st := toStatus(fmt.Errorf("get: %w", tc.err))
			if got := status.Code(st); got != tc.code {
				t.Fatalf("code = %v, want %v", got, tc.code)
			}
			re := pb.RegionErrorFromStatus(st)
			if re == nil {
				t.Fatalf("status %v carries no RegionError", st)
			}
			back := re.ToError()
			if !reflect.DeepEqual(back, tc.err) {
				t.Fatalf("round trip: got %#v, want %#v", back, tc.err)
			}
			if !region.IsRegionError(back) {
				t.Fatalf("%v is not a region error after the round trip", back)
			}
		})
	}
}

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
		if re := pb.RegionErrorFromStatus(toStatus(tc.err)); re != nil {
			t.Errorf("toStatus(%v) carries a region error %v", tc.err, re)
		}
	}
}

func TestRegionErrorUnknownKind(t *testing.T) {
	if err := (&pb.RegionError{Message: "from the future"}).ToError(); err == nil || region.IsRegionError(err) {
		t.Fatalf("empty RegionError -> %v, want a plain error", err)
	}
	if err := (*pb.RegionError)(nil).ToError(); err != nil {
		t.Fatalf("nil RegionError -> %v, want nil", err)
	}
	if re := pb.RegionErrorFromError(errors.New("plain")); re != nil {
		t.Fatalf("plain error -> %v, want nil", re)
	}
}
