package engine

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"testing"
)

// Fuzz targets for the region snapshot format (snapshot.go), as a store
// reads it from its peers: the in-memory decoder, the apply, and the
// streaming decoder.

// fuzzEngine opens a scratch engine for one fuzz target; inputs share it.
func fuzzEngine(f *testing.F) *Engine {
	e, err := openEngine(f.TempDir(), true)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = e.Close() })
	return e
}

// regionJSON is a region's metadata as raftstore writes it (the JSON of
// region.Region), so that the seeds carry what real snapshots do: the
// engine reads only ID, StartKey and EndKey of it, and must carry the
// rest through untouched.
type regionJSON struct {
	ID       uint64
	StartKey []byte
	EndKey   []byte
	Epoch    struct{ ConfVer, Version uint64 }
	Peers    []peerJSON
}

type peerJSON struct {
	ID        uint64
	StoreID   uint64
	IsLearner bool `json:",omitempty"`
}

// fuzzSnapshot builds a real snapshot of region r holding kvs (alternating
// keys and values) and dedup records, with the engine's own encoder.
func fuzzSnapshot(tb testing.TB, e *Engine, r regionJSON, dedup []DedupRecord, kvs ...string) []byte {
	tb.Helper()
	meta, err := json.Marshal(r)
	if err != nil {
		tb.Fatal(err)
	}
	sp := Span{ID: r.ID, StartKey: r.StartKey, EndKey: r.EndKey}
	mustUpdate(tb, e, func(tx *Tx) error {
		if err := tx.PutRegionMeta(r.ID, meta); err != nil {
			return err
		}
		if err := tx.PutApplyState(r.ID, ApplyState{AppliedIndex: 10, AppliedTerm: 6, TruncatedIndex: 5, TruncatedTerm: 5}); err != nil {
			return err
		}
		if err := replaceDedupTx(tx.tx, sp, dedup); err != nil {
			return err
		}
		if err := putDedupBaseTx(tx.tx, r.ID, 1000+r.ID); err != nil {
			return err
		}
		for i := 0; i+1 < len(kvs); i += 2 {
			if err := tx.Put([]byte(kvs[i]), []byte(kvs[i+1])); err != nil {
				return err
			}
		}
		return nil
	})
	snap, _ := buildSnapshot(tb, e, r.ID)
	return snap
}

// snapshotSeeds are valid snapshots, then truncated and corrupted ones.
func snapshotSeeds(f *testing.F) [][]byte {
	e := fuzzEngine(f)
	peers := []peerJSON{{ID: 1, StoreID: 1}, {ID: 2, StoreID: 2}, {ID: 3, StoreID: 3, IsLearner: true}}
	full := fuzzSnapshot(f, e, regionJSON{ID: 3, StartKey: []byte("b"), EndKey: []byte("m"), Epoch: struct{ ConfVer, Version uint64 }{2, 5}, Peers: peers},
		[]DedupRecord{{Clock: 1008, ID: 77, Key: []byte("c")}, {Clock: 1009, ID: 78, Key: []byte("k")}, {Clock: 1009, ID: 79, Key: []byte("k")}},
		"a", "outside", "b", "1", "c", "", "l\xff", "big", "m", "outside")
	empty := fuzzSnapshot(f, e, regionJSON{ID: 4, StartKey: []byte("x"), Epoch: struct{ ConfVer, Version uint64 }{1, 1}}, nil)
	unbounded := fuzzSnapshot(f, e, regionJSON{ID: 5, Peers: peers[:1]}, []DedupRecord{{Clock: 6, ID: 1, Key: []byte("zz")}}, "zz", "top")
	flipped := bytes.Clone(full)
	flipped[len(flipped)/2] ^= 0x10
	return [][]byte{
		full, empty, unbounded,
		full[:len(full)-1],                   // checksum cut
		full[:len(full)/2],                   // truncated body
		flipped,                              // bit flip: checksum mismatch
		fixCRC(flipped),                      // the same flip, re-checksummed
		append([]byte("HKVS3"), full[5:]...), // an older format
		append([]byte("HKVS2"), full[5:]...), // an older one
		fixCRC(append(bytes.Clone(full[:len(full)-4]), 0x05)), // a trailing half chunk
		[]byte("HKVS4"),
		nil,
		// A region from -inf holding an empty key: decoded, but bbolt
		// cannot store it, so the apply failed and stopped the store.
		fixCRC(append(append(bytes.Clone(unbounded[:len(unbounded)-4]), 0, 1, 'v'), 0, 0, 0, 0)),
	}
}

