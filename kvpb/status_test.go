package kvpb

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/hedgekv/hedgekv/region"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRegionErrorStatusRoundTrip: a region error turned into a gRPC status
// by RegionErrorStatus comes back out of the converters as the same typed error.
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
			st := RegionErrorStatus(fmt.Errorf("get: %w", tc.err))
			if got := status.Code(st); got != tc.code {
				t.Fatalf("code = %v, want %v", got, tc.code)
			}
			re := RegionErrorFromStatus(st)
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

func TestRegionErrorUnknownKind(t *testing.T) {
	if err := (&RegionError{Message: "from the future"}).ToError(); err == nil || region.IsRegionError(err) {
		t.Fatalf("empty RegionError -> %v, want a plain error", err)
	}
	if err := (*RegionError)(nil).ToError(); err != nil {
		t.Fatalf("nil RegionError -> %v, want nil", err)
	}
	if re := RegionErrorFromError(errors.New("plain")); re != nil {
		t.Fatalf("plain error -> %v, want nil", re)
	}
}
