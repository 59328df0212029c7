package server

import (
	"context"
	"errors"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// toStatus maps an error from the store to the gRPC status a client sees.
// Region errors keep their typed payload as a *kvpb.RegionError detail (see
// kvpb.RegionErrorStatus).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if st := kvpb.RegionErrorStatus(err); st != nil {
		return st
	}
	switch {
	case errors.Is(err, raftstore.ErrMergeRolledBack):
		// Whatever stopped it (a refusal among them), the merge may be
		// tried again: nothing changed.
		return status.Error(codes.Aborted, err.Error())
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
