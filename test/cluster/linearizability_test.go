package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
)

// A register-per-key model: puts and gets over a few keys, partitioned by
// key so porcupine checks each key's history alone.

type kvInput struct {
	Put   bool
	Key   string
	Value string
	Mode  string // how a get asked to be served: leader | follower
}

type kvOutput struct {
	Value   string
	Found   bool
	Unknown bool // a put whose outcome the client never learned
}

var kvModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(kvInput).Key
			byKey[k] = append(byKey[k], op)
		}
		keys := make([]string, 0, len(byKey))
		for k := range byKey {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return kvOutput{} },
	Step: func(state, input, output any) (bool, any) {
		st, in, out := state.(kvOutput), input.(kvInput), output.(kvOutput)
		if in.Put {
			return true, kvOutput{Value: in.Value, Found: true}
		}
		return out.Found == st.Found && out.Value == st.Value, st
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(kvInput), output.(kvOutput)
		if in.Put {
			if out.Unknown {
				return fmt.Sprintf("put(%s, %s) -> ?", in.Key, in.Value)
			}
			return fmt.Sprintf("put(%s, %s)", in.Key, in.Value)
		}
		if !out.Found {
			return fmt.Sprintf("get[%s](%s) -> none", in.Mode, in.Key)
		}
		return fmt.Sprintf("get[%s](%s) -> %s", in.Mode, in.Key, out.Value)
	},
}

// history records operations from many goroutines against one clock.
type history struct {
	mu   sync.Mutex
	base time.Time
	ops  []porcupine.Operation
}

func (h *history) now() int64 { return int64(time.Since(h.base)) }

func (h *history) add(op porcupine.Operation) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// nemesis injects one fault at a time, chosen by rng, until stop closes.
func nemesis(c *raftstoretest.Cluster, rng *rand.Rand, stop <-chan struct{}, log func(string, ...any)) {
	sleep := func(d time.Duration) bool {
		select {
		case <-stop:
			return false
		case <-time.After(d):
			return true
		}
	}
	for {
		if !sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond) {
			return
		}
		leader, hasLeader := c.Leader(1)
		ids := c.IDs()
		victim := ids[rng.IntN(len(ids))]
		hold := time.Duration(200+rng.IntN(400)) * time.Millisecond
		switch rng.IntN(7) {
		case 0:
			if !hasLeader {
				continue
			}
			log("partition leader %d for %v", leader, hold)
			heal := c.Net.AddFilter(raftstore.IsolateFilter(leader))
			sleep(hold)
			heal()
		case 1:
			if victim == leader {
				continue
			}
			log("isolate follower %d for %v", victim, hold)
			heal := c.Net.AddFilter(raftstore.IsolateFilter(victim))
			sleep(hold)
			heal()
		case 2:
			if !hasLeader || victim == leader {
				continue
			}
			if s, ok := c.Store(leader); ok {
				log("transfer leader %d -> %d", leader, victim)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = s.TransferLeader(ctx, 1, victim)
				cancel()
			}
		case 3:
			log("restart store %d", victim)
			if c.StopStore(victim) == nil {
				sleep(hold)
				_ = c.StartStore(victim)
			}
		case 4:
			log("delay all messages for %v", hold)
			heal := c.Net.AddFilter(raftstore.DelayFilter(2*time.Millisecond, 8*time.Millisecond))
			sleep(hold)
			heal()
		case 5:
			log("drop 20%% of messages for %v", hold)
			heal := c.Net.AddFilter(raftstore.DropFilter(0.2))
			sleep(hold)
			heal()
		case 6:
			// Move a follower's replica to the store without one: a learner
			// catches up by snapshot, is promoted, and the old replica is
			// removed and its data deleted while reads may still reach it.
			r, ok := c.RegionOf(nil)
			s, up := c.Store(leader)
			if !ok || !hasLeader || !up {
				continue
			}
			var from, to uint64
			for _, id := range ids {
				_, has := r.PeerOnStore(id)
				switch {
				case !has:
					to = id
				case id != leader:
					from = id
				}
			}
			if from == 0 || to == 0 {
				continue
			}
			log("move replica %d -> %d", from, to)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = s.MovePeer(ctx, 1, from, to)
			cancel()
		}
	}
}

