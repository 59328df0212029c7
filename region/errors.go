package region

import (
	"errors"
	"fmt"
	"time"
)

// The typed region errors. They tell a client that its routing is stale and
// how to fix it; a client refreshes its cache and retries rather than
// surfacing them while its deadline allows.

// NotLeaderError: this replica is not the leader. Leader is the hint, nil if
// unknown (for example during an election).
type NotLeaderError struct {
	RegionID uint64
	Leader   *Peer
}

func (e *NotLeaderError) Error() string {
	if e.Leader == nil {
		return fmt.Sprintf("region %d: not leader, leader unknown", e.RegionID)
	}
	return fmt.Sprintf("region %d: not leader, leader is peer %d on store %d", e.RegionID, e.Leader.ID, e.Leader.StoreID)
}

// EpochNotMatchError: the request's epoch is stale; Current holds the regions
// that now cover the requested region's old range.
type EpochNotMatchError struct {
	RegionID uint64
	Current  []Region
}

func (e *EpochNotMatchError) Error() string {
	return fmt.Sprintf("region %d: epoch not match (%d current regions)", e.RegionID, len(e.Current))
}

// RegionNotFoundError: this store hosts no such region.
type RegionNotFoundError struct {
	RegionID uint64
}

func (e *RegionNotFoundError) Error() string {
	return fmt.Sprintf("region %d not found", e.RegionID)
}

// KeyNotInRegionError: the key lies outside the region's range.
type KeyNotInRegionError struct {
	Key      []byte
	RegionID uint64
	StartKey []byte
	EndKey   []byte
}

func (e *KeyNotInRegionError) Error() string {
	return fmt.Sprintf("key %q not in region %d [%q, %q)", e.Key, e.RegionID, e.StartKey, e.EndKey)
}

// DataIsNotReadyError: a stale read could not be served because this
// replica cannot prove its data is fresh enough; try another replica.
type DataIsNotReadyError struct {
	RegionID uint64
	PeerID   uint64
	SafeAge  uint64 // how old, in milliseconds, this replica's safe point is; 0 if it has none
}

func (e *DataIsNotReadyError) Error() string {
	return fmt.Sprintf("region %d peer %d: data is not ready (safe point age %dms)", e.RegionID, e.PeerID, e.SafeAge)
}

// ServerIsBusyError: the store refused a read because its estimated wait
// for a new read exceeded the threshold the read carried; nothing was read.
// The client tries another replica.
type ServerIsBusyError struct {
	StoreID       uint64
	EstimatedWait time.Duration
}

func (e *ServerIsBusyError) Error() string {
	return fmt.Sprintf("store %d: server is busy (estimated wait %v)", e.StoreID, e.EstimatedWait)
}

// IsRegionError reports whether err (or anything it wraps) is one of the
// typed region errors, all of which mean "refresh routing and retry".
func IsRegionError(err error) bool {
	var (
		nl *NotLeaderError
		en *EpochNotMatchError
		rn *RegionNotFoundError
		kn *KeyNotInRegionError
		dr *DataIsNotReadyError
		sb *ServerIsBusyError
	)
	return errors.As(err, &nl) || errors.As(err, &en) || errors.As(err, &rn) || errors.As(err, &kn) || errors.As(err, &dr) ||
		errors.As(err, &sb)
}
