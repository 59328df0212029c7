package raftstore

import (
	"testing"
)

// TestDecideReadTable runs the cases of testdata/read_path.txt: the facts
// that hold, and the path decideRead must choose.
func TestDecideReadTable(t *testing.T) {
	eachCase(t, "testdata/read_path.txt", 20, func(line int, facts []string, want string) {
		var rf readFacts
		for _, name := range facts {
			field, known := readFactFields(&rf)[name]
			if !known {
				t.Fatalf("line %d: unknown fact %q", line, name)
			}
			*field = true
		}
		if got := decideRead(rf).String(); got != want {
			t.Errorf("line %d: %v -> %s: got %s", line, facts, want, got)
		}
	})
}

func readFactFields(f *readFacts) map[string]*bool {
	return map[string]*bool{
		"disk": &f.diskFailed, "lease": &f.leaderLease, "leader": &f.leader, "replica": &f.replicaRead,
		"fl": &f.followerLease, "stale-allowed": &f.staleAllowed, "stale-ok": &f.staleOK, "local": &f.local,
	}
}

// TestDecideReadPromises checks every combination of facts against the
// promises the read path keeps, whatever the table lists: no lease read
// without a valid lease, no stale read the session did not allow or that
// cannot be served, nothing but a stale read or a refusal from a frozen
// store, and no follower read for a session that did not ask for one.
func TestDecideReadPromises(t *testing.T) {
	for bits := range 1 << 8 {
		var f readFacts
		fields := []*bool{&f.diskFailed, &f.leaderLease, &f.leader, &f.replicaRead, &f.followerLease, &f.staleAllowed, &f.staleOK, &f.local}
		for i, p := range fields {
			*p = bits&(1<<i) != 0
		}
		// Facts the store cannot produce together.
		if (f.leaderLease && !f.leader) || (f.followerLease && (f.leader || !f.replicaRead)) || (f.staleOK && !f.staleAllowed) {
			continue
		}
		path := decideRead(f)
		if f.local && !f.diskFailed {
			// A read that asked for the local state gets it, whatever
			// else holds; the promises below are about the others.
			if path != readLocal {
				t.Errorf("%+v: %s, want local", f, path)
			}
			continue
		}
		switch {
		case path == readLease && !f.leaderLease,
			path == readFollowerLease && !f.followerLease,
			path == readStale && !(f.staleAllowed && f.staleOK),
			f.diskFailed && path != readStale && path != readRefuseDisk,
			!f.diskFailed && !f.leader && !f.replicaRead && !f.staleAllowed && path != readNotLeader,
			!f.leader && !f.replicaRead && path == readIndex,
			path == readNotLeader && f.leader,
			path == readLocal:
			t.Errorf("%+v: %s breaks a promise", f, path)
		}
	}
}