func runLinearizability(seed uint64) {
	c := startCluster(raftstoretest.Options{LogGCThreshold: 200})
	// A fourth store, without a replica at first, for the nemesis to move
	// replicas to.
	_, err := c.AddStore()
	Expect(err).NotTo(HaveOccurred())
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h := &history{base: time.Now()}
	keys := []string{"a", "b", "c"}
	const clients = 6
	duration := 3 * time.Second
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for cl := range clients {
		crng := rand.New(rand.NewPCG(seed+uint64(cl), uint64(cl)))
		wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := keys[crng.IntN(len(keys))]
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				call := h.now()
				switch r := crng.IntN(10); {
				case r < 4:
					val := fmt.Sprintf("%d.%d", cl, n)
					err := c.Put(ctx, []byte(key), []byte(val))
					in := kvInput{Put: true, Key: key, Value: val}
					if err != nil {
						// It may still happen at any later time.
						h.add(porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
					} else {
						h.add(porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: kvOutput{}, Return: h.now()})
					}
				case r < 7:
					v, found, err := c.Get(ctx, []byte(key))
					if err == nil {
						h.add(porcupine.Operation{ClientId: cl, Input: kvInput{Key: key, Mode: "leader"}, Call: call, Output: kvOutput{Value: string(v), Found: found}, Return: h.now()})
					}
				default:
					ids := c.IDs()
					if s, ok := c.Store(ids[crng.IntN(len(ids))]); ok {
						v, found, _, err := s.Get(ctx, raftstore.ReadOptions{ReplicaRead: true}, []byte(key))
						if err == nil {
							h.add(porcupine.Operation{ClientId: cl, Input: kvInput{Key: key, Mode: "follower"}, Call: call, Output: kvOutput{Value: string(v), Found: found}, Return: h.now()})
						}
					}
				}
				cancel()
			}
		}()
	}
	var faults []string
	nemesisDone := make(chan struct{})
	go func() {
		defer close(nemesisDone)
		nemesis(c, rng, stop, func(f string, a ...any) { faults = append(faults, fmt.Sprintf(f, a...)) })
	}()
	time.Sleep(duration)
	close(stop)
	wg.Wait()
	<-nemesisDone

	end := h.now() + 1
	reads := 0
	for i := range h.ops {
		if h.ops[i].Return == -1 {
			h.ops[i].Return = end
		}
		if !h.ops[i].Input.(kvInput).Put {
			reads++
		}
	}
	GinkgoWriter.Printf("seed %d: %d operations (%d reads), faults: %v\n", seed, len(h.ops), reads, faults)
	Expect(reads).To(BeNumerically(">", 20), "too few successful reads to check anything")

	res, info := porcupine.CheckOperationsVerbose(kvModel, h.ops, 30*time.Second)
	if res != porcupine.Ok {
		dir, _ := filepath.Abs("failures")
		_ = os.MkdirAll(dir, 0o755)
		html := filepath.Join(dir, fmt.Sprintf("linearizability-seed-%d.html", seed))
		_ = porcupine.VisualizePath(kvModel, info, html)
		raw, _ := json.MarshalIndent(h.ops, "", " ")
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("linearizability-seed-%d.json", seed)), raw, 0o644)
		Fail(fmt.Sprintf("history is %v (not linearizable); saved to %s; faults: %v", res, html, faults))
	}
}

var _ = Describe("linearizability", func() {
	DescribeTable("puts and gets in every read mode under a nemesis",
		func(seed uint64) { runLinearizability(seed) },
		Entry("seed 1", uint64(1)),
		Entry("seed 2", uint64(2)),
		Entry("seed 3", uint64(3)),
		Entry("seed 4", uint64(4)),
	)
})
