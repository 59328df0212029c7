package raftstore

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hedgekv/hedgekv/region"
	"github.com/hedgekv/hedgekv/replica"
	"github.com/hedgekv/hedgekv/storage/engine"
)

// newDigestStore opens a store (not started) that bootstrapped region 1 with
// the given initial stores. Nothing runs: the tests write its engine
// directly, as the apply transaction would.
func newDigestStore(t *testing.T, id uint64, initial ...uint64) *Store {
	t.Helper()
	s, err := NewStore(Config{StoreID: id, DataDir: t.TempDir(), InitialStores: initial, NoSync: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

func putData(t *testing.T, s *Store, kv ...string) {
	t.Helper()
	mustUpdate(t, s.eng, func(tx *engine.Tx) error {
		for i := 0; i+1 < len(kv); i += 2 {
			if err := tx.Put([]byte(kv[i]), []byte(kv[i+1])); err != nil {
				return err
			}
		}
		return nil
	})
}

func setApplied(t *testing.T, s *Store, regionID, index, term uint64) {
	t.Helper()
	mustUpdate(t, s.eng, func(tx *engine.Tx) error {
		return tx.PutApplyState(regionID, engine.ApplyState{AppliedIndex: index, AppliedTerm: term, TruncatedIndex: index, TruncatedTerm: term})
	})
}

func setRegionMeta(t *testing.T, s *Store, r region.Region) {
	t.Helper()
	mustUpdate(t, s.eng, func(tx *engine.Tx) error { return putRegion(tx, r) })
}

func mustDigest(t *testing.T, s *Store, regionID uint64) replica.Digest {
	t.Helper()
	d, err := s.RegionDigest(regionID)
	if err != nil {
		t.Fatalf("store %d: digest of region %d: %v", s.ID(), regionID, err)
	}
	return d
}

// threeReplicas returns stores 1..3, each holding region 1 with the same data.
func threeReplicas(t *testing.T) []*Store {
	t.Helper()
	var ss []*Store
	for id := uint64(1); id <= 3; id++ {
		s := newDigestStore(t, id, 1, 2, 3)
		putData(t, s, "a", "1", "b", "2", "c", "3")
		setApplied(t, s, 1, 42, 7)
		ss = append(ss, s)
	}
	return ss
}

func digests(t *testing.T, ss []*Store, regionID uint64) []replica.Digest {
	t.Helper()
	var ds []replica.Digest
	for _, s := range ss {
		ds = append(ds, mustDigest(t, s, regionID))
	}
	return ds
}

func TestRegionDigestReadsTheReplica(t *testing.T) {
	s := newDigestStore(t, 2, 1, 2, 3)
	putData(t, s, "a", "1", "b", "22")
	setApplied(t, s, 1, 9, 6)
	d := mustDigest(t, s, 1)
	if d.StoreID != 2 || d.PeerID != 2 || d.Region.ID != 1 || d.AppliedIndex != 9 || d.AppliedTerm != 6 {
		t.Errorf("digest = %+v", d)
	}
	if d.Keys != 2 || d.Bytes != 5 {
		t.Errorf("keys, bytes = %d, %d; want 2, 5", d.Keys, d.Bytes)
	}
	if d.Hash == ([32]byte{}) {
		t.Error("empty hash")
	}
	if again := mustDigest(t, s, 1); again.Hash != d.Hash {
		t.Error("digest of unchanged data changed")
	}
	applied, kvs, err := s.RegionDump(1)
	if err != nil || applied != 9 || len(kvs) != 2 || string(kvs[1].Key) != "b" || string(kvs[1].Value) != "22" {
		t.Errorf("dump = %d %q %v", applied, kvs, err)
	}
}

func TestRegionDigestCoversOnlyTheRange(t *testing.T) {
	s := newDigestStore(t, 1, 1)
	putData(t, s, "a", "x", "b", "x", "c", "x", "d", "x")
	r := region.Region{ID: 1, StartKey: []byte("b"), EndKey: []byte("d"), Epoch: region.Epoch{ConfVer: 1, Version: 2}, Peers: []region.Peer{{ID: 1, StoreID: 1}}}
	setRegionMeta(t, s, r)
	d := mustDigest(t, s, 1)
	if d.Keys != 2 || d.Region.Epoch.Version != 2 {
		t.Errorf("digest = %v, want 2 keys at version 2", d)
	}
	_, kvs, err := s.RegionDump(1)
	if err != nil || len(kvs) != 2 || string(kvs[0].Key) != "b" || string(kvs[1].Key) != "c" {
		t.Errorf("dump = %q %v", kvs, err)
	}
	// A change outside the range is not this region's.
	before := d.Hash
	putData(t, s, "a", "y", "d", "y")
	if mustDigest(t, s, 1).Hash != before {
		t.Error("a write outside the range changed the digest")
	}
}

func TestRegionDigestLengthPrefixesPairs(t *testing.T) {
	a := newDigestStore(t, 1, 1)
	b := newDigestStore(t, 1, 1)
	putData(t, a, "ab", "c")
	putData(t, b, "a", "bc")
	if mustDigest(t, a, 1).Hash == mustDigest(t, b, 1).Hash {
		t.Error(`"ab"="c" and "a"="bc" hash alike`)
	}
}

func TestRegionDigestOfAReplicaNotHere(t *testing.T) {
	s := newDigestStore(t, 1, 1, 2, 3)
	var nf *ReplicaNotFoundError
	if _, err := s.RegionDigest(99); !errors.As(err, &nf) || nf.Uninitialized || nf.RegionID != 99 || nf.StoreID != 1 {
		t.Errorf("digest of an unknown region: %v", err)
	}
	// An uninitialized placeholder, waiting for its snapshot.
	if _, err := s.createPeer(persistedPeer{region: region.Region{ID: 5, Peers: []region.Peer{{ID: 50, StoreID: 1}, {ID: 51, StoreID: 2}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RegionDigest(5); !errors.As(err, &nf) || !nf.Uninitialized {
		t.Errorf("digest of a placeholder: %v", err)
	}
	if _, _, err := s.RegionDump(5); !IsReplicaNotFound(err) {
		t.Errorf("dump of a placeholder: %v", err)
	}
	// A replica that applied its own removal and awaits destruction.
	setRegionMeta(t, s, region.Region{ID: 1, Epoch: region.Epoch{ConfVer: 2, Version: 1}, Peers: []region.Peer{{ID: 2, StoreID: 2}, {ID: 3, StoreID: 3}}})
	if _, err := s.RegionDigest(1); !IsReplicaNotFound(err) {
		t.Errorf("digest of a removed replica: %v", err)
	}
	// A destroyed one.
	p, _ := s.peer(1)
	if err := s.destroyPeer(p); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RegionDigest(1); !IsReplicaNotFound(err) {
		t.Errorf("digest of a destroyed replica: %v", err)
	}
}

func TestRegionDigestOfAStoppedStore(t *testing.T) {
	s := newDigestStore(t, 1, 1)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RegionDigest(1); !errors.Is(err, ErrStopped) {
		t.Errorf("digest on a stopped store: %v", err)
	}
}

func TestCompareReplicasAgree(t *testing.T) {
	ds := digests(t, threeReplicas(t), 1)
	if err := replica.Compare(ds); err != nil {
		t.Fatal(err)
	}
	if err := replica.Compare(ds[:1]); err != nil {
		t.Errorf("one digest: %v", err)
	}
	if err := replica.Compare(nil); err != nil {
		t.Errorf("no digests: %v", err)
	}
}

func TestCompareReplicasNotAtSameIndex(t *testing.T) {
	ss := threeReplicas(t)
	setApplied(t, ss[1], 1, 43, 7)
	err := replica.Compare(digests(t, ss, 1))
	var ni *replica.NotAtSameIndexError
	if !errors.As(err, &ni) {
		t.Fatalf("got %v, want replica.NotAtSameIndexError", err)
	}
	if ni.RegionID != 1 || ni.Applied[1] != 42 || ni.Applied[2] != 43 || ni.Applied[3] != 42 {
		t.Errorf("got %+v", ni)
	}
	if want := "store 1 at 42, store 2 at 43, store 3 at 42"; !strings.Contains(err.Error(), want) {
		t.Errorf("%q lacks %q", err, want)
	}
}

func TestCompareReplicasNamesTheOddOneOut(t *testing.T) {
	ss := threeReplicas(t)
	putData(t, ss[0], "b", "corrupt")
	ds := digests(t, ss, 1)
	// Order of the digests does not matter.
	ds[0], ds[2] = ds[2], ds[0]
	err := replica.Compare(ds)
	var me *replica.MismatchError
	if !errors.As(err, &me) {
		t.Fatalf("got %v, want replica.MismatchError", err)
	}
	if me.RegionID != 1 || me.AppliedIndex != 42 || me.What != "data" ||
		fmt.Sprint(me.Stores) != "[1 2 3]" || fmt.Sprint(me.Groups) != "[[2 3] [1]]" {
		t.Errorf("got %+v", me)
	}
	// Dump the two and name the key.
	ia, a, errA := ss[1].RegionDump(1)
	ib, b, errB := ss[0].RegionDump(1)
	if errA != nil || errB != nil || ia != ib {
		t.Fatal(errA, errB, ia, ib)
	}
	d, ok := replica.Diff(ia, 2, a, 1, b)
	if !ok || string(d.Key) != "b" || string(d.ValueA) != "2" || string(d.ValueB) != "corrupt" || !d.FoundA || !d.FoundB {
		t.Fatalf("diff = %+v %v", d, ok)
	}
	me.Diff = &d
	for _, want := range []string{"region 1", "applied index 42", "data differs", "stores [2 3]", "stores [1]", `first differing key "b"`, `store 2 has "2"`, `store 1 has "corrupt"`} {
		if !strings.Contains(me.Error(), want) {
			t.Errorf("%q lacks %q", me.Error(), want)
		}
	}
}

func TestCompareReplicasMissingKey(t *testing.T) {
	ss := threeReplicas(t)
	mustUpdate(t, ss[2].eng, func(tx *engine.Tx) error { return tx.Delete([]byte("c")) })
	var me *replica.MismatchError
	if err := replica.Compare(digests(t, ss, 1)); !errors.As(err, &me) || fmt.Sprint(me.Groups) != "[[1 2] [3]]" {
		t.Fatalf("got %v", err)
	}
	_, a, _ := ss[0].RegionDump(1)
	_, b, _ := ss[2].RegionDump(1)
	d, ok := replica.Diff(42, 1, a, 3, b)
	if !ok || string(d.Key) != "c" || !d.FoundA || d.FoundB {
		t.Fatalf("diff = %+v %v", d, ok)
	}
	if !strings.Contains(d.String(), "store 3 has no such key") {
		t.Errorf("%q", d.String())
	}
}

func TestCompareReplicasMetadataAndTerm(t *testing.T) {
	ss := threeReplicas(t)
	ds := digests(t, ss, 1)

	term := append([]replica.Digest(nil), ds...)
	term[1].AppliedTerm++
	var me *replica.MismatchError
	if err := replica.Compare(term); !errors.As(err, &me) || me.What != "applied term" {
		t.Errorf("term: %v", err)
	}

	meta := append([]replica.Digest(nil), ds...)
	meta[2].Region = meta[2].Region.Clone()
	meta[2].Region.Epoch.ConfVer++
	if err := replica.Compare(meta); !errors.As(err, &me) || me.What != "region metadata" {
		t.Errorf("meta: %v", err)
	}

	// The same peers in another order are the same metadata.
	order := append([]replica.Digest(nil), ds...)
	order[0].Region = order[0].Region.Clone()
	ps := order[0].Region.Peers
	ps[0], ps[2] = ps[2], ps[0]
	if err := replica.Compare(order); err != nil {
		t.Errorf("peer order: %v", err)
	}

	// Digests of two regions are a caller's mistake.
	mixed := append([]replica.Digest(nil), ds...)
	mixed[1].Region.ID = 2
	if err := replica.Compare(mixed); !errors.Is(err, replica.ErrNotComparable) {
		t.Errorf("mixed regions: %v", err)
	}
}
