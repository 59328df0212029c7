package raftstore

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/hedgekv/hedgekv/region"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Peer is one replica of one region on this store: a raft RawNode, its
// storage, and the requests waiting on it. Everything below mu is guarded by
// it; the Ready loop holds mu only to talk to the RawNode, never across I/O.
type Peer struct {
	store    *Store
	storage  *peerStorage
	id       uint64
	regionID uint64 // never changes; safe to read without mu
	// instance identifies this instance of the peer among every instance
	// of every peer this store ever ran (instance.go); never changes.
	instance uint64

	mu      sync.Mutex
	rn      *raft.RawNode
	region  region.Region
	lead    uint64 // leader peer ID as of the last Ready, 0 if unknown
	term    uint64
	commit  uint64
	applied uint64
	// appliedTerm is the term of the last applied entry. A leader serves
	// lease reads only once it has applied an entry of its own term, so that
	// everything the previous leaders acknowledged is in its state machine.
	appliedTerm uint64
	lastIndex   uint64 // last index persisted in bbolt (for conflict truncation)
	// initialized: the peer has region metadata and data (bootstrapped, split
	// from a parent, or restored from a snapshot). A peer created for a
	// message from an unknown region is not, until its snapshot arrives; it
	// serves nothing and owns no key range.
	initialized bool
	removed     bool // destroyed or superseded; the loop forgets it
	// snapGen counts snapshot applies begun and finished: odd while one
	// writes the peer's range outside the loop, when it serves nothing
	// (snapapply.go).
	snapGen uint64

	lease     lease
	proposals map[uint64]*proposal
	// queued are proposals not yet stepped into raft: the Ready loop steps
	// them as one MsgProp per round (batchProposalsLocked), so a round's
	// writes travel in one MsgApp per follower and come back in one ack.
	queued    []raftpb.Entry
	queuedIDs []uint64
	reads     readQueue
	applyWait []applyWaiter
	// confInFlight: this leader proposed a conf change that has not been
	// applied yet; raft would drop another one (see proposeConfChange).
	confInFlight bool
	// transferring is set while a leadership transfer this peer started is in
	// flight; the lease stays revoked until it ends (etcd-io/raft#99).
	transferring bool
	// timeoutNowAt is when this leader last sent MsgTimeoutNow; rounds
	// issued before it plus an election timeout never renew the lease.
	timeoutNowAt time.Time
	// noVotesBefore: the peer ignores (pre-)vote requests until then,
	// because it may have forgotten a leader it acked (votes.go).
	noVotesBefore time.Time
	// readsSinceRenew: a lease read happened since the last renewal check,
	// so renewing ahead of expiry is worth a heartbeat round.
	readsSinceRenew bool
	// leading: this peer led as of its last published Ready. The passes
	// over every peer of the store (Summary, Gauges, ledRegions) read it
	// rather than raft's BasicStatus, which was a quarter of an idle
	// 10,000-region store's CPU.
	leading bool
	// hibernating: the peer does not tick (hibernate.go); idleTicks counts
	// ticks without traffic.
	hibernating bool
	idleTicks   int
	// leaderSeen is when this follower last heard a leader (an append, a
	// heartbeat or a snapshot); staleChecked when it last asked its
	// region's other peers whether it is still a member (membership.go).
	leaderSeen, staleChecked time.Time
	// safe holds the latest safe points heard from the leader (stale.go).
	safe safePoints
	// lastNudge is when this follower last asked its leader for fresh safe
	// points (stale.go).
	lastNudge time.Time
	// fl is the follower-lease state: this follower's lease, the leader's
	// grants, and the keys the unapplied log writes (followerlease.go).
	fl followerLeaseState
	// size is the region's size as this peer last counted it while leading
	// (the split check); it describes the region only while the epoch's
	// version it was counted at is still the region's (a split changes it).
	size regionSize
	// senders maps the peer IDs of message senders the region does not
	// list to their stores (learnSenderLocked): a placeholder lists only
	// itself and the peer whose message created it, and must still answer
	// a leader elected since (TiKV's peer cache).
	senders map[uint64]uint64
	// heldProps: forwarded proposals raft dropped while no leader could
	// take them, stepped again once one can (heldprops.go).
	heldProps []heldProp
	// mergeAcks: the peers of this frozen region that said they applied
	// its freeze, and its index (merge.go).
	mergeAcks map[uint64]uint64
	// durableFreeze is the freeze of region.Merge once the round that
	// applied it is durable (set at its publish, or at a load): only then
	// does the replica confirm it to a coordinator. Confirmed before, a
	// power loss could take the freeze back after the target absorbed
	// the source, and the source's leader, gone with the merge, would
	// never commit it here again.
	durableFreeze region.MergeState
}

