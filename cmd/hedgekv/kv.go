package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/server"
)

// readFlags are the read-policy flags get and scan share.
type readFlags struct {
	read         string
	hedge        string
	hedgeBudget  float64
	maxStaleness time.Duration
	busy         time.Duration
}

func (f *readFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.read, "read", "leader", "replica to read from: leader, follower (one in --zone when there is one), mixed, closest (in --zone, else the fastest), prefer-leader or round-robin")
	cmd.Flags().StringVar(&f.hedge, "hedge", "off", "backup request to another replica after a delay: off, a duration (10ms), a latency percentile (p99, p999) or min(p99,50ms) / max(p99,5ms)")
	cmd.Flags().Float64Var(&f.hedgeBudget, "hedge-budget", client.DefaultHedgeBudget, "at most this fraction of reads may be hedged, in [0,1]")
	cmd.Flags().DurationVar(&f.maxStaleness, "max-staleness", 0, "permit reads this stale (e.g. 5s); 0 keeps reads linearizable")
	cmd.Flags().DurationVar(&f.busy, "busy-threshold", 0, "a store expecting to take longer than this refuses the read and another replica serves it (e.g. 50ms); 0: never")
}

// policy turns the flags into a client.ReadPolicy.
func (f *readFlags) policy() (client.ReadPolicy, error) {
	replica, err := client.ParseReplicaPolicy(f.read)
	if err != nil {
		return client.ReadPolicy{}, usageError{fmt.Errorf("--read: %w", err)}
	}
	if f.maxStaleness < 0 {
		return client.ReadPolicy{}, usagef("--max-staleness must not be negative, got %v", f.maxStaleness)
	}
	if f.busy < 0 {
		return client.ReadPolicy{}, usagef("--busy-threshold must not be negative, got %v", f.busy)
	}
	h, err := client.ParseHedge(f.hedge)
	if err != nil {
		return client.ReadPolicy{}, usageError{fmt.Errorf("--%w", err)}
	}
	if !(f.hedgeBudget >= 0 && f.hedgeBudget <= 1) {
		return client.ReadPolicy{}, usagef("--hedge-budget must be between 0 and 1, got %v", f.hedgeBudget)
	}
	budget := f.hedgeBudget
	if budget == 0 {
		budget = -1 // the client's way of saying "no budget"; 0 means its default
	}
	return client.ReadPolicy{Replica: replica, MaxStaleness: f.maxStaleness, Hedge: h, HedgeBudget: budget, BusyThreshold: f.busy}, nil
}

// valueFromStdin is the VALUE argument of put that reads the value from
// standard input.
const valueFromStdin = "-"

func newPutCmd(a *app) *cobra.Command {
	var valueFile string
	cmd := &cobra.Command{
		Use:   "put KEY (VALUE | - | --value-file FILE)",
		Short: "Write KEY=VALUE",
		Long: `Write KEY=VALUE. VALUE "-" reads the value from standard input and
--value-file FILE from FILE, byte for byte (a trailing newline is part of
the value), for values a command line cannot carry: binary ones, or over
the ~128 KiB a single argument may hold. Values are limited to 8 MiB.`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case valueFile != "" && len(args) != 1:
				return usagef("put with --value-file takes KEY only, got %d argument(s)", len(args))
			case valueFile == "" && len(args) != 2:
				return usagef("put takes 2 argument(s) (KEY VALUE, VALUE - for standard input, or KEY --value-file FILE), got %d", len(args))
			}
			return nil
		},
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if err := checkKey(args[0]); err != nil {
				return err
			}
			value, err := a.putValue(args, valueFile)
			if err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				if err := cli.Put(ctx, []byte(args[0]), value); err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, "OK")
				return nil
			})
		}),
	}
	cmd.Flags().StringVar(&valueFile, "value-file", "", "read the value from `FILE` instead of the command line")
	return cmd
}

