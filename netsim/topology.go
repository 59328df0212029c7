// Package netsim simulates the network between data centers in user space:
// a toxiproxy proxy for every (zone → store) link, with the topology's
// one-way latency, jitter and bandwidth as toxics, and partitions that cut
// a store's links. The file format, the port scheme and what a partition
// means are documented in docs/topology.md.
package netsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// MaxStoreID is the largest store id a topology may name: the port scheme
// gives every zone 100 ports, PortBase + 100*zoneIndex + storeID.
const MaxStoreID = 99

// DefaultTopology is the name Load accepts for Default().
const DefaultTopology = "default"

// Topology is the simulated WAN: the zones, which store sits in which zone,
// and the network between each pair of zones.
type Topology struct {
	// Zones in file order; a zone's index for the port scheme is its
	// position here, counted from 1.
	Zones []Zone `json:"zones"`
	// Default applies between two different zones that no Link names.
	// Inside a zone nothing is added unless a Link names the zone twice.
	Default LinkSpec `json:"default"`
	// Links name pairs of zones explicitly; a pair is symmetric and
	// appears at most once.
	Links []Link `json:"links"`
}

// Zone is a data center and the stores in it. A zone without stores is
// allowed: clients can sit there.
type Zone struct {
	Name   string   `json:"name"`
	Stores []uint64 `json:"stores"`
}

// Link is the network between two zones, the same in both directions.
// Between may name one zone twice, for latency inside that zone.
type Link struct {
	Between [2]string `json:"between"`
	LinkSpec
}

// LinkSpec is what one direction of a link adds to every byte.
type LinkSpec struct {
	// Latency is one way; a round trip pays it twice.
	Latency time.Duration
	// Jitter: each chunk of data is delayed by Latency ± up to Jitter
	// (uniform), never more than Latency.
	Jitter time.Duration
	// BandwidthMbit is per connection and per direction, in Mbit/s
	// (10^6 bit/s); 0 means unlimited.
	BandwidthMbit float64
}

// IsZero reports whether the spec adds nothing.
func (s LinkSpec) IsZero() bool { return s == LinkSpec{} }

// RateKBps is the toxiproxy bandwidth rate (KB/s, 1 KB = 1000 bytes),
// 0 for unlimited. It is never 0 for a limited link.
func (s LinkSpec) RateKBps() int64 {
	if s.BandwidthMbit <= 0 {
		return 0
	}
	return max(1, int64(math.Round(s.BandwidthMbit*125)))
}

// String is "14ms one way, jitter 2ms, 300 Mbit/s" or "nothing added".
func (s LinkSpec) String() string {
	if s.IsZero() {
		return "nothing added"
	}
	parts := []string{s.Latency.String() + " one way"}
	if s.Jitter > 0 {
		parts = append(parts, "jitter "+s.Jitter.String())
	}
	if s.BandwidthMbit > 0 {
		parts = append(parts, fmt.Sprintf("%g Mbit/s", s.BandwidthMbit))
	} else {
		parts = append(parts, "unlimited bandwidth")
	}
	return strings.Join(parts, ", ")
}

type linkSpecJSON struct {
	Latency       string  `json:"latency"`
	Jitter        string  `json:"jitter"`
	BandwidthMbit float64 `json:"bandwidth_mbit"`
}

// MarshalJSON writes durations as strings ("14ms"), as the file has them.
func (s LinkSpec) MarshalJSON() ([]byte, error) {
	return json.Marshal(linkSpecJSON{s.Latency.String(), s.Jitter.String(), s.BandwidthMbit})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *LinkSpec) UnmarshalJSON(b []byte) error {
	var j linkSpecJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var err error
	var out LinkSpec
	if out.Latency, err = time.ParseDuration(j.Latency); err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	if out.Jitter, err = time.ParseDuration(j.Jitter); err != nil {
		return fmt.Errorf("jitter: %w", err)
	}
	out.BandwidthMbit = j.BandwidthMbit
	*s = out
	return nil
}

