package etcdapi

import (
	"bytes"
	"sort"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/hedgekv/hedgekv/region"
)

// mapTx is a raftstore.StateTx over a map: enough for Apply.
type mapTx map[string][]byte

func (m mapTx) Get(key []byte) ([]byte, bool) {
	v, ok := m[string(key)]
	return bytes.Clone(v), ok
}
func (m mapTx) Put(key, value []byte) error { m[string(key)] = bytes.Clone(value); return nil }
func (m mapTx) Delete(key []byte) error     { delete(m, string(key)); return nil }
func (m mapTx) ForEachData(start, end []byte, fn func(k, v []byte) bool) {
	keys := make([]string, 0, len(m))
	for k := range m {
		if k >= string(start) && (len(end) == 0 || k < string(end)) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !fn([]byte(k), m[k]) {
			return
		}
	}
}

// TestApplierWakesWatchersAfterTheRound: a put's revision reaches the
// watchers' hub only when raftstore says the round that applied it has
// ended (its writes readable), not from Apply, inside the round: a
// watcher woken there could read the state before the write and sleep
// past it (seen as a 50–100 ms late event across the WAN, bench etcd-wan).
func TestApplierWakesWatchersAfterTheRound(t *testing.T) {
	a := NewApplier()
	tx := mapTx{}
	payload, err := encodeRequest(&pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k"), Value: []byte("v")}}})
	if err != nil {
		t.Fatal(err)
	}
	wake, rev := a.hub.next()
	if _, err := a.Apply(tx, region.Region{ID: 1}, 10, payload); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
		t.Fatal("the hub was woken inside the round")
	default:
	}
	a.RoundApplied()
	select {
	case <-wake:
	default:
		t.Fatal("the hub was not woken when the round ended")
	}
	if _, now := a.hub.next(); now != rev+2 {
		t.Fatalf("hub revision %d after a put on revision %d, want %d", now, rev+1, rev+2)
	}
	// A round that applied nothing of the keyspace wakes no one.
	wake, _ = a.hub.next()
	a.RoundApplied()
	select {
	case <-wake:
		t.Fatal("an empty round woke the hub")
	default:
	}
}
