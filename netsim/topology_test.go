package netsim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

func TestDefault(t *testing.T) {
	topo := Default()
	if err := topo.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := topo.ZoneNames(); !reflect.DeepEqual(got, []string{"dc-a", "dc-b", "dc-c"}) {
		t.Errorf("zones %v", got)
	}
	if got := topo.Stores(); !reflect.DeepEqual(got, []uint64{1, 2, 3}) {
		t.Errorf("stores %v", got)
	}
	for i, z := range topo.ZoneNames() {
		if s, _ := topo.ZoneOf(uint64(i + 1)); s != z {
			t.Errorf("store %d in %q, want %q", i+1, s, z)
		}
		for _, z2 := range topo.ZoneNames() {
			want := LinkSpec{Latency: 14 * ms, BandwidthMbit: 300}
			if z == z2 {
				want = LinkSpec{}
			}
			if got := topo.Spec(z, z2); got != want {
				t.Errorf("Spec(%s, %s) = %+v, want %+v", z, z2, got, want)
			}
		}
	}
	if got := topo.Default.RateKBps(); got != 37500 {
		t.Errorf("300 Mbit/s is %d KB/s, want 37500", got)
	}
	loaded, err := Load("default")
	if err != nil || !reflect.DeepEqual(loaded, topo) {
		t.Errorf("Load(default) = %+v, %v", loaded, err)
	}
}

