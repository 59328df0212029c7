package kvpb

import (
	"crypto/sha256"
	"fmt"

	"github.com/hedgekv/hedgekv/replica"
)

// FromDigest and ToDigest convert a replica digest to and from the wire.
func FromDigest(d replica.Digest) *RegionDigestResponse {
	return &RegionDigestResponse{
		StoreId: d.StoreID, PeerId: d.PeerID, Region: FromRegion(d.Region),
		AppliedIndex: d.AppliedIndex, AppliedTerm: d.AppliedTerm, Keys: d.Keys, Bytes: d.Bytes,
		Hash: d.Hash[:], DedupRecords: d.DedupRecords, DedupHash: d.DedupHash[:],
	}
}

// ToDigest is FromDigest's inverse; a hash of the wrong length (a broken
// or foreign peer) is an error, not a digest that compares as different.
func ToDigest(r *RegionDigestResponse) (replica.Digest, error) {
	d := replica.Digest{
		StoreID: r.GetStoreId(), PeerID: r.GetPeerId(), Region: r.GetRegion().ToRegion(),
		AppliedIndex: r.GetAppliedIndex(), AppliedTerm: r.GetAppliedTerm(), Keys: r.GetKeys(), Bytes: r.GetBytes(),
		DedupRecords: r.GetDedupRecords(),
	}
	if len(r.GetHash()) != sha256.Size || len(r.GetDedupHash()) != sha256.Size {
		return replica.Digest{}, fmt.Errorf("store %d: region digest with a %d-byte hash", r.GetStoreId(), len(r.GetHash()))
	}
	copy(d.Hash[:], r.GetHash())
	copy(d.DedupHash[:], r.GetDedupHash())
	return d, nil
}
