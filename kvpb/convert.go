package kvpb

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/region"
	"google.golang.org/grpc/status"
)

// Converters between the wire types and package region. Both the server and
// the client use them, so a region error survives the trip through a gRPC
// status unchanged. Byte slices are copied: a wire message must not alias
// metadata the store keeps, and vice versa.

// FromEpoch converts a region epoch to its wire form.
func FromEpoch(e region.Epoch) *Epoch {
	return &Epoch{ConfVer: e.ConfVer, Version: e.Version}
}

// ToEpoch converts back; a nil epoch is the zero epoch ("not checked").
func (e *Epoch) ToEpoch() region.Epoch {
	if e == nil {
		return region.Epoch{}
	}
	return region.Epoch{ConfVer: e.ConfVer, Version: e.Version}
}

// FromPeer converts a peer to its wire form.
func FromPeer(p region.Peer) *Peer {
	return &Peer{Id: p.ID, StoreId: p.StoreID, IsLearner: p.IsLearner}
}

// ToPeer converts back; nil is the zero peer.
func (p *Peer) ToPeer() region.Peer {
	if p == nil {
		return region.Peer{}
	}
	return region.Peer{ID: p.Id, StoreID: p.StoreId, IsLearner: p.IsLearner}
}

// FromRegion converts region metadata to its wire form.
func FromRegion(r region.Region) *Region {
	out := &Region{
		Id:       r.ID,
		StartKey: cloneBytes(r.StartKey),
		EndKey:   cloneBytes(r.EndKey),
		Epoch:    FromEpoch(r.Epoch),
	}
	if len(r.Peers) > 0 {
		out.Peers = make([]*Peer, len(r.Peers))
		for i, p := range r.Peers {
			out.Peers[i] = FromPeer(p)
		}
	}
	return out
}

// ToRegion converts back; nil is the zero region.
func (r *Region) ToRegion() region.Region {
	if r == nil {
		return region.Region{}
	}
	out := region.Region{
		ID:       r.Id,
		StartKey: cloneBytes(r.StartKey),
		EndKey:   cloneBytes(r.EndKey),
		Epoch:    r.Epoch.ToEpoch(),
	}
	if len(r.Peers) > 0 {
		out.Peers = make([]region.Peer, len(r.Peers))
		for i, p := range r.Peers {
			out.Peers[i] = p.ToPeer()
		}
	}
	return out
}

// RegionErrorFromError returns the wire form of the typed region error err
// is or wraps, or nil if it is none of them.
func RegionErrorFromError(err error) *RegionError {
	if err == nil {
		return nil
	}
	var (
		nl *region.NotLeaderError
		en *region.EpochNotMatchError
		rn *region.RegionNotFoundError
		kn *region.KeyNotInRegionError
		dr *region.DataIsNotReadyError
		sb *region.ServerIsBusyError
	)
	out := &RegionError{Message: err.Error()}
	switch {
	case errors.As(err, &nl):
		out.NotLeader = &NotLeader{RegionId: nl.RegionID}
		if nl.Leader != nil {
			out.NotLeader.Leader = FromPeer(*nl.Leader)
		}
	case errors.As(err, &en):
		cur := make([]*Region, len(en.Current))
		for i, r := range en.Current {
			cur[i] = FromRegion(r)
		}
		out.EpochNotMatch = &EpochNotMatch{RegionId: en.RegionID, CurrentRegions: cur}
	case errors.As(err, &rn):
		out.RegionNotFound = &RegionNotFound{RegionId: rn.RegionID}
	case errors.As(err, &kn):
		out.KeyNotInRegion = &KeyNotInRegion{
			Key:      cloneBytes(kn.Key),
			RegionId: kn.RegionID,
			StartKey: cloneBytes(kn.StartKey),
			EndKey:   cloneBytes(kn.EndKey),
		}
	case errors.As(err, &dr):
		out.DataIsNotReady = &DataIsNotReady{RegionId: dr.RegionID, PeerId: dr.PeerID, SafeAgeMs: dr.SafeAge}
	case errors.As(err, &sb):
		out.ServerIsBusy = &ServerIsBusy{StoreId: sb.StoreID, EstimatedWaitUs: uint64(max(sb.EstimatedWait, 0) / time.Microsecond)}
	default:
		return nil
	}
	return out
}

