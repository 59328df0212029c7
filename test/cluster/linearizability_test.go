package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
	"github.com/hedgekv/hedgekv/region"
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

// nemesisEnv reads a duration in seconds from the environment: the specs
// run briefly in `make test`, and for minutes when asked
// (HEDGEKV_NEMESIS_SECONDS=300 go test ./test/cluster -ginkgo.focus nemesis).
func nemesisEnv(name string, def time.Duration) time.Duration {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return def
}

// splitKeys are where the nemesis may split: the clients' keys spread over
// up to three regions.
var splitKeys = []string{"c", "e"}

// faultLog counts and lists the faults the nemesis injected.
type faultLog struct {
	mu     sync.Mutex
	list   []string
	byKind map[string]int
}

func (f *faultLog) add(kind, format string, a ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byKind == nil {
		f.byKind = map[string]int{}
	}
	f.byKind[kind]++
	if len(f.list) < 200 {
		f.list = append(f.list, kind+": "+fmt.Sprintf(format, a...))
	}
}

func (f *faultLog) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	kinds := make([]string, 0, len(f.byKind))
	n := 0
	for k, c := range f.byKind {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, c))
		n += c
	}
	sort.Strings(kinds)
	return fmt.Sprintf("%d faults (%s)", n, strings.Join(kinds, " "))
}

// nemesis injects one fault at a time, chosen by rng, until stop closes.
// Besides partitions, restarts, delays, drops, transfers and replica
// moves, it combines faults the way the read path's past bugs needed:
// a follower restart while another follower is cut off from a leader with
// a live lease; a leadership transfer whose caller gives up while the
// target lags; and a split while a follower lags (clients keep the old
// epochs, see runLinearizability).
func nemesis(c *raftstoretest.Cluster, rng *rand.Rand, stop <-chan struct{}, log *faultLog) {
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
		regions := c.Regions()
		r := regions[rng.IntN(len(regions))]
		leader, hasLeader := c.Leader(r.ID)
		ids := c.IDs()
		victim := ids[rng.IntN(len(ids))]
		var followers []uint64
		for _, pr := range r.Peers {
			if pr.StoreID != leader && !pr.IsLearner {
				followers = append(followers, pr.StoreID)
			}
		}
		rng.Shuffle(len(followers), func(i, j int) { followers[i], followers[j] = followers[j], followers[i] })
		hold := time.Duration(200+rng.IntN(400)) * time.Millisecond
		switch rng.IntN(11) {
		case 0:
			if !hasLeader {
				continue
			}
			log.add("partition-leader", "store %d (region %d) for %v", leader, r.ID, hold)
			heal := c.Net.AddFilter(raftstore.IsolateFilter(leader))
			sleep(hold)
			heal()
		case 1:
			if victim == leader {
				continue
			}
			log.add("isolate-follower", "store %d for %v", victim, hold)
			heal := c.Net.AddFilter(raftstore.IsolateFilter(victim))
			sleep(hold)
			heal()
		case 2:
			if !hasLeader || len(followers) == 0 {
				continue
			}
			if s, ok := c.Store(leader); ok {
				log.add("transfer", "region %d %d -> %d", r.ID, leader, followers[0])
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = s.TransferLeader(ctx, r.ID, followers[0])
				cancel()
			}
		case 3:
			log.add("restart", "store %d", victim)
			if c.StopStore(victim) == nil {
				sleep(hold)
				_ = c.StartStore(victim)
			}
		case 4:
			log.add("delay", "all messages for %v", hold)
			heal := c.Net.AddFilter(raftstore.DelayFilter(2*time.Millisecond, 8*time.Millisecond))
			sleep(hold)
			heal()
		case 5:
			log.add("drop", "20%% of messages for %v", hold)
			heal := c.Net.AddFilter(raftstore.DropFilter(0.2))
			sleep(hold)
			heal()
		case 6:
			// Move a follower's replica to a store without one: a learner
			// catches up by snapshot, is promoted, and the old replica is
			// removed and its data deleted while reads may still reach it.
			s, up := c.Store(leader)
			if !hasLeader || !up || len(followers) == 0 {
				continue
			}
			var to uint64
			for _, id := range ids {
				if _, has := r.PeerOnStore(id); !has {
					to = id
				}
			}
			if to == 0 {
				continue
			}
			log.add("move-replica", "region %d %d -> %d", r.ID, followers[0], to)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = s.MovePeer(ctx, r.ID, followers[0], to)
			cancel()
		case 7:
			key := splitKeys[rng.IntN(len(splitKeys))]
			log.add("split", "at %q", key)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.Split(ctx, []byte(key))
			cancel()
		case 8:
			// A follower lags (no entries, heartbeats only) while the
			// region splits under it: clients holding the old epoch read
			// from it, it learns of the split while their reads wait.
			if len(followers) == 0 {
				continue
			}
			f := followers[0]
			key := splitKeys[rng.IntN(len(splitKeys))]
			log.add("split-while-lagging", "store %d lags, split at %q, for %v", f, key, hold)
			heal := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
				return m.ToStore == f && (m.Msg.Type == raftpb.MsgApp || m.Msg.Type == raftpb.MsgSnap), 0
			}))
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.Split(ctx, []byte(key))
			cancel()
			sleep(hold)
			heal()
		case 9:
			// A transfer whose caller gives up at once while its target
			// lags: raft keeps the transfer live and sends MsgTimeoutNow
			// once the target catches up; the old leader is then cut off.
			s, up := c.Store(leader)
			if !hasLeader || !up || len(followers) == 0 {
				continue
			}
			target := followers[0]
			log.add("abandoned-transfer", "region %d %d -> %d", r.ID, leader, target)
			lag := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
				return m.ToStore == target && m.Msg.Type == raftpb.MsgApp, 0
			}))
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rng.IntN(20))*time.Millisecond)
			_ = s.TransferLeader(ctx, r.ID, target)
			cancel()
			if !sleep(time.Duration(rng.IntN(50)) * time.Millisecond) {
				lag()
				return
			}
			var cut atomic.Bool
			isolate := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
				if cut.Load() {
					return m.FromStore == leader || m.ToStore == leader, 0
				}
				if m.FromStore == leader && m.Msg.Type == raftpb.MsgTimeoutNow {
					cut.Store(true)
				}
				return false, 0
			}))
			lag()
			sleep(hold)
			isolate()
		case 10:
			// One follower is cut off from the leader while the other
			// restarts: if the restarted one forgets the leader it acked,
			// the cut-off one can be elected inside the leader's lease.
			if !hasLeader || len(followers) < 2 {
				continue
			}
			b, cf := followers[0], followers[1]
			log.add("restart-in-lease", "region %d leader %d, cut %d, restart %d", r.ID, leader, cf, b)
			cutLink := c.Net.AddFilter(raftstore.FilterFunc(func(m *raftstore.Message) (bool, time.Duration) {
				return (m.FromStore == leader && m.ToStore == cf) || (m.FromStore == cf && m.ToStore == leader), 0
			}))
			sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
			if c.StopStore(b) == nil {
				_ = c.StartStore(b)
			}
			sleep(hold)
			cutLink()
		}
	}
}

