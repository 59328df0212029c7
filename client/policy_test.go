package client

import "testing"

func TestParseReplicaPolicy(t *testing.T) {
	tests := []struct {
		in      string
		want    ReplicaPolicy
		wantErr bool
	}{
		{"leader", ReplicaLeader, false},
		{"follower", ReplicaFollower, false},
		{"mixed", ReplicaMixed, false},
		{"closest", ReplicaClosest, false},
		{"prefer-leader", ReplicaPreferLeader, false},
		{"", 0, true},
		{"Leader", 0, true},
		{"nearest", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseReplicaPolicy(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseReplicaPolicy(%q) error %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if err == nil && got != tt.want {
			t.Errorf("ParseReplicaPolicy(%q) = %v, want %v", tt.in, got, tt.want)
		}
		if err == nil && got.String() != tt.in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tt.in)
		}
	}
	if s := ReplicaPolicy(42).String(); s != "ReplicaPolicy(42)" {
		t.Errorf("unknown policy prints %q", s)
	}
}