// maxSenders bounds the senders a peer remembers beyond its region's.
const maxSenders = 16

// learnSenderLocked remembers the store of m's sender when the region does
// not list it, so that raft's answers to it can be addressed.
func (p *Peer) learnSenderLocked(m *Message) {
	from := m.FromPeer()
	if from == 0 || m.FromStore == 0 || from == p.id {
		return
	}
	if _, ok := p.region.PeerByID(from); ok {
		return
	}
	if p.senders[from] == m.FromStore {
		return
	}
	if p.senders == nil || len(p.senders) >= maxSenders {
		p.senders = make(map[uint64]uint64)
	}
	p.senders[from] = m.FromStore
}

// storeOfLocked returns the store of peer id: the region's, or one learned
// from its messages.
func (p *Peer) storeOfLocked(id uint64) (uint64, bool) {
	if pr, ok := p.region.PeerByID(id); ok {
		return pr.StoreID, true
	}
	sid, ok := p.senders[id]
	return sid, ok
}

// regionSize is a region's key count and bytes of keys and values, as
// counted at version (the region epoch's); the zero value is "not counted".
type regionSize struct {
	keys, bytes uint64
	version     uint64
	counted     bool
}

type proposal struct {
	term     uint64 // 0 for a forwarded one: raft gives it a term elsewhere
	proposed time.Time
	// forwarded: proposed on a follower (WriteOptions.Forward), its entry
	// handed to the leader; matched by request ID when this replica
	// applies it.
	forwarded bool
	// giveUpAt: the leader its entry went to is gone (orphaned); it may
	// still apply under the next one until then, and fails with
	// ErrMaybeApplied after. Zero: not orphaned.
	giveUpAt time.Time
	waiters  []chan error // each buffered(1): a retry of a pending request joins it
	// results are the waiters that also take the entry's result: a
	// Propose's, whose command the Applier answered (buffered(1) too).
	results []chan proposalResult
}

// proposalResult is what a Propose waits for: the Applier's result, or
// why there is none.
type proposalResult struct {
	result []byte
	err    error
}

func (pr *proposal) finish(err error) { pr.finishWith(nil, err) }

// finishWith wakes every waiter: those of a plain write with err, those
// of a Propose with result and err.
func (pr *proposal) finishWith(result []byte, err error) {
	for _, w := range pr.waiters {
		w <- err
	}
	for _, w := range pr.results {
		w <- proposalResult{result: result, err: err}
	}
}

type applyWaiter struct {
	index uint64
	done  chan struct{}
}

// leaderPeerLocked returns the leader as a region.Peer, nil if unknown.
func (p *Peer) leaderPeerLocked() *region.Peer {
	lp, ok := p.region.PeerByID(p.lead)
	if !ok || p.lead == 0 {
		return nil
	}
	return &lp
}

func (p *Peer) notLeaderLocked() error {
	return p.notLeaderWithLocked(p.lead)
}

// notLeaderWithLocked builds NotLeader with lead as the hint.
func (p *Peer) notLeaderWithLocked(lead uint64) error {
	e := &region.NotLeaderError{RegionID: p.regionID}
	if lp, ok := p.region.PeerByID(lead); ok && lead != 0 {
		e.Leader = &lp
	}
	return e
}

func (p *Peer) isLeader() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.isLeaderLocked()
}

func (p *Peer) isLeaderLocked() bool {
	return p.rn.BasicStatus().RaftState == raft.StateLeader
}

// waitAppliedLocked returns a channel closed once applied >= index, or at
// once if p was removed: readers then learn it from stillHolds.
func (p *Peer) waitAppliedLocked(index uint64) <-chan struct{} {
	ch := make(chan struct{})
	if p.applied >= index || p.removed { // a removed peer applies nothing more
		close(ch)
		return ch
	}
	p.applyWait = append(p.applyWait, applyWaiter{index: index, done: ch})
	return ch
}

