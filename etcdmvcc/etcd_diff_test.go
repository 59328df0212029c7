package etcdmvcc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// The differential test: random requests through clientv3's connection to
// a real etcd, and through CheckRequest, Apply and Range to a MemStore,
// revisions counted alike (etcd starts at 1; a request that changes
// nothing takes none), answers compared field by field, then every event
// against an etcd watch of the whole keyspace and every revision's state.
//
// ETCDMVCC_DIFF_OPS (default 3000) and ETCDMVCC_DIFF_SEED set the run.

// findEtcd returns the etcd binary the test runs: $ETCD_BIN (relative to
// the package or the module root), else etcd on PATH, else the module's
// .tools/etcd (make etcd). Without one the test fails: CI installs Debian's
// etcd-server.
func findEtcd(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ETCD_BIN"); p != "" {
		// go test runs in the package's directory: a relative path may be
		// meant from the module root, where go test was typed.
		if root, err := moduleRoot(); err == nil && !filepath.IsAbs(p) {
			if _, err := os.Stat(p); err != nil {
				p = filepath.Join(root, p)
			}
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("ETCD_BIN=%s: %v", os.Getenv("ETCD_BIN"), err)
		}
		return p
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	if root, err := moduleRoot(); err == nil {
		p := filepath.Join(root, ".tools", "etcd")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	const why = "no etcd binary: the differential test needs a real etcd. Install Debian's etcd-server " +
		"(apt-get install etcd-server, as CI's .ci/run does), or run `make etcd` at the module root " +
		"(builds .tools/etcd from the Go module proxy), or set ETCD_BIN to an etcd binary"
	if testing.Short() {
		// make check, the developer's fast loop; make test (CI) fails.
		t.Skip(why)
	}
	t.Fatal(why)
	return ""
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// etcdVersion reads the binary's --version: etcd's major and minor, and
// the Go release that built it ("go1.26").
func etcdVersion(t *testing.T, bin string) (major, minor int, goRelease string) {
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	major = -1
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "etcd Version: "); ok {
			parts := strings.SplitN(v, ".", 3)
			if len(parts) >= 2 {
				major, _ = strconv.Atoi(parts[0])
				minor, _ = strconv.Atoi(parts[1])
			}
		}
		if v, ok := strings.CutPrefix(line, "Go Version: "); ok {
			goRelease = goMinor(v)
		}
	}
	if major < 0 {
		t.Fatalf("%s --version: no version in\n%s", bin, out)
	}
	return major, minor, goRelease
}

// goMinor is "go1.26" of "go1.26.8".
func goMinor(v string) string {
	if parts := strings.SplitN(v, ".", 3); len(parts) >= 2 {
		return parts[0] + "." + parts[1]
	}
	return v
}

// startEtcd runs one etcd member on free loopback ports with a temporary
// data directory, stopped when the test ends, and returns its client URL.
func startEtcd(t *testing.T, bin string) (string, *syncBuffer) {
	t.Helper()
	help, _ := exec.Command(bin, "--help").CombinedOutput()
	for attempt := 0; ; attempt++ {
		client := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		args := []string{
			"--name", "etcdmvcc-diff",
			"--data-dir", dataDir(t, help),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "etcdmvcc-diff=" + peer,
			"--logger", "zap", "--log-level", "error",
		}
		if bytes.Contains(help, []byte("--unsafe-no-fsync")) {
			args = append(args, "--unsafe-no-fsync")
		}
		logs := &syncBuffer{}
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", bin, err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		stop := func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		}
		ready := make(chan error, 1)
		go func() { ready <- waitReady(client, 30*time.Second) }()
		select {
		case err := <-ready:
			if err == nil {
				t.Cleanup(stop)
				return client, logs
			}
			stop()
			t.Fatalf("etcd at %s not ready: %v\n%s", client, err, logs.String())
		case err := <-exited:
			// A port taken between freePort and etcd's bind: try others.
			if attempt < 3 && strings.Contains(logs.String(), "address already in use") {
				continue
			}
			t.Fatalf("etcd exited: %v\n%s", err, logs.String())
		}
	}
}

