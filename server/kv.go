package server

import (
	"context"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"github.com/hedgekv/hedgekv/readmode"
	"github.com/hedgekv/hedgekv/region"
)

// kvService is the KV gRPC service: it validates a request, maps it onto
// the store and maps the answer (or the region error) back.
type kvService struct {
	kvpb.UnimplementedKVServer
	store   *raftstore.Store
	load    *loadTracker
	metrics *metrics
	faults  *faultInjector
}

func (s *kvService) Get(ctx context.Context, req *kvpb.GetRequest) (*kvpb.GetResponse, error) {
	if err := validateUserKey("key", req.GetKey()); err != nil {
		return nil, err
	}
	var (
		value []byte
		found bool
	)
	info, load, err := s.serveRead(ctx, req.GetContext(), func(ctx context.Context) (info raftstore.ReadInfo, err error) {
		value, found, info, err = s.store.Get(ctx, readOptions(req.GetContext()), req.GetKey())
		return info, err
	})
	if err != nil {
		return nil, err
	}
	return &kvpb.GetResponse{Value: value, NotFound: !found, ReadInfo: info, Load: load}, nil
}

func (s *kvService) BatchGet(ctx context.Context, req *kvpb.BatchGetRequest) (*kvpb.BatchGetResponse, error) {
	if err := validateBatchGet(req); err != nil {
		return nil, err
	}
	if len(req.GetKeys()) == 0 {
		// Nothing to read and no region to route to.
		return &kvpb.BatchGetResponse{Load: s.load.load()}, nil
	}
	var kvs []raftstore.KV
	info, load, err := s.serveRead(ctx, req.GetContext(), func(ctx context.Context) (info raftstore.ReadInfo, err error) {
		kvs, info, err = s.store.BatchGet(ctx, readOptions(req.GetContext()), req.GetKeys())
		return info, err
	})
	if err != nil {
		return nil, err
	}
	return &kvpb.BatchGetResponse{Pairs: fromKVs(kvs), ReadInfo: info, Load: load}, nil
}

func (s *kvService) Scan(ctx context.Context, req *kvpb.ScanRequest) (*kvpb.ScanResponse, error) {
	limit, err := validateScan(req)
	if err != nil {
		return nil, err
	}
	// Never the etcd API's keyspace (validate.go, scanReadRange).
	readEnd, none := scanReadRange(req.GetStartKey(), req.GetEndKey())
	if none {
		limit = 0
	}
	var (
		kvs []raftstore.KV
		r   region.Region
	)
	info, load, err := s.serveRead(ctx, req.GetContext(), func(ctx context.Context) (info raftstore.ReadInfo, err error) {
		kvs, r, info, err = s.store.Scan(ctx, readOptions(req.GetContext()), req.GetStartKey(), readEnd, limit)
		return info, err
	})
	if err != nil {
		return nil, err
	}
	return &kvpb.ScanResponse{
		Pairs:        fromKVs(kvs),
		ReadInfo:     info,
		Load:         load,
		RegionEndKey: scanRegionEnd(req.GetStartKey(), req.GetEndKey(), r.EndKey),
	}, nil
}

// serveRead runs one validated KV read: it refuses the read as busy if the
// request's threshold is below this store's estimated wait, applies an
// injected read delay, and counts the read in the load every answer
// reports (the injected delay included, so that clients see a slow store
// as slow) and in the metrics.
func (s *kvService) serveRead(ctx context.Context, rc *kvpb.ReadContext, read func(context.Context) (raftstore.ReadInfo, error)) (*kvpb.ReadInfo, *kvpb.Load, error) {
	hedge := rc.GetHedge()
	s.metrics.observeReadStart(hedge)
	if th := msDuration(rc.GetBusyThresholdMs()); th > 0 {
		if wait := s.load.estimatedWait(time.Now()); wait > th {
			s.metrics.observeReadBusy()
			return nil, nil, toStatus(&region.ServerIsBusyError{StoreID: s.store.ID(), EstimatedWait: wait})
		}
	}
	start := s.load.begin()
	err := s.faults.delayRead(ctx)
	var info raftstore.ReadInfo
	if err == nil {
		info, err = read(ctx)
		err = toStatus(err)
	}
	s.load.end(start)
	if err != nil {
		s.metrics.observeReadFailed(ctx, hedge)
		return nil, nil, err
	}
	s.metrics.observeRead(info.Mode, time.Since(start))
	return fromReadInfo(info), s.load.load(), nil
}

func (s *kvService) Put(ctx context.Context, req *kvpb.PutRequest) (*kvpb.PutResponse, error) {
	if err := validateUserKey("key", req.GetKey()); err != nil {
		return nil, err
	}
	if err := validateValue(req.GetValue()); err != nil {
		return nil, err
	}
	if err := s.store.Put(ctx, writeOptions(req.GetContext()), req.GetKey(), req.GetValue()); err != nil {
		return nil, toStatus(err)
	}
	return &kvpb.PutResponse{}, nil
}

func (s *kvService) Delete(ctx context.Context, req *kvpb.DeleteRequest) (*kvpb.DeleteResponse, error) {
	if err := validateUserKey("key", req.GetKey()); err != nil {
		return nil, err
	}
	if err := s.store.Delete(ctx, writeOptions(req.GetContext()), req.GetKey()); err != nil {
		return nil, toStatus(err)
	}
	return &kvpb.DeleteResponse{}, nil
}

func fromReadInfo(info raftstore.ReadInfo) *kvpb.ReadInfo {
	out := &kvpb.ReadInfo{StoreId: info.StoreID, PeerId: info.PeerID, Mode: kvpb.FromReadMode(info.Mode), LeaderStoreId: info.LeaderStoreID}
	if info.Mode == readmode.Stale {
		// Round up: a bound under 1ms must not read as "not stale at all".
		d := max(info.StalenessBound, 0)
		out.StalenessBoundMs = uint64(d / time.Millisecond)
		if d%time.Millisecond != 0 {
			out.StalenessBoundMs++
		}
	}
	return out
}

func fromKVs(kvs []raftstore.KV) []*kvpb.KvPair {
	if len(kvs) == 0 {
		return nil
	}
	out := make([]*kvpb.KvPair, len(kvs))
	for i, kv := range kvs {
		out[i] = &kvpb.KvPair{Key: kv.Key, Value: kv.Value}
	}
	return out
}
