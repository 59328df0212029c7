// Package etcdmodel is the porcupine model that histories of etcd clients
// (clientv3 against hedgekv's etcd API) are checked against: a register
// per key, with puts, gets and compare-and-set Txns, partitioned by key.
// server/etcdapi's in-process test and test/etcdfaults' multi-process one
// share it.
package etcdmodel

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// Ops of an Input.
const (
	OpPut = "put"
	OpGet = "get"
	OpCAS = "cas" // Txn: If(value(Key) == Old) Then(Put(Key, Value))
)

// Input is an etcd client's view of one key: put, get, and a
// compare-and-set Txn (value == Old then put Value). Values are never
// empty: the model's "" is an absent key.
type Input struct {
	Op         string // OpPut, OpGet, OpCAS
	Key, Value string
	Old        string
	Mode       string // a get's read mode, for the report
}

// Output is what the operation returned.
type Output struct {
	Value     string
	Found     bool
	Succeeded bool // a cas
	Unknown   bool // a write whose outcome the client never learned
}

// Model checks histories of Input/Output operations.
var Model = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(Input).Key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return "" }, // "": absent (values are never empty)
	Step: func(state, input, output any) (bool, any) {
		st, in, out := state.(string), input.(Input), output.(Output)
		switch in.Op {
		case OpPut:
			return true, in.Value
		case OpGet:
			return out.Found == (st != "") && out.Value == st, st
		case OpCAS:
			if out.Unknown {
				if st == in.Old {
					return true, in.Value
				}
				return true, st
			}
			if out.Succeeded {
				return st == in.Old, in.Value
			}
			return st != in.Old, st
		}
		return false, st
	},
	Equal: func(a, b any) bool { return a == b },
	DescribeOperation: func(input, output any) string {
		in, out := input.(Input), output.(Output)
		return fmt.Sprintf("%s(%s %q old=%q %s) -> %+v", in.Op, in.Key, in.Value, in.Old, in.Mode, out)
	},
}

// Prepare readies a recorded history for the checker: a write whose
// outcome is unknown has Return -1, and end is a time after every
// operation. Such a write may take effect at any later time, which makes
// it concurrent with everything after its call; under faults there are
// many, and porcupine's search grows exponentially with them. Values are
// unique per write, which allows two rewrites that keep the verdict (as
// test/kvmodel's Prepare):
//   - an unknown write whose value no get returned and no cas that
//     succeeded compared against, on a key where no cas that failed
//     returned after its call, is dropped: it can always be placed after
//     every other operation, where nothing observes it (a failed cas
//     observes every value but its Old, so one after its call keeps it);
//   - an unknown write whose value some get returned, or some cas that
//     succeeded compared against, took effect before the first such
//     operation returned: it returns then.
//
// Every other unknown write returns at end.
func Prepare(ops []porcupine.Operation, end int64) []porcupine.Operation {
	type kv struct{ k, v string }
	seen := map[kv]int64{}              // the earliest return of an op that saw the value
	lastFailedCAS := map[string]int64{} // by key, the latest return of a cas that failed
	observe := func(k kv, at int64) {
		if t, ok := seen[k]; !ok || at < t {
			seen[k] = at
		}
	}
	for _, op := range ops {
		in, out := op.Input.(Input), op.Output.(Output)
		switch {
		case op.Return == -1:
		case in.Op == OpGet && out.Found:
			observe(kv{in.Key, out.Value}, op.Return)
		case in.Op == OpCAS && out.Succeeded:
			observe(kv{in.Key, in.Old}, op.Return)
		case in.Op == OpCAS:
			lastFailedCAS[in.Key] = max(lastFailedCAS[in.Key], op.Return)
		}
	}
	out := make([]porcupine.Operation, 0, len(ops))
	for _, op := range ops {
		if op.Return != -1 {
			out = append(out, op)
			continue
		}
		in := op.Input.(Input)
		at, observed := seen[kv{in.Key, in.Value}]
		switch {
		case !observed && lastFailedCAS[in.Key] < op.Call:
			continue
		case observed && at > op.Call:
			op.Return = at
		default:
			op.Return = end
		}
		out = append(out, op)
	}
	return out
}