// syncBuffer is etcd's log, written by the process and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// dataDir is a temporary directory for etcd's data: in memory (/dev/shm)
// when etcd cannot be told not to fsync (before 3.5), so that its fsyncs
// cost nothing either.
func dataDir(t *testing.T, help []byte) string {
	if !bytes.Contains(help, []byte("--unsafe-no-fsync")) {
		if dir, err := os.MkdirTemp("/dev/shm", "etcdmvcc-diff-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

func waitReady(url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "health")
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func envInt(t *testing.T, name string, def int64) int64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return v
}

func TestDifferentialEtcd(t *testing.T) {
	bin := findEtcd(t)
	major, minor, etcdGo := etcdVersion(t, bin)
	t.Logf("etcd %s: v%d.%d built with %s", bin, major, minor, etcdGo)
	url, logs := startEtcd(t, bin)
	defer func() {
		if t.Failed() {
			t.Logf("etcd's log:\n%s", logs.String())
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	d := &differ{
		t:       t,
		ctx:     ctx,
		kv:      pb.NewKVClient(cli.ActiveConnection()),
		ms:      NewMemStore(),
		rev:     1,
		version: [2]int{major, minor},
		// sort.Sort leaves ties in an order that its algorithm decides, and
		// Go releases have changed it (etcd 3.4.23 in Debian: go1.19): with
		// another Go release than this test's, ties are compared as sets.
		exactTies: etcdGo == goMinor(runtime.Version()),
	}
	if !d.exactTies {
		t.Logf("etcd built with %s, this test with %s: the order of sort ties is not compared", etcdGo, runtime.Version())
	}
	seed := envInt(t, "ETCDMVCC_DIFF_SEED", time.Now().UnixNano())
	ops := int(envInt(t, "ETCDMVCC_DIFF_OPS", 3000))
	t.Logf("seed %d (ETCDMVCC_DIFF_SEED), %d ops (ETCDMVCC_DIFF_OPS)", seed, ops)
	d.rnd = rand.New(rand.NewPCG(uint64(seed), 0))

	// Two leases that outlive the test; puts also name a third, missing one.
	lc := pb.NewLeaseClient(cli.ActiveConnection())
	for range 2 {
		lr, err := lc.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 3600})
		if err != nil {
			t.Fatal(err)
		}
		d.leases = append(d.leases, lr.ID)
		d.ms.GrantLease(lr.ID)
	}
	d.leases = append(d.leases, 0x6d697373696e67) // never granted

	// Every event of the run, from etcd's side.
	w := &watchLog{}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := cli.Watch(wctx, "\x00", clientv3.WithFromKey(), clientv3.WithPrevKV(), clientv3.WithRev(2))
	go w.run(wch)

	// The store starts at revision 1, as MemStore's counter does.
	if r, err := d.kv.Range(ctx, &pb.RangeRequest{Key: []byte("x")}); err != nil {
		t.Fatal(err)
	} else if r.Header.Revision != 1 {
		t.Fatalf("a fresh etcd at revision %d, want 1", r.Header.Revision)
	}

	d.outcomes = map[string]int{}
	for i := range ops {
		d.step = i
		d.randomOp(w)
		if t.Failed() {
			t.FailNow()
		}
	}
	t.Logf("%d requests, final revision %d, compacted at %d, %d events; outcomes:", ops, d.rev, d.ms.CompactRev(), len(d.events))
	for _, k := range slices.Sorted(maps.Keys(d.outcomes)) {
		t.Logf("  %5d %s", d.outcomes[k], k)
	}

	// Every revision still held, whole keyspace.
	from := max(d.ms.CompactRev(), 1)
	for r := from; r <= d.rev; r++ {
		d.rangeOp(&pb.RangeRequest{Key: []byte("\x00"), RangeEnd: []byte("\x00"), Revision: r})
	}

	// Every event, in order, with prev_kv.
	got := w.wait(len(d.events), 30*time.Second)
	if len(got) != len(d.events) {
		t.Fatalf("etcd's watch gave %d events, Apply %d", len(got), len(d.events))
	}
	for i, ev := range d.events {
		if ev.Rev.Main != got[i].Kv.ModRevision || !proto.Equal(ev.Event, got[i]) {
			t.Fatalf("event %d: etcd\n%s\netcdmvcc (%v)\n%s", i, prototext.Format(got[i]), ev.Rev, prototext.Format(ev.Event))
		}
		if i > 0 && ev.Rev.Compare(d.events[i-1].Rev) <= 0 {
			t.Fatalf("event %d at %v after %v", i, ev.Rev, d.events[i-1].Rev)
		}
	}
	t.Logf("%d revisions read back, %d events equal", d.rev-from+1, len(d.events))

	if d.atLeast(3, 6) {
		d.watchFromCompaction(cli)
	} else {
		// Before etcd PR #18274 (3.6; backported in #18474 and #18475 to
		// 3.5 and 3.4 patch releases of late 2024) a compaction dropped a
		// deletion at exactly its revision, and a watch from there missed
		// it (etcd issue #18089).
		t.Logf("etcd v%d.%d: watch from a compaction not compared", major, minor)
	}
}

// watchFromCompaction compacts both at the last revision that deleted a key
// and compares etcd's watch from there (prev_kv on) with the events the
// MemStore's remaining history yields: the compaction must have kept the
// deletion at the compaction revision, as etcd's does, and everything after.
func (d *differ) watchFromCompaction(cli *clientv3.Client) {
	t := d.t
	var at int64
	for _, ev := range d.events {
		if ev.Event.Type == mvccpb.Event_DELETE && ev.Rev.Main > d.ms.CompactRev() {
			at = ev.Rev.Main
		}
	}
	if at == 0 {
		t.Log("no deletion after the last compaction: no watch from a compaction")
		return
	}
	if err := CheckCompact(at, d.ms.CompactRev(), d.rev); err != nil {
		t.Fatal(err)
	}
	if _, err := d.kv.Compact(d.ctx, &pb.CompactionRequest{Revision: at, Physical: true}); err != nil {
		t.Fatal(err)
	}
	if err := d.ms.Compact(at); err != nil {
		t.Fatal(err)
	}
	want := replay(d.ms, at)

	w := &watchLog{}
	ctx, cancel := context.WithCancel(d.ctx)
	defer cancel()
	go w.run(cli.Watch(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithPrevKV(), clientv3.WithRev(at)))
	got := w.wait(len(want), 30*time.Second)
	if w.err != nil || len(got) != len(want) {
		t.Fatalf("watch from compaction at %d: etcd gave %d events (%v), the history %d", at, len(got), w.err, len(want))
	}
	for i := range want {
		if !proto.Equal(want[i].Event, got[i]) {
			t.Fatalf("watch from compaction at %d, event %d: etcd\n%s\nhistory (%v)\n%s", at, i, prototext.Format(got[i]), want[i].Rev, prototext.Format(want[i].Event))
		}
	}
	t.Logf("compacted at %d (a deletion's revision): %d events from there equal", at, len(want))
}

// replay is what a watch from revision from catches up with, from m's
// history: every change at or after from, in revision order, with prev_kv
// as etcd's watch server reads it (the key at ModRevision-1, when that is
// not compacted and the event is not a creation).
func replay(m *MemStore, from int64) []Event {
	var out []Event
	m.hist.Ascend(func(it histItem) bool {
		if it.rev.Main < from {
			return true
		}
		ev := &mvccpb.Event{}
		if it.rec.Kind == KindPut {
			ev.Kv = it.rec.Record(it.rev.Main).KeyValue(it.key)
		} else {
			ev.Type = mvccpb.Event_DELETE
			ev.Kv = &mvccpb.KeyValue{Key: it.key, ModRevision: it.rev.Main}
		}
		creation := it.rec.Kind == KindPut && it.rec.CreateRev == it.rev.Main
		if prevRev := it.rev.Main - 1; !creation && prevRev >= m.CompactRev() {
			if rec, ok, _ := m.GetAt(it.key, prevRev); ok {
				ev.PrevKv = rec.KeyValue(it.key)
			}
		}
		out = append(out, Event{Rev: it.rev, Event: ev})
		return true
	})
	slices.SortFunc(out, func(a, b Event) int { return a.Rev.Compare(b.Rev) })
	return out
}

// watchLog collects a watch's events.
type watchLog struct {
	mu     sync.Mutex
	events []*mvccpb.Event
	rev    int64 // highest revision seen
	err    error
}

func (w *watchLog) run(ch clientv3.WatchChan) {
	for resp := range ch {
		w.mu.Lock()
		if err := resp.Err(); err != nil && w.err == nil {
			w.err = err
		}
		for _, ev := range resp.Events {
			w.events = append(w.events, ev)
			w.rev = max(w.rev, ev.Kv.ModRevision)
		}
		w.mu.Unlock()
	}
}

func (w *watchLog) seen() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rev
}

func (w *watchLog) wait(n int, within time.Duration) []*mvccpb.Event {
	deadline := time.Now().Add(within)
	for {
		w.mu.Lock()
		if len(w.events) >= n || w.err != nil || time.Now().After(deadline) {
			out := w.events
			w.mu.Unlock()
			return out
		}
		w.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
}

type differ struct {
	t      *testing.T
	ctx    context.Context
	kv     pb.KVClient
	ms     *MemStore
	rev    int64 // etcd's current revision, and MemStore's
	rnd    *rand.Rand
	leases []int64
	events []Event
	step   int
	named  [][]byte // keys the request being built names
	// outcomes counts requests by kind and result, to show what a run covered.
	outcomes map[string]int
	version  [2]int // etcd's major and minor
	// exactTies: etcd was built with this test's Go release, so sorted
	// Ranges must give ties in the same order.
	exactTies bool
}

// atLeast says whether the etcd run is major.minor or later.
func (d *differ) atLeast(major, minor int) bool {
	return d.version[0] > major || (d.version[0] == major && d.version[1] >= minor)
}

// The keys: a few families, bytes that sort at the edges, and under k/ more
// than the 12 keys below which sort.Sort is an insertion sort (stable: a
// sort that differs from etcd's only on ties would pass with fewer).
var (
	diffKeys = append([]string{"a", "a/1", "a/2", "a/3", "a\x00b", "b", "b/x", "c", "c0", "foo", "foo/bar", "z", "\xff"},
		func() (ks []string) {
			for i := range 20 {
				ks = append(ks, fmt.Sprintf("k/%02d", i))
			}
			return ks
		}()...)
	diffVals = []string{"", "v1", "v2", "v3", "x"}
)

// key is often one the request already named, so that its operations meet:
// a nested Txn compares a key an earlier operation wrote, a Range reads it.
func (d *differ) key() []byte {
	if d.rnd.IntN(200) == 0 {
		return nil // ErrGRPCEmptyKey
	}
	if len(d.named) > 0 && d.rnd.IntN(5) < 2 {
		return d.named[d.rnd.IntN(len(d.named))]
	}
	k := []byte(diffKeys[d.rnd.IntN(len(diffKeys))])
	d.named = append(d.named, k)
	return k
}

// rangeEnd: one key, to the end, the key's prefix, or another key (which
// may be before it: an empty range).
func (d *differ) rangeEnd(key []byte) []byte {
	switch d.rnd.IntN(6) {
	case 0, 1:
		return nil
	case 2:
		return []byte{0}
	case 3:
		if d.rnd.IntN(2) == 0 {
			return []byte("k0") // with a key under k/, the rest of k/
		}
		return []byte(clientv3.GetPrefixRangeEnd(string(key)))
	}
	return []byte(diffKeys[d.rnd.IntN(len(diffKeys))])
}

// randRev is around the revisions that exist: negative, compacted, held,
// current, future.
func (d *differ) randRev() int64 {
	switch d.rnd.IntN(8) {
	case 0:
		return -d.rnd.Int64N(3)
	case 1:
		return d.rev + 1 + d.rnd.Int64N(2)
	case 2:
		return d.rev
	}
	return d.rnd.Int64N(d.rev + 1)
}

func (d *differ) randRange() *pb.RangeRequest {
	key := d.key()
	r := &pb.RangeRequest{Key: key, RangeEnd: d.rangeEnd(key), Serializable: d.rnd.IntN(2) == 0}
	if d.rnd.IntN(3) == 0 {
		r.Limit = []int64{-1, 1, 2, 3, 5}[d.rnd.IntN(5)]
	}
	if d.rnd.IntN(3) == 0 {
		r.Revision = d.randRev()
	}
	if d.rnd.IntN(2) == 0 {
		r.SortOrder = pb.RangeRequest_SortOrder(d.rnd.IntN(3))
		r.SortTarget = pb.RangeRequest_SortTarget(d.rnd.IntN(5))
		if d.rnd.IntN(100) == 0 && d.atLeast(3, 5) {
			r.SortOrder = 7 // ErrGRPCInvalidSortOption, checked since etcd 3.5
		}
	}
	if !d.exactTies && !isDefaultOrdering(r.SortTarget, r.SortOrder) {
		// A limit may cut through ties, and which of them come back
		// depends on the sort algorithm (see exactTies).
		r.Limit = 0
	}
	r.KeysOnly = d.rnd.IntN(5) == 0
	r.CountOnly = d.rnd.IntN(8) == 0
	if d.rnd.IntN(4) == 0 {
		switch d.rnd.IntN(4) {
		case 0:
			r.MinModRevision = d.rnd.Int64N(d.rev + 1)
		case 1:
			r.MaxModRevision = d.rnd.Int64N(d.rev + 1)
		case 2:
			r.MinCreateRevision = d.rnd.Int64N(d.rev + 1)
		case 3:
			r.MaxCreateRevision = d.rnd.Int64N(d.rev + 1)
		}
	}
	return r
}

func (d *differ) randPut() *pb.PutRequest {
	p := &pb.PutRequest{Key: d.key(), Value: []byte(diffVals[d.rnd.IntN(len(diffVals))]), PrevKv: d.rnd.IntN(2) == 0}
	if d.rnd.IntN(3) == 0 {
		p.Lease = d.leases[d.rnd.IntN(len(d.leases))]
	}
	if d.rnd.IntN(8) == 0 {
		p.IgnoreValue = true
		if d.rnd.IntN(8) != 0 {
			p.Value = nil
		}
	}
	if d.rnd.IntN(8) == 0 {
		p.IgnoreLease = true
		if d.rnd.IntN(8) != 0 {
			p.Lease = 0
		}
	}
	if p.IgnoreValue && p.Lease == d.leases[2] && !d.atLeast(3, 7) {
		// Before 3.7 a put in a Txn checked the key before the lease (3.7's
		// checkPut the lease first): one error, not both, on older etcd.
		p.Lease = 0
	}
	return p
}

func (d *differ) randDelete() *pb.DeleteRangeRequest {
	key := d.key()
	return &pb.DeleteRangeRequest{Key: key, RangeEnd: d.rangeEnd(key), PrevKv: d.rnd.IntN(2) == 0}
}

func (d *differ) randCompare() *pb.Compare {
	key := d.key()
	c := &pb.Compare{Key: key, Result: pb.Compare_CompareResult(d.rnd.IntN(4)), Target: pb.Compare_CompareTarget(d.rnd.IntN(5))}
	if d.rnd.IntN(4) == 0 {
		c.RangeEnd = d.rangeEnd(key)
	}
	target := c.Target
	if d.rnd.IntN(20) == 0 {
		target = pb.Compare_CompareTarget(d.rnd.IntN(5)) // a union that does not match the target
	}
	near := max(d.rev-d.rnd.Int64N(4), 0)
	switch target {
	case pb.Compare_VERSION:
		c.TargetUnion = &pb.Compare_Version{Version: d.rnd.Int64N(4)}
	case pb.Compare_CREATE:
		c.TargetUnion = &pb.Compare_CreateRevision{CreateRevision: near}
	case pb.Compare_MOD:
		c.TargetUnion = &pb.Compare_ModRevision{ModRevision: near}
	case pb.Compare_VALUE:
		c.TargetUnion = &pb.Compare_Value{Value: []byte(diffVals[d.rnd.IntN(len(diffVals))])}
	case pb.Compare_LEASE:
		c.TargetUnion = &pb.Compare_Lease{Lease: []int64{0, d.leases[0], d.leases[1]}[d.rnd.IntN(3)]}
	}
	return c
}

func (d *differ) randOps(depth, n int) []*pb.RequestOp {
	var ops []*pb.RequestOp
	for range d.rnd.IntN(n + 1) {
		switch k := d.rnd.IntN(10); {
		case k < 3:
			r := d.randRange()
			if !d.atLeast(3, 6) {
				// Before 3.6 a Txn's checks ran in two passes, every put
				// then every range; 3.6 checks operations in order. Without
				// a revision a Range has no check to order.
				r.Revision = 0
			}
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}})
		case k < 6:
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: d.randPut()}})
		case k < 8:
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: d.randDelete()}})
		case depth < 2:
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: d.randTxn(depth + 1)}})
		}
	}
	return ops
}

