// Package readmode names how a replica served a read. The store sets it,
// the wire carries it (kvpb converts), the client reports it and the CLI
// prints it: one type, so the four cannot drift apart.
package readmode

// Mode says how a replica served a read. Its values are the names the CLI
// prints; a read that failed, or has not been served, has the zero Mode.
type Mode string

const (
	// Lease: the leader served the read from its lease, with no round
	// trip.
	Lease Mode = "lease"
	// ReadIndex: a leader without a lease, or a follower, served it after
	// a ReadIndex round trip to the leader.
	ReadIndex Mode = "read-index"
	// FollowerLease: a follower served it from a read lease its leader
	// granted (the server's --follower-leases), with no round trip.
	FollowerLease Mode = "follower-lease"
	// Stale: a replica served it from local state within the session's
	// bound on staleness, which the answer reports.
	Stale Mode = "stale"
	// Local: a replica served its applied state as it is, with no promise
	// of freshness (ReadOptions.Local: etcd's watch, which each member
	// serves from its own state). Never offered by the KV API.
	Local Mode = "local"
	// Unknown: the answer named no mode this build knows (a newer peer).
	Unknown Mode = "unknown"
)

// All is every mode a store serves reads in, for metrics that list them.
var All = []Mode{Lease, ReadIndex, FollowerLease, Stale}
