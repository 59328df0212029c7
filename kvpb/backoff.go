package kvpb

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// ResetBackoff makes a connection waiting out its reconnect back-off try
// again now. It calls grpc's ResetConnectBackoff only on a channel in
// TRANSIENT_FAILURE: grpc-go (v1.85) walks its subchannel map there after
// releasing the lock, which races with the subchannel's creation when a
// channel leaves IDLE (the race detector caught it in the client's
// examples). In TRANSIENT_FAILURE the one subchannel exists and is backing
// off; a channel in any other state has no back-off to cut short.
func ResetBackoff(cc *grpc.ClientConn) {
	if cc != nil && cc.GetState() == connectivity.TransientFailure {
		cc.ResetConnectBackoff()
	}
}
