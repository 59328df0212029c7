package kvpb

import (
	"reflect"
	"testing"

	"github.com/hedgekv/hedgekv/region"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Fuzz targets for the conversions between wire messages (as a client
// receives them from any server) and package region: they must never
// panic, and a converted value must survive the trip back and forth.

func marshal(f *testing.F, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzRegionErrorToError: a RegionError's wire bytes, read as a client
// reads them. ToError must give a typed region error that converts back to
// the same RegionError kind (or a plain error for an unknown kind); the
// same bytes read as a Region and a ZoneAddresses map must round-trip too.
func FuzzRegionErrorToError(f *testing.F) {
	reg := &Region{Id: 3, StartKey: []byte("b"), EndKey: []byte("m"), Epoch: &Epoch{ConfVer: 2, Version: 5},
		Peers: []*Peer{{Id: 1, StoreId: 1}, {Id: 2, StoreId: 2, IsLearner: true}}}
	for _, re := range []*RegionError{
		{Message: "not leader", NotLeader: &NotLeader{RegionId: 1, Leader: &Peer{Id: 2, StoreId: 2}}},
		{NotLeader: &NotLeader{RegionId: 1}},
		{EpochNotMatch: &EpochNotMatch{RegionId: 3, CurrentRegions: []*Region{reg, {}, nil}}},
		{RegionNotFound: &RegionNotFound{RegionId: 9}},
		{KeyNotInRegion: &KeyNotInRegion{Key: []byte("z"), RegionId: 3, StartKey: []byte("b"), EndKey: []byte("m")}},
		{DataIsNotReady: &DataIsNotReady{RegionId: 3, PeerId: 2, SafeAgeMs: 1 << 60}},
		{ServerIsBusy: &ServerIsBusy{StoreId: 1, EstimatedWaitUs: ^uint64(0)}},
		{Message: "from a newer server"},
		{NotLeader: &NotLeader{}, ServerIsBusy: &ServerIsBusy{}},
	} {
		f.Add(marshal(f, re))
	}
	f.Add(marshal(f, reg))
	f.Add(marshal(f, &ZoneAddresses{Addresses: map[string]string{"dc-a": "h:1"}}))
	f.Add([]byte{0x12, 0x05, 0x08})

	f.Fuzz(func(t *testing.T, wire []byte) {
		var re RegionError
		if proto.Unmarshal(wire, &re) == nil {
			checkRegionError(t, &re)
		}
		var r Region
		if proto.Unmarshal(wire, &r) == nil {
			got := r.ToRegion()
			if again := FromRegion(got).ToRegion(); !reflect.DeepEqual(again, got) {
				t.Fatalf("region %+v came back as %+v", got, again)
			}
		}
		var za ZoneAddresses
		if proto.Unmarshal(wire, &za) == nil {
			in := map[uint64]*ZoneAddresses{1: &za, 2: nil, 3: {}}
			m := ToZoneAddrs(in)
			if again := ToZoneAddrs(FromZoneAddrs(m)); !reflect.DeepEqual(again, m) {
				t.Fatalf("zone addresses %v came back as %v", m, again)
			}
		}
	})
}

func checkRegionError(t *testing.T, re *RegionError) {
	t.Helper()
	err := re.ToError()
	if err == nil {
		t.Fatalf("%v converted to no error", re)
	}
	known := re.NotLeader != nil || re.EpochNotMatch != nil || re.RegionNotFound != nil ||
		re.KeyNotInRegion != nil || re.DataIsNotReady != nil || re.ServerIsBusy != nil
	if known != region.IsRegionError(err) {
		t.Fatalf("%v converted to %T (%v), region error = %v", re, err, err, region.IsRegionError(err))
	}
	if sb, ok := err.(*region.ServerIsBusyError); ok && sb.EstimatedWait < 0 {
		t.Fatalf("wait %d µs became %v", re.ServerIsBusy.EstimatedWaitUs, sb.EstimatedWait)
	}
	back := RegionErrorFromError(err)
	if !known {
		if back != nil {
			t.Fatalf("an unknown kind %v came back as %v", re, back)
		}
		return
	}
	if back == nil {
		t.Fatalf("%T did not convert back", err)
	}
	if again := back.ToError(); !reflect.DeepEqual(again, err) {
		t.Fatalf("%#v came back as %#v", err, again)
	}
	// As the client receives it: a detail of a gRPC status.
	st := status.New(codes.Unavailable, "x")
	if d, derr := st.WithDetails(back); derr == nil {
		got := RegionErrorFromStatus(d.Err())
		if got == nil || !reflect.DeepEqual(got.ToError(), err) {
			t.Fatalf("through a status: %v became %v", back, got)
		}
	}
}
