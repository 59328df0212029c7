package bench

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/bench/ycsbdb"
	"github.com/hedgekv/hedgekv/client"
)

// The delete-everything step (ScaleConfig.DeleteAll): last, every record
// is deleted through the client, and the scenario waits for the stores'
// merge checks to fold the emptied regions back together, then compares
// every region's replicas again. A store that only ever split would keep
// each emptied region, with its raft group, for good.

// Merge thresholds the servers get for the step: TiKV's defaults
// (max-merge-region-size 20 MiB, max-merge-region-keys 200,000).
const (
	deleteMergeMaxBytes = 20 << 20
	deleteMergeMaxKeys  = 200_000
)

// mergeMaxBytes is the servers' --merge-max-bytes for the step: TiKV's
// 20 MiB, or a third of the split size if less, so that the halves of a
// split are never merged back while the load goes on.
func (cfg *ScaleConfig) mergeMaxBytes() uint64 {
	split := cmp.Or(cfg.SplitMaxBytes, 64<<20) // the server's default
	return min(deleteMergeMaxBytes, split/3)
}

// ScaleDelete is what the delete-everything step measured.
type ScaleDelete struct {
	Deleted int64   `json:"deleted"`
	Failed  int64   `json:"failed"`
	Seconds float64 `json:"seconds"` // deleting, from the first scan to the last delete
	// RegionsBefore is the count when the deletes began; Target the count
	// the step waits for (the count before the load, plus one).
	RegionsBefore int `json:"regions_before"`
	Target        int `json:"target"`
	RegionsEnd    int `json:"regions_end"`
	// MergeSeconds runs from the last delete until the count reached
	// Target (Settled) or MergeWait passed.
	MergeSeconds float64 `json:"merge_seconds"`
	Settled      bool    `json:"settled"`
	// KeysLeft is what a scan of the table still finds at the end.
	KeysLeft int `json:"keys_left"`
	// Samples are (seconds since the deletes began, regions).
	Samples [][2]float64 `json:"samples"`
	// Check compares every region's replicas once the merges are done.
	Check ScaleCheck `json:"check"`
	Err   string     `json:"error,omitempty"`
}

// deleteScanPage is how many keys one scan of the deleting step reads.
const deleteScanPage = 1000

// deleteAll deletes every record, then waits for the merges.
func (st *scaleState) deleteAll(ctx context.Context) {
	if !st.cfg.DeleteAll {
		return
	}
	d := &ScaleDelete{Target: st.res.RegionsBefore + 1}
	st.res.Delete = d
	start := time.Now()
	sample := func() int {
		n, _, _, err := regionCount(ctx, st.admin)
		if err != nil {
			return -1
		}
		d.Samples = append(d.Samples, [2]float64{time.Since(start).Seconds(), float64(n)})
		return n
	}
	d.RegionsBefore = sample()
	st.prog.Step(fmt.Sprintf("delete %d records", st.res.Records), st.res.Records, 0)

	keys := make(chan []byte, 4*deleteScanPage)
	var deleted, failed atomic.Int64
	var wg sync.WaitGroup
	for range st.cfg.Threads {
		wg.Go(func() {
			for k := range keys {
				dctx, cancel := context.WithTimeout(ctx, st.cfg.OpTimeout)
				err := st.admin.Delete(dctx, k)
				cancel()
				if err != nil {
					failed.Add(1)
				} else {
					deleted.Add(1)
				}
				st.prog.Update(deleted.Load(), failed.Load())
			}
		})
	}
	stopSampling := make(chan struct{})
	var sampler sync.WaitGroup
	var sampleMu sync.Mutex
	sampler.Go(func() {
		for sleepCtxOr(ctx, stopSampling, st.cfg.Interval) {
			sampleMu.Lock()
			sample()
			sampleMu.Unlock()
		}
	})
	// The records' keys: go-ycsb's table, "usertable/" + key ('0'
	// follows '/').
	table, end := ycsbdb.RowKey("usertable", ""), []byte("usertable0")
	scanErr := st.scanKeys(ctx, table, end, keys)
	close(keys)
	wg.Wait()
	d.Deleted, d.Failed, d.Seconds = deleted.Load(), failed.Load(), time.Since(start).Seconds()
	if scanErr != nil {
		d.Err = scanErr.Error()
		st.errorf("delete everything: %v", scanErr)
	}
	st.prog.Printf("scale: deleted %d records in %.1fs (%d failed); waiting up to %v for the regions to merge to %d",
		d.Deleted, d.Seconds, d.Failed, st.cfg.MergeWait, d.Target)

	merging := time.Now()
	for {
		sampleMu.Lock()
		n := sample()
		sampleMu.Unlock()
		if n >= 0 {
			d.RegionsEnd = n
		}
		if n >= 0 && n <= d.Target {
			d.Settled = true
			break
		}
		if time.Since(merging) >= st.cfg.MergeWait || !sleepCtx(ctx, time.Second) {
			break
		}
	}
	d.MergeSeconds = time.Since(merging).Seconds()
	close(stopSampling)
	sampler.Wait()
	if left, err := st.admin.Scan(ctx, table, end, 10); err != nil {
		st.errorf("delete everything: scan after: %v", err)
	} else {
		d.KeysLeft = len(left)
	}
	st.prog.Printf("scale: %d regions %.1fs after the last delete (settled: %t); %d keys left", d.RegionsEnd, d.MergeSeconds, d.Settled, d.KeysLeft)
	if !d.Settled {
		st.errorf("delete everything: %d regions %.0fs after the last delete, want at most %d", d.RegionsEnd, d.MergeSeconds, d.Target)
	}
	st.memAndDisk("after deleting everything")
	d.Check = st.compareReplicas(ctx)
}

