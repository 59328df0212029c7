package etcdctl

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hedgekv/hedgekv/test/testbin"
)

// rangeJSON is etcdctl get -w json's answer.
type rangeJSON struct {
	Header struct {
		Revision int64 `json:"revision"`
	} `json:"header"`
	Kvs []map[string]any `json:"kvs"`
}

func (c *cluster) getJSON(args ...string) rangeJSON {
	c.t.Helper()
	var r rangeJSON
	if err := json.Unmarshal([]byte(c.ctl("", append([]string{"get", "-w", "json"}, args...)...)), &r); err != nil {
		c.t.Fatal(err)
	}
	return r
}

// TestEtcdctlSnapshot: etcdctl snapshot save against one store writes a
// file etcd's tools take (the sha256 trailer, and, when bin/etcdutl is
// built (make etcdutl) or ETCDUTL_BIN names one, etcdutl snapshot status
// with the keyspace's revision and key count, and etcdutl snapshot
// restore), and hedgekv etcd-restore brings it up in a second cluster
// with the same keys, values, revisions and versions.
func TestEtcdctlSnapshot(t *testing.T) {
	c := startCluster(t)
	for i := range 5 {
		c.ctl("", "put", fmt.Sprintf("snap/k%d", i), fmt.Sprintf("v%d", i))
	}
	c.ctl("", "put", "snap/k0", "again")
	c.ctl("", "del", "snap/k4")
	before := c.getJSON("snap/", "--prefix")
	rev := before.Header.Revision
	c.ctl("", "compaction", fmt.Sprint(rev-2))

	file := filepath.Join(c.dir, "snap.db")
	if out := c.ctl(c.endpoint(1), "snapshot", "save", file); !strings.Contains(out, "Snapshot saved at "+file) {
		t.Fatalf("etcdctl snapshot save: %q", out)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw)%512 != sha256.Size {
		t.Fatalf("snapshot of %d bytes: no sha256 trailer", len(raw))
	}
	if sum := sha256.Sum256(raw[:len(raw)-sha256.Size]); !bytes.Equal(sum[:], raw[len(raw)-sha256.Size:]) {
		t.Fatal("sha256 trailer does not match the file")
	}

	utl := os.Getenv("ETCDUTL_BIN")
	if utl == "" {
		utl = filepath.Join(repoRoot, "bin", "etcdutl")
	}
	if _, err := os.Stat(utl); err != nil {
		t.Logf("etcdutl not found at %s (make etcdutl, or ETCDUTL_BIN): the trailer was checked here instead", utl)
	} else {
		r := testbin.Run(repoRoot, ctlTimeout, c.env, utl, "snapshot", "status", file, "-w", "json")
		var st struct {
			Revision int64  `json:"revision"`
			TotalKey int    `json:"totalKey"`
			Version  string `json:"version"`
		}
		if r.Err != nil || json.Unmarshal([]byte(r.Stdout), &st) != nil {
			t.Fatalf("etcdutl snapshot status: %v", r)
		}
		if st.Revision != rev || st.TotalKey != len(before.Kvs) || st.Version != "3.6.0" {
			t.Fatalf("etcdutl snapshot status: %+v; want revision %d, %d keys", st, rev, len(before.Kvs))
		}
		if r := testbin.Run(repoRoot, ctlTimeout, c.env, utl, "snapshot", "restore", file, "--data-dir", filepath.Join(c.dir, "restored.etcd")); r.Err != nil {
			t.Fatalf("etcdutl snapshot restore: %v", r)
		}
	}

	d := startCluster(t)
	r := testbin.Run(repoRoot, 60*time.Second, d.env, binPath, "etcd-restore", "--from", file, "--endpoints", d.endpoints)
	if want := fmt.Sprintf("restored %s: revision %d, compaction %d,", file, rev, rev-2); r.Err != nil || !strings.HasPrefix(r.Stdout, want) {
		t.Fatalf("hedgekv etcd-restore: %v; want %q...", r, want)
	}
	after := d.getJSON("snap/", "--prefix")
	if after.Header.Revision != rev || !reflect.DeepEqual(after.Kvs, before.Kvs) {
		t.Fatalf("restored: revision %d, %v; want revision %d, %v", after.Header.Revision, after.Kvs, rev, before.Kvs)
	}
	if _, err := d.try("", "get", "snap/k0", "--rev", fmt.Sprint(rev-3)); err == nil || !strings.Contains(err.Error(), "compacted") {
		t.Fatalf("restored: get below the compaction: %v, want compacted", err)
	}
	d.ctl("", "put", "snap/k9", "new")
	if got := d.getJSON("snap/k9").Header.Revision; got != rev+1 {
		t.Fatalf("restored: the next write at revision %d, want %d", got, rev+1)
	}
	// Again: done already.
	if r := testbin.Run(repoRoot, 60*time.Second, d.env, binPath, "etcd-restore", "--from", file, "--endpoints", d.endpoints); r.Err != nil || !strings.Contains(r.Stdout, "restored into this keyspace already") {
		t.Fatalf("hedgekv etcd-restore again: %v", r)
	}
}
