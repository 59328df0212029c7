package server

import (
	"context"
	"errors"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/server/pb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// toStatus maps an error from the store to the gRPC status a client sees.
// Region errors keep their typed payload as a *pb.RegionError detail, so the
// client can repair its routing without parsing messages.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if re := pb.RegionErrorFromError(err); re != nil {
		st, derr := status.New(regionErrorCode(err), err.Error()).WithDetails(re)
		if derr != nil {
			// Only fails if the detail cannot be marshalled; the code alone
			// still tells the client to refresh and retry.
			return status.Error(regionErrorCode(err), err.Error())
		}
		return st.Err()
	}
	switch {
	case errors.Is(err, raftstore.ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, raftstore.ErrProposalDropped), errors.Is(err, raftstore.ErrStopped), errors.Is(err, raftstore.ErrDiskFailed):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// regionErrorCode picks the status code of a region error: NotFound when the
// store has no such region, Unavailable when this replica cannot serve yet,
// ResourceExhausted when it refused a read for load, FailedPrecondition when the request was routed with stale metadata.
func regionErrorCode(err error) codes.Code {
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
