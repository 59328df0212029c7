package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/readmode"
)

// The examples start a three-store cluster in this process, one store per
// zone (dc-a, dc-b, dc-c), with cluster.StartLocal; against a real
// cluster, Config.Endpoints are any of its stores' gRPC addresses.

// Example opens a client, writes a key and reads it back from the leader.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stores, err := cluster.StartLocal(ctx, cluster.LocalConfig{NoSync: true})
	if err != nil {
		log.Fatal(err)
	}
	defer stores.Stop()

	cli, err := client.New(ctx, client.Config{
		Endpoints: stores.Endpoints,
		// Retries and hedges are logged at debug level; warn keeps the
		// client quiet unless something is wrong.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	if err := cli.Put(ctx, []byte("greeting"), []byte("hello")); err != nil {
		log.Fatal(err)
	}
	v, err := cli.Get(ctx, []byte("greeting"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(v))
	if _, err := cli.Get(ctx, []byte("nobody")); errors.Is(err, client.ErrNotFound) {
		fmt.Println("nobody: not found")
	}
	// Output:
	// hello
	// nobody: not found
}

// ExampleClient_Session reads from followers: each read asks the leader
// for its commit index (ReadIndex) and is served by a follower once it has
// applied that far, so it is as linearizable as a leader read while the
// leader serves no data.
func ExampleClient_Session() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stores, err := cluster.StartLocal(ctx, cluster.LocalConfig{NoSync: true})
	if err != nil {
		log.Fatal(err)
	}
	defer stores.Stop()
	cli, err := client.New(ctx, client.Config{Endpoints: stores.Endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	if err := cli.Put(ctx, []byte("greeting"), []byte("hello")); err != nil {
		log.Fatal(err)
	}
	followers := cli.Session(client.ReadPolicy{Replica: client.ReplicaFollower})
	v, info, err := followers.GetWithInfo(ctx, []byte("greeting"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(v))
	// ReadModeReadIndex from a follower; ReadModeLease should no follower
	// be reachable and the leader serve instead. Never ReadModeStale.
	fmt.Println("linearizable:", info.Mode != readmode.Stale)
	// Output:
	// hello
	// linearizable: true
}

// ExampleClient_Session_boundedStaleness lets a replica in the client's
// zone answer from its local state, with no round trip to the leader, if
// that state is at most MaxStaleness old: the read may miss the latest
// writes, and ReadInfo says how stale it may be.
func ExampleClient_Session_boundedStaleness() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stores, err := cluster.StartLocal(ctx, cluster.LocalConfig{NoSync: true})
	if err != nil {
		log.Fatal(err)
	}
	defer stores.Stop()
	// The client sits in dc-b: ReplicaClosest reads from the store there.
	cli, err := client.New(ctx, client.Config{Endpoints: stores.Endpoints, Zone: "dc-b"})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	if err := cli.Put(ctx, []byte("greeting"), []byte("hello")); err != nil {
		log.Fatal(err)
	}
	const maxStaleness = 5 * time.Second
	stale := cli.Session(client.ReadPolicy{Replica: client.ReplicaClosest, MaxStaleness: maxStaleness})
	// A stale read need not see the client's own write at once: the
	// replica may not have applied it yet. Ask until it has.
	for {
		v, info, err := stale.GetWithInfo(ctx, []byte("greeting"))
		if errors.Is(err, client.ErrNotFound) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(string(v))
		// A leader with a valid lease serves it as ReadModeLease, a
		// follower as ReadModeStale, StalenessBound then saying how old
		// its state may be.
		fmt.Println("within the bound:", info.Mode != readmode.Stale || info.StalenessBound <= maxStaleness)
		break
	}
	// Output:
	// hello
	// within the bound: true
}

// ExampleSession_Scan reads a key range, in key order, across every region
// it spans.
func ExampleSession_Scan() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stores, err := cluster.StartLocal(ctx, cluster.LocalConfig{NoSync: true})
	if err != nil {
		log.Fatal(err)
	}
	defer stores.Stop()
	cli, err := client.New(ctx, client.Config{Endpoints: stores.Endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	for _, k := range []string{"user/3", "user/1", "user/2", "video/1"} {
		if err := cli.Put(ctx, []byte(k), []byte("v-"+k)); err != nil {
			log.Fatal(err)
		}
	}
	// [user/, user0): every key with the prefix "user/". A limit of 0
	// returns them all.
	followers := cli.Session(client.ReadPolicy{Replica: client.ReplicaFollower})
	kvs, err := followers.Scan(ctx, []byte("user/"), []byte("user0"), 0)
	if err != nil {
		log.Fatal(err)
	}
	for _, kv := range kvs {
		fmt.Printf("%s = %s\n", kv.Key, kv.Value)
	}
	// Output:
	// user/1 = v-user/1
	// user/2 = v-user/2
	// user/3 = v-user/3
}

// ExampleHedgeAfter hedges reads: a read the leader has not answered
// within 20ms goes to a follower too (a ReadIndex read there, so still
// linearizable) and the first answer wins. A budget caps the extra
// requests at 10% of the reads.
func ExampleHedgeAfter() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stores, err := cluster.StartLocal(ctx, cluster.LocalConfig{NoSync: true})
	if err != nil {
		log.Fatal(err)
	}
	defer stores.Stop()
	cli, err := client.New(ctx, client.Config{Endpoints: stores.Endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	if err := cli.Put(ctx, []byte("greeting"), []byte("hello")); err != nil {
		log.Fatal(err)
	}
	hedged := cli.Session(client.ReadPolicy{
		Replica:     client.ReplicaLeader,
		Hedge:       client.HedgeAfter(20 * time.Millisecond),
		HedgeBudget: 0.1,
	})
	for range 10 {
		if _, err := hedged.Get(ctx, []byte("greeting")); err != nil {
			log.Fatal(err)
		}
	}
	v, info, err := hedged.GetWithInfo(ctx, []byte("greeting"))
	if err != nil {
		log.Fatal(err)
	}
	// info.HedgeWon says whether the hedge answered first.
	fmt.Println(string(v), "linearizable:", info.Mode != readmode.Stale)
	// At most HedgeBudget of the reads over the budget's window (10 s), or
	// its floor (1 hedge a second, 10 a window) when that is more.
	stats := hedged.HedgeStats()
	fmt.Println("hedges within the budget:", stats.HedgesSent <= stats.Primaries/10+10)
	// Output:
	// hello linearizable: true
	// hedges within the budget: true
}