func (d *differ) randTxn(depth int) *pb.TxnRequest {
	t := &pb.TxnRequest{}
	for range d.rnd.IntN(4) {
		t.Compare = append(t.Compare, d.randCompare())
	}
	t.Success = d.randOps(depth, 4)
	t.Failure = d.randOps(depth, 3)
	if depth == 0 && d.rnd.IntN(150) == 0 { // ErrGRPCTooManyOps
		for range DefaultMaxTxnOps + 1 {
			t.Success = append(t.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("a")}}})
		}
	}
	return t
}

// randomOp runs one random request on both and compares.
func (d *differ) randomOp(w *watchLog) {
	d.named = d.named[:0]
	switch k := d.rnd.IntN(100); {
	case k < 22:
		d.write(&pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: d.randPut()}})
	case k < 32:
		d.write(&pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: d.randDelete()}})
	case k < 70:
		d.write(&pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: d.randTxn(0)}})
	case k < 99:
		d.rangeOp(d.randRange())
	default:
		d.compact(w)
	}
}

// outcome counts one request's kind and result.
func (d *differ) outcome(kind string, err error, detail string) {
	switch {
	case err != nil:
		kind += ": " + status.Convert(err).Message()
	case detail != "":
		kind += ": " + detail
	}
	d.outcomes[kind]++
}

