package client

import (
	"testing"

	"github.com/hedgekv/hedgekv/kvpb"
)

// TestMergeRegionSizes: the merged region carries the size its leader
// counted under the highest term, and none counted before its last split.
func TestMergeRegionSizes(t *testing.T) {
	at := func(version, term, keys uint64, known bool) *kvpb.RegionInfo {
		return &kvpb.RegionInfo{
			Region:        &kvpb.Region{Id: 1, Epoch: &kvpb.Epoch{ConfVer: 1, Version: version}, Peers: []*kvpb.Peer{{Id: 1, StoreId: 1}, {Id: 2, StoreId: 2}}},
			LeaderStoreId: 1, Term: term,
			SizeKnown: known, ApproximateKeys: keys, ApproximateSize: 10 * keys,
		}
	}
	tests := []struct {
		name     string
		answers  [][]*kvpb.RegionInfo
		wantKeys uint64
		known    bool
	}{
		{"nobody counted", [][]*kvpb.RegionInfo{{at(2, 5, 0, false)}, {at(2, 5, 0, false)}}, 0, false},
		{"the leader's count", [][]*kvpb.RegionInfo{{at(2, 5, 0, false)}, {at(2, 5, 7, true)}}, 7, true},
		{"the newer term's count wins", [][]*kvpb.RegionInfo{{at(2, 4, 3, true)}, {at(2, 5, 7, true)}, {at(2, 3, 9, true)}}, 7, true},
		{"a count from before the split is dropped", [][]*kvpb.RegionInfo{{at(1, 6, 9, true)}, {at(2, 5, 0, false)}}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mergeRegionInfos(tt.answers)
			if len(got) != 1 {
				t.Fatalf("merged %d regions", len(got))
			}
			info := regionInfoFromPB(got[0])
			if info.SizeKnown != tt.known || info.ApproximateKeys != tt.wantKeys || info.ApproximateBytes != 10*tt.wantKeys {
				t.Errorf("size known %v, %d keys, %d bytes; want %v, %d keys", info.SizeKnown, info.ApproximateKeys, info.ApproximateBytes, tt.known, tt.wantKeys)
			}
		})
	}
}