// fixCRC replaces the last 4 bytes of b (or appends them) with the
// checksum of what precedes, so mutated inputs get past the checksum and
// reach the structure decoder.
func fixCRC(b []byte) []byte {
	if len(b) < len(snapMagic)+4 {
		return b
	}
	body := bytes.Clone(b[:len(b)-4])
	return binary.BigEndian.AppendUint32(body, crc32.Checksum(body, snapCRC))
}

// checkDecodedSnapshot checks what decodeSnapshotData says about data: an
// error wrapping ErrCorrupt, or a snapshot whose every key lies in its
// region; DecodeSnapshot must agree. It returns whether data was accepted.
func checkDecodedSnapshot(t *testing.T, data []byte) (snapshotData, bool) {
	t.Helper()
	sd, err := decodeSnapshotData(data)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decodeSnapshotData error %v does not wrap ErrCorrupt", err)
		}
		if _, err := DecodeSnapshot(data); err == nil {
			t.Fatal("DecodeSnapshot accepts what decodeSnapshotData refuses")
		}
		return sd, false
	}
	meta, err := DecodeSnapshot(data)
	if err != nil || !bytes.Equal(meta, sd.meta) {
		t.Fatalf("DecodeSnapshot disagrees with decodeSnapshotData: %q, %v", meta, err)
	}
	if sp, err := DecodeSpan(meta); err != nil || sp.String() != sd.span.String() {
		t.Fatalf("the snapshot's meta decodes as %s (%v), the decoder read %s", sp, err, sd.span)
	}
	for _, d := range sd.dedup {
		if !sd.span.Contains(d.Key) {
			t.Fatalf("accepted dedup record %v outside %s", d, sd.span)
		}
	}
	n := 0
	if err := forEachKV(sd.kvs, func(k, v []byte) error {
		if !sd.span.Contains(k) {
			return fmt.Errorf("accepted key %q outside %s", k, sd.span)
		}
		n++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if 2*n+17*len(sd.dedup) > len(data) {
		t.Fatalf("%d pairs and %d dedup records from %d bytes", n, len(sd.dedup), len(data))
	}
	return sd, true
}

// FuzzDecodeSnapshot: snapshot data as it arrives from a leader, checked by
// HandleRaftMessage and decoded again by the apply. Every input is tried as
// is and with its checksum fixed, so mutations reach the structure.
func FuzzDecodeSnapshot(f *testing.F) {
	for _, s := range snapshotSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecodedSnapshot(t, data)
		checkDecodedSnapshot(t, fixCRC(data))
	})
}

