// Package layout names everything a store keeps on disk: its files and
// directories, bbolt's buckets, and every key in them. It is the one place
// to read (and change) the on-disk format; the engine and the replication
// layer above it take their names from here.
//
// # Files, in the data directory
//
//	store.db          bbolt: the state machine, the raft log, raft and apply state (below)
//	store.ckpt        the last checkpoint: bbolt's two meta pages as of its last sync,
//	                  magic "HKVCKPT1" | page size(4) | crc32c(4) | pages; written to
//	                  store.ckpt.tmp, synced, renamed, the directory synced
//	store.lock        flock'd while a process has the store open
//	wal/<seq>.wal     round-log segments (package storage/wal has the record format)
//	snap/             snapshot files received and not yet applied (<region>-<index>-<n>.hkvs)
//
// # bbolt buckets and keys
//
//	data        user key -> value (all regions share it: regions are key ranges)
//	raftlog     regionID(8) | index(8) -> raftpb.Entry
//	raftstate   regionID(8) | 'h' -> raftpb.HardState
//	            regionID(8) | 'a' -> apply state: applied index, term, truncated index, term (4×8)
//	            regionID(8) | 'r' -> region meta (region.Region as JSON; small and rarely written; the first region's carries the cluster's region ID counter)
//	            regionID(8) | 'd' -> the region's dedup clock base(8) (absent: 0)
//	            regionID(8) | 't' | peerID(8) -> a tombstone for a peer removed here: empty, or,
//	                                             for a region a merge absorbed, the absorbing region's ID(8)
//	            regionID(8) | 's' | peerID(8) -> a snapshot apply in progress (JSON marker)
//	            regionID(8) | 'c' | peerID(8) -> a range clear in progress (JSON marker)
//	meta        "store_id" -> storeID(8)
//	            "cluster_id" -> the cluster's ID(8), from its cluster token: raft from another cluster is refused
//	            "incarnation" -> the store's incarnation(8)
//	            "next_id" -> this store's peer ID counter, n of its last n<<16|store(8)
//	            "wal_seq" -> the last round-log record this state holds(8)
//	            "disk-probe" -> written and deleted at once (a probe of a failed disk)
//	dedup3      the write-dedup table, keyed by user key (raftstore/dedup.go)
//
// Integers are big-endian unless a comment says otherwise. The layout is
// versioned by bucket name: a bucket of an older layout found on open is
// converted (dedup2, dedup2idx) or dropped (dedup, dedupidx) explicitly
// before anything reads the store, never misread.
package layout

// Files and directories in the data directory.
const (
	BoltFile       = "store.db"
	CheckpointFile = "store.ckpt"
	LockFile       = "store.lock"
	WALDir         = "wal"
	SnapDir        = "snap"
)

// Buckets.
var (
	BucketData      = []byte("data")
	BucketRaftLog   = []byte("raftlog")
	BucketRaftState = []byte("raftstate")
	BucketMeta      = []byte("meta")
	BucketDedup     = []byte("dedup3")

	// Older layouts: BucketsDedupV1 is dropped on open, the V2 pair
	// converted into BucketDedup.
	BucketsDedupV1   = [][]byte{[]byte("dedup"), []byte("dedupidx")}
	BucketDedupV2    = []byte("dedup2")    // regionID(8) | id(8) -> index(8) | user key
	BucketDedupV2Idx = []byte("dedup2idx") // regionID(8) | index(8) | id(8) -> nil
)

// Keys in BucketMeta.
var (
	KeyStoreID     = []byte("store_id")
	KeyClusterID   = []byte("cluster_id")
	KeyIncarnation = []byte("incarnation")
	KeyNextID      = []byte("next_id")
	KeyWALSeq      = []byte("wal_seq")
	KeyDiskProbe   = []byte("disk-probe") // written and deleted by a disk probe: never present
)

// Suffixes of a region's keys in BucketRaftState (after its ID).
const (
	SuffixHardState  byte = 'h'
	SuffixApplyState byte = 'a'
	SuffixRegion     byte = 'r'
	SuffixDedupBase  byte = 'd'
	SuffixTombstone  byte = 't'
	SuffixSnapApply  byte = 's'
	SuffixClear      byte = 'c'
)
