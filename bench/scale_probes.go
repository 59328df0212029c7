package bench

// What the scale scenario asks of the cluster and its store processes
// between phases: region counts, readiness, memory, disk.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hedgekv/hedgekv/client"
)

// regionCount counts the cluster's regions, those whose size the leader
// has counted, and the bytes they hold.
func regionCount(ctx context.Context, cli *client.Client) (n, known int, bytes int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	regions, err := cli.Regions(ctx)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("regions: %w", err)
	}
	for _, r := range regions {
		if r.SizeKnown {
			known++
			bytes += int64(r.ApproximateBytes)
		}
	}
	return len(regions), known, bytes, nil
}

// sleepCtx sleeps d, or less if ctx ends (then false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	return sleepCtxOr(ctx, nil, d)
}

// sleepCtxOr is sleepCtx, also cut short (false) when stop is closed.
func sleepCtxOr(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	}
}

// waitReadyz polls http://addr/readyz until it answers 200.
func waitReadyz(ctx context.Context, addr string) error {
	hc := &http.Client{Timeout: time.Second}
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("readyz: %w", err)
		}
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		if !sleepCtx(ctx, 20*time.Millisecond) {
			return fmt.Errorf("%s/readyz never answered 200 (last: %s): %w", addr, last, ctx.Err())
		}
	}
}

// readStoreMem reads a process's resident memory from /proc/PID/status
// (Linux): RssAnon (heap, stacks), RssFile (mapped files: bbolt's mmap of
// store.db, the binary), RssShmem.
func readStoreMem(pid int) StoreMem {
	m := StoreMem{PID: pid}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		m.Err = err.Error()
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) != 2 || fs[1] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(fs[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			m.RSS = n << 10
		case "RssAnon":
			m.Anon = n << 10
		case "RssFile":
			m.File = n << 10
		case "RssShmem":
			m.Shmem = n << 10
		}
	}
	if err := sc.Err(); err != nil {
		m.Err = err.Error()
	}
	return m
}

// boltBuckets opens a stopped store's store.db read-only and sizes each
// top-level bucket (keys, and bytes of the pages in use).
func boltBuckets(path string) ([]BucketStat, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	var out []BucketStat
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			s := b.Stats()
			out = append(out, BucketStat{Name: string(name), Keys: s.KeyN, Bytes: int64(s.BranchInuse + s.LeafInuse)})
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}