func (d *differ) fail(req proto.Message, format string, args ...any) {
	d.t.Helper()
	d.t.Errorf("step %d, revision %d: %s\nrequest:\n%s", d.step, d.rev, fmt.Sprintf(format, args...), prototext.Format(req))
}

// sameErr compares etcd's gRPC error with ours (nil or an rpctypes.ErrGRPC*).
func sameErr(etcdErr, ours error) bool {
	if etcdErr == nil || ours == nil {
		return etcdErr == nil && ours == nil
	}
	a, b := status.Convert(etcdErr), status.Convert(ours)
	return a.Code() == b.Code() && a.Message() == b.Message()
}

func (d *differ) write(req *pb.RequestOp) {
	d.t.Helper()
	ours := CheckRequest(req, DefaultMaxTxnOps)
	var resp *pb.ResponseOp
	a := &applier{base: d.ms, rev: d.rev + 1, dirty: map[string]*dirtyEntry{}}
	if ours == nil {
		resp, ours = a.apply(req)
	}
	writes, events := a.writes, a.events
	if a.etcdPanics {
		d.outcome(writeKind(req), nil, "not sent: etcd's apply panics on it")
		return
	}

	var etcdResp proto.Message
	var header *pb.ResponseHeader
	var err error
	switch r := req.Request.(type) {
	case *pb.RequestOp_RequestPut:
		var resp *pb.PutResponse
		if resp, err = d.kv.Put(d.ctx, r.RequestPut); err == nil {
			header, resp.Header, etcdResp = resp.Header, nil, resp
		}
	case *pb.RequestOp_RequestDeleteRange:
		var resp *pb.DeleteRangeResponse
		if resp, err = d.kv.DeleteRange(d.ctx, r.RequestDeleteRange); err == nil {
			header, resp.Header, etcdResp = resp.Header, nil, resp
		}
	case *pb.RequestOp_RequestTxn:
		var resp *pb.TxnResponse
		if resp, err = d.kv.Txn(d.ctx, r.RequestTxn); err == nil {
			header, resp.Header, etcdResp = resp.Header, nil, resp
		}
	}
	if !sameErr(err, ours) {
		d.fail(req, "etcd: %v, etcdmvcc: %v", err, ours)
		return
	}
	d.outcome(writeKind(req), err, writeDetail(resp, len(writes)))
	if err != nil {
		return
	}
	if len(writes) > 0 {
		d.rev++
		if err := Commit(d.ms, writes); err != nil {
			d.t.Fatal(err)
		}
		d.events = append(d.events, events...)
	}
	if header.Revision != d.rev {
		d.fail(req, "etcd's header revision %d, etcdmvcc's %d (%d writes)", header.Revision, d.rev, len(writes))
	}
	var got proto.Message
	switch r := resp.Response.(type) {
	case *pb.ResponseOp_ResponsePut:
		got = r.ResponsePut
	case *pb.ResponseOp_ResponseDeleteRange:
		got = r.ResponseDeleteRange
	case *pb.ResponseOp_ResponseTxn:
		got = r.ResponseTxn
		eachRange(req.GetRequestTxn(), etcdResp.(*pb.TxnResponse), d.normalize)
		eachRange(req.GetRequestTxn(), r.ResponseTxn, d.normalize)
	}
	if !proto.Equal(etcdResp, got) {
		d.fail(req, "etcd:\n%s\netcdmvcc:\n%s", prototext.Format(etcdResp), prototext.Format(got))
	}
}

