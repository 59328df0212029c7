package etcdmvcc

// A HistRef names one history record of a key for compaction: its
// revision and whether it is a deletion.
type HistRef struct {
	Rev    Revision
	Delete bool
}

// CompactPrefix says which of one key's history records a compaction at
// compactRev removes: the first n of hist, which must be in revision order.
// It is what etcd's keyIndex.compact (server/storage/mvcc/key_index.go)
// keeps: of the records at or below compactRev only the newest stays, so
// that a read at any revision ≥ compactRev still finds the key's state,
// and that one goes too if it is a deletion below compactRev (the key is
// absent then and needs no record). A deletion at exactly compactRev stays,
// as in etcd (its "compact(5)" example), so a watch from compactRev still
// sees it. A put and a deletion of the key in the same revision count as
// two records: the put goes. Records above compactRev all stay.
func CompactPrefix(hist []HistRef, compactRev int64) int {
	n := 0 // records at or below compactRev
	for n < len(hist) && hist[n].Rev.Main <= compactRev {
		n++
	}
	if n == 0 {
		return 0
	}
	if last := hist[n-1]; last.Delete && last.Rev.Main < compactRev {
		return n
	}
	return n - 1
}