// ToError converts back to the typed region error, so callers can use
// errors.As and region.IsRegionError. A RegionError with no field set (a
// newer server's kind this client does not know) becomes a plain error
// carrying the message; nil stays nil.
func (e *RegionError) ToError() error {
	switch {
	case e == nil:
		return nil
	case e.NotLeader != nil:
		out := &region.NotLeaderError{RegionID: e.NotLeader.RegionId}
		if e.NotLeader.Leader != nil {
			p := e.NotLeader.Leader.ToPeer()
			out.Leader = &p
		}
		return out
	case e.EpochNotMatch != nil:
		out := &region.EpochNotMatchError{RegionID: e.EpochNotMatch.RegionId}
		if len(e.EpochNotMatch.CurrentRegions) > 0 {
			out.Current = make([]region.Region, len(e.EpochNotMatch.CurrentRegions))
			for i, r := range e.EpochNotMatch.CurrentRegions {
				out.Current[i] = r.ToRegion()
			}
		}
		return out
	case e.RegionNotFound != nil:
		return &region.RegionNotFoundError{RegionID: e.RegionNotFound.RegionId}
	case e.KeyNotInRegion != nil:
		k := e.KeyNotInRegion
		return &region.KeyNotInRegionError{
			Key:      cloneBytes(k.Key),
			RegionID: k.RegionId,
			StartKey: cloneBytes(k.StartKey),
			EndKey:   cloneBytes(k.EndKey),
		}
	case e.DataIsNotReady != nil:
		d := e.DataIsNotReady
		return &region.DataIsNotReadyError{RegionID: d.RegionId, PeerID: d.PeerId, SafeAge: d.SafeAgeMs}
	case e.ServerIsBusy != nil:
		b := e.ServerIsBusy
		wait := time.Duration(min(b.EstimatedWaitUs, uint64(math.MaxInt64/int64(time.Microsecond)))) * time.Microsecond
		return &region.ServerIsBusyError{StoreID: b.StoreId, EstimatedWait: wait}
	}
	return fmt.Errorf("region error: %s", e.Message)
}

// RegionErrorFromStatus returns the RegionError carried as a detail of the
// gRPC status in err, or nil if there is none.
func RegionErrorFromStatus(err error) *RegionError {
	st, ok := status.FromError(err)
	if !ok || st == nil {
		return nil
	}
	for _, d := range st.Details() {
		if re, ok := d.(*RegionError); ok {
			return re
		}
	}
	return nil
}

func cloneBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// FromZoneAddrs converts stores' addresses per zone (store id -> zone ->
// address) to their wire form; stores without any are left out.
func FromZoneAddrs(in map[uint64]map[string]string) map[uint64]*ZoneAddresses {
	if len(in) == 0 {
		return nil
	}
	out := make(map[uint64]*ZoneAddresses, len(in))
	for id, za := range in {
		if len(za) == 0 {
			continue
		}
		m := make(map[string]string, len(za))
		for z, a := range za {
			m[z] = a
		}
		out[id] = &ZoneAddresses{Addresses: m}
	}
	return out
}

// ToZoneAddrs converts back; stores without any address are left out.
func ToZoneAddrs(in map[uint64]*ZoneAddresses) map[uint64]map[string]string {
	out := make(map[uint64]map[string]string, len(in))
	for id, za := range in {
		if len(za.GetAddresses()) == 0 {
			continue
		}
		m := make(map[string]string, len(za.GetAddresses()))
		for z, a := range za.GetAddresses() {
			m[z] = a
		}
		out[id] = m
	}
	return out
}

// FromReadMode puts a read mode on the wire.
func FromReadMode(m readmode.Mode) ReadMode {
	switch m {
	case readmode.Lease:
		return ReadMode_READ_MODE_LEASE
	case readmode.ReadIndex:
		return ReadMode_READ_MODE_READ_INDEX
	case readmode.Stale:
		return ReadMode_READ_MODE_STALE
	case readmode.FollowerLease:
		return ReadMode_READ_MODE_FOLLOWER_LEASE
	}
	return ReadMode_READ_MODE_UNSPECIFIED
}

// ToReadMode is FromReadMode's inverse; a value this build does not know
// (a newer peer's) is readmode.Unknown.
func (m ReadMode) ToReadMode() readmode.Mode {
	switch m {
	case ReadMode_READ_MODE_LEASE:
		return readmode.Lease
	case ReadMode_READ_MODE_READ_INDEX:
		return readmode.ReadIndex
	case ReadMode_READ_MODE_STALE:
		return readmode.Stale
	case ReadMode_READ_MODE_FOLLOWER_LEASE:
		return readmode.FollowerLease
	}
	return readmode.Unknown
}