// MarshalJSON flattens the spec beside "between".
func (l Link) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Between [2]string `json:"between"`
		linkSpecJSON
	}{l.Between, linkSpecJSON{l.Latency.String(), l.Jitter.String(), l.BandwidthMbit}})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (l *Link) UnmarshalJSON(b []byte) error {
	var j struct {
		Between [2]string `json:"between"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var spec LinkSpec
	if err := spec.UnmarshalJSON(b); err != nil {
		return err
	}
	*l = Link{Between: j.Between, LinkSpec: spec}
	return nil
}

// MarshalJSON writes empty lists as [] rather than null.
func (t Topology) MarshalJSON() ([]byte, error) {
	type plain Topology
	out := plain(t)
	out.Zones = make([]Zone, len(t.Zones))
	for i, z := range t.Zones {
		out.Zones[i] = Zone{Name: z.Name, Stores: z.Stores}
		if z.Stores == nil {
			out.Zones[i].Stores = []uint64{}
		}
	}
	if out.Links == nil {
		out.Links = []Link{}
	}
	return json.Marshal(out)
}

// Default is the built-in three-zone WAN: dc-a, dc-b and dc-c with stores
// 1, 2 and 3, 14 ms one way between every pair of zones (28 ms round
// trip), 300 Mbit/s per link, nothing added inside a zone.
func Default() *Topology {
	return &Topology{
		Zones: []Zone{
			{Name: "dc-a", Stores: []uint64{1}},
			{Name: "dc-b", Stores: []uint64{2}},
			{Name: "dc-c", Stores: []uint64{3}},
		},
		Default: LinkSpec{Latency: 14 * time.Millisecond, BandwidthMbit: 300},
	}
}

// Load reads a topology file, or returns Default() for "default".
func Load(pathOrDefault string) (*Topology, error) {
	if pathOrDefault == DefaultTopology {
		return Default(), nil
	}
	if strings.TrimSpace(pathOrDefault) == "" {
		return nil, errors.New(`topology: no file given (a path or "default")`)
	}
	data, err := os.ReadFile(pathOrDefault)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("topology: %s: %v", pathOrDefault, err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, pathOrDefault)
	}
	return t, nil
}

// value keeps whatever TOML value a key holds, so that Parse can name the
// field in its own words when the type is wrong.
type value struct {
	v   any
	set bool
}

func (x *value) UnmarshalTOML(v any) error {
	x.v, x.set = v, true
	return nil
}

type rawSpec struct {
	Latency       value `toml:"latency"`
	Jitter        value `toml:"jitter"`
	BandwidthMbit value `toml:"bandwidth_mbit"`
}

type rawFile struct {
	Zone []struct {
		Name   value `toml:"name"`
		Stores value `toml:"stores"`
	} `toml:"zone"`
	Link []struct {
		Between value `toml:"between"`
		rawSpec
	} `toml:"link"`
	Default *rawSpec `toml:"default"`
}

// Parse reads a topology from TOML (the format is in docs/topology.md) and
// validates it. Every error is one line that names the field.
func Parse(data []byte) (*Topology, error) {
	// The shape first, for messages in the file's terms rather than Go's.
	var top map[string]any
	if _, err := toml.Decode(string(data), &top); err != nil {
		return nil, tomlError(err)
	}
	for _, k := range []string{"zone", "link"} {
		if v, ok := top[k]; ok {
			if _, ok := v.([]map[string]any); !ok {
				return nil, fmt.Errorf("topology: %s: %s is not a list of [[%s]] tables", k, show(v), k)
			}
		}
	}
	if v, ok := top["default"]; ok {
		if _, ok := v.(map[string]any); !ok {
			return nil, fmt.Errorf("topology: default: %s is not a [default] table", show(v))
		}
	}
	var raw rawFile
	md, err := toml.Decode(string(data), &raw)
	if err != nil {
		return nil, tomlError(err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, fmt.Errorf("topology: unknown key %s", unknownKey(top, und[0]))
	}
	t := &Topology{}
	for i, z := range raw.Zone {
		field := fmt.Sprintf("zone[%d]", i+1)
		name, err := stringValue(field+".name", z.Name)
		if err != nil {
			return nil, err
		}
		var stores []uint64
		if z.Stores.set {
			list, ok := z.Stores.v.([]any)
			if !ok {
				return nil, fmt.Errorf("topology: %s.stores: %s is not a list of store ids (write stores = [1, 2])", field, show(z.Stores.v))
			}
			for j, s := range list {
				n, ok := s.(int64)
				if !ok {
					return nil, fmt.Errorf("topology: %s.stores[%d]: %s is not a store id", field, j+1, show(s))
				}
				if n < 1 || n > MaxStoreID {
					return nil, fmt.Errorf("topology: %s.stores[%d]: store id %d is out of range 1..%d (the port scheme gives each zone 100 ports)", field, j+1, n, MaxStoreID)
				}
				stores = append(stores, uint64(n))
			}
		}
		t.Zones = append(t.Zones, Zone{Name: name, Stores: stores})
	}
	if raw.Default != nil {
		if t.Default, err = raw.Default.spec("default"); err != nil {
			return nil, err
		}
	}
	for i, l := range raw.Link {
		field := fmt.Sprintf("link[%d]", i+1)
		var link Link
		if !l.Between.set {
			return nil, fmt.Errorf("topology: %s.between is missing (write between = [\"dc-a\", \"dc-b\"])", field)
		}
		list, ok := l.Between.v.([]any)
		if !ok || len(list) != 2 {
			return nil, fmt.Errorf("topology: %s.between: %s is not two zone names (write between = [\"dc-a\", \"dc-b\"])", field, show(l.Between.v))
		}
		for j, z := range list {
			s, ok := z.(string)
			if !ok {
				return nil, fmt.Errorf("topology: %s.between[%d]: %s is not a zone name", field, j+1, show(z))
			}
			link.Between[j] = s
		}
		if link.LinkSpec, err = l.rawSpec.spec(field); err != nil {
			return nil, err
		}
		t.Links = append(t.Links, link)
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

// unknownKey names an undecoded key with the index of the [[zone]] or
// [[link]] it sits in: zone[2].foo.
func unknownKey(top map[string]any, k toml.Key) string {
	if len(k) >= 2 {
		if tables, ok := top[k[0]].([]map[string]any); ok {
			for i, tab := range tables {
				if _, ok := tab[k[1]]; ok {
					return fmt.Sprintf("%s[%d].%s", k[0], i+1, strings.Join(k[1:], "."))
				}
			}
		}
	}
	return k.String()
}

func (r rawSpec) spec(field string) (LinkSpec, error) {
	var s LinkSpec
	var err error
	if s.Latency, err = durationValue(field+".latency", r.Latency); err != nil {
		return s, err
	}
	if s.Jitter, err = durationValue(field+".jitter", r.Jitter); err != nil {
		return s, err
	}
	if r.BandwidthMbit.set {
		switch v := r.BandwidthMbit.v.(type) {
		case int64:
			s.BandwidthMbit = float64(v)
		case float64:
			s.BandwidthMbit = v
		default:
			return s, fmt.Errorf("topology: %s.bandwidth_mbit: %s is not a number of Mbit/s", field, show(v))
		}
	}
	return s, nil
}

func stringValue(field string, x value) (string, error) {
	if !x.set {
		return "", fmt.Errorf("topology: %s is missing", field)
	}
	s, ok := x.v.(string)
	if !ok {
		return "", fmt.Errorf("topology: %s: %s is not a string", field, show(x.v))
	}
	return s, nil
}

func durationValue(field string, x value) (time.Duration, error) {
	if !x.set {
		return 0, nil
	}
	s, ok := x.v.(string)
	if !ok {
		return 0, fmt.Errorf("topology: %s: %s is not a duration (write it as a string, e.g. \"14ms\")", field, show(x.v))
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("topology: %s: %q is not a duration (e.g. \"14ms\")", field, s)
	}
	if d < 0 {
		return 0, fmt.Errorf("topology: %s: %q is negative", field, s)
	}
	if d%time.Millisecond != 0 {
		return 0, fmt.Errorf("topology: %s: %q is not a whole number of milliseconds (toxiproxy's resolution)", field, s)
	}
	return d, nil
}

// show renders a TOML value for an error message.
func show(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("%q", v)
	case []any, map[string]any:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprintf("%v", v)
		}
		return string(b)
	default:
		return fmt.Sprintf("%v", v)
	}
}

// tomlError makes a TOML syntax or type error one line.
func tomlError(err error) error {
	msg := err.Error()
	var pe toml.ParseError
	if errors.As(err, &pe) {
		msg = pe.Error()
	}
	msg = strings.TrimPrefix(msg, "toml: ")
	msg = strings.Join(strings.Fields(msg), " ")
	return fmt.Errorf("topology: %s", msg)
}

var zoneNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Validate checks a topology built in code as Parse checks a file. Zone
// and link indices in messages count from 1, in order.
func (t *Topology) Validate() error {
	if t == nil || len(t.Zones) == 0 {
		return errors.New("topology: no zone (add a [[zone]] with a name and stores)")
	}
	zones := make(map[string]int)
	stores := make(map[uint64]string)
	for i, z := range t.Zones {
		field := fmt.Sprintf("zone[%d]", i+1)
		if z.Name == "" {
			return fmt.Errorf("topology: %s.name is empty", field)
		}
		if !zoneNameRE.MatchString(z.Name) {
			return fmt.Errorf("topology: %s.name: %q may hold only letters, digits, '.', '_' and '-' (at most 64)", field, z.Name)
		}
		if j, dup := zones[z.Name]; dup {
			return fmt.Errorf("topology: %s.name: zone %q is already zone[%d]", field, z.Name, j)
		}
		zones[z.Name] = i + 1
		for j, s := range z.Stores {
			if s < 1 || s > MaxStoreID {
				return fmt.Errorf("topology: %s.stores[%d]: store id %d is out of range 1..%d (the port scheme gives each zone 100 ports)", field, j+1, s, MaxStoreID)
			}
			if other, dup := stores[s]; dup {
				if other == z.Name {
					return fmt.Errorf("topology: %s.stores: store %d is listed twice", field, s)
				}
				return fmt.Errorf("topology: %s.stores: store %d is already in zone %q", field, s, other)
			}
			stores[s] = z.Name
		}
	}
	if len(stores) == 0 {
		return errors.New("topology: no zone has a store (give a [[zone]] stores = [1])")
	}
	if err := t.Default.validate("default"); err != nil {
		return err
	}
	pairs := make(map[[2]string]int)
	for i, l := range t.Links {
		field := fmt.Sprintf("link[%d]", i+1)
		for j, z := range l.Between {
			if _, ok := zones[z]; !ok {
				return fmt.Errorf("topology: %s.between[%d]: unknown zone %q", field, j+1, z)
			}
		}
		key := pairKey(l.Between[0], l.Between[1])
		if j, dup := pairs[key]; dup {
			return fmt.Errorf("topology: %s.between: zones %q and %q are already link[%d]", field, l.Between[0], l.Between[1], j)
		}
		pairs[key] = i + 1
		if err := l.LinkSpec.validate(field); err != nil {
			return err
		}
	}
	return nil
}

func (s LinkSpec) validate(field string) error {
	switch {
	case s.Latency < 0:
		return fmt.Errorf("topology: %s.latency: %v is negative", field, s.Latency)
	case s.Jitter < 0:
		return fmt.Errorf("topology: %s.jitter: %v is negative", field, s.Jitter)
	case s.Latency%time.Millisecond != 0:
		return fmt.Errorf("topology: %s.latency: %v is not a whole number of milliseconds (toxiproxy's resolution)", field, s.Latency)
	case s.Jitter%time.Millisecond != 0:
		return fmt.Errorf("topology: %s.jitter: %v is not a whole number of milliseconds (toxiproxy's resolution)", field, s.Jitter)
	case s.Jitter > s.Latency:
		return fmt.Errorf("topology: %s.jitter: %v is more than the latency %v (a delay is latency ± jitter)", field, s.Jitter, s.Latency)
	case math.IsNaN(s.BandwidthMbit) || math.IsInf(s.BandwidthMbit, 0):
		return fmt.Errorf("topology: %s.bandwidth_mbit: %v is not a number of Mbit/s", field, s.BandwidthMbit)
	case s.BandwidthMbit < 0:
		return fmt.Errorf("topology: %s.bandwidth_mbit: %v is negative (0 means unlimited)", field, s.BandwidthMbit)
	case s.BandwidthMbit > 0 && s.BandwidthMbit < 0.008:
		return fmt.Errorf("topology: %s.bandwidth_mbit: %v is below toxiproxy's resolution of 1 KB/s (0.008 Mbit/s); 0 means unlimited", field, s.BandwidthMbit)
	}
	return nil
}

func pairKey(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// ZoneOf returns the zone of a store.
func (t *Topology) ZoneOf(store uint64) (string, bool) {
	for _, z := range t.Zones {
		if slices.Contains(z.Stores, store) {
			return z.Name, true
		}
	}
	return "", false
}

// ZoneIndex returns a zone's position, counted from 1, or 0 if there is no
// such zone.
func (t *Topology) ZoneIndex(zone string) int {
	for i, z := range t.Zones {
		if z.Name == zone {
			return i + 1
		}
	}
	return 0
}

// ZoneNames returns the zones' names in order.
func (t *Topology) ZoneNames() []string {
	names := make([]string, len(t.Zones))
	for i, z := range t.Zones {
		names[i] = z.Name
	}
	return names
}

// Stores returns every store id, ascending.
func (t *Topology) Stores() []uint64 {
	var ids []uint64
	for _, z := range t.Zones {
		ids = append(ids, z.Stores...)
	}
	slices.Sort(ids)
	return ids
}

// Spec is what the network adds between zones a and b (either way): the
// Link naming them, else nothing inside a zone and Default between two.
func (t *Topology) Spec(a, b string) LinkSpec {
	key := pairKey(a, b)
	for _, l := range t.Links {
		if pairKey(l.Between[0], l.Between[1]) == key {
			return l.LinkSpec
		}
	}
	if a == b {
		return LinkSpec{}
	}
	return t.Default
}
