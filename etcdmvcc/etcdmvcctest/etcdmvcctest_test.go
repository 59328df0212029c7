package etcdmvcctest

import (
	"bytes"
	"testing"

	"github.com/hedgekv/hedgekv/etcdmvcc"
)

func TestMemStore(t *testing.T) {
	for seed := range uint64(5) {
		if err := Check(etcdmvcc.NewMemStore(), seed, 1000); err != nil {
			t.Fatal(err)
		}
	}
}

// The check finds what a store gets wrong: here a ScanAt that does not
// stop at its end, and a compaction that forgets its revision.
type scanPastEnd struct{ *etcdmvcc.MemStore }

func (s scanPastEnd) ScanAt(start, end []byte, rev int64, fn func([]byte, etcdmvcc.Record) bool) error {
	return s.MemStore.ScanAt(start, nil, rev, fn)
}

type forgetfulCompact struct{ *etcdmvcc.MemStore }

func (s forgetfulCompact) Compact(int64) error { return nil }

// A store that loses a history record on the way (its bytes reused).
type reusedValue struct{ *etcdmvcc.MemStore }

func (s reusedValue) PutHistory(key []byte, rev etcdmvcc.Revision, rec etcdmvcc.HistRecord) error {
	if bytes.Equal(key, []byte("k")) {
		rec.Value = append(rec.Value, 'x')
	}
	return s.MemStore.PutHistory(key, rev, rec)
}

func TestFindsFaults(t *testing.T) {
	for name, s := range map[string]Store{
		"scan past end":     scanPastEnd{etcdmvcc.NewMemStore()},
		"forgetful compact": forgetfulCompact{etcdmvcc.NewMemStore()},
		"corrupt history":   reusedValue{etcdmvcc.NewMemStore()},
	} {
		if err := Check(s, 1, 1000); err == nil {
			t.Errorf("%s: no difference found", name)
		} else {
			t.Logf("%s: %.200s", name, err)
		}
	}
}