// scanKeys sends every key in [start, end) to keys, a page at a time.
func (st *scaleState) scanKeys(ctx context.Context, start, end []byte, keys chan<- []byte) error {
	from := start
	for {
		var page []client.KV
		var err error
		for range 5 { // a page is read again after a region error
			sctx, cancel := context.WithTimeout(ctx, st.cfg.OpTimeout)
			page, err = st.admin.Scan(sctx, from, end, deleteScanPage)
			cancel()
			if err == nil || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("scan from %q: %w", from, err)
		}
		for _, kv := range page {
			select {
			case keys <- kv.Key:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if len(page) < deleteScanPage {
			return nil
		}
		from = append(append([]byte(nil), page[len(page)-1].Key...), 0)
	}
}

// writeDelete writes the delete-everything step to the report.
func writeDelete(b *strings.Builder, d *ScaleDelete, wait time.Duration, mergeBytes uint64) {
	if d == nil {
		return
	}
	b.WriteString("\n## Delete everything, then merge\n\n")
	fmt.Fprintf(b, "Last, every record was deleted through the client (a scan of the table, %d keys a page, the deletes from the load's threads): **%d deleted** in %.1f s, %d failed. ",
		deleteScanPage, d.Deleted, d.Seconds, d.Failed)
	fmt.Fprintf(b, "The servers merge a region into its neighbour when both hold at most %s and %d keys (`--merge-max-bytes`, `--merge-max-keys`: TiKV's defaults, the size capped at a third of the split size). ",
		mb(int64(mergeBytes)), deleteMergeMaxKeys)
	verdict := fmt.Sprintf("did not reach %d within %v", d.Target, wait)
	if d.Settled {
		verdict = fmt.Sprintf("reached %d", d.Target)
	}
	fmt.Fprintf(b, "Regions: **%d** when the deletes began, **%d** %.1f s after the last one (the count before the load plus one: %s). A scan of the table found %d keys left.\n",
		d.RegionsBefore, d.RegionsEnd, d.MergeSeconds, verdict, d.KeysLeft)
	if len(d.Samples) > 1 {
		b.WriteString("\n| s since the deletes began | regions |\n| --- | --- |\n")
		step := max(1, len(d.Samples)/20)
		for i, s := range d.Samples {
			if i%step == 0 || i == len(d.Samples)-1 {
				fmt.Fprintf(b, "| %.0f | %.0f |\n", s[0], s[1])
			}
		}
	}
	if d.Err != "" {
		fmt.Fprintf(b, "\nError: %s\n", inlineCode(d.Err))
	}
	b.WriteString("\nAfter the merges:")
	writeCheckResult(b, d.Check)
}