func (d *differ) rangeOp(req *pb.RangeRequest) {
	d.t.Helper()
	etcdResp, err := d.kv.Range(d.ctx, req)
	ours := CheckRequest(&pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: req}}, DefaultMaxTxnOps)
	var got *pb.RangeResponse
	if ours == nil {
		var atRev int64
		if atRev, ours = ReadRev(req.Revision, d.ms.CompactRev(), d.rev); ours == nil {
			got, ours = Range(d.ms, req, atRev)
		}
	}
	if !sameErr(err, ours) {
		d.fail(req, "etcd: %v, etcdmvcc: %v", err, ours)
		return
	}
	detail := "current"
	if req.Revision > 0 && req.Revision < d.rev {
		detail = "historical"
	}
	if err == nil && len(got.Kvs) == 0 && !req.CountOnly {
		detail += ", empty"
	}
	d.outcome("range", err, detail)
	if err != nil {
		return
	}
	if etcdResp.Header.Revision != d.rev {
		d.fail(req, "etcd's header revision %d, ours %d", etcdResp.Header.Revision, d.rev)
	}
	etcdResp.Header = nil
	d.normalize(req, etcdResp)
	d.normalize(req, got)
	if !proto.Equal(etcdResp, got) {
		d.fail(req, "etcd:\n%s\netcdmvcc:\n%s", prototext.Format(etcdResp), prototext.Format(got))
	}
}