// TestExampleIsDefault: scripts/topology.example.toml describes the same
// network as Default().
func TestExampleIsDefault(t *testing.T) {
	topo, err := Load(filepath.Join("..", "scripts", "topology.example.toml"))
	if err != nil {
		t.Fatal(err)
	}
	def := Default()
	if !reflect.DeepEqual(topo.Zones, def.Zones) {
		t.Errorf("zones %+v, want %+v", topo.Zones, def.Zones)
	}
	for _, a := range def.ZoneNames() {
		for _, b := range def.ZoneNames() {
			if got, want := topo.Spec(a, b), def.Spec(a, b); got != want {
				t.Errorf("Spec(%s, %s) = %+v, want %+v", a, b, got, want)
			}
		}
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		toml string
		want *Topology
	}{
		{
			name: "brief's shape",
			toml: `
[[zone]]
name = "dc-a"
stores = [1]
[[zone]]
name = "dc-b"
stores = [2, 3]
[[link]]
between = ["dc-a", "dc-b"]
latency = "14ms"   # one way
jitter = "0ms"
bandwidth_mbit = 300
`,
			want: &Topology{
				Zones: []Zone{{"dc-a", []uint64{1}}, {"dc-b", []uint64{2, 3}}},
				Links: []Link{{Between: [2]string{"dc-a", "dc-b"}, LinkSpec: LinkSpec{Latency: 14 * ms, BandwidthMbit: 300}}},
			},
		},
		{
			name: "default, links, a zone without stores, latency inside a zone, fractional bandwidth",
			toml: `
[default]
latency = "30ms"
jitter = "2ms"
bandwidth_mbit = 100

[[zone]]
name = "eu"
stores = [1, 2]
[[zone]]
name = "us"
stores = [3]
[[zone]]
name = "clients"

[[link]]
between = ["eu", "eu"]
latency = "1ms"
[[link]]
between = ["us", "clients"]
latency = "0s"
bandwidth_mbit = 0.5
`,
			want: &Topology{
				Zones:   []Zone{{"eu", []uint64{1, 2}}, {"us", []uint64{3}}, {"clients", nil}},
				Default: LinkSpec{Latency: 30 * ms, Jitter: 2 * ms, BandwidthMbit: 100},
				Links: []Link{
					{Between: [2]string{"eu", "eu"}, LinkSpec: LinkSpec{Latency: 1 * ms}},
					{Between: [2]string{"us", "clients"}, LinkSpec: LinkSpec{BandwidthMbit: 0.5}},
				},
			},
		},
		{
			name: "no default: nothing added between zones",
			toml: "[[zone]]\nname = \"a\"\nstores = [1]\n[[zone]]\nname = \"b\"\nstores = [2]\n",
			want: &Topology{Zones: []Zone{{"a", []uint64{1}}, {"b", []uint64{2}}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.toml))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestSpec(t *testing.T) {
	topo, err := Parse([]byte(`
[default]
latency = "30ms"
[[zone]]
name = "eu"
stores = [1, 2]
[[zone]]
name = "us"
stores = [3]
[[zone]]
name = "ap"
stores = [4]
[[link]]
between = ["us", "eu"]
latency = "40ms"
[[link]]
between = ["ap", "ap"]
latency = "2ms"
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		a, b string
		want time.Duration
	}{
		{"eu", "us", 40 * ms}, {"us", "eu", 40 * ms}, // a link is symmetric
		{"eu", "ap", 30 * ms}, {"ap", "us", 30 * ms}, // the default
		{"eu", "eu", 0}, {"us", "us", 0}, // nothing inside a zone...
		{"ap", "ap", 2 * ms}, // ...unless stated
	} {
		if got := topo.Spec(c.a, c.b).Latency; got != c.want {
			t.Errorf("Spec(%s, %s).Latency = %v, want %v", c.a, c.b, got, c.want)
		}
	}
	if topo.ZoneIndex("eu") != 1 || topo.ZoneIndex("ap") != 3 || topo.ZoneIndex("nope") != 0 {
		t.Error("ZoneIndex")
	}
	if z, ok := topo.ZoneOf(2); !ok || z != "eu" {
		t.Errorf("ZoneOf(2) = %q, %v", z, ok)
	}
	if _, ok := topo.ZoneOf(9); ok {
		t.Error("ZoneOf(9) found a zone")
	}
}

func TestParseRejects(t *testing.T) {
	const zones = "[[zone]]\nname = \"dc-a\"\nstores = [1]\n[[zone]]\nname = \"dc-b\"\nstores = [2]\n"
	const link = "[[link]]\nbetween = [\"dc-a\", \"dc-b\"]\n"
	tests := []struct {
		name string
		toml string
		want string // the whole message
	}{
		{"empty file", "", `topology: no zone (add a [[zone]] with a name and stores)`},
		{"syntax", "[[zone]]\nname = \"dc-a\nstores = [1]\n", `topology: line 2 (last key "zone.name"): strings cannot contain newlines`},
		{"key twice", zones + "[[link]]\nbetween = [\"dc-a\", \"dc-b\"]\nlatency = \"1ms\"\nlatency = \"2ms\"\n", `topology: line 10 (last key "link.latency"): Key 'link.latency' has already been defined.`},
		{"zone not an array of tables", "[zone]\nname = \"a\"\nstores = [1]\n", `topology: zone: {"name":"a","stores":[1]} is not a list of [[zone]] tables`},
		{"key after a table belongs to it", zones + "link = [1, 2]\n", `topology: unknown key zone[2].link`},
		{"link a number", "link = 3\n" + zones, `topology: link: 3 is not a list of [[link]] tables`},
		{"default not a table", "default = \"14ms\"\n" + zones, `topology: default: "14ms" is not a [default] table`},
		{"unknown top-level key", "zones = 3\n" + zones, `topology: unknown key zones`},
		{"unknown zone key", zones + "[[zone]]\nname = \"dc-c\"\nstore = [3]\n", `topology: unknown key zone[3].store`},
		{"unknown link key", zones + link + "latncy = \"14ms\"\n", `topology: unknown key link[1].latncy`},
		{"unknown default key", "[default]\nrtt = \"28ms\"\n" + zones, `topology: unknown key default.rtt`},
		{"zone without name", "[[zone]]\nstores = [1]\n", `topology: zone[1].name is missing`},
		{"zone name not a string", "[[zone]]\nname = 1\nstores = [1]\n", `topology: zone[1].name: 1 is not a string`},
		{"zone name empty", "[[zone]]\nname = \"\"\nstores = [1]\n", `topology: zone[1].name is empty`},
		{"zone name with a space", "[[zone]]\nname = \"dc a\"\nstores = [1]\n", `topology: zone[1].name: "dc a" may hold only letters, digits, '.', '_' and '-' (at most 64)`},
		{"duplicate zone", zones + "[[zone]]\nname = \"dc-a\"\nstores = [3]\n", `topology: zone[3].name: zone "dc-a" is already zone[1]`},
		{"stores not a list", "[[zone]]\nname = \"a\"\nstores = 1\n", `topology: zone[1].stores: 1 is not a list of store ids (write stores = [1, 2])`},
		{"store not a number", "[[zone]]\nname = \"a\"\nstores = [1, \"2\"]\n", `topology: zone[1].stores[2]: "2" is not a store id`},
		{"store zero", "[[zone]]\nname = \"a\"\nstores = [0]\n", `topology: zone[1].stores[1]: store id 0 is out of range 1..99 (the port scheme gives each zone 100 ports)`},
		{"store too big", "[[zone]]\nname = \"a\"\nstores = [100]\n", `topology: zone[1].stores[1]: store id 100 is out of range 1..99 (the port scheme gives each zone 100 ports)`},
		{"store in two zones", zones + "[[zone]]\nname = \"dc-c\"\nstores = [3, 1]\n", `topology: zone[3].stores: store 1 is already in zone "dc-a"`},
		{"store twice in a zone", "[[zone]]\nname = \"a\"\nstores = [1, 1]\n", `topology: zone[1].stores: store 1 is listed twice`},
		{"no store at all", "[[zone]]\nname = \"a\"\n", `topology: no zone has a store (give a [[zone]] stores = [1])`},
		{"link without between", zones + "[[link]]\nlatency = \"1ms\"\n", `topology: link[1].between is missing (write between = ["dc-a", "dc-b"])`},
		{"between one zone", zones + "[[link]]\nbetween = [\"dc-a\"]\n", `topology: link[1].between: ["dc-a"] is not two zone names (write between = ["dc-a", "dc-b"])`},
		{"between a string", zones + "[[link]]\nbetween = \"dc-a\"\n", `topology: link[1].between: "dc-a" is not two zone names (write between = ["dc-a", "dc-b"])`},
		{"between a number", zones + "[[link]]\nbetween = [\"dc-a\", 2]\n", `topology: link[1].between[2]: 2 is not a zone name`},
		{"unknown zone in a link", zones + link + "[[link]]\nbetween = [\"dc-a\", \"dc-x\"]\n", `topology: link[2].between[2]: unknown zone "dc-x"`},
		{"duplicate link", zones + link + "[[link]]\nbetween = [\"dc-b\", \"dc-a\"]\n", `topology: link[2].between: zones "dc-b" and "dc-a" are already link[1]`},
		{"latency without unit", zones + link + "[[link]]\nbetween = [\"dc-b\", \"dc-b\"]\nlatency = \"14\"\n", `topology: link[2].latency: "14" is not a duration (e.g. "14ms")`},
		{"latency a number", zones + link + "latency = 14\n", `topology: link[1].latency: 14 is not a duration (write it as a string, e.g. "14ms")`},
		{"negative latency", zones + link + "latency = \"-1ms\"\n", `topology: link[1].latency: "-1ms" is negative`},
		{"sub-millisecond latency", zones + link + "latency = \"1500us\"\n", `topology: link[1].latency: "1500us" is not a whole number of milliseconds (toxiproxy's resolution)`},
		{"negative jitter", zones + link + "latency = \"10ms\"\njitter = \"-2ms\"\n", `topology: link[1].jitter: "-2ms" is negative`},
		{"jitter over latency", zones + link + "latency = \"10ms\"\njitter = \"11ms\"\n", `topology: link[1].jitter: 11ms is more than the latency 10ms (a delay is latency ± jitter)`},
		{"negative bandwidth", zones + link + "bandwidth_mbit = -300\n", `topology: link[1].bandwidth_mbit: -300 is negative (0 means unlimited)`},
		{"bandwidth a string", zones + link + "bandwidth_mbit = \"300\"\n", `topology: link[1].bandwidth_mbit: "300" is not a number of Mbit/s`},
		{"bandwidth nan", zones + link + "bandwidth_mbit = nan\n", `topology: link[1].bandwidth_mbit: NaN is not a number of Mbit/s`},
		{"bandwidth inf", zones + link + "bandwidth_mbit = inf\n", `topology: link[1].bandwidth_mbit: +Inf is not a number of Mbit/s`},
		{"bandwidth too small", zones + link + "bandwidth_mbit = 0.001\n", `topology: link[1].bandwidth_mbit: 0.001 is below toxiproxy's resolution of 1 KB/s (0.008 Mbit/s); 0 means unlimited`},
		{"bad default latency", "[default]\nlatency = \"fast\"\n" + zones, `topology: default.latency: "fast" is not a duration (e.g. "14ms")`},
		{"negative default bandwidth", "[default]\nbandwidth_mbit = -1.5\n" + zones, `topology: default.bandwidth_mbit: -1.5 is negative (0 means unlimited)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo, err := Parse([]byte(tt.toml))
			if err == nil {
				t.Fatalf("accepted: %+v", topo)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got  %s\n want %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

func TestValidateInCode(t *testing.T) {
	ok := func() *Topology { return Default() }
	tests := []struct {
		name   string
		change func(*Topology)
		want   string
	}{
		{"nil zones", func(t *Topology) { t.Zones = nil }, "topology: no zone"},
		{"negative latency", func(t *Topology) { t.Default.Latency = -ms }, "topology: default.latency: -1ms is negative"},
		{"sub-ms jitter", func(t *Topology) { t.Default.Jitter = 500 * time.Microsecond }, "topology: default.jitter: 500µs is not a whole number"},
		{"link to an unknown zone", func(t *Topology) {
			t.Links = []Link{{Between: [2]string{"dc-a", "mars"}}}
		}, `topology: link[1].between[2]: unknown zone "mars"`},
		{"store 0", func(t *Topology) { t.Zones[0].Stores = []uint64{0} }, "topology: zone[1].stores[1]: store id 0 is out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo := ok()
			tt.change(topo)
			err := topo.Validate()
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want %q...", err, tt.want)
			}
		})
	}
	var nilTopo *Topology
	if err := nilTopo.Validate(); err == nil {
		t.Error("nil topology validated")
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[[zone]]\nname = \"a\"\nstores = [1]\n[[link]]\nbetween = [\"a\", \"b\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{filepath.Join(dir, "missing.toml"), "topology: " + filepath.Join(dir, "missing.toml") + ": no such file or directory"},
		{"", `topology: no file given (a path or "default")`},
		{dir, "topology: " + dir + ": is a directory"},
		{bad, `topology: link[1].between[2]: unknown zone "b" (in ` + bad + ")"},
	} {
		_, err := Load(c.path)
		if err == nil || err.Error() != c.want {
			t.Errorf("Load(%q) = %v, want %s", c.path, err, c.want)
		}
	}
}

func TestTopologyJSON(t *testing.T) {
	topo := Default()
	topo.Links = []Link{{Between: [2]string{"dc-a", "dc-a"}, LinkSpec: LinkSpec{Latency: 2 * ms, BandwidthMbit: 1000}}}
	b, err := json.Marshal(topo)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"zones":[{"name":"dc-a","stores":[1]},{"name":"dc-b","stores":[2]},{"name":"dc-c","stores":[3]}],` +
		`"default":{"latency":"14ms","jitter":"0s","bandwidth_mbit":300},` +
		`"links":[{"between":["dc-a","dc-a"],"latency":"2ms","jitter":"0s","bandwidth_mbit":1000}]}`
	if string(b) != want {
		t.Errorf("JSON\n got  %s\n want %s", b, want)
	}
	var back Topology
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, topo) {
		t.Errorf("round trip: %+v, want %+v", &back, topo)
	}
}

func TestLinkSpecString(t *testing.T) {
	for _, c := range []struct {
		s    LinkSpec
		want string
	}{
		{LinkSpec{}, "nothing added"},
		{LinkSpec{Latency: 14 * ms, BandwidthMbit: 300}, "14ms one way, 300 Mbit/s"},
		{LinkSpec{Latency: 14 * ms, Jitter: 2 * ms}, "14ms one way, jitter 2ms, unlimited bandwidth"},
	} {
		if got := c.s.String(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.s, got, c.want)
		}
	}
	if (LinkSpec{BandwidthMbit: 0.008}).RateKBps() != 1 || (LinkSpec{}).RateKBps() != 0 {
		t.Error("RateKBps")
	}
}

func TestTopologyJSONEmptyLists(t *testing.T) {
	topo := &Topology{Zones: []Zone{{Name: "a", Stores: []uint64{1}}, {Name: "b"}}}
	b, err := json.Marshal(topo)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"zones":[{"name":"a","stores":[1]},{"name":"b","stores":[]}],"default":{"latency":"0s","jitter":"0s","bandwidth_mbit":0},"links":[]}`
	if string(b) != want {
		t.Errorf("JSON\n got  %s\n want %s", b, want)
	}
}
