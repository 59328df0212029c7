package raftstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/storage/engine"
	"go.etcd.io/raft/v3/raftpb"
)

// Message is a raft message, or a notice, addressed to one region's peer
// on another store.
type Message struct {
	RegionID  uint64
	FromStore uint64
	ToStore   uint64
	// Msg is the raft message; unused (zero) when Notice is set.
	Msg raftpb.Message
	// Notice, if set, is what m carries instead of a raft message: one of
	// raftstore's own notices, handled beside raft (notice.go).
	Notice *Notice
	// SafePoint rides on a leaseholder's heartbeats (see stale.go).
	SafePoint *SafePoint
	// FromConfVer is the sending peer's region epoch conf version (0:
	// unknown). A member that has applied more conf changes and does not
	// list the sender answers with a tombstone (membership.go).
	FromConfVer uint64
	// LeaseHorizon rides on a MsgTimeoutNow: how long, on the sender's
	// clock, a follower-lease grant it made may still be valid. The target,
	// once elected, defers its commits at least that long (followerlease.go).
	LeaseHorizon time.Duration
}

// SafePoint is a leader's promise, made while it holds a valid lease: every
// write acknowledged before Time (the leader's wall clock) has an index no
// greater than Commit. A follower that has applied Commit may serve reads
// that are at most now-Time (plus clock offset) stale.
type SafePoint struct {
	Term   uint64
	Commit uint64
	Time   time.Time
}

// Transport carries raft messages and notices between stores. Implementations batch per
// target store. Send must not block the Ready loop on the network.
type Transport interface {
	// Send queues m for delivery to m.ToStore. Delivery is best effort:
	// raft retries what is lost.
	Send(m *Message)
	// Flush pushes out everything queued since the last Flush.
	Flush()
}

// Handler is what a transport delivers inbound traffic and delivery reports
// to; *Store implements it.
type Handler interface {
	HandleRaftMessage(m *Message) error
	ReportUnreachable(regionID, toPeerID uint64)
	// ReportSnapshot says how sending the MsgSnap m ended: every MsgSnap
	// handed to Send must be reported once, delivered or not.
	ReportSnapshot(m *Message, ok bool)
}

// SnapshotSource is implemented by *Store: a transport sending a MsgSnap
// whose data is a descriptor (IsSnapshotDescriptor) streams the data from
// OpenSnapshot, and closes the reader when done.
type SnapshotSource interface {
	OpenSnapshot(m *Message) (io.ReadCloser, error)
}

// SnapshotReceiver is implemented by *Store: a transport receiving a
// streamed snapshot hands its MsgSnap (data: the sender's descriptor) and
// the stream to ReceiveSnapshot, which checks it, stores it and steps it.
type SnapshotReceiver interface {
	ReceiveSnapshot(m *Message, data io.Reader) error
}

// ReadOptions routes and qualifies one read.
type ReadOptions struct {
	// RegionID 0 means "the region holding the key on this store".
	RegionID uint64
	// Epoch, if non-zero, must not be stale.
	Epoch region.Epoch
	// ReplicaRead lets a follower serve through a ReadIndex round trip.
	ReplicaRead bool
	// MaxStaleness > 0 permits a bounded-staleness local read.
	MaxStaleness time.Duration
	// Local serves this replica's applied state as it is, however far
	// behind, with no round trip and no safe point: for a layer that, as
	// etcd's watch does, serves each member's own state and can say what
	// revision it saw. A frozen store (diskfail.go) still refuses it.
	Local bool

	// scan and scanEnd: the read is a scan of [its key, scanEnd); a
	// follower-lease read waits for pending writes in that range.
	// wholeRegion: the read may read any key of the region (ReadView); a
	// follower-lease read waits for every pending write.
	scan        bool
	scanEnd     []byte
	wholeRegion bool
}

// WriteOptions routes one write.
type WriteOptions struct {
	RegionID uint64
	Epoch    region.Epoch
	// RequestID identifies the write across the client's retries so that it
	// is applied at most once. 0: the store picks a fresh one (no dedup).
	RequestID uint64
	// Forward lets a follower take a Propose: it hands the entry to its
	// leader through raft (a MsgProp, as etcd's members do) and answers
	// from its own apply of it, instead of refusing with NotLeader. It
	// saves the caller a hop to the leader's store and the store a second
	// request. Put and Delete ignore it (they deduplicate on the leader).
	Forward bool
}

