package region

import (
	"errors"
	"fmt"
	"io"
	"testing"
)

func TestErrorMessages(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"not leader, unknown", &NotLeaderError{RegionID: 3}, "region 3: not leader, leader unknown"},
		{"not leader, hint", &NotLeaderError{RegionID: 3, Leader: &Peer{ID: 31, StoreID: 2}}, "region 3: not leader, leader is peer 31 on store 2"},
		{"epoch not match, none", &EpochNotMatchError{RegionID: 4}, "region 4: epoch not match (0 current regions)"},
		{"epoch not match, two", &EpochNotMatchError{RegionID: 4, Current: []Region{rg(4, "", "m"), rg(5, "m", "")}}, "region 4: epoch not match (2 current regions)"},
		{"not found", &RegionNotFoundError{RegionID: 9}, "region 9 not found"},
		{"key not in region", &KeyNotInRegionError{Key: []byte("z"), RegionID: 1, StartKey: []byte("a"), EndKey: []byte("m")}, `key "z" not in region 1 ["a", "m")`},
		{"key not in region, open bounds", &KeyNotInRegionError{Key: nil, RegionID: 1}, `key "" not in region 1 ["", "")`},
		{"key not in region, binary", &KeyNotInRegionError{Key: []byte{0, 0xff}, RegionID: 1, StartKey: []byte{1}}, `key "\x00\xff" not in region 1 ["\x01", "")`},
		{"data not ready", &DataIsNotReadyError{RegionID: 2, PeerID: 21, SafeAge: 1500}, "region 2 peer 21: data is not ready (safe point age 1500ms)"},
		{"data not ready, no safe point", &DataIsNotReadyError{RegionID: 2, PeerID: 21}, "region 2 peer 21: data is not ready (safe point age 0ms)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Fatalf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestIsRegionError(t *testing.T) {
	typed := []error{
		&NotLeaderError{RegionID: 1},
		&EpochNotMatchError{RegionID: 1},
		&RegionNotFoundError{RegionID: 1},
		&KeyNotInRegionError{RegionID: 1},
		&DataIsNotReadyError{RegionID: 1},
	}
	wraps := []struct {
		name string
		wrap func(error) error
	}{
		{"bare", func(e error) error { return e }},
		{"%w", func(e error) error { return fmt.Errorf("get: %w", e) }},
		{"%w twice", func(e error) error { return fmt.Errorf("rpc: %w", fmt.Errorf("get: %w", e)) }},
		{"errors.Join", func(e error) error { return errors.Join(io.EOF, e) }},
		{"multi %w", func(e error) error { return fmt.Errorf("a: %w, b: %w", io.EOF, e) }},
	}
	for _, e := range typed {
		for _, w := range wraps {
			t.Run(fmt.Sprintf("%T/%s", e, w.name), func(t *testing.T) {
				err := w.wrap(e)
				if !IsRegionError(err) {
					t.Fatalf("IsRegionError(%v) = false", err)
				}
			})
		}
	}

	notRegion := []struct {
		name string
		err  error
	}{
		{"nil", nil},
		{"plain", errors.New("region 1 not found")},
		{"io.EOF", io.EOF},
		{"wrapped plain", fmt.Errorf("x: %w", io.ErrUnexpectedEOF)},
		{"%v does not wrap", fmt.Errorf("x: %v", &NotLeaderError{RegionID: 1})},
		{"value not pointer", NotLeaderErrorValue{}},
	}
	for _, tt := range notRegion {
		t.Run("not/"+tt.name, func(t *testing.T) {
			if IsRegionError(tt.err) {
				t.Fatalf("IsRegionError(%v) = true", tt.err)
			}
		})
	}
}

// NotLeaderErrorValue is an unrelated error type with a similar name, to make
// sure IsRegionError matches the real types only.
type NotLeaderErrorValue struct{}

func (NotLeaderErrorValue) Error() string { return "not leader" }

func TestErrorsAsThroughWrapping(t *testing.T) {
	leader := &Peer{ID: 7, StoreID: 3}
	err := fmt.Errorf("client: %w", fmt.Errorf("send: %w", &NotLeaderError{RegionID: 5, Leader: leader}))
	var nl *NotLeaderError
	if !errors.As(err, &nl) {
		t.Fatal("errors.As NotLeaderError failed")
	}
	if nl.RegionID != 5 || nl.Leader == nil || *nl.Leader != *leader {
		t.Fatalf("unwrapped %+v", nl)
	}
	var en *EpochNotMatchError
	if errors.As(err, &en) {
		t.Fatal("NotLeaderError matched EpochNotMatchError")
	}

	cur := []Region{rg(5, "", "m"), rg(6, "m", "")}
	err = fmt.Errorf("route: %w", &EpochNotMatchError{RegionID: 5, Current: cur})
	if !errors.As(err, &en) || en.RegionID != 5 || len(en.Current) != 2 || en.Current[1].ID != 6 {
		t.Fatalf("errors.As EpochNotMatchError = %+v", en)
	}

	var rn *RegionNotFoundError
	err = errors.Join(io.EOF, fmt.Errorf("w: %w", &RegionNotFoundError{RegionID: 8}))
	if !errors.As(err, &rn) || rn.RegionID != 8 {
		t.Fatalf("errors.As RegionNotFoundError = %+v", rn)
	}

	var kn *KeyNotInRegionError
	err = fmt.Errorf("w: %w", &KeyNotInRegionError{Key: []byte("k"), RegionID: 2, StartKey: []byte("a"), EndKey: []byte("c")})
	if !errors.As(err, &kn) || string(kn.Key) != "k" || string(kn.StartKey) != "a" || string(kn.EndKey) != "c" {
		t.Fatalf("errors.As KeyNotInRegionError = %+v", kn)
	}

	var dr *DataIsNotReadyError
	err = fmt.Errorf("w: %w", &DataIsNotReadyError{RegionID: 2, PeerID: 3, SafeAge: 10})
	if !errors.As(err, &dr) || dr.PeerID != 3 || dr.SafeAge != 10 {
		t.Fatalf("errors.As DataIsNotReadyError = %+v", dr)
	}
	if errors.As(err, &kn) && kn.RegionID == 2 && string(kn.Key) != "k" {
		t.Fatal("DataIsNotReadyError matched KeyNotInRegionError")
	}
}
