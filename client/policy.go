package client

import (
	"fmt"
	"time"

	"github.com/hedgekv/hedgekv/readmode"
)

// ReplicaPolicy says which replica of a region a session's reads go to.
// Every policy except ReplicaLeader reads from followers through a ReadIndex
// round trip to the leader, so all of them stay linearizable unless the
// session also sets MaxStaleness.
type ReplicaPolicy int

const (
	// ReplicaLeader reads from the leader only (lease or ReadIndex there).
	ReplicaLeader ReplicaPolicy = iota
	// ReplicaFollower reads from a follower, one in the client's zone
	// (Config.Zone) when there is one, falling back to the leader when no
	// follower is reachable.
	ReplicaFollower
	// ReplicaMixed reads from any replica, balanced by power of two choices
	// on the client's in-flight requests per store.
	ReplicaMixed
	// ReplicaClosest reads from a replica in the client's zone, else from the
	// replica with the lowest observed latency.
	ReplicaClosest
	// ReplicaPreferLeader reads from the leader unless its store failed
	// recently, then from a follower.
	ReplicaPreferLeader
	// ReplicaRoundRobin reads from every replica in turn, blind to load:
	// the baseline power of two choices is measured against (ScyllaDB's
	// token-aware round-robin). Stores that failed recently are skipped
	// while others remain, as for the other policies.
	ReplicaRoundRobin
)

var replicaPolicyNames = [...]string{
	ReplicaLeader:       "leader",
	ReplicaFollower:     "follower",
	ReplicaMixed:        "mixed",
	ReplicaClosest:      "closest",
	ReplicaPreferLeader: "prefer-leader",
	ReplicaRoundRobin:   "round-robin",
}

// ParseReplicaPolicy parses the names the CLI's --read flag takes.
func ParseReplicaPolicy(s string) (ReplicaPolicy, error) {
	for p, name := range replicaPolicyNames {
		if s == name {
			return ReplicaPolicy(p), nil
		}
	}
	return 0, fmt.Errorf("unknown replica policy %q (want leader, follower, mixed, closest, prefer-leader or round-robin)", s)
}

// String returns the name ParseReplicaPolicy accepts.
func (p ReplicaPolicy) String() string {
	if p >= 0 && int(p) < len(replicaPolicyNames) {
		return replicaPolicyNames[p]
	}
	return fmt.Sprintf("ReplicaPolicy(%d)", int(p))
}

// ReadPolicy is a session's read behaviour.
type ReadPolicy struct {
	Replica ReplicaPolicy
	// MaxStaleness > 0 lets a replica answer from local state that may miss
	// writes committed within this bound (bounded-staleness read). Zero keeps
	// reads linearizable.
	MaxStaleness time.Duration
	// Hedge says when a read (Get, BatchGet, Scan; never a write) not yet
	// answered is sent again to another replica, the first answer winning.
	// A hedge to a follower is a ReadIndex read, so it stays linearizable,
	// unless MaxStaleness > 0 permits a stale one. The zero value is
	// HedgeOff.
	Hedge Hedge
	// HedgeBudget caps hedges at this share of the reads over a sliding
	// window (Finagle's retry budget): over any HedgeWindow, the hedges of
	// reads whose primary went to a store are at most HedgeBudget of the
	// reads sent to that store in the window, or HedgeMinPerSecond ×
	// HedgeWindow when that is more. Each store has its own account, so
	// hedging away from a store that stays slow spends only what its own
	// reads deposited. A pause shorter than HedgeBudget × HedgeWindow (0.5 s
	// at the defaults) is hedged in full from what the seconds before it
	// deposited; a store slow for longer gets HedgeBudget of its reads
	// hedged. Zero means DefaultHedgeBudget (5%), so that naming a Hedge is
	// enough; a negative value is a budget of zero: no hedge is ever sent,
	// each one due counted as denied. 1 or more is no cap.
	HedgeBudget float64
	// HedgeMaxAttempts is how many attempts of one read may be in flight
	// at once, the primary included; zero means DefaultHedgeMaxAttempts (2).
	HedgeMaxAttempts int
	// HedgeWindow is how long a read counts towards the budget (Finagle's
	// TTL); zero means DefaultHedgeWindow (10 s), and anything under 100 ms
	// counts as 100 ms.
	HedgeWindow time.Duration
	// HedgeMinPerSecond is the budget's floor: a store's account allows
	// HedgeMinPerSecond × HedgeWindow hedges per window however few reads
	// it had, so that a session that reads rarely (a CLI get) may hedge now
	// and then. It is a floor, not an addition: a session reading more
	// than HedgeMinPerSecond / HedgeBudget reads a second from a store (20
	// at the defaults) is held to HedgeBudget exactly. Zero means
	// DefaultHedgeMinPerSecond (1); negative: no floor.
	HedgeMinPerSecond float64
	// BusyThreshold > 0 lets a store refuse a read at once with
	// ServerIsBusy when its estimated wait for a new read exceeds this, so
	// the client tries another replica instead of queueing behind a slow
	// one (TiKV's load-based replica read). When every replica is busy the
	// read goes, without the threshold, to the one that reported the
	// shortest wait. Zero: never refused for load.
	BusyThreshold time.Duration
}

// ReadInfo says who served a read and how, so tests and benchmarks can count.
type ReadInfo struct {
	StoreID uint64
	// Mode is how the read was served; only readmode.Lease,
	// readmode.FollowerLease and readmode.ReadIndex reads are linearizable.
	Mode readmode.Mode
	// StalenessBound is how stale a "stale" answer may be; zero otherwise.
	StalenessBound time.Duration
	// Attempts is the number of tries the read took, retries included
	// (a primary and its hedges count as one try).
	Attempts int
	// HedgeWon says the answer came from a hedge (a backup request sent
	// because the primary was late), not from the primary.
	HedgeWon bool
	// Hedge says what became of the hedging of the try that answered:
	// whether a hedge was sent, where, and why not when it was not.
	Hedge HedgeInfo
}

// HedgeOutcome is what became of a read's hedge, as the CLI's get -v
// names it.
type HedgeOutcome string

const (
	// HedgeNotDue: the primary answered within the hedge delay, so no
	// hedge was due.
	HedgeNotDue HedgeOutcome = "not-due"
	// HedgeNoReplica: a hedge was due, but no other replica could take
	// it (every other one excluded or already tried, or its store's
	// address unknown).
	HedgeNoReplica HedgeOutcome = "no-replica"
	// HedgeAtLimit: a hedge was due, but HedgeMaxAttempts attempts were
	// in flight already.
	HedgeAtLimit HedgeOutcome = "at-limit"
	// HedgeDenied: a hedge was due, and the budget (HedgeBudget) denied
	// it.
	HedgeDenied HedgeOutcome = "denied"
	// HedgeLost: a hedge was sent, and the primary answered first (or
	// the hedge failed).
	HedgeLost HedgeOutcome = "lost"
	// HedgeWonRace: a hedge was sent and its answer is the one returned.
	HedgeWonRace HedgeOutcome = "won"
)

// HedgeInfo is what the hedging of one read did, for a session with a
// Hedge policy (the zero value otherwise).
type HedgeInfo struct {
	// Outcome is empty when the session does not hedge.
	Outcome HedgeOutcome
	// Delay is the hedge delay the read had: the policy's, or the
	// percentile of the primary's store's recent latency.
	Delay time.Duration
	// PrimaryStoreID is the store the primary went to.
	PrimaryStoreID uint64
	// StoreID is the store the (last) hedge went to; 0 when none was
	// sent.
	StoreID uint64
}