// normalize undoes, in a Range response, what differs between etcd
// releases and is not a difference of etcdmvcc's: before 3.7, keys_only
// kept each key's lease (3.7 reads keys_only from the index, FastKeysOnly,
// and leaves it out, as etcdmvcc does); and with etcd built by another Go
// release, the order of sort ties (the kvs are then stably re-sorted by the
// sort target, then key).
func (d *differ) normalize(req *pb.RangeRequest, resp *pb.RangeResponse) {
	if !d.atLeast(3, 7) && req.GetKeysOnly() && req.GetSortTarget() != pb.RangeRequest_VALUE {
		for _, kv := range resp.Kvs {
			kv.Lease = 0
		}
	}
	if d.exactTies || isDefaultOrdering(req.GetSortTarget(), req.GetSortOrder()) && req.GetSortTarget() == pb.RangeRequest_KEY {
		return
	}
	cmp := func(a, b *mvccpb.KeyValue) int {
		switch req.GetSortTarget() {
		case pb.RangeRequest_VERSION:
			return compareInt64(a.Version, b.Version)
		case pb.RangeRequest_CREATE:
			return compareInt64(a.CreateRevision, b.CreateRevision)
		case pb.RangeRequest_MOD:
			return compareInt64(a.ModRevision, b.ModRevision)
		case pb.RangeRequest_VALUE:
			return bytes.Compare(a.Value, b.Value)
		}
		return 0
	}
	slices.SortStableFunc(resp.Kvs, func(a, b *mvccpb.KeyValue) int {
		if c := cmp(a, b); c != 0 {
			return c
		}
		return bytes.Compare(a.Key, b.Key)
	})
}

