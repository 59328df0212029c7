// Package client is the Go client of hedgekv.
//
// A Client routes every request by key to the region that holds it, using a
// region cache (region_cache.go) filled from any store's Admin service and
// corrected by the region errors stores answer with. Each request is sent by
// one retry loop (request.go) that, within the request's deadline, follows
// NotLeader hints, replaces stale regions after EpochNotMatch, reloads after
// RegionNotFound / KeyNotInRegion and moves to another replica when a store
// is unreachable; region errors reach the caller only once the deadline has
// run out. A NotLeader hint naming a store in its back-off (a leader that
// just failed, as far as the client knows) is declined for at most a
// second per request, then followed: replicas that keep naming it hear
// from it. An EpochNotMatch from a store whose copy of the region is older
// than the request's (it has not applied a split the client learned
// elsewhere) changes nothing; the same store is asked again after a
// back-off. Which replica serves a read is the session's ReadPolicy, decided
// per attempt by the replica selector (replica_selector.go) from the region's
// peers, the client's in-flight count and observed latency per store
// (store_stats.go), and the zones stores report. Connections are one gRPC
// ClientConn per store address, dialled lazily (conn.go).
//
// # Hedged reads
//
// A session whose ReadPolicy has a Hedge (hedge.go) races its reads (Get,
// BatchGet, Scan; never writes): when the attempt the policy chose has not
// answered within the hedge delay, the same read goes to another replica,
// picked by the replica selector with the first one's store excluded; the
// first good answer wins and the others are cancelled through their
// contexts. The delay is fixed, a percentile of the recent read latency of
// the first attempt's store (a sliding-window HDR histogram per store), or
// the min / max of the two. A hedge to a follower is a ReadIndex read, so
// it stays linearizable, unless the session's MaxStaleness permits a stale
// one. A region error on one attempt does not end the race while another
// is outstanding. A budget (budget.go) caps the extra requests at
// HedgeBudget of the reads over a sliding window (HedgeWindow, 10 s;
// Finagle's retry budget): each primary deposits HedgeBudget of a token,
// expiring after the window, in the session's account for the primary's
// store, and each hedge spends one, so a pause of up to HedgeBudget ×
// HedgeWindow is hedged in full and a store that stays slow gets no more
// than HedgeBudget of its reads hedged; HedgeMinPerSecond is a floor for
// sessions that read rarely. The counters are Session.HedgeStats and, over
// all sessions, Client.HedgeStats.
// ReadInfo.HedgeWon says whether an answer came from a hedge.
//
// # Metadata calls
//
// The store list (Admin.Stores) and the region holding a key (Admin.Regions
// by key) are hedged like reads (metadata.go), so that one store that does
// not answer (cut off, stalled) costs a client a short delay rather than a
// DialTimeout: the call goes to the client's own zone's store first, to
// the next store when the first has not answered within its hedge delay
// (three times its recent latency, 20-100 ms) or at once when it failed;
// the first good answer wins and the others are cancelled. A store that
// failed, or stayed silent past its delay while another answered, is asked
// last until its back-off (storeStats' rules) ends; one that failed
// outright also enters the read path's back-off. A store that hosts no
// region holding the key (NotFound), or answers with a region older than
// the cache holds, gave no answer: another is asked, and if none knows the
// region the request retries within its deadline, after a back-off; a
// store silent meanwhile (perhaps the one that does know, stalled) is
// waited for gatherGrace, not DialTimeout. The
// list of every region (Client.Regions, lookups by region id) asks every
// store at once and waits for the rest at most gatherGrace after the
// first answer. An attempt at a presumed leader that has not answered
// within 200-500 ms asks the stores who leads the region now, and again at
// that interval while they still name it; when another store leads, the
// attempt is cancelled and retried there (the store it left is not
// counted as failed), so a leader that moved and was then cut off, or was
// cut off or stalled and then replaced by an election, does not hold a
// request for its attempt timeout (request.go, watchLeader).
//
// # Which address a store is dialled at
//
// Config.Endpoints only bootstrap the client: New asks each endpoint which
// store it is (Admin.Status) and then loads the store list (Admin.Stores).
// From then on each store is dialled, for data requests and admin calls
// alike, at:
//
//  1. its address for the client's zone (Config.Zone), when the store
//     advertises one (the server's --advertise-zone-addrs: in the simulated
//     WAN, the proxy of the link from that zone to the store), so a client
//     in zone Z reaches every store through zone Z's links;
//  2. otherwise the endpoint the user gave for that store, if any (the user
//     may reach it through a proxy the store does not know about);
//  3. otherwise the address the store advertises (Store.address).
//
// A client without a zone, or a cluster whose stores advertise no zone
// addresses, thus dials exactly the endpoints it was given and the
// advertised addresses of the other stores. The addresses are learned from
// the cluster (Status and Stores answers), never from a list kept by hand,
// and are updated whenever the store list is reloaded.
//
// # Logging
//
// The client logs through Config.Logger (nil: slog.Default()): retries and
// hedges at debug level, trouble loading the store list at warn.
//
// The examples (go doc -http, or example_test.go) each start a cluster in
// the process with cluster.StartLocal and show a client opened, a
// put and get, follower, bounded-staleness and hedged sessions, and a scan.
//
// The client depends only on the region model and the wire protocol; it
// never imports raftstore or server.
package client
