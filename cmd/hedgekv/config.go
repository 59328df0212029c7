package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hedgekv/hedgekv/raftstore"
)

// storeFlags are the raft store's tuning knobs (raftstore.Config), each a
// server flag and a key of the --config file. Zero is the store's default
// throughout, so that the defaults live in one place, raftstore.
type storeFlags struct {
	electionTicks      int
	heartbeatTicks     int
	leaseDriftMargin   float64
	maxClockOffset     time.Duration
	splitCheckInterval time.Duration
	splitMaxKeys       uint64
	splitMaxBytes      uint64
	mergeCheckInterval time.Duration
	mergeMaxKeys       uint64
	mergeMaxBytes      uint64
	mergeAfterSplit    time.Duration
	hibernateAfter     time.Duration
	logGCThreshold     uint64
	dedupWindow        uint64
	maxReplicas        int
}

func (s *storeFlags) register(fl *pflag.FlagSet) {
	fl.IntVar(&s.electionTicks, "election-ticks", 0, "ticks without a leader's word before a follower campaigns (0: default 10); the leader lease is 2 ticks shorter; must exceed --heartbeat-ticks")
	fl.IntVar(&s.heartbeatTicks, "heartbeat-ticks", 0, "ticks between a leader's heartbeats (0: default 2)")
	fl.Float64Var(&s.leaseDriftMargin, "lease-drift-margin", 0, "fraction of a lease given up for clock-rate drift between stores, in [0, 1) (0: default 0.1)")
	fl.DurationVar(&s.maxClockOffset, "max-clock-offset", 0, "most the stores' wall clocks may disagree; added to every bounded-staleness read's bound (0: default 50ms)")
	fl.DurationVar(&s.splitCheckInterval, "split-check-interval", 0, "how often a leader checks its regions' sizes for a split (0: default 10s, negative: never split)")
	fl.Uint64Var(&s.splitMaxKeys, "split-max-keys", 0, "split a region holding more keys than this (0: no key limit)")
	fl.Uint64Var(&s.splitMaxBytes, "split-max-bytes", 0, "split a region holding more bytes than this (0: no byte limit, or 64 MiB when --split-max-keys is 0 too)")
	fl.DurationVar(&s.mergeCheckInterval, "merge-check-interval", 0, "how often a leader settles a merge left half-way and looks for a small neighbour to merge with (0: default 10s, negative: never)")
	fl.Uint64Var(&s.mergeMaxKeys, "merge-max-keys", 0, "merge adjacent regions automatically when both hold at most this many keys (0: no key limit; with --merge-max-bytes 0 too, no automatic merges)")
	fl.Uint64Var(&s.mergeMaxBytes, "merge-max-bytes", 0, "merge adjacent regions automatically when both hold at most this many bytes (0: no byte limit; with --merge-max-keys 0 too, no automatic merges)")
	fl.DurationVar(&s.mergeAfterSplit, "merge-after-split", 0, "how long both regions must have kept their shape before an automatic merge (0: default 1m: a region just split is not merged back)")
	fl.DurationVar(&s.hibernateAfter, "hibernate-after", 0, "a region idle this long stops ticking until traffic arrives (0: default 10s, negative: never); at least one --tick")
	fl.Uint64Var(&s.logGCThreshold, "log-gc-threshold", 0, "compact a region's raft log once it holds more applied entries than this (0: default 5000)")
	fl.Uint64Var(&s.dedupWindow, "dedup-window", 0, "log entries a region remembers applied request ids for, so a retried write applies once (0: default 100000)")
	fl.IntVar(&s.maxReplicas, "max-replicas", 0, "voters the balancer keeps per region (0: default 3)")
}

