package kvpb

import (
	"errors"

	"github.com/hedgekv/hedgekv/region"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RegionErrorStatus returns the gRPC status a store answers the typed region
// error err is or wraps with: err's message under RegionErrorCode(err),
// carrying the error's wire form as a *RegionError detail, so the client can
// repair its routing without parsing messages (RegionErrorFromStatus and
// ToError take it back). It returns nil if err is no region error.
func RegionErrorStatus(err error) error {
	re := RegionErrorFromError(err)
	if re == nil {
		return nil
	}
	st, derr := status.New(RegionErrorCode(err), err.Error()).WithDetails(re)
	if derr != nil {
		// Only fails if the detail cannot be marshalled; the code alone
		// still tells the client to refresh and retry.
		return status.Error(RegionErrorCode(err), err.Error())
	}
	return st.Err()
}

// RegionErrorCode picks the status code of a region error: NotFound when the
// store has no such region, Unavailable when this replica cannot serve yet,
// ResourceExhausted when it refused a read for load, FailedPrecondition when the request was routed with stale metadata.
func RegionErrorCode(err error) codes.Code {
	var (
		rn *region.RegionNotFoundError
		dr *region.DataIsNotReadyError
		sb *region.ServerIsBusyError
	)
	switch {
	case errors.As(err, &rn):
		return codes.NotFound
	case errors.As(err, &dr):
		return codes.Unavailable
	case errors.As(err, &sb):
		return codes.ResourceExhausted
	}
	return codes.FailedPrecondition
}
