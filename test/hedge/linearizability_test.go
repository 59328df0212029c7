package hedge_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/client"
	"github.com/hedgekv/hedgekv/test/kvmodel"
)

// The model lives in test/kvmodel, shared with the other linearizability specs.
type (
	kvInput  = kvmodel.Input
	kvOutput = kvmodel.Output
)

var kvModel = kvmodel.Model

var _ = Describe("hedged reads", func() {
	It("stays linearizable with hedging on", func() {
		c := startCluster()
		cl := newClient(c)
		leader := leaderOf(c)
		// Half the leader's reads are held 30ms, so hedges (after 5ms, to
		// followers, as ReadIndex reads) win often while puts keep going
		// through the leader.
		Expect(cl.Fault(ctxFor(10*time.Second), leader, client.Fault{Delay: 30 * time.Millisecond, Prob: 0.5})).To(Succeed())

		const (
			workers  = 4
			duration = 2 * time.Second
		)
		keys := []string{"lin-a", "lin-b", "lin-c"}
		base := time.Now()
		now := func() int64 { return int64(time.Since(base)) }
		var (
			mu  sync.Mutex
			ops []porcupine.Operation
		)
		add := func(op porcupine.Operation) {
			mu.Lock()
			ops = append(ops, op)
			mu.Unlock()
		}
		sessions := make([]*client.Session, workers)
		ctx := ctxFor(60 * time.Second)
		var wg sync.WaitGroup
		for w := range workers {
			s := cl.Session(client.ReadPolicy{Replica: client.ReplicaLeader, Hedge: client.HedgeAfter(5 * time.Millisecond), HedgeBudget: 1})
			sessions[w] = s
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 42))
				for i := 0; time.Since(base) < duration; i++ {
					key := keys[rng.IntN(len(keys))]
					call := now()
					if rng.IntN(10) < 3 {
						in := kvInput{Put: true, Key: key, Value: fmt.Sprintf("w%d-%d", w, i)}
						if err := cl.Put(ctx, []byte(key), []byte(in.Value)); err != nil {
							// Outcome unknown: it may take effect any time later.
							add(porcupine.Operation{ClientId: w, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: -1})
							continue
						}
						add(porcupine.Operation{ClientId: w, Input: in, Call: call, Output: kvOutput{}, Return: now()})
						continue
					}
					v, err := s.Get(ctx, []byte(key))
					ret := now()
					switch {
					case errors.Is(err, client.ErrNotFound):
						add(porcupine.Operation{ClientId: w, Input: kvInput{Key: key}, Call: call, Output: kvOutput{}, Return: ret})
					case err == nil:
						add(porcupine.Operation{ClientId: w, Input: kvInput{Key: key}, Call: call, Output: kvOutput{Value: string(v), Found: true}, Return: ret})
					}
					// A failed get tells nothing and is left out.
				}
			})
		}
		wg.Wait()

		end := now() + 1
		reads := 0
		for i := range ops {
			if ops[i].Return == -1 {
				ops[i].Return = end
			}
			if !ops[i].Input.(kvInput).Put {
				reads++
			}
		}
		var won uint64
		for _, s := range sessions {
			won += s.HedgeStats().HedgesWon
		}
		GinkgoWriter.Printf("%d operations (%d reads), %d hedges won\n", len(ops), reads, won)
		Expect(reads).To(BeNumerically(">", 20), "too few successful reads to check anything")
		Expect(won).To(BeNumerically(">", 0), "no read was answered by a hedge")
		res, _ := porcupine.CheckOperationsVerbose(kvModel, ops, 30*time.Second)
		Expect(res).To(Equal(porcupine.Ok), "history with hedged reads is not linearizable")
	})
})
