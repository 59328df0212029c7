package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/hedgekv/hedgekv/region"
)

// Fuzz targets for the records raftstore writes to raft entries and to
// bbolt: every decoder must turn any input into a value or an error wrapping
// errCorrupt, never a panic, and must give back what its encoder wrote.
// The seed corpora are in testdata/fuzz/<target>; `make fuzz` runs them.

// FuzzDecodeCommand: the payload of a normal raft entry (command.go), read
// by every replica's apply and by the leader's pending-write scan.
func FuzzDecodeCommand(f *testing.F) {
	f.Add(command{op: opPut, id: 7, key: []byte("k"), value: []byte("v")}.encode())
	f.Add(command{op: opDelete, id: 1 << 63, key: []byte("key")}.encode())
	f.Add(command{op: opSplit, id: 3, key: []byte("m"), value: encodeSplit(2, region.Epoch{ConfVer: 1, Version: 4})}.encode())
	f.Add(command{op: opPut, id: 9, key: nil, value: nil}.encode())
	f.Add(command{op: opApply, id: 11, key: []byte("k"), value: []byte("incr k")}.encode())
	f.Add(command{op: opApply, id: 12, key: nil, value: nil}.encode())
	f.Add([]byte{})
	f.Add([]byte{byte(opPut), 0, 0, 0, 0, 0, 0, 0, 1})                                            // no key length
	f.Add([]byte{byte(opPut), 0, 0, 0, 0, 0, 0, 0, 1, 5, 'a'})                                    // key runs past the end
	f.Add([]byte{byte(opPut), 0, 0, 0, 0, 0, 0, 0, 1, 0x80, 0x80, 0x80})                          // truncated uvarint
	f.Add([]byte{99, 0, 0, 0, 0, 0, 0, 0, 1, 1, 'a'})                                             // unknown op
	f.Add(append([]byte{byte(opPut), 0, 0, 0, 0, 0, 0, 0, 1}, bytes.Repeat([]byte{0xff}, 10)...)) // uvarint overflow

	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCommand(b)
		if err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("decodeCommand error %v does not wrap errCorrupt", err)
			}
			return
		}
		switch c.op {
		case opPut, opDelete, opSplit, opApply:
		default:
			t.Fatalf("decodeCommand accepted op %d", c.op)
		}
		if len(c.key)+len(c.value) > len(b) {
			t.Fatalf("decoded %d key and %d value bytes from %d", len(c.key), len(c.value), len(b))
		}
		// Round trip: what the decoder read, the encoder writes back and
		// the decoder reads again unchanged. (The input itself need not be
		// canonical: a uvarint may be padded.)
		enc := c.encode()
		c2, err := decodeCommand(enc)
		if err != nil {
			t.Fatalf("decode(encode(%+v)): %v", c, err)
		}
		if c2.op != c.op || c2.id != c.id || !bytes.Equal(c2.key, c.key) || !bytes.Equal(c2.value, c.value) {
			t.Fatalf("round trip: %+v became %+v", c, c2)
		}
		if len(enc) > len(b) {
			t.Fatalf("canonical encoding (%d bytes) longer than the input (%d)", len(enc), len(b))
		}
	})
}

// FuzzDecodeConfContext: the Context of a conf-change entry (apply.go),
// requestID(8) | uvarint n | n × (peerID(8) | storeID(8)). The input is also
// read as a list of peers to encode, so the round trip from structured
// values is fuzzed too.
func FuzzDecodeConfContext(f *testing.F) {
	f.Add(encodeConfContext(42, []region.Peer{{ID: 4, StoreID: 4}}))
	f.Add(encodeConfContext(0, nil))
	f.Add(encodeConfContext(1, []region.Peer{{ID: 4, StoreID: 4}, {ID: 5, StoreID: 9}, {ID: 4, StoreID: 7}}))
	f.Add([]byte{1, 2, 3})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 4}) // claims 2 peers, holds part of one
	f.Add(append(make([]byte, 8), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01))
	f.Add(append(make([]byte, 8), 0x80)) // truncated count

	f.Fuzz(func(t *testing.T, b []byte) {
		reqID, stores, err := decodeConfContext(b)
		if err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("decodeConfContext error %v does not wrap errCorrupt", err)
			}
		} else {
			if len(stores)*16 > len(b) {
				t.Fatalf("%d placements from %d bytes", len(stores), len(b))
			}
			var peers []region.Peer
			for _, id := range slices.Sorted(maps.Keys(stores)) {
				peers = append(peers, region.Peer{ID: id, StoreID: stores[id]})
			}
			r2, s2, err := decodeConfContext(encodeConfContext(reqID, peers))
			if err != nil || r2 != reqID || !equalStores(s2, stores) {
				t.Fatalf("round trip: (%d, %v) became (%d, %v), %v", reqID, stores, r2, s2, err)
			}
		}

		// Structured: the first 8 bytes a request ID, every further 16 a
		// peer. A later placement of the same peer wins, as in a map.
		if len(b) < 8 {
			return
		}
		reqID = binary.BigEndian.Uint64(b)
		var peers []region.Peer
		want := map[uint64]uint64{}
		for rest := b[8:]; len(rest) >= 16; rest = rest[16:] {
			p := region.Peer{ID: binary.BigEndian.Uint64(rest), StoreID: binary.BigEndian.Uint64(rest[8:])}
			peers = append(peers, p)
			want[p.ID] = p.StoreID
		}
		r2, s2, err := decodeConfContext(encodeConfContext(reqID, peers))
		if err != nil || r2 != reqID || !equalStores(s2, want) {
			t.Fatalf("round trip of %d, %v: (%d, %v), %v", reqID, peers, r2, s2, err)
		}
	})
}

func equalStores(a, b map[uint64]uint64) bool {
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
