package raftstore

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
)

// TestLeaseRulesTable runs testdata/lease.txt: each line a lease rule, its
// inputs and the verdict.
func TestLeaseRulesTable(t *testing.T) {
	epoch := time.Unix(1_000_000, 0)
	at := func(ms uint64) time.Time { return epoch.Add(time.Duration(ms) * time.Millisecond) }
	inputs := map[string]bool{
		"role": true, "term": true, "lead": true, "transferee": true, "transferring": true, "lease-term": true,
		"until": true, "applied-term": true, "now": true, "held-term": true, "held-leader": true, "commit": true,
		"applied": true, "removed": true, "initialized": true,
	}
	eachCase(t, "testdata/lease.txt", 20, func(line int, fields []string, want string) {
		if len(fields) == 0 {
			t.Fatalf("line %d: no rule", line)
		}
		in := map[string]string{}
		for _, kv := range fields[1:] {
			k, v, has := strings.Cut(kv, "=")
			if !inputs[k] {
				t.Fatalf("line %d: unknown input %q", line, k)
			}
			if !has {
				v = "true"
			}
			in[k] = v
		}
		num := func(k string) uint64 {
			if in[k] == "" {
				return 0
			}
			n, err := strconv.ParseUint(in[k], 10, 64)
			if err != nil {
				t.Fatalf("line %d: %s=%q: %v", line, k, in[k], err)
			}
			return n
		}
		st := raft.BasicStatus{}
		st.Term, st.Lead, st.LeadTransferee = num("term"), num("lead"), num("transferee")
		switch in["role"] {
		case "leader":
			st.RaftState = raft.StateLeader
		case "follower":
			st.RaftState = raft.StateFollower
		case "candidate":
			st.RaftState = raft.StateCandidate
		default:
			t.Fatalf("line %d: role %q", line, in["role"])
		}
		var got bool
		switch fields[0] {
		case "leader":
			l := lease{term: num("lease-term")}
			if l.term != 0 {
				l.until = at(num("until"))
			}
			got = leaseReadable(l, st, in["transferring"] == "true", num("applied-term"), at(num("now")))
		case "follower":
			h := heldLease{term: num("held-term"), leader: num("held-leader"), until: at(num("until")), commit: num("commit")}
			got = heldLeaseReadable(h, st, in["removed"] == "true", in["initialized"] == "true", num("applied"), at(num("now")))
		default:
			t.Fatalf("line %d: unknown rule %q", line, fields[0])
		}
		if strconv.FormatBool(got) != want {
			t.Errorf("line %d: %v -> %s: got %v", line, fields, want, got)
		}
	})
}