// ReadInfo says who served a read and how.
type ReadInfo struct {
	StoreID        uint64
	PeerID         uint64
	Mode           readmode.Mode
	StalenessBound time.Duration
	// LeaderStoreID is the store of the region's leader as this replica
	// knows it (0: unknown), set on stale reads: a client that reads stale
	// from followers would otherwise never hear of a new leader.
	LeaderStoreID uint64
}

// KV is one key-value pair (the engine's: reads return its pairs as they
// are).
type KV = engine.KV

// RegionStatus is a peer's view of its region.
type RegionStatus struct {
	Region        region.Region
	LeaderPeerID  uint64 // 0: unknown
	LeaderStoreID uint64 // 0: unknown
	IsLeader      bool
	Transferring  bool // a leadership transfer this leader started is under way
	Hibernating   bool // the peer has stopped ticking for lack of traffic
	Term          uint64
	CommitIndex   uint64
	AppliedIndex  uint64
	LastIndex     uint64 // last index of the peer's raft log
	// Progress is, on a leader, raft's view of every other peer: what it
	// has replicated to each and how (why a replica lags, when one does).
	Progress []PeerProgress
	// LeaseExpiry is when the leader's lease runs out, on the store's
	// clock; zero when this peer holds no valid lease.
	LeaseExpiry time.Time
	// SizeKnown: this peer leads and has counted the region since its last
	// split (every SplitCheckInterval); ApproximateKeys and ApproximateBytes
	// (keys and values) are that count, so at most an interval old.
	SizeKnown        bool
	ApproximateKeys  uint64
	ApproximateBytes uint64
}

// PeerProgress is a leader's replication state for one peer.
type PeerProgress struct {
	PeerID          uint64
	Match, Next     uint64
	State           string // probe, replicate or snapshot
	Paused          bool   // the leader sends it nothing until it hears back
	PendingSnapshot uint64 // index of the snapshot in flight, in state snapshot
	RecentActive    bool
}

func (pp PeerProgress) String() string {
	s := fmt.Sprintf("peer %d %s match %d next %d", pp.PeerID, pp.State, pp.Match, pp.Next)
	if pp.Paused {
		s += " paused"
	}
	if pp.PendingSnapshot > 0 {
		s += fmt.Sprintf(" pending snapshot %d", pp.PendingSnapshot)
	}
	if !pp.RecentActive {
		s += " inactive"
	}
	return s
}

// String is a one-line summary of the replica's raft state.
func (st RegionStatus) String() string {
	s := fmt.Sprintf("region %d term %d leader peer %d commit %d applied %d last %d", st.Region.ID, st.Term, st.LeaderPeerID, st.CommitIndex, st.AppliedIndex, st.LastIndex)
	if st.Hibernating {
		s += " hibernating"
	}
	for _, pp := range st.Progress {
		s += "; " + pp.String()
	}
	return s
}

// Errors of the store itself (region errors live in package region).
var (
	ErrStopped = errors.New("raftstore: store stopped")
	// ErrProposalDropped: raft refused the proposal (no leader known, or a
	// leadership transfer under way). Retryable.
	ErrProposalDropped = errors.New("raftstore: proposal dropped")
	// ErrMaybeApplied wraps the error (a NotLeader) of a proposal failed
	// after raft took it, because its leader stepped down: the entry may
	// still commit and apply under the next leader. A retry must be
	// harmless: hedgekv's writes carry request IDs, an Applier's commands
	// are not deduplicated (etcdapi answers "leader changed", as etcd).
	ErrMaybeApplied = errors.New("raftstore: the proposal's leader stepped down; it may still apply")
	// ErrNoApplier: a command for Config.Applier, on a store that has
	// none (Propose refuses it up front; an entry of one that reaches
	// such a store's apply is acknowledged with it and writes nothing).
	ErrNoApplier = errors.New("raftstore: no Applier configured")
)

// StoreInfo is what the balancer knows about one store of the cluster.
type StoreInfo struct {
	ID          uint64
	Zone        string
	Up          bool
	LeaderCount int
	RegionCount int
	// Removing: the store is being removed from the cluster; the balancer
	// moves its replicas and leaderships off and puts none on it.
	Removing bool
}

// ClusterView tells a store about the others; the server implements it by
// asking every known store for its status, tests by looking at all stores.
// Stores must include this store itself.
type ClusterView interface {
	Stores(ctx context.Context) []StoreInfo
}