// apply copies the knobs into c.
func (s *storeFlags) apply(c *raftstore.Config) {
	c.ElectionTicks = s.electionTicks
	c.HeartbeatTicks = s.heartbeatTicks
	c.LeaseDriftMargin = s.leaseDriftMargin
	c.MaxClockOffset = s.maxClockOffset
	c.SplitCheckInterval = s.splitCheckInterval
	c.SplitMaxKeys = s.splitMaxKeys
	c.SplitMaxBytes = s.splitMaxBytes
	c.MergeCheckInterval = s.mergeCheckInterval
	c.MergeMaxKeys = s.mergeMaxKeys
	c.MergeMaxBytes = s.mergeMaxBytes
	c.MergeAfterSplit = s.mergeAfterSplit
	c.HibernateAfter = s.hibernateAfter
	c.LogGCThreshold = s.logGCThreshold
	c.DedupWindow = s.dedupWindow
	c.MaxReplicas = s.maxReplicas
}

// configFields names the flag (and config key) of each raftstore.Config
// field the server sets, so that the store's verdict on a field is
// reported as what the operator wrote.
var configFields = map[string]string{
	"StoreID":               "id",
	"InitialStores":         "peers",
	"TickInterval":          "tick",
	"ElectionTicks":         "election-ticks",
	"HeartbeatTicks":        "heartbeat-ticks",
	"LeaseDriftMargin":      "lease-drift-margin",
	"FollowerLeaseDuration": "follower-lease-duration",
	"FollowerLeaseStores":   "follower-lease-stores",
	"MaxClockOffset":        "max-clock-offset",
	"SplitCheckInterval":    "split-check-interval",
	"SplitMaxKeys":          "split-max-keys",
	"SplitMaxBytes":         "split-max-bytes",
	"MergeCheckInterval":    "merge-check-interval",
	"MergeMaxKeys":          "merge-max-keys",
	"MergeMaxBytes":         "merge-max-bytes",
	"MergeAfterSplit":       "merge-after-split",
	"HibernateAfter":        "hibernate-after",
	"LogGCThreshold":        "log-gc-threshold",
	"DedupWindow":           "dedup-window",
	"BalanceInterval":       "balance-interval",
	"MaxStoreDownTime":      "max-store-down-time",
	"MaxReplicas":           "max-replicas",
}

// opt names an option the way the operator gave it: "--name" on the
// command line (or not given at all), "name in FILE" when it came from
// the --config file.
func (f *serverFlags) opt(name string) string {
	if f.fromFile[name] {
		return name + " in " + f.configFile
	}
	return "--" + name
}

// key is opt without the file's name, for options named within a message
// that already names the file.
func (f *serverFlags) key(name string) string {
	if f.fromFile[name] {
		return name
	}
	return "--" + name
}

// validateStore runs the store's own validation on c and reports a
// refused field as the flag or config key it came from, as a usage error.
func (f *serverFlags) validateStore(c *raftstore.Config) error {
	err := c.Validate()
	var ce *raftstore.ConfigError
	if err == nil || !errors.As(err, &ce) {
		return err
	}
	name, ok := configFields[ce.Field]
	if !ok {
		return usagef("%v", err) // a field no flag sets: the store's words
	}
	// The reason may name other fields: name them as the operator would.
	var pairs []string
	for field, flag := range configFields {
		pairs = append(pairs, field, f.key(flag))
	}
	reason := strings.NewReplacer(pairs...).Replace(ce.Reason)
	if f.fromFile[name] {
		return usagef("config %s: %s = %v: %s", f.configFile, name, ce.Value, reason)
	}
	return usagef("--%s %v: %s", name, ce.Value, reason)
}

// loadConfigFile applies the TOML file named by --config to the command's
// flags: each top-level key is a flag's name without the dashes, and a
// flag given on the command line wins over the file. Unknown keys and
// values of the wrong kind are usage errors, never ignored: a misspelt
// key would otherwise leave a default in place without a word.
func (f *serverFlags) loadConfigFile(cmd *cobra.Command) error {
	if f.configFile == "" {
		return nil
	}
	var raw map[string]any
	md, err := toml.DecodeFile(f.configFile, &raw)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return usagef("config %s: line %d: %s", f.configFile, pe.Position.Line, pe.Message)
		}
		return usagef("config %s: %v", f.configFile, err)
	}
	fl := cmd.Flags()
	allowed := fileKeys(cmd)
	f.fromFile = make(map[string]bool)
	for _, key := range md.Keys() {
		if len(key) != 1 {
			continue // inside a table, refused with the table below
		}
		name := key[0]
		if _, table := raw[name].(map[string]any); table {
			return usagef("config %s: [%s]: no tables: every key goes at the top level", f.configFile, name)
		}
		flag := fl.Lookup(name)
		if flag == nil || !allowed[name] {
			return usagef("config %s: unknown key %q (keys are the server's flag names without the dashes)", f.configFile, name)
		}
		v, err := flagValue(flag.Value.Type(), raw[name])
		if err != nil {
			return usagef("config %s: %s: %v", f.configFile, name, err)
		}
		if fl.Changed(name) {
			continue // the command line wins
		}
		if err := fl.Set(name, v); err != nil {
			return usagef("config %s: %s = %s: %v", f.configFile, name, v, err)
		}
		f.fromFile[name] = true
	}
	return nil
}

