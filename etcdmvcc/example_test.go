package etcdmvcc_test

import (
	"fmt"

	"github.com/hedgekv/hedgekv/etcdmvcc"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// A state machine's apply loop over a MemStore: check, apply at the next
// revision, commit, and the header revision etcd would send.
func ExampleApply() {
	ms := etcdmvcc.NewMemStore()
	rev := int64(1) // a new etcd is at revision 1
	apply := func(req *pb.RequestOp) {
		if err := etcdmvcc.CheckRequest(req, etcdmvcc.DefaultMaxTxnOps); err != nil {
			fmt.Println("refused:", err)
			return
		}
		resp, writes, events, err := etcdmvcc.Apply(ms, rev+1, req)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		if len(writes) > 0 {
			rev++ // only a request that changed something takes a revision
			if err := etcdmvcc.Commit(ms, writes); err != nil {
				panic(err)
			}
		}
		fmt.Printf("header revision %d, %d events\n", rev, len(events))
		if t := resp.GetResponseTxn(); t != nil {
			fmt.Println("  succeeded:", t.Succeeded)
			for _, r := range t.Responses {
				if rr := r.GetResponseRange(); rr != nil {
					for _, kv := range rr.Kvs {
						fmt.Printf("  %s=%s version %d\n", kv.Key, kv.Value, kv.Version)
					}
				}
			}
		}
	}

	apply(&pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("config"), Value: []byte("v1")}}})
	// Compare-and-set: replace config only if nobody changed it since.
	apply(&pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
		Compare: []*pb.Compare{{Key: []byte("config"), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL,
			TargetUnion: &pb.Compare_ModRevision{ModRevision: 2}}},
		Success: []*pb.RequestOp{
			{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("config"), Value: []byte("v2")}}},
			{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("config")}}},
		},
	}}})
	// The same again fails its compare and changes nothing.
	apply(&pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
		Compare: []*pb.Compare{{Key: []byte("config"), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL,
			TargetUnion: &pb.Compare_ModRevision{ModRevision: 2}}},
		Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("config"), Value: []byte("v3")}}}},
	}}})

	// Read as of revision 2.
	atRev, err := etcdmvcc.ReadRev(2, ms.CompactRev(), rev)
	if err != nil {
		panic(err)
	}
	old, err := etcdmvcc.Range(ms, &pb.RangeRequest{Key: []byte("config")}, atRev)
	if err != nil {
		panic(err)
	}
	fmt.Printf("at 2: %s\n", old.Kvs[0].Value)

	// Output:
	// header revision 2, 1 events
	// header revision 3, 1 events
	//   succeeded: true
	//   config=v2 version 2
	// header revision 3, 0 events
	//   succeeded: false
	// at 2: v1
}