// putValue is put's value: the argument, standard input ("-") or
// --value-file; a value that cannot be read is bad input (exit 2). Reading stops one byte past the store's limit, so that an
// oversized value is refused here, saying so, without reading all of it.
func (a *app) putValue(args []string, valueFile string) ([]byte, error) {
	var (
		r    io.Reader
		from string
	)
	switch {
	case valueFile != "":
		f, err := os.Open(valueFile)
		if err != nil {
			return nil, usageError{fmt.Errorf("--value-file: %w", err)}
		}
		defer f.Close()
		r, from = f, valueFile
	case args[1] == valueFromStdin:
		r, from = a.stdin, "standard input"
	default:
		return []byte(args[1]), nil
	}
	v, err := io.ReadAll(io.LimitReader(r, server.MaxValueSize+1))
	if err != nil {
		return nil, usageError{fmt.Errorf("read the value from %s: %w", from, err)}
	}
	if len(v) > server.MaxValueSize {
		return nil, usagef("the value from %s is over the %d MiB limit", from, server.MaxValueSize>>20)
	}
	return v, nil
}

func newDeleteCmd(a *app) *cobra.Command {
	var prefix bool
	cmd := &cobra.Command{
		Use:   "delete KEY",
		Short: "Delete KEY (deleting a missing key succeeds); --prefix deletes every key starting with KEY",
		Long: `Delete KEY; deleting a missing key succeeds. With --prefix, KEY is a prefix
and every key that starts with it is deleted, one at a time (not
atomically: a failure part way leaves the rest), and the count is printed.`,
		Args: exactArgs("KEY"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			key := []byte(args[0])
			if prefix && len(key) == 0 {
				return usagef("delete --prefix needs a non-empty prefix (an empty one would delete every key)")
			}
			if err := checkKey(args[0]); err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				if !prefix {
					if err := cli.Delete(ctx, key); err != nil {
						return err
					}
					fmt.Fprintln(a.stdout, "OK")
					return nil
				}
				n, err := deletePrefix(ctx, cli, key)
				if err != nil {
					return fmt.Errorf("delete --prefix: %d keys deleted before: %w", n, err)
				}
				noun := "keys"
				if n == 1 {
					noun = "key"
				}
				fmt.Fprintf(a.stdout, "OK: deleted %d %s\n", n, noun)
				return nil
			})
		}),
	}
	cmd.Flags().BoolVar(&prefix, "prefix", false, "delete every key starting with KEY")
	return cmd
}

// deletePage is how many keys delete --prefix lists at a time.
const deletePage = 1000

// deletePrefix deletes every key starting with prefix, page by page, and
// returns how many it deleted. Each page is listed by a leader scan, so
// keys written after it started may survive.
func deletePrefix(ctx context.Context, cli *client.Client, prefix []byte) (int, error) {
	end := prefixEnd(prefix)
	n := 0
	for {
		kvs, err := cli.Scan(ctx, prefix, end, deletePage)
		if err != nil {
			return n, err
		}
		for _, kv := range kvs {
			if err := cli.Delete(ctx, kv.Key); err != nil {
				return n, err
			}
			n++
		}
		if len(kvs) < deletePage {
			return n, nil
		}
	}
}

// prefixEnd is the first key after every key starting with prefix: the
// prefix with its last byte below 0xff incremented and what follows cut.
// nil (the end of the key space) when there is none.
func prefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// outputFlag is -w/--write-out (table or json) with --json as an alias of
// -w json, shared by every command that prints data. "table" is the
// command's plain form: a table for ctl, the value for get, KEY<TAB>VALUE
// lines for scan ("text" is accepted for it too).
type outputFlag struct {
	format string
	asJSON bool
}

func (o *outputFlag) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.format, "write-out", "w", "table", "output format: table or json (JSON: pretty-printed; keys and values as JSON strings, or as key_base64/value_base64 when they are not UTF-8)")
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "the same as -w json")
}

func (o *outputFlag) json() (bool, error) {
	switch o.format {
	case "table", "text":
		return o.asJSON, nil
	case "json":
		return true, nil
	}
	return false, usagef("--write-out must be table or json, got %q", o.format)
}

// jsonBytes puts bytes into a JSON object the one way every -w json does:
// as a JSON string under name when they are UTF-8 (JSON's own escapes
// carry a newline or a tab), else base64 under name_base64 (no string
// could carry them losslessly). Exactly one of the two is set.
func jsonBytes(b []byte) (text *string, b64 *string) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, nil
	}
	s := base64.StdEncoding.EncodeToString(b)
	return nil, &s
}

// kvJSON is a pair in get/scan -w json. The value is left out by scan
// --keys-only.
type kvJSON struct {
	Key         *string `json:"key,omitempty"`
	KeyBase64   *string `json:"key_base64,omitempty"`
	Value       *string `json:"value,omitempty"`
	ValueBase64 *string `json:"value_base64,omitempty"`
}

