package controlplane

import (
	"net"
	"strings"
	"testing"

	"github.com/hedgekv/hedgekv/kvpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FuzzValidateJoin: the Admin Join call. zas holds the zone addresses as
// lines "zone=address"; the last argument (a region id, from when this
// target also checked AddPeer/RemovePeer) is unused, kept so the corpus
// stays valid.
func FuzzValidateJoin(f *testing.F) {
	f.Add(uint64(2), "10.0.0.2:20160", "dc-a", "dc-a=10.0.0.2:20160\ndc-b=127.0.0.1:30002", uint64(1))
	f.Add(uint64(0), "", "", "", uint64(0))
	f.Add(uint64(MaxStoreID+1), "host:1", "z", "", uint64(5))
	f.Add(uint64(1), "[::1]:20160", "", "=x:1", uint64(1))
	f.Add(uint64(1), "no-port", "", "z=h:0", uint64(1))
	f.Add(uint64(1), "h:", "", "z=h:65536", uint64(1))
	f.Add(uint64(1), ":1", strings.Repeat("z", maxZoneLen+1), "z=[::1]:1", uint64(1))
	f.Add(uint64(MaxStoreID), "h:1", "z", "z=h:1\nz=h:2\nw", uint64(1))

	f.Fuzz(func(t *testing.T, id uint64, addr, zone, zas string, _ uint64) {
		var za map[string]string
		if zas != "" {
			za = map[string]string{}
			for _, line := range strings.Split(zas, "\n") {
				z, a, _ := strings.Cut(line, "=")
				za[z] = a
			}
		}
		req := &kvpb.JoinRequest{StoreId: id, Address: addr, Zone: zone, ZoneAddresses: za}
		err := ValidateJoin(req)
		if err != nil {
			wantInvalidArgument(t, "join", err)
		} else {
			host, port, herr := net.SplitHostPort(addr)
			if id == 0 || id > MaxStoreID || len(addr) > maxAddrLen || herr != nil || host == "" || port == "" || len(zone) > maxZoneLen || len(za) > maxZoneAddrs {
				t.Fatalf("ValidateJoin accepted %+v", req)
			}
			for z, a := range za {
				if z == "" || len(z) > maxZoneLen || len(a) > maxAddrLen || checkHostPort(a) != nil {
					t.Fatalf("ValidateJoin accepted zone address %q=%q", z, a)
				}
			}
		}
	})
}

func wantInvalidArgument(t *testing.T, what string, err error) {
	t.Helper()
	if st, ok := status.FromError(err); !ok || st.Code() != codes.InvalidArgument {
		t.Fatalf("%s refused with %v, want an InvalidArgument status", what, err)
	}
}
