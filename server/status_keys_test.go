package server

import (
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/hedgekv/hedgekv/kvpb"
)

// /status shows region keys as ctl regions does: losslessly escaped, not
// base64.
func TestStatusKeys(t *testing.T) {
	st := &kvpb.StatusResponse{StoreId: 1, Regions: []*kvpb.RegionInfo{
		{Region: &kvpb.Region{Id: 1, EndKey: []byte("m")}},
		{Region: &kvpb.Region{Id: 2, StartKey: []byte("m"), EndKey: []byte{0xff, 0xfe}}, LeaderStoreId: 1},
		{Region: &kvpb.Region{Id: 3, StartKey: []byte{0xff, 0xfe}}},
	}}
	body, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	out, err := statusKeys(body)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		StoreID string `json:"store_id"`
		Regions []struct {
			Region struct {
				StartKey string `json:"start_key"`
				EndKey   string `json:"end_key"`
			} `json:"region"`
		} `json:"regions"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var got []string
	for _, r := range doc.Regions {
		got = append(got, r.Region.StartKey, r.Region.EndKey)
	}
	want := []string{"", "m", "m", `\xff\xfe`, `\xff\xfe`, ""}
	if doc.StoreID != "1" || len(got) != len(want) {
		t.Fatalf("status %s", out)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("keys %q, want %q", got, want)
			break
		}
	}
}
