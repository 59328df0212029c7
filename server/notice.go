package server

import (
	"math"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
)

// noticeToPB is a raftstore notice on the wire (kvpb.RaftMessage.notice).
// The kinds' numbers are the same on both sides.
func noticeToPB(n *raftstore.Notice) *kvpb.Notice {
	pn := &kvpb.Notice{Kind: kvpb.NoticeKind(n.Kind), From: n.From, To: n.To, Term: n.Term, Commit: n.Commit}
	if l := n.Lease; l != nil {
		pn.Lease = &kvpb.LeaseMsg{Instance: l.Instance, Seq: l.Seq, Commit: l.Commit, DurationNanos: uint64(max(l.Duration, 0))}
	}
	return pn
}

// noticeFromPB decodes a notice off the wire; ok is false for a kind this
// store does not know.
func noticeFromPB(pn *kvpb.Notice) (n *raftstore.Notice, ok bool) {
	k := pn.GetKind()
	if k < 0 || k > math.MaxUint8 || !raftstore.NoticeKind(k).Valid() {
		return nil, false
	}
	n = &raftstore.Notice{Kind: raftstore.NoticeKind(k), From: pn.GetFrom(), To: pn.GetTo(), Term: pn.GetTerm(), Commit: pn.GetCommit()}
	if l := pn.GetLease(); l != nil {
		n.Lease = &raftstore.LeaseMsg{Instance: l.GetInstance(), Seq: l.GetSeq(), Commit: l.GetCommit(), Duration: time.Duration(min(l.GetDurationNanos(), uint64(math.MaxInt64)))}
	}
	return n, true
}
