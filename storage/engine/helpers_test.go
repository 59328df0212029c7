package engine

import (
	"encoding/json"
	"testing"

	"go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// Helpers shared by the engine's tests. The engine stores a region's
// metadata as opaque bytes and reads only its ID and range from them
// (Span), so the tests build that metadata here, as the JSON of those
// three fields, without the replication layer's region type.

// raftInitIndex is the index a region's log starts after (raftstore's
// raftInitIndex): a fresh region's apply state is compacted to it.
const raftInitIndex = 5

// testRegionID is the region most tests write (raftstore's testRegion).
const testRegionID = 7

// testMirror is the mirror bound the tests load peers with (raftstore's).
var testMirror = MirrorBound{Entries: 256, Bytes: 1 << 20}

// metaOf is a region's metadata as the engine reads it: the JSON of its
// ID and range, under the field names of raftstore's region.Region
// (DecodeSpan). A struct of its own, not Span: the test must notice if
// Span stops reading what the region's JSON holds.
func metaOf(id uint64, start, end []byte) []byte {
	b, err := json.Marshal(struct {
		ID       uint64
		StartKey []byte
		EndKey   []byte
	}{id, start, end})
	if err != nil {
		panic(err)
	}
	return b
}

// spanMeta is metaOf for a span.
func spanMeta(sp Span) []byte { return metaOf(sp.ID, sp.StartKey, sp.EndKey) }

// openEngine opens the engine in dir (noSync: without fsyncs).
func openEngine(dir string, noSync bool) (*Engine, error) {
	return Open(dir, Options{NoSync: noSync})
}

// testEngine is an engine in a temporary directory, without fsyncs,
// closed when the test ends.
func testEngine(tb testing.TB) *Engine {
	tb.Helper()
	e, err := openEngine(tb.TempDir(), true)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = e.Close() })
	return e
}

// mustUpdate runs fn in a write transaction committed without a
// checkpoint (as a round's is), failing the test on an error.
func mustUpdate(tb testing.TB, e *Engine, fn func(*Tx) error) {
	tb.Helper()
	if err := e.LockedUpdate(fn); err != nil {
		tb.Fatal(err)
	}
}

// ents is the entries lo..hi of term, each holding its index's low byte.
func ents(term uint64, lo, hi uint64) []raftpb.Entry {
	var out []raftpb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, raftpb.Entry{Index: i, Term: term, Data: []byte{byte(i)}})
	}
	return out
}

// crash closes the engine's files the way kill -9 would: no checkpoint.
func crash(e *Engine) { e.Crash() }

// seedRegion records region testRegionID (the whole key space) in e, its
// log compacted to raftInitIndex (term 1), with hs as its hard state if
// set, durably (Engine.Update).
func seedRegion(e *Engine, hs *raftpb.HardState) error {
	return e.Update(func(tx *Tx) error {
		if err := tx.PutRegionMeta(testRegionID, metaOf(testRegionID, nil, nil)); err != nil {
			return err
		}
		if hs != nil {
			if err := tx.PutHardState(testRegionID, *hs); err != nil {
				return err
			}
		}
		return tx.PutApplyState(testRegionID, ApplyState{AppliedIndex: raftInitIndex, AppliedTerm: 1, TruncatedIndex: raftInitIndex, TruncatedTerm: 1})
	})
}

// checkBolt runs bbolt's consistency check on the engine's committed
// state.
func checkBolt(e *Engine) error {
	return e.db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	})
}
