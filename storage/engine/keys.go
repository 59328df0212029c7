package engine

import "github.com/hedgekv/hedgekv/storage/layout"

// The store's on-disk names, all defined (and documented) in
// storage/layout; the short names here keep the engine code
// readable.
const (
	ckptFile = layout.CheckpointFile
	boltFile = layout.BoltFile
	snapDir  = layout.SnapDir
	walDir   = layout.WALDir
	lockFile = layout.LockFile

	suffixHardState  = layout.SuffixHardState
	suffixApplyState = layout.SuffixApplyState
	suffixRegion     = layout.SuffixRegion
	suffixDedupBase  = layout.SuffixDedupBase
	suffixTombstone  = layout.SuffixTombstone
	suffixSnapApply  = layout.SuffixSnapApply
	suffixClear      = layout.SuffixClear
)

var (
	bucketData       = layout.BucketData
	bucketRaftLog    = layout.BucketRaftLog
	bucketRaftState  = layout.BucketRaftState
	bucketMeta       = layout.BucketMeta
	bucketDedup      = layout.BucketDedup
	bucketsDedupV1   = layout.BucketsDedupV1
	bucketDedupV2    = layout.BucketDedupV2
	bucketDedupV2Idx = layout.BucketDedupV2Idx

	keyStoreID     = layout.KeyStoreID
	keyClusterID   = layout.KeyClusterID
	keyIncarnation = layout.KeyIncarnation
	keyNextID      = layout.KeyNextID
	keyWALSeq      = layout.KeyWALSeq
	keyDiskProbe   = layout.KeyDiskProbe
)
