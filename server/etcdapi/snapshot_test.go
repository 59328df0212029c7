package etcdapi_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hedgekv/hedgekv/cluster"
	"github.com/hedgekv/hedgekv/server/etcdapi"
)

// TestSnapshotRoundTripUnderLoad: a snapshot taken through clientv3
// while a writer keeps writing holds exactly the keyspace at its header's
// revision R, and its history from the compaction on (every revision's
// Range agrees with the file's replay); its sha256 trailer is etcd's; and
// restored into a new cluster it gives back every key with its value,
// revisions and version, the same Ranges at old revisions, the same
// watch history, ErrCompacted below the compaction, and revision R+1 for
// the next write. A restore that is under way refuses reads and writes,
// resumes when run again, and a second restore is refused.
func TestSnapshotRoundTripUnderLoad(t *testing.T) {
	t.Parallel()
	a := startCluster(t)
	ctx := ctxFor(t, 120*time.Second)
	cli := client(t, a.Endpoints[0])

	// History: puts, overwrites, deletes, a multi-op Txn (sub-revisions),
	// keys with NUL bytes, then a compaction in the middle of it.
	for i := range 60 {
		if _, err := cli.Put(ctx, fmt.Sprintf("h/k%02d", i%20), fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
		if i%7 == 6 {
			if _, err := cli.Delete(ctx, fmt.Sprintf("h/k%02d", (i+3)%20)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := cli.Txn(ctx).Then(clientv3.OpPut("t/a", "1"), clientv3.OpPut("t/b\x00z", "2"), clientv3.OpDelete("h/k01"), clientv3.OpPut("\x00nul", "3")).Commit(); err != nil {
		t.Fatal(err)
	}
	mid, err := cli.Put(ctx, "h/mid", "m")
	if err != nil {
		t.Fatal(err)
	}
	compact := mid.Header.Revision - 15
	if _, err := cli.Compact(ctx, compact); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := cli.Put(ctx, fmt.Sprintf("h/k%02d", i), "after"); err != nil {
			t.Fatal(err)
		}
	}

	// A writer through another store, during the snapshot.
	wctx, stopWriter := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var wmu sync.Mutex
	var written []int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		w := client(t, a.Endpoints[2])
		for i := 0; wctx.Err() == nil; i++ {
			var rev int64
			if i%5 == 4 {
				r, err := w.Delete(wctx, fmt.Sprintf("load/%03d", (i-1)%300))
				if err != nil {
					break
				}
				rev = r.Header.Revision
			} else {
				r, err := w.Put(wctx, fmt.Sprintf("load/%03d", i%300), fmt.Sprint(i))
				if err != nil {
					break
				}
				rev = r.Header.Revision
			}
			wmu.Lock()
			written = append(written, rev)
			wmu.Unlock()
		}
	}()
	waitWrites := func(n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			wmu.Lock()
			got := len(written)
			wmu.Unlock()
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the writer wrote %d, want %d", got, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitWrites(50)

	// The snapshot, through a store that does not lead the keyspace: it
	// forwards the stream from the leader's.
	follower := ""
	for _, ep := range a.Endpoints {
		if st, err := cli.Status(ctx, ep); err == nil && st.Leader != st.Header.MemberId {
			follower = ep
		}
	}
	if follower == "" {
		t.Fatal("no follower of the etcd keyspace")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "snap.db")
	snapCli := client(t, follower)
	resp, err := snapCli.SnapshotWithVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Snapshot)
	resp.Snapshot.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	rev := resp.Header.GetRevision()
	wmu.Lock()
	n := len(written)
	wmu.Unlock()
	waitWrites(n + 20)
	stopWriter()
	wg.Wait()
	wmu.Lock()
	before, after := 0, 0
	for _, r := range written {
		if r <= rev {
			before++
		} else {
			after++
		}
	}
	wmu.Unlock()
	if before == 0 || after == 0 || rev < compact {
		t.Fatalf("snapshot at revision %d (compaction %d): %d writes at or before, %d after: the writer did not run across it", rev, compact, before, after)
	}
	if resp.Version != "3.6.0" {
		t.Errorf("snapshot storage version %q", resp.Version)
	}

	// etcd's trailer: size % 512 == 32, the sha256 of the rest.
	if len(raw)%512 != sha256.Size {
		t.Fatalf("snapshot of %d bytes: no sha256 trailer", len(raw))
	}
	if sum := sha256.Sum256(raw[:len(raw)-sha256.Size]); !bytes.Equal(sum[:], raw[len(raw)-sha256.Size:]) {
		t.Fatal("sha256 trailer does not match")
	}

	// The file: etcd's buckets and meta, and a history whose replay is
	// the keyspace at every revision from the compaction to R.
	hist := readKeyBucket(t, path, compact)
	if last := hist[len(hist)-1].rev; last != rev {
		t.Fatalf("the file's last revision %d, header revision %d", last, rev)
	}
	checks := []int64{compact, compact + 1, mid.Header.Revision, (compact + rev) / 2, rev - 1, rev}
	t.Logf("snapshot at revision %d, compaction %d: %d bytes, %d history entries; the writer wrote %d before and %d after", rev, compact, len(raw), len(hist), before, after)
	if p := os.Getenv("ETCDAPI_KEEP_SNAPSHOT"); p != "" {
		_ = os.WriteFile(p, raw, 0o600)
	}
	for _, r := range checks {
		want := rangeAt(t, ctx, cli, r)
		if got := replay(hist, r); !sameKVs(got, want) {
			t.Fatalf("the file at revision %d:\n%s\nthe cluster at %d:\n%s", r, dumpKVs(got), r, dumpKVs(want))
		}
	}
	if info, err := etcdapi.ReadSnapshotInfo(path, false); err != nil || info.Revision != rev || info.CompactRevision != compact || !info.HasHash {
		t.Fatalf("ReadSnapshotInfo = %+v, %v; want revision %d, compaction %d", info, err, rev, compact)
	}

	// A new cluster: a restore under way refuses reads and writes ...
	b := startCluster(t)
	conns := dialAll(t, b.Endpoints)
	bcli := client(t, b.Endpoints[1])
	info, err := etcdapi.ReadSnapshotInfo(path, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := etcdapi.BeginRestore(ctx, conns[2], info); err != nil {
		t.Fatal(err)
	}
	kv := pb.NewKVClient(conns[1]) // no retries, as clientv3 would
	_, gerr := kv.Range(ctx, &pb.RangeRequest{Key: []byte("h/k00")})
	_, perr := kv.Put(ctx, &pb.PutRequest{Key: []byte("x"), Value: []byte("y")})
	for _, err := range []error{gerr, perr} {
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "being restored") {
			t.Fatalf("during a restore: %v, want Unavailable (being restored)", err)
		}
	}
	// ... then resumes and completes, in small batches.
	batches := 0
	res, err := etcdapi.RestoreSnapshot(ctx, conns, path, etcdapi.RestoreOptions{BatchEntries: 37, Progress: func(int, int) { batches++ }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Revision != rev || res.CompactRevision != compact || res.Entries != len(hist) || batches < 2 {
		t.Fatalf("restore: %+v in %d batches; want revision %d, compaction %d, %d entries", res, batches, rev, compact, len(hist))
	}
	for _, r := range checks {
		want := rangeAt(t, ctx, cli, r)
		if got := rangeAt(t, ctx, bcli, r); !sameKVs(got, want) {
			t.Fatalf("restored cluster at revision %d:\n%s\nthe original at %d:\n%s", r, dumpKVs(got), r, dumpKVs(want))
		}
	}
	cur, err := bcli.Get(ctx, "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	if cur.Header.Revision != rev || !sameKVs(toMap(cur.Kvs), rangeAt(t, ctx, cli, rev)) || res.Keys != len(cur.Kvs) {
		t.Fatalf("restored keyspace at header revision %d (want %d), %d keys (restore counted %d)", cur.Header.Revision, rev, len(cur.Kvs), res.Keys)
	}
	if _, err := bcli.Get(ctx, "h/k00", clientv3.WithRev(compact-1)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("restored: a Range below the compaction: %v, want ErrCompacted", err)
	}
	// Watchers replay the same history from the compaction.
	if got, want := watchUpTo(t, ctx, bcli, compact, rev), watchUpTo(t, ctx, cli, compact, rev); got != want {
		t.Fatalf("restored history from %d, watched:\n%s\nthe original's:\n%s", compact, got, want)
	}
	// The keyspace goes on from R.
	p, err := bcli.Put(ctx, "h/k00", "new", clientv3.WithPrevKV())
	if err != nil || p.Header.Revision != rev+1 || p.PrevKv == nil {
		t.Fatalf("put after the restore: %+v, %v; want revision %d", p, err, rev+1)
	}
	if want := rangeAt(t, ctx, cli, rev)["h/k00"]; !proto.Equal(p.PrevKv, want) {
		t.Fatalf("restored h/k00 = %v, want %v", p.PrevKv, want)
	}

	// Run again: done already. Another snapshot: refused.
	if res, err := etcdapi.RestoreSnapshot(ctx, conns, path, etcdapi.RestoreOptions{}); err != nil || !res.AlreadyRestored {
		t.Fatalf("restore again: %+v, %v; want already restored", res, err)
	}
	other := filepath.Join(dir, "other.db")
	r2, err := client(t, a.Endpoints[0]).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw2, err := io.ReadAll(r2)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, raw2, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := etcdapi.RestoreSnapshot(ctx, conns, other, etcdapi.RestoreOptions{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("restore into a keyspace that is not empty: %v, want FailedPrecondition", err)
	}
}

type histEntry struct {
	rev       int64
	tombstone bool
	kv        *mvccpb.KeyValue
}

// readKeyBucket reads a snapshot file as etcd would: its buckets, its meta
// (the compaction revision must be compact; -1: none) and its key bucket.
func readKeyBucket(t *testing.T, path string, compact int64) []histEntry {
	t.Helper()
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var out []histEntry
	err = db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		for _, name := range []string{"key", "meta", "lease", "alarm", "cluster", "members", "members_removed", "auth", "authUsers", "authRoles"} {
			if tx.Bucket([]byte(name)) == nil {
				return fmt.Errorf("no bucket %q", name)
			}
		}
		meta := tx.Bucket([]byte("meta"))
		for _, k := range []string{"finishedCompactRev", "scheduledCompactRev"} {
			v := meta.Get([]byte(k))
			if compact < 0 && v != nil || compact >= 0 && (len(v) != 17 || int64(beUint64(v)) != compact) {
				return fmt.Errorf("meta %s = %x, want revision %d", k, v, compact)
			}
		}
		if len(meta.Get([]byte("consistent_index"))) != 8 || len(meta.Get([]byte("term"))) != 8 {
			return errors.New("meta: no consistent_index or term")
		}
		return tx.Bucket([]byte("key")).ForEach(func(k, v []byte) error {
			if (len(k) != 17 && len(k) != 18) || k[8] != '_' {
				return fmt.Errorf("key bucket key %x", k)
			}
			kv := &mvccpb.KeyValue{}
			if err := proto.Unmarshal(v, kv); err != nil {
				return err
			}
			e := histEntry{rev: int64(beUint64(k)), tombstone: len(k) == 18 && k[17] == 't', kv: kv}
			if !e.tombstone && kv.ModRevision != e.rev {
				return fmt.Errorf("entry at %d: mod revision %d", e.rev, kv.ModRevision)
			}
			out = append(out, e)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("empty key bucket")
	}
	return out
}

func beUint64(b []byte) uint64 {
	var v uint64
	for _, c := range b[:8] {
		v = v<<8 | uint64(c)
	}
	return v
}

// replay is the keyspace at rev as the file's history has it.
func replay(hist []histEntry, rev int64) map[string]*mvccpb.KeyValue {
	out := map[string]*mvccpb.KeyValue{}
	for _, e := range hist {
		if e.rev > rev {
			break
		}
		if e.tombstone {
			delete(out, string(e.kv.Key))
		} else {
			out[string(e.kv.Key)] = e.kv
		}
	}
	return out
}

func rangeAt(t *testing.T, ctx context.Context, cli *clientv3.Client, rev int64) map[string]*mvccpb.KeyValue {
	t.Helper()
	g, err := cli.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatalf("range at %d: %v", rev, err)
	}
	return toMap(g.Kvs)
}

func toMap(kvs []*mvccpb.KeyValue) map[string]*mvccpb.KeyValue {
	out := map[string]*mvccpb.KeyValue{}
	for _, kv := range kvs {
		out[string(kv.Key)] = kv
	}
	return out
}

func sameKVs(a, b map[string]*mvccpb.KeyValue) bool {
	if len(a) != len(b) {
		return false
	}
	for k, kv := range a {
		if !proto.Equal(kv, b[k]) {
			return false
		}
	}
	return true
}

func dumpKVs(m map[string]*mvccpb.KeyValue) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	for _, k := range keys {
		kv := m[k]
		fmt.Fprintf(&b, "  %q=%q create %d mod %d version %d\n", k, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version)
	}
	return b.String()
}

// watchUpTo renders every event a watch of the whole keyspace from
// `from` delivers up to revision `to`.
func watchUpTo(t *testing.T, ctx context.Context, cli *clientv3.Client, from, to int64) string {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var b bytes.Buffer
	for wr := range cli.Watch(wctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(from), clientv3.WithPrevKV()) {
		if err := wr.Err(); err != nil {
			t.Fatalf("watch from %d: %v", from, err)
		}
		done := false
		for _, ev := range wr.Events {
			if ev.Kv.ModRevision > to {
				return b.String()
			}
			fmt.Fprintf(&b, "%s %q=%q mod %d create %d version %d prev %v\n", ev.Type, ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision, ev.Kv.CreateRevision, ev.Kv.Version, ev.PrevKv)
			done = ev.Kv.ModRevision == to
		}
		if done { // a response holds whole revisions
			return b.String()
		}
	}
	t.Fatalf("watch from %d ended before revision %d", from, to)
	return ""
}

func dialAll(t *testing.T, endpoints []string) []grpc.ClientConnInterface {
	t.Helper()
	var out []grpc.ClientConnInterface
	for _, ep := range endpoints {
		conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		out = append(out, conn)
	}
	return out
}

// TestRestoreFromEtcdMember: a snapshot of a real etcd member (the etcd
// binary on PATH; skipped without one), with a compaction, a multi-op Txn
// and a key attached to a lease, restores into hedgekv with every
// revision as etcd has it: refused while it holds a lease, then with
// DropLeases the same Ranges at every revision from the compaction on,
// less the lease.
func TestRestoreFromEtcdMember(t *testing.T) {
	t.Parallel()
	bin, err := cluster.FindEtcd(os.Getenv("ETCD_BIN"))
	if err != nil {
		t.Skip(err)
	}
	ctx := ctxFor(t, 120*time.Second)
	e, err := cluster.StartEtcd(ctx, cluster.EtcdConfig{Binary: bin, Members: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	ecli := client(t, e.Endpoints[0])
	for i := range 40 {
		if _, err := ecli.Put(ctx, fmt.Sprintf("e/k%d", i%9), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		if i%6 == 5 {
			if _, err := ecli.Delete(ctx, fmt.Sprintf("e/k%d", (i+4)%9)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := ecli.Txn(ctx).Then(clientv3.OpPut("e/t1", "a"), clientv3.OpDelete("e/k2"), clientv3.OpPut("e/t2\x00", "b")).Commit(); err != nil {
		t.Fatal(err)
	}
	lease, err := ecli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ecli.Put(ctx, "e/leased", "l", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	g, err := ecli.Get(ctx, "e/k0")
	if err != nil {
		t.Fatal(err)
	}
	compact := g.Header.Revision - 10
	if _, err := ecli.Compact(ctx, compact, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	last, err := ecli.Put(ctx, "e/k1", "last")
	if err != nil {
		t.Fatal(err)
	}
	rev := last.Header.Revision
	r, err := ecli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "etcd.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}

	h := startCluster(t)
	conns := dialAll(t, h.Endpoints)
	if _, err := etcdapi.RestoreSnapshot(ctx, conns, path, etcdapi.RestoreOptions{}); err == nil || !strings.Contains(err.Error(), "lease") {
		t.Fatalf("restore of a snapshot with a lease: %v, want refused", err)
	}
	res, err := etcdapi.RestoreSnapshot(ctx, conns, path, etcdapi.RestoreOptions{DropLeases: true, BatchEntries: 7})
	if err != nil {
		t.Fatal(err)
	}
	if res.Revision != rev || res.CompactRevision != compact || res.LeasedKeys != 1 {
		t.Fatalf("restore: %+v; want revision %d, compaction %d, one leased key", res, rev, compact)
	}
	hcli := client(t, h.Endpoints[2])
	for r := compact; r <= rev; r++ {
		want := rangeAt(t, ctx, ecli, r)
		if kv := want["e/leased"]; kv != nil {
			kv.Lease = 0
		}
		if got := rangeAt(t, ctx, hcli, r); !sameKVs(got, want) {
			t.Fatalf("restored at revision %d:\n%s\netcd at %d:\n%s", r, dumpKVs(got), r, dumpKVs(want))
		}
	}
	if _, err := hcli.Get(ctx, "e/k0", clientv3.WithRev(compact-1)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("a Range below the compaction: %v, want ErrCompacted", err)
	}
	if p, err := hcli.Put(ctx, "e/after", "x"); err != nil || p.Header.Revision != rev+1 {
		t.Fatalf("put after the restore: %+v, %v; want revision %d", p, err, rev+1)
	}
}

// TestSnapshotManyRecords: a keyspace whose history spans several of the
// snapshot file's write transactions (made small here) and several
// restore steps by size comes back whole.
func TestSnapshotManyRecords(t *testing.T) {
	t.Parallel()
	a := startCluster(t, &etcdapi.TestingKnobs{BackendBatch: 1000})
	ctx := ctxFor(t, 120*time.Second)
	cli := client(t, a.Endpoints[0])
	value := strings.Repeat("v", 250)
	const txns, ops = 24, 128 // 128: etcd's default --max-txn-ops
	for i := range txns {
		var puts []clientv3.Op
		for j := range ops {
			puts = append(puts, clientv3.OpPut(fmt.Sprintf("m/%05d", (i*ops+j)%2000), fmt.Sprint(value, i)))
		}
		if _, err := cli.Txn(ctx).Then(puts...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	r, err := cli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "snap.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if hist := readKeyBucket(t, path, -1); len(hist) != txns*ops {
		t.Fatalf("%d history entries, want %d", len(hist), txns*ops)
	}
	b := startCluster(t)
	steps := 0
	res, err := etcdapi.RestoreSnapshot(ctx, dialAll(t, b.Endpoints), path, etcdapi.RestoreOptions{BatchBytes: 256 << 10, Progress: func(int, int) { steps++ }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != txns*ops || res.Keys != 2000 || steps < 3 {
		t.Fatalf("restore: %+v in %d steps", res, steps)
	}
	for _, rev := range []int64{res.Revision, res.Revision / 2} {
		if got, want := rangeAt(t, ctx, client(t, b.Endpoints[1]), rev), rangeAt(t, ctx, cli, rev); !sameKVs(got, want) {
			t.Fatalf("restored at %d: %d keys, want %d", rev, len(got), len(want))
		}
	}
}
