package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Span is what the engine knows of a region: its ID and key range. The
// engine stores a region's metadata as the bytes it is given and reads
// only these three fields of them (the metadata is JSON, and its fields
// ID, StartKey and EndKey are a region's identity and range), to check
// that a snapshot's keys lie in its region and to find the ranges the
// store holds.
type Span struct {
	ID       uint64
	StartKey []byte
	EndKey   []byte // empty: no bound
}

// Contains reports whether key falls in the span's range.
func (s *Span) Contains(key []byte) bool {
	return bytes.Compare(key, s.StartKey) >= 0 && (len(s.EndKey) == 0 || bytes.Compare(key, s.EndKey) < 0)
}

func (s Span) String() string {
	return fmt.Sprintf("region %d [%q, %q)", s.ID, s.StartKey, s.EndKey)
}

// DecodeSpan reads a region's ID and range from its metadata.
func DecodeSpan(meta []byte) (Span, error) {
	var s Span
	if err := json.Unmarshal(meta, &s); err != nil {
		return Span{}, fmt.Errorf("decode region meta: %v: %w", err, ErrCorrupt)
	}
	return s, nil
}