// eachRange calls fn with every Range of the branch a Txn response took,
// nested Txns included, and its response.
func eachRange(req *pb.TxnRequest, resp *pb.TxnResponse, fn func(*pb.RangeRequest, *pb.RangeResponse)) {
	ops := req.Success
	if !resp.Succeeded {
		ops = req.Failure
	}
	for i, op := range ops {
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			fn(r.RequestRange, resp.Responses[i].GetResponseRange())
		case *pb.RequestOp_RequestTxn:
			eachRange(r.RequestTxn, resp.Responses[i].GetResponseTxn(), fn)
		}
	}
}

func (d *differ) compact(w *watchLog) {
	d.t.Helper()
	// Mostly a step that keeps 100 revisions of history readable; sometimes
	// at or below the last compaction, or in the future (both refused).
	rev := d.rev - 100 - d.rnd.Int64N(20)
	switch d.rnd.IntN(6) {
	case 0:
		rev = d.ms.CompactRev() - d.rnd.Int64N(2)
	case 1:
		rev = d.rev + 1
	}
	// The watch must not fall behind a compaction (it would be canceled):
	// compact only what it has seen.
	if rev > d.ms.CompactRev() && rev <= d.rev {
		rev = min(rev, w.seen())
	}
	req := &pb.CompactionRequest{Revision: rev}
	resp, err := d.kv.Compact(d.ctx, req)
	ours := CheckCompact(rev, d.ms.CompactRev(), d.rev)
	if !sameErr(err, ours) {
		d.fail(req, "etcd: %v, etcdmvcc: %v", err, ours)
		return
	}
	d.outcome("compact", err, "")
	if err != nil {
		return
	}
	if resp.Header.Revision != d.rev {
		d.fail(req, "etcd's header revision %d, ours %d", resp.Header.Revision, d.rev)
	}
	if err := d.ms.Compact(rev); err != nil {
		d.t.Fatal(err)
	}
}

func writeKind(req *pb.RequestOp) string {
	switch req.Request.(type) {
	case *pb.RequestOp_RequestPut:
		return "put"
	case *pb.RequestOp_RequestDeleteRange:
		return "delete"
	}
	return "txn"
}

func writeDetail(resp *pb.ResponseOp, writes int) string {
	detail := "no change"
	if writes > 0 {
		detail = "changed"
	}
	if t := resp.GetResponseTxn(); t != nil {
		if t.Succeeded {
			return detail + ", then"
		}
		return detail + ", else"
	}
	return detail
}
