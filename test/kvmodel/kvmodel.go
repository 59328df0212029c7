// Package kvmodel is the porcupine model the linearizability specs check
// histories against: a register per key, puts and gets, partitioned by key
// so that each key's history is checked alone.
package kvmodel

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Input is one operation as the client issued it.
type Input struct {
	Put    bool
	Delete bool // a delete of Key (Put false)
	Key    string
	Value  string
	Mode   string // how a get asked to be served (leader, follower, ...); "" if not said
}

// Output is what the operation returned.
type Output struct {
	Value   string
	Found   bool
	Unknown bool // a put whose outcome the client never learned
}

// Model checks histories of Input/Output operations.
var Model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(Input).Key
			byKey[k] = append(byKey[k], op)
		}
		keys := make([]string, 0, len(byKey))
		for k := range byKey {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return Output{} },
	Step: func(state, input, output any) (bool, any) {
		st, in, out := state.(Output), input.(Input), output.(Output)
		if in.Put {
			return true, Output{Value: in.Value, Found: true}
		}
		if in.Delete {
			return true, Output{}
		}
		return out.Found == st.Found && out.Value == st.Value, st
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(Input), output.(Output)
		get := "get"
		if in.Mode != "" {
			get = fmt.Sprintf("get[%s]", in.Mode)
		}
		switch {
		case in.Delete && out.Unknown:
			return fmt.Sprintf("delete(%s) -> ?", in.Key)
		case in.Delete:
			return fmt.Sprintf("delete(%s)", in.Key)
		case in.Put && out.Unknown:
			return fmt.Sprintf("put(%s, %s) -> ?", in.Key, in.Value)
		case in.Put:
			return fmt.Sprintf("put(%s, %s)", in.Key, in.Value)
		case !out.Found:
			return fmt.Sprintf("%s(%s) -> none", get, in.Key)
		}
		return fmt.Sprintf("%s(%s) -> %s", get, in.Key, out.Value)
	},
}

// History records operations from many goroutines against one clock:
// Now is nanoseconds since the history began, what porcupine's Call and
// Return compare.
type History struct {
	mu   sync.Mutex
	base time.Time
	ops  []porcupine.Operation
}

// NewHistory starts a history now.
func NewHistory() *History { return &History{base: time.Now()} }

// Now is the history's clock.
func (h *History) Now() int64 { return int64(time.Since(h.base)) }

// Add records one operation.
func (h *History) Add(op porcupine.Operation) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Ops returns the operations recorded, to check once recording is over.
func (h *History) Ops() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ops
}

// Prepare readies a recorded history for the checker; end is a time after
// every operation. A put whose outcome the client never learned (Return
// -1) may take effect at any later time, which makes it concurrent with
// everything after its call: a few of those on one key make porcupine's
// search exponential. Two rewrites shrink that without changing the
// verdict (etcd's robustness tests make the same two):
//   - an unknown put whose value no read returned is dropped: it can always
//     be placed after every other operation, where it changes nothing;
//   - an unknown put whose value some read returned must have taken effect
//     before the first such read returned, so it returns then (only when
//     no other put wrote the same value: otherwise the read may have seen
//     that one).
//
// An unknown delete no read after its call found the key missing for is
// dropped alike; every other unknown put or delete returns at end.
func Prepare(ops []porcupine.Operation, end int64) []porcupine.Operation {
	type key struct{ k, v string }
	writers := map[key]int{}
	firstSeen := map[key]int64{}
	lastMissing := map[string]int64{} // the latest return of a read finding the key missing
	for _, op := range ops {
		in, out := op.Input.(Input), op.Output.(Output)
		k := key{in.Key, in.Value}
		if in.Put || in.Delete {
			writers[k] += btoi(in.Put)
			continue
		}
		if !out.Found {
			lastMissing[in.Key] = max(lastMissing[in.Key], op.Return)
			continue
		}
		k.v = out.Value
		if t, ok := firstSeen[k]; !ok || op.Return < t {
			firstSeen[k] = op.Return
		}
	}
	out := make([]porcupine.Operation, 0, len(ops))
	for _, op := range ops {
		in := op.Input.(Input)
		if in.Delete && op.Return == -1 {
			if lastMissing[in.Key] > op.Call {
				op.Return = end
				out = append(out, op)
			}
			continue
		}
		if !in.Put || op.Return != -1 {
			out = append(out, op)
			continue
		}
		k := key{in.Key, in.Value}
		seen, observed := firstSeen[k]
		switch {
		case !observed:
			continue
		case writers[k] == 1 && seen > op.Call:
			op.Return = seen
		default:
			op.Return = end
		}
		out = append(out, op)
	}
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
