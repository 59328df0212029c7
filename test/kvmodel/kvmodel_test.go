package kvmodel

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

func put(cl int, k, v string, call, ret int64) porcupine.Operation {
	out := Output{}
	if ret == -1 {
		out.Unknown = true
	}
	return porcupine.Operation{ClientId: cl, Input: Input{Put: true, Key: k, Value: v}, Call: call, Output: out, Return: ret}
}

func get(cl int, k, v string, call, ret int64) porcupine.Operation {
	return porcupine.Operation{ClientId: cl, Input: Input{Key: k}, Call: call, Output: Output{Value: v, Found: v != ""}, Return: ret}
}

func TestPrepareDropsUnobservedAndBoundsObservedUnknownPuts(t *testing.T) {
	ops := []porcupine.Operation{
		put(0, "k", "a", 0, 10),
		put(1, "k", "lost", 5, -1), // never read: dropped
		put(2, "k", "b", 20, -1),   // read at 40: returns then
		get(3, "k", "b", 30, 40),
		get(3, "k", "b", 50, 60),
	}
	got := Prepare(ops, 1000)
	if len(got) != 4 {
		t.Fatalf("got %d operations, want 4 (the unobserved unknown put dropped): %v", len(got), got)
	}
	for _, op := range got {
		in := op.Input.(Input)
		if in.Value == "lost" {
			t.Fatalf("unobserved unknown put kept: %v", op)
		}
		if in.Put && in.Value == "b" && op.Return != 40 {
			t.Fatalf("observed unknown put returns at %d, want 40 (its first reader's return)", op.Return)
		}
	}
	if res := porcupine.CheckOperations(Model, got); !res {
		t.Fatal("a linearizable history became illegal")
	}
}

func TestPrepareKeepsAStaleReadIllegal(t *testing.T) {
	// b is written (outcome unknown) and read; a read after that returns
	// the older a: not linearizable, before and after Prepare.
	ops := []porcupine.Operation{
		put(0, "k", "a", 0, 10),
		put(1, "k", "b", 20, -1),
		get(2, "k", "b", 30, 40),
		get(2, "k", "a", 50, 60),
	}
	if porcupine.CheckOperations(Model, Prepare(ops, 1000)) {
		t.Fatal("a stale read passed after Prepare")
	}
}

func TestPrepareLeavesAValueWrittenTwiceUnbounded(t *testing.T) {
	// Two puts wrote "x"; the read may have seen the first: the unknown
	// second one keeps an open end.
	ops := []porcupine.Operation{
		put(0, "k", "x", 0, 10),
		put(1, "k", "x", 20, -1),
		get(2, "k", "x", 30, 40),
	}
	got := Prepare(ops, 1000)
	for _, op := range got {
		if in := op.Input.(Input); in.Put && op.Output.(Output).Unknown && op.Return != 1000 {
			t.Fatalf("unknown put of a value written twice returns at %d, want the end", op.Return)
		}
	}
}
