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

func del(cl int, k string, call, ret int64) porcupine.Operation {
	out := Output{}
	if ret == -1 {
		out.Unknown = true
	}
	return porcupine.Operation{ClientId: cl, Input: Input{Delete: true, Key: k}, Call: call, Output: out, Return: ret}
}

func TestDeletes(t *testing.T) {
	// A read after a delete finds nothing; one finding the deleted value
	// is stale.
	ok := []porcupine.Operation{
		put(0, "k", "a", 0, 10),
		del(1, "k", 20, 30),
		get(2, "k", "", 40, 50),
		put(0, "k", "b", 60, 70),
		get(2, "k", "b", 80, 90),
	}
	if !porcupine.CheckOperations(Model, Prepare(ok, 1000)) {
		t.Fatal("a linearizable history with a delete failed")
	}
	stale := []porcupine.Operation{
		put(0, "k", "a", 0, 10),
		del(1, "k", 20, 30),
		get(2, "k", "a", 40, 50),
	}
	if porcupine.CheckOperations(Model, Prepare(stale, 1000)) {
		t.Fatal("a read of a deleted value passed")
	}
}

func TestPrepareUnknownDeletes(t *testing.T) {
	// An unknown delete no later read found missing is dropped; one that
	// a later read may have seen stays, open-ended, and explains it.
	ops := []porcupine.Operation{
		put(0, "k", "a", 0, 10),
		del(1, "k", 20, -1), // no miss after it: dropped
		get(2, "k", "a", 30, 40),
		del(1, "j", 20, -1), // a miss at 60: kept to the end
		put(0, "j", "x", 0, 10),
		get(2, "j", "", 50, 60),
	}
	got := Prepare(ops, 1000)
	var kept []string
	for _, op := range got {
		if in := op.Input.(Input); in.Delete {
			kept = append(kept, in.Key)
			if op.Return != 1000 {
				t.Fatalf("unknown delete of %s returns at %d, want the end", in.Key, op.Return)
			}
		}
	}
	if len(kept) != 1 || kept[0] != "j" {
		t.Fatalf("unknown deletes kept: %v, want [j]", kept)
	}
	if !porcupine.CheckOperations(Model, got) {
		t.Fatal("a linearizable history became illegal")
	}
}
