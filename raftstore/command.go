package raftstore

import (
	"encoding/binary"
	"fmt"
)

// A command is the payload of a normal raft entry: one write.
//
//	op(1) | proposalID(8) | uvarint len(key) | key | value
//
// The proposal ID lets the proposing leader find the waiter to wake when the
// entry is applied; other replicas ignore it. An opApply's key only routes
// it (it must lie in the region when the entry applies) and its value is
// the payload for Config.Applier (applier.go).
type cmdOp byte

const (
	opPut cmdOp = iota + 1
	opDelete
	opSplit // key: the split key; value: encodeSplit
	opApply // key: routes it; value: the Applier's payload (Store.Propose)
	// opAllocRegionID takes the next region ID from the cluster's counter
	// (region.Region.LastRegionID); key: empty (the first region); value:
	// the proposer's floor, 8 bytes (regionid.go).
	opAllocRegionID
	// The merge's entries (merge.go). key: the region's start key.
	opPrepareMerge  // on the source: freeze it; value: encodePrepareMerge
	opCommitMerge   // on the target: absorb the source; value: encodeCommitMerge
	opAbortMerge    // on the target: refuse the freeze's commit for good; value: encodeCommitMerge
	opRollbackMerge // on the source: unfreeze, once the target aborted; value: encodeRollbackMerge
)

type command struct {
	op    cmdOp
	id    uint64
	key   []byte
	value []byte
}

func (c command) encode() []byte {
	b := make([]byte, 0, 1+8+binary.MaxVarintLen64+len(c.key)+len(c.value))
	b = append(b, byte(c.op))
	b = binary.BigEndian.AppendUint64(b, c.id)
	b = binary.AppendUvarint(b, uint64(len(c.key)))
	b = append(b, c.key...)
	return append(b, c.value...)
}

func decodeCommand(b []byte) (command, error) {
	if len(b) < 9 {
		return command{}, fmt.Errorf("command: short entry (%d bytes): %w", len(b), errCorrupt)
	}
	c := command{op: cmdOp(b[0]), id: binary.BigEndian.Uint64(b[1:9])}
	rest := b[9:]
	n, w := binary.Uvarint(rest)
	if w <= 0 || uint64(len(rest)-w) < n {
		return command{}, fmt.Errorf("command: bad key length: %w", errCorrupt)
	}
	c.key = rest[w : w+int(n)]
	c.value = rest[w+int(n):]
	switch c.op {
	case opPut, opDelete, opSplit, opApply, opAllocRegionID, opPrepareMerge, opCommitMerge, opAbortMerge, opRollbackMerge:
	default:
		return command{}, fmt.Errorf("command: unknown op %d: %w", c.op, errCorrupt)
	}
	return c, nil
}
