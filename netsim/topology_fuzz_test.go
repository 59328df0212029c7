package netsim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// FuzzParseTopology: a topology file (--topology, docs/topology.md), which
// an operator writes by hand. Parse must answer any text with a topology
// or a one-line error naming the problem, never panic; what it accepts must
// pass Validate and survive the JSON encoding the control endpoint uses.
func FuzzParseTopology(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("..", "scripts", "topology.example.toml")); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`[[zone]]
name = "dc-a"
stores = [1]
[[zone]]
name = "dc-b"
stores = [2, 3]
[default]
latency = "20ms"
jitter = "2ms"
bandwidth_mbit = 100
[[link]]
between = ["dc-a", "dc-a"]
latency = "1ms"
`))
	f.Add([]byte(`zone = 3`))
	f.Add([]byte(`[[zone]]
name = "a"
stores = [100]`))
	f.Add([]byte(`[[zone]]
name = "a"
stores = [1]
[[link]]
between = ["a"]
latency = 5`))
	f.Add([]byte(`[[zone]]
name = "a"
stores = [1]
[default]
latency = "1.5ms"
bandwidth_mbit = nan`))
	f.Add([]byte(`[[zone]]
name = "a"
stores = [1]
[default]
latency = "1ms"
jitter = "2ms"
bandwidth_mbit = 0.001
extra = 1`))
	f.Add([]byte("[[zone]\nname = "))
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, data []byte) {
		topo, err := Parse(data)
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "topology: ") {
				t.Fatalf("error is not one line starting with \"topology: \": %q", msg)
			}
			return
		}
		if err := topo.Validate(); err != nil {
			t.Fatalf("Parse accepted a topology Validate refuses: %v", err)
		}
		b, err := json.Marshal(topo)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		var back Topology
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("unmarshal %s: %v", b, err)
		}
		// No links (or stores) is the same whether nil or empty.
		if len(back.Links) == 0 && len(topo.Links) == 0 {
			back.Links = topo.Links
		}
		for i := range back.Zones {
			if i < len(topo.Zones) && len(back.Zones[i].Stores) == 0 && len(topo.Zones[i].Stores) == 0 {
				back.Zones[i].Stores = topo.Zones[i].Stores
			}
		}
		if !reflect.DeepEqual(&back, topo) {
			t.Fatalf("JSON round trip: %#v became %#v", topo, &back)
		}
	})
}
