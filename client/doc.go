// Package client is the Go client of hedgekv.
//
// A Client routes every request by key to the region that holds it, using a
// region cache (region_cache.go) filled from any store's Admin service and
// corrected by the region errors stores answer with. Each request is sent by
// one retry loop (request.go) that, within the request's deadline, follows
// NotLeader hints, replaces stale regions after EpochNotMatch, reloads after
// RegionNotFound / KeyNotInRegion and moves to another replica when a store
// is unreachable; region errors reach the caller only once the deadline has
// run out. Which replica serves a read is the session's ReadPolicy, decided
// per attempt by the replica selector (replica_selector.go) from the region's
// peers, the client's in-flight count and observed latency per store
// (store_stats.go), and the zones stores report. Connections are one gRPC
// ClientConn per store address, dialled lazily (conn.go).
//
// The client depends only on the region model and the wire protocol; it
// never imports raftstore or server.
package client
