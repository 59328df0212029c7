package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestScanStopsWhenCancelled(t *testing.T) {
	e, err := Open(t.TempDir(), Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Update(func(tx *Tx) error {
		for i := range 3 * scanCheckEvery {
			if err := tx.Put(fmt.Appendf(nil, "k%05d", i), []byte("v")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	kvs, err := e.Scan(context.Background(), nil, nil, 10000)
	if err != nil || len(kvs) != 3*scanCheckEvery {
		t.Fatalf("scan: %d pairs, %v", len(kvs), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.Scan(ctx, nil, nil, 10000); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled scan: %v, want context.Canceled", err)
	}
}
