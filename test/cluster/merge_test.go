package cluster_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hedgekv/hedgekv/raftstore/raftstoretest"
)

var _ = Describe("merge", func() {
	It("loses and rejects no write when regions merge and split under concurrent writes", mergeUnderWrites)
	It("keeps a merged region's data through a restart of each store in turn", mergeThenRestart)
})

// writers runs four writers over key(0..999) until stop closes; acked
// holds each key's last acknowledged value.
func writers(c *raftstoretest.Cluster, stop <-chan struct{}, acked *sync.Map, written, failed *atomic.Int64) *sync.WaitGroup {
	ctx := ctxFor(60 * time.Second)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i += 4 {
				select {
				case <-stop:
					return
				default:
				}
				k := key(i % 1000)
				v := fmt.Sprintf("v%d", i)
				if err := c.Put(ctx, k, []byte(v)); err != nil {
					failed.Add(1)
					continue
				}
				acked.Store(string(k), v)
				written.Add(1)
			}
		}()
	}
	return &wg
}

func expectAcked(c *raftstoretest.Cluster, acked *sync.Map) {
	GinkgoHelper()
	ctx := ctxFor(60 * time.Second)
	n := 0
	acked.Range(func(k, v any) bool {
		got, found, err := c.Get(ctx, []byte(k.(string)))
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue(), "%s lost", k)
		Expect(string(got)).To(Equal(v.(string)), "%s", k)
		n++
		return true
	})
	Expect(n).To(BeNumerically(">", 100))
}

// mergeUnderWrites: regions split and merge back while four writers write
// across them; a write to a frozen region is retried once it is merged,
// so no caller sees one fail, and none is lost.
func mergeUnderWrites() {
	c := startCluster(raftstoretest.Options{})
	ctx := ctxFor(60 * time.Second)
	var (
		acked           sync.Map
		written, failed atomic.Int64
		stop            = make(chan struct{})
	)
	wg := writers(c, stop, &acked, &written, &failed)
	moreWrites := func() {
		want := written.Load() + 20
		Eventually(written.Load).WithTimeout(10 * time.Second).Should(BeNumerically(">=", want))
	}
	for _, at := range []int{500, 250, 750} {
		moreWrites()
		Expect(c.Split(ctx, key(at))).To(Succeed())
	}
	Expect(c.Regions()).To(HaveLen(4))
	for len(c.Regions()) > 1 {
		moreWrites()
		first := c.Regions()[0]
		_, err := c.Merge(ctx, first.ID)
		Expect(err).NotTo(HaveOccurred())
	}
	moreWrites()
	Expect(c.Split(ctx, key(600))).To(Succeed())
	moreWrites()
	close(stop)
	wg.Wait()
	Expect(failed.Load()).To(BeZero(), "a caller saw a write rejected")
	Expect(c.Regions()).To(HaveLen(2))
	everyRegionHasLeader(c)
	expectAcked(c, &acked)
}

// mergeThenRestart: each store restarts in turn after a merge, under
// writes; each loads the merged region, and nothing acknowledged is lost.
func mergeThenRestart() {
	c := startCluster(raftstoretest.Options{})
	ctx := ctxFor(60 * time.Second)
	var (
		acked           sync.Map
		written, failed atomic.Int64
		stop            = make(chan struct{})
	)
	wg := writers(c, stop, &acked, &written, &failed)
	moreWrites := func() {
		want := written.Load() + 20
		Eventually(written.Load).WithTimeout(10 * time.Second).Should(BeNumerically(">=", want))
	}
	moreWrites()
	Expect(c.Split(ctx, key(500))).To(Succeed())
	moreWrites()
	left, _ := c.RegionOf(key(0))
	_, err := c.Merge(ctx, left.ID)
	Expect(err).NotTo(HaveOccurred())
	for _, id := range c.IDs() {
		moreWrites()
		Expect(c.StopStore(id)).To(Succeed())
		Expect(c.StartStore(id)).To(Succeed())
		st, ok := c.Status(id, left.ID)
		Expect(ok).To(BeTrue())
		Expect(st.Region.Contains(key(999))).To(BeTrue(), "store %d loaded %s", id, st.Region.String())
	}
	moreWrites()
	close(stop)
	wg.Wait()
	Expect(failed.Load()).To(BeZero(), "a caller saw a write rejected")
	Expect(c.Regions()).To(HaveLen(1))
	everyRegionHasLeader(c)
	expectAcked(c, &acked)
}