// getJSON is get -w json: the pair, and found, false for a missing key
// (then without a value).
type getJSON struct {
	kvJSON
	Found bool `json:"found"`
}

func newKVJSON(key, value []byte, keysOnly bool) kvJSON {
	var out kvJSON
	out.Key, out.KeyBase64 = jsonBytes(key)
	if !keysOnly {
		out.Value, out.ValueBase64 = jsonBytes(value)
	}
	return out
}

// checkKey refuses an empty key, and one over the stores' limit (which
// they would refuse as well, then a failed request, exit 4): bad input,
// exit 2, for every command, as an oversized value is.
func checkKey(key string) error {
	return checkKeyArg("KEY", key)
}

// checkKeyArg is checkKey for the argument named name (START, END).
func checkKeyArg(name, key string) error {
	if key == "" {
		return usagef("%s must not be empty", name)
	}
	if len(key) > server.MaxKeySize {
		return usagef("%s is %d bytes, over the %d byte limit", name, len(key), server.MaxKeySize)
	}
	return nil
}

func newGetCmd(a *app) *cobra.Command {
	var (
		rf      readFlags
		out     outputFlag
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Print the value of KEY",
		Long: "Print the value of KEY and a newline. A missing key prints \"key not found\" on stderr and exits 1.\n" +
			"-v tells on stderr which store served the read, how (lease, read-index, stale) and how long it took, and where the hedge went and whether it won,\n" +
			"or why none was sent (not due, no other replica, denied by the budget).\n" +
			"-w json prints {\"key\": K, \"value\": V, \"found\": true} instead (as scan -w json does: JSON strings, or key_base64/value_base64 for bytes that are not UTF-8),\n" +
			"and for a missing key {\"key\": K, \"found\": false}, exit 1 all the same.",
		Args: exactArgs("KEY"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if err := checkKey(args[0]); err != nil {
				return err
			}
			policy, err := rf.policy()
			if err != nil {
				return err
			}
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				start := time.Now()
				v, info, err := cli.Session(policy).GetWithInfo(ctx, []byte(args[0]))
				took := time.Since(start)
				if err != nil && !errors.Is(err, client.ErrNotFound) {
					return err
				}
				if verbose {
					fmt.Fprintln(a.stderr, servedBy(info, took))
					fmt.Fprintln(a.stderr, hedgeLine(info))
				}
				if errors.Is(err, client.ErrNotFound) {
					// -w json prints a document whatever the answer, so that
					// a script parses stdout without looking at the code
					// first; the line on stderr stays for people.
					if asJSON {
						doc := getJSON{Found: false}
						doc.Key, doc.KeyBase64 = jsonBytes([]byte(args[0]))
						if err := writeJSON(a.stdout, doc); err != nil {
							return err
						}
					}
					fmt.Fprintln(a.stderr, client.ErrNotFound.Error())
					return silentError{exitNotFound}
				}
				if asJSON {
					return writeJSON(a.stdout, getJSON{kvJSON: newKVJSON([]byte(args[0]), v, false), Found: true})
				}
				_, err = fmt.Fprintf(a.stdout, "%s\n", v)
				return err
			})
		}),
	}
	rf.register(cmd)
	out.register(cmd)
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "tell on stderr who served the read and how")
	return cmd
}

// servedBy is get -v's line about the read: who served it, how, and how
// long the read took (from the client's first attempt to the answer).
func servedBy(info client.ReadInfo, took time.Duration) string {
	s := fmt.Sprintf("served by store %d via %s in %s", info.StoreID, info.Mode, roundLatency(took))
	if info.Mode == "stale" && info.StalenessBound > 0 {
		s += fmt.Sprintf(" (at most %v stale)", info.StalenessBound)
	}
	if info.Attempts > 1 {
		s += fmt.Sprintf(" after %d attempts", info.Attempts)
	}
	return s
}