// notifyAppliedLocked wakes waiters whose index has been applied.
func (p *Peer) notifyAppliedLocked() {
	kept := p.applyWait[:0]
	for _, w := range p.applyWait {
		if p.applied >= w.index {
			close(w.done)
		} else {
			kept = append(kept, w)
		}
	}
	for i := len(kept); i < len(p.applyWait); i++ {
		p.applyWait[i] = applyWaiter{}
	}
	p.applyWait = kept
}

// failProposalsLocked fails every pending proposal with err. Used when the
// peer stops being leader: the entries may still commit under the next
// leader, so err must be one the client retries (all our writes are
// idempotent puts and deletes, and a retry is ordered after the original).
func (p *Peer) failProposalsLocked(err error) {
	p.confInFlight = false // it may still apply, but under another leader
	p.queued, p.queuedIDs = nil, nil
	for id, pr := range p.proposals {
		pr.finish(err)
		delete(p.proposals, id)
	}
}

// orphanProposalsLocked handles the proposals of a peer whose leader is
// gone: it stepped down, or (forwardedOnly) the leader it forwarded to
// changed. The caller has failed those still queued (failQueuedLocked):
// they never reached raft. The rest were appended to a log the next leader
// most likely holds (a transfer waits for its target to catch up; an
// election picks a candidate holding every committed entry), so they wait
// until giveUpAt for their apply (answered as any other) and then fail
// with ErrMaybeApplied (expireOrphansLocked). Failing them at once, as
// this store did, failed writes that were about to apply, and every
// leadership transfer of the balancer cost a burst of errors.
func (p *Peer) orphanProposalsLocked(giveUpAt time.Time, forwardedOnly bool) {
	for _, pr := range p.proposals {
		if (forwardedOnly && !pr.forwarded) || !pr.giveUpAt.IsZero() {
			continue
		}
		pr.giveUpAt = giveUpAt
	}
}

// failQueuedLocked fails the proposals queued for the next round with
// err: they never reached raft, so err may be one callers retry.
func (p *Peer) failQueuedLocked(err error) {
	for _, id := range p.queuedIDs {
		if pr, ok := p.proposals[id]; ok {
			delete(p.proposals, id)
			pr.finish(err)
		}
	}
	p.queued, p.queuedIDs = nil, nil
}

// expireOrphansLocked fails the orphaned proposals whose wait is over
// (orphanProposalsLocked): their outcome is unknown.
func (p *Peer) expireOrphansLocked(now time.Time) {
	for id, pr := range p.proposals {
		if pr.giveUpAt.IsZero() || now.Before(pr.giveUpAt) {
			continue
		}
		delete(p.proposals, id)
		if p.rn.BasicStatus().RaftState == raft.StateLeader {
			pr.finish(fmt.Errorf("region %d: %w", p.regionID, ErrMaybeApplied))
		} else {
			pr.finish(fmt.Errorf("%w: %w", ErrMaybeApplied, p.notLeaderLocked()))
		}
	}
}

func uint64Bytes(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

// supersedePlaceholder marks an uninitialized peer removed, so that the
// Ready loop neither persists nor answers for it once a peer with another
// ID replaces it. It reports false for an initialized or removed peer, and
// for a placeholder whose raft has taken a snapshot (its commit index is
// the snapshot's; a placeholder's is 0 until then): from that moment the
// peer is on its way to holding the region, its round may already be
// persisting the snapshot and acking it, and a leader that hears the ack
// counts on this peer ID holding that log. Superseded then, the next
// message to the ID would create a fresh placeholder with an empty log,
// and the leader's heartbeat commit (the acked index) panics its raft:
// `tocommit(984) is out of range [lastIndex(0)]`, seen at scale with two
// leaders addressing the store by different peer IDs during a removal.
// Messages to the other ID are refused until this peer is removed.
func (p *Peer) supersedePlaceholder() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.initialized || p.removed || p.rn.BasicStatus().Commit > 0 {
		return false
	}
	p.removed = true
	return true
}

func (p *Peer) isRemoved() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.removed
}