// clientState is one client's view: its cached regions, which may be
// stale (the split and replica-move faults make them so), as a real
// client's region cache would be.
type clientState struct {
	cache map[string]region.Region
}

func (cs *clientState) regionFor(c *raftstoretest.Cluster, key string, refresh bool) (region.Region, bool) {
	if r, ok := cs.cache[key]; ok && !refresh {
		return r, true
	}
	r, ok := c.RegionOf([]byte(key))
	if ok {
		cs.cache[key] = r
	}
	return r, ok
}

// nemesisDuration is how long each seed runs; clockSkew whether stores get
// skewed clocks (within the drift margin and the max clock offset).
func runLinearizability(seed uint64, duration time.Duration) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	// Clocks skewed within what the lease and the staleness bounds allow
	// for: a rate off by up to 3% (the lease gives up 10%), an offset of
	// up to 20ms (MaxClockOffset is 50ms). Store 3 campaigns sooner than
	// the others, so elections race leases more often.
	skews := map[uint64]func() time.Time{}
	for id := uint64(1); id <= 4; id++ {
		skews[id] = raftstoretest.SkewedClock(time.Duration(rng.IntN(41)-20)*time.Millisecond, 0.97+rng.Float64()*0.06)
	}
	c := startCluster(raftstoretest.Options{
		LogGCThreshold:     200,
		StoreElectionTicks: map[uint64]int{3: 6},
		Clock:              func(id uint64) func() time.Time { return skews[id] },
	})
	// A fourth store, without a replica at first, for the nemesis to move
	// replicas to.
	_, err := c.AddStore()
	Expect(err).NotTo(HaveOccurred())
	h := &history{base: time.Now()}
	keys := []string{"a", "b", "c", "d", "e", "f"}
	const clients = 6
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for cl := range clients {
		crng := rand.New(rand.NewPCG(seed+uint64(cl), uint64(cl)))
		cs := &clientState{cache: map[string]region.Region{}}
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
				switch r := crng.IntN(20); {
				case r < 6:
					val := fmt.Sprintf("%d.%d", cl, n)
					err := c.Put(ctx, []byte(key), []byte(val))
					in := kvInput{Put: true, Key: key, Value: val}
					if err != nil {
						// It may still happen at any later time.
						h.add(porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
					} else {
						h.add(porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: kvOutput{}, Return: h.now()})
					}
				case r < 8:
					// A write whose acknowledgement is lost: a first attempt
					// under a tiny deadline, then, after faults had time to
					// split the region or add a replica, a retry with the same
					// request ID. One operation from the first call to the
					// retry's answer.
					val := fmt.Sprintf("%d.%d", cl, n)
					id := crng.Uint64() | 1
					first, cancelFirst := context.WithTimeout(ctx, time.Duration(1+crng.IntN(3))*time.Millisecond)
					_ = c.PutWithID(first, id, []byte(key), []byte(val))
					cancelFirst()
					select {
					case <-stop:
					case <-time.After(time.Duration(50+crng.IntN(300)) * time.Millisecond):
					}
					retry, cancelRetry := context.WithTimeout(context.Background(), time.Second)
					err := c.PutWithID(retry, id, []byte(key), []byte(val))
					cancelRetry()
					in := kvInput{Put: true, Key: key, Value: val}
					if err != nil {
						h.add(porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
					} else {
						h.add(porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: kvOutput{}, Return: h.now()})
					}
				case r < 13:
					v, found, err := c.Get(ctx, []byte(key))
					if err == nil {
						h.add(porcupine.Operation{ClientId: cl, Input: kvInput{Key: key, Mode: "leader"}, Call: call, Output: kvOutput{Value: string(v), Found: found}, Return: h.now()})
					}
				default:
					// A follower read routed by the client's cache, which may
					// predate a split or a move.
					ids := c.IDs()
					reg, ok := cs.regionFor(c, key, false)
					s, up := c.Store(ids[crng.IntN(len(ids))])
					if !ok || !up {
						break
					}
					v, found, _, err := s.Get(ctx, raftstore.ReadOptions{RegionID: reg.ID, Epoch: reg.Epoch, ReplicaRead: true}, []byte(key))
					if err == nil {
						h.add(porcupine.Operation{ClientId: cl, Input: kvInput{Key: key, Mode: "follower"}, Call: call, Output: kvOutput{Value: string(v), Found: found}, Return: h.now()})
					} else if region.IsRegionError(err) && crng.IntN(2) == 0 {
						// Half the time refresh at once; otherwise keep the
						// stale epoch a while, as a slow client would.
						cs.regionFor(c, key, true)
					}
				}
				cancel()
			}
		}()
	}
	faults := &faultLog{}
	nemesisDone := make(chan struct{})
	go func() {
		defer close(nemesisDone)
		nemesis(c, rng, stop, faults)
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
	GinkgoWriter.Printf("seed %d: %d operations (%d reads) in %v, %d regions, %s\n", seed, len(h.ops), reads, duration, len(c.Regions()), faults.summary())
	Expect(reads).To(BeNumerically(">", 20), "too few successful reads to check anything")

	res, info := porcupine.CheckOperationsVerbose(kvModel, h.ops, 60*time.Second)
	if res != porcupine.Ok {
		dir, _ := filepath.Abs("failures")
		_ = os.MkdirAll(dir, 0o755)
		html := filepath.Join(dir, fmt.Sprintf("linearizability-seed-%d.html", seed))
		_ = porcupine.VisualizePath(kvModel, info, html)
		raw, _ := json.MarshalIndent(h.ops, "", " ")
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("linearizability-seed-%d.json", seed)), raw, 0o644)
		Fail(fmt.Sprintf("history is %v (not linearizable); saved to %s; %s: %v", res, html, faults.summary(), faults.list))
	}
	// startCluster's cleanup then checks that every region's replicas agree.
}

var _ = Describe("linearizability", func() {
	duration := nemesisEnv("HEDGEKV_NEMESIS_SECONDS", 4*time.Second)
	DescribeTable("puts and gets in every read mode under a nemesis",
		func(seed uint64) { runLinearizability(seed, duration) },
		Entry("seed 1", uint64(1)),
		Entry("seed 2", uint64(2)),
		Entry("seed 3", uint64(3)),
		Entry("seed 4", uint64(4)),
	)
})