// fileKeys are the flags a config file may set: the server command's own
// and the TLS identity; not --config itself, nor the client-side globals
// (--endpoints, --timeout, ...), which a server does not use.
func fileKeys(cmd *cobra.Command) map[string]bool {
	keys := map[string]bool{"tls-cert": true, "tls-key": true, "tls-ca": true}
	cmd.NonInheritedFlags().VisitAll(func(fl *pflag.Flag) { keys[fl.Name] = true })
	delete(keys, "config")
	delete(keys, "help")
	return keys
}

// flagValue renders a TOML value as the flag's command-line text, checking
// that its kind fits the flag: a duration is a string such as "50ms" (an
// integer would be ambiguous: nanoseconds? seconds?), a list flag takes a
// string or an array.
func flagValue(typ string, v any) (string, error) {
	switch typ {
	case "bool":
		if b, ok := v.(bool); ok {
			return strconv.FormatBool(b), nil
		}
		return "", fmt.Errorf("want true or false, got %s", tomlKind(v))
	case "int", "int64":
		if n, ok := v.(int64); ok {
			return strconv.FormatInt(n, 10), nil
		}
		return "", fmt.Errorf("want an integer, got %s", tomlKind(v))
	case "uint64":
		n, ok := v.(int64)
		if !ok {
			return "", fmt.Errorf("want an integer, got %s", tomlKind(v))
		}
		if n < 0 {
			return "", fmt.Errorf("%d: must not be negative", n)
		}
		return strconv.FormatInt(n, 10), nil
	case "float64":
		switch n := v.(type) {
		case float64:
			if math.IsNaN(n) || math.IsInf(n, 0) {
				return "", fmt.Errorf("want a number, got %v", n)
			}
			return strconv.FormatFloat(n, 'g', -1, 64), nil
		case int64:
			return strconv.FormatInt(n, 10), nil
		}
		return "", fmt.Errorf("want a number, got %s", tomlKind(v))
	case "duration":
		if s, ok := v.(string); ok {
			return s, nil
		}
		return "", fmt.Errorf("want a duration as a string such as \"50ms\" or \"10s\", got %s", tomlKind(v))
	case "string":
		switch s := v.(type) {
		case string:
			return s, nil
		case []any:
			// --peers, --join, --follower-lease-stores, ...: comma-separated
			// on the command line, an array in the file.
			items := make([]string, len(s))
			for i, e := range s {
				switch e := e.(type) {
				case string:
					items[i] = e
				case int64:
					items[i] = strconv.FormatInt(e, 10)
				default:
					return "", fmt.Errorf("item %d: want a string or an integer, got %s", i+1, tomlKind(e))
				}
			}
			return strings.Join(items, ","), nil
		}
		return "", fmt.Errorf("want a string, got %s", tomlKind(v))
	}
	return "", fmt.Errorf("flags of type %s cannot be set from a config file", typ)
}

// tomlKind names a decoded TOML value's kind for an error message.
func tomlKind(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("string %q", v)
	case int64:
		return fmt.Sprintf("integer %d", v)
	case float64:
		return fmt.Sprintf("float %v", v)
	case bool:
		return fmt.Sprintf("boolean %v", v)
	case []any:
		return "an array"
	case map[string]any:
		return "a table (keys go at the top level, without [sections])"
	}
	return fmt.Sprintf("%T", v)
}