// FuzzSnapshotApply: a snapshot the decoder accepts must apply (an apply
// error stops the store: HandleRaftMessage decodes every snapshot first so
// that a bad one never reaches the Ready loop), and the state it leaves must
// build the same snapshot again: decode(build(apply(x))) == decode(x), with
// repeated data keys resolved as the apply resolves them (the later one
// wins; dedup records come in strict order, so they cannot repeat). The
// same holds of the apply from a stream (a snapshot file's), into an
// engine of its own.
func FuzzSnapshotApply(f *testing.F) {
	for _, s := range snapshotSeeds(f) {
		f.Add(s, uint64(10), uint64(6))
	}
	e, es := fuzzEngine(f), fuzzEngine(f)
	f.Fuzz(func(t *testing.T, data []byte, index, term uint64) {
		data = fixCRC(data)
		sd, ok := checkDecodedSnapshot(t, data)
		if !ok {
			return
		}
		for _, c := range []struct {
			name  string
			e     *Engine
			apply func(tx *Tx) ([]byte, error)
		}{
			{"ApplySnapshot", e, func(tx *Tx) ([]byte, error) { return tx.ApplySnapshot(data, index, term) }},
			{"ApplySnapshotFrom", es, func(tx *Tx) ([]byte, error) {
				return tx.ApplySnapshotFrom(bytes.NewReader(data), index, term)
			}},
		} {
			var applied []byte
			err := c.e.LockedUpdate(func(tx *Tx) error {
				var err error
				applied, err = c.apply(tx)
				return err
			})
			if err != nil {
				t.Fatalf("%s: a snapshot the decoder accepted does not apply: %v", c.name, err)
			}
			if !bytes.Equal(applied, sd.meta) {
				t.Fatalf("%s: applied region %q, snapshot has %q", c.name, applied, sd.meta)
			}
			again, as := buildSnapshot(t, c.e, sd.span.ID)
			if as.AppliedIndex != index || as.AppliedTerm != term {
				t.Fatalf("%s: rebuilt snapshot at %d/%d, applied at %d/%d", c.name, as.AppliedIndex, as.AppliedTerm, index, term)
			}
			if as.TruncatedIndex != index || as.TruncatedTerm != term {
				t.Fatalf("%s: log truncated at %d/%d after a snapshot at %d/%d", c.name, as.TruncatedIndex, as.TruncatedTerm, index, term)
			}
			sd2, err := decodeSnapshotData(again)
			if err != nil {
				t.Fatalf("%s: the rebuilt snapshot does not decode: %v", c.name, err)
			}
			if !bytes.Equal(sd2.meta, sd.meta) {
				t.Fatalf("%s: region %q rebuilt as %q", c.name, sd.meta, sd2.meta)
			}
			if got, want := kvMap(t, sd2.kvs), kvMap(t, sd.kvs); !equalKV(got, want) {
				t.Fatalf("%s: pairs %q rebuilt as %q", c.name, want, got)
			}
			if got, want := sd2.dedup, sd.dedup; !slices.EqualFunc(got, want, equalDedup) {
				t.Fatalf("%s: dedup table %v rebuilt as %v", c.name, want, got)
			}
			if sd2.dedupBase != sd.dedupBase {
				t.Fatalf("%s: dedup clock base %d rebuilt as %d", c.name, sd.dedupBase, sd2.dedupBase)
			}
		}
	})
}

func equalDedup(a, b DedupRecord) bool {
	return a.Clock == b.Clock && a.ID == b.ID && bytes.Equal(a.Key, b.Key)
}

func kvMap(t *testing.T, kvs []byte) map[string]string {
	m := map[string]string{}
	if err := forEachKV(kvs, func(k, v []byte) error {
		m[string(k)] = string(v)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return m
}

func equalKV(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// FuzzSnapshotStreamDecode: the streaming decoder (what a receiver checks a
// snapshot with as it arrives, and what the Ready loop applies it with)
// accepts exactly what decodeSnapshotData accepts, agrees on the region,
// the dedup table and the pairs, and never panics.
func FuzzSnapshotStreamDecode(f *testing.F) {
	for _, s := range snapshotSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		want, werr := decodeSnapshotData(data)
		var got snapshotData
		var kvs bytes.Buffer
		err := decodeSnapshotStream(bytes.NewReader(data), func(sd *snapshotData) error {
			got = *sd
			return nil
		}, func(k, v []byte) error {
			fmt.Fprintf(&kvs, "%q=%q;", k, v)
			return nil
		})
		if (err == nil) != (werr == nil) {
			t.Fatalf("stream decoder err %v, in-memory decoder err %v", err, werr)
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("stream decoder error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		var wantKVs bytes.Buffer
		_ = forEachKV(want.kvs, func(k, v []byte) error {
			fmt.Fprintf(&wantKVs, "%q=%q;", k, v)
			return nil
		})
		if got.span.String() != want.span.String() || !bytes.Equal(got.meta, want.meta) || got.dedupBase != want.dedupBase ||
			len(got.dedup) != len(want.dedup) || !slices.EqualFunc(got.dedup, want.dedup, equalDedup) || kvs.String() != wantKVs.String() {
			t.Fatalf("stream decoder disagrees: %+v %s vs %+v %s", got, kvs.String(), want, wantKVs.String())
		}
	})
}