// roundLatency shows a latency to three significant digits or so: 843µs,
// 1.27ms, 28.3ms.
func roundLatency(d time.Duration) string {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond).String()
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// hedgeLine is get -v's line about hedging: where the hedge went and
// whether it answered, or why none was sent (not due, nowhere to send it,
// denied by the budget), so that a tail read can be told apart from a
// hedge that could not help.
func hedgeLine(info client.ReadInfo) string {
	h := info.Hedge
	switch h.Outcome {
	case "":
		return "hedge: no (--hedge off)"
	case client.HedgeNotDue:
		return fmt.Sprintf("hedge: no, not sent: store %d answered within the %s delay", h.PrimaryStoreID, roundLatency(h.Delay))
	case client.HedgeNoReplica:
		return fmt.Sprintf("hedge: no, not sent: due after %s, but no other replica could take it", roundLatency(h.Delay))
	case client.HedgeAtLimit:
		return fmt.Sprintf("hedge: no, not sent: due after %s, but the most attempts allowed in flight were", roundLatency(h.Delay))
	case client.HedgeDenied:
		return fmt.Sprintf("hedge: no, denied by the budget (--hedge-budget): due after %s", roundLatency(h.Delay))
	case client.HedgeLost:
		return fmt.Sprintf("hedge: lost: sent to store %d after %s; the primary at store %d answered first", h.StoreID, roundLatency(h.Delay), h.PrimaryStoreID)
	case client.HedgeWonRace:
		return fmt.Sprintf("hedge: won: sent to store %d after %s, it answered before the primary at store %d", h.StoreID, roundLatency(h.Delay), h.PrimaryStoreID)
	}
	return "hedge: " + string(h.Outcome)
}

func newScanCmd(a *app) *cobra.Command {
	var (
		rf       readFlags
		out      outputFlag
		limit    int
		prefix   bool
		keysOnly bool
	)
	cmd := &cobra.Command{
		Use:   "scan START [END] | scan --prefix PREFIX",
		Short: "Print KEY<TAB>VALUE lines for START <= KEY < END in key order",
		Long: `Print KEY<TAB>VALUE lines for START <= KEY < END in key order. Without END the
scan runs to the end of the key space; with --prefix, it covers the keys
starting with PREFIX. --keys-only prints the keys alone. -w json prints a
JSON array of {"key": K, "value": V} instead, pretty-printed like every -w
json: keys and values are JSON strings (a tab or a newline in them is
JSON's \t or \n), or, for bytes that are not UTF-8, base64 under
key_base64 or value_base64, so that any bytes stay unambiguous.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if prefix && len(args) != 1 {
				return usagef("scan --prefix takes PREFIX only, got %d argument(s)", len(args))
			}
			if len(args) < 1 || len(args) > 2 {
				return usagef("scan takes START and an optional END, got %d argument(s)", len(args))
			}
			return nil
		},
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if limit < 0 {
				return usagef("--limit must not be negative, got %d", limit)
			}
			policy, err := rf.policy()
			if err != nil {
				return err
			}
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			// An empty START is the start of the key space; a key over the
			// limit is bad input here as everywhere.
			for i, name := range []string{"START", "END"}[:len(args)] {
				if len(args[i]) > server.MaxKeySize {
					return checkKeyArg(name, args[i])
				}
			}
			start := []byte(args[0])
			var end []byte
			switch {
			case prefix:
				end = prefixEnd(start)
			case len(args) == 2:
				end = []byte(args[1])
			}
			return a.withClient(cmd, func(ctx context.Context, cli *client.Client) error {
				kvs, err := cli.Session(policy).Scan(ctx, start, end, limit)
				if err != nil {
					return err
				}
				if asJSON {
					pairs := make([]kvJSON, 0, len(kvs))
					for _, kv := range kvs {
						pairs = append(pairs, newKVJSON(kv.Key, kv.Value, keysOnly))
					}
					return writeJSON(a.stdout, pairs)
				}
				w := bufio.NewWriter(a.stdout)
				for _, kv := range kvs {
					if keysOnly {
						fmt.Fprintf(w, "%s\n", kv.Key)
					} else {
						fmt.Fprintf(w, "%s\t%s\n", kv.Key, kv.Value)
					}
				}
				return w.Flush()
			})
		}),
	}
	rf.register(cmd)
	out.register(cmd)
	cmd.Flags().IntVar(&limit, "limit", 0, "print at most N pairs; 0 prints all")
	cmd.Flags().BoolVar(&prefix, "prefix", false, "scan the keys starting with the one argument")
	cmd.Flags().BoolVar(&keysOnly, "keys-only", false, "print the keys only")
	return cmd
}
