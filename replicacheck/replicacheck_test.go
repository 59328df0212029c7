package replicacheck_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/replica"
	"github.com/hedgekv/hedgekv/replicacheck"
)

func TestCheckFindsAgreementAndDivergence(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Once diverge is set, store 2 applies every write of k05 as "bad":
	// its replica diverges as a bug or a bad disk would make it.
	var diverge atomic.Bool
	c, err := cluster.StartLocal(ctx, cluster.LocalConfig{
		Dir: t.TempDir(), NoSync: true, DisableBalancing: true, DisableSplit: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		StoreKnobs: func(id uint64) raftstore.TestingKnobs {
			return raftstore.TestingKnobs{ApplyFilter: func(_ uint64, key, value []byte, del bool) ([]byte, bool) {
				if id == 2 && diverge.Load() && string(key) == "k05" {
					return []byte("bad"), false
				}
				return value, del
			}}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	cli, err := client.New(ctx, client.Config{Endpoints: c.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for i := range 20 {
		if err := cli.Put(ctx, fmt.Appendf(nil, "k%02d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := cli.Split(ctx, []byte("k10")); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	rep, err := replicacheck.Check(cctx, cli, 10*time.Millisecond)
	ccancel()
	if err != nil {
		t.Fatalf("check of a healthy cluster: %v", err)
	}
	if len(rep.Agreed) != 2 {
		t.Fatalf("agreed %+v, want both regions", rep.Agreed)
	}
	for _, a := range rep.Agreed {
		if len(a.Stores) != 3 {
			t.Errorf("region %d compared on stores %v, want all three", a.RegionID, a.Stores)
		}
	}

	// Store 2's copy of k05 changes behind raft's back.
	diverge.Store(true)
	if err := cli.Put(ctx, []byte("k05"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel = context.WithTimeout(ctx, 10*time.Second)
	_, err = replicacheck.Check(cctx, cli, 10*time.Millisecond)
	ccancel()
	var mm *replica.MismatchError
	if !errors.As(err, &mm) {
		t.Fatalf("check after corrupting store 2: %v, want a replica mismatch", err)
	}
	if mm.Diff == nil || string(mm.Diff.Key) != "k05" {
		t.Fatalf("mismatch %v: want the first differing key named k05", err)
	}
	if len(mm.Groups) != 2 || len(mm.Groups[1]) != 1 || mm.Groups[1][0] != 2 {
		t.Errorf("groups %v: want store 2 alone against the others", mm.Groups)
	}
}
