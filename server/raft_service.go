package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgekv/hedgekv/kvpb"
	"github.com/hedgekv/hedgekv/raftstore"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxSnapshotSize bounds how much snapshot data one Snapshot stream may
// carry, so a broken or hostile peer cannot make this store buffer without
// limit.
const maxSnapshotSize = 2 << 30

// raftService is the receiving end of the transport: it hands every raft
// message that another store sends to the local handler (the Store).
type raftService struct {
	kvpb.UnimplementedRaftServer
	storeID uint64
	handler raftstore.Handler
	logger  *slog.Logger

	// done ends the long-lived inbound streams at shutdown; without it
	// GracefulStop would wait for peers that never close their streams.
	done     chan struct{}
	stopOnce sync.Once
	// receivers tracks the goroutines reading inbound streams, so shutdown
	// can wait until none of them touches the handler any more.
	receivers sync.WaitGroup

	batches atomic.Uint64 // batches received; read by tests

	// onStream, if set, is told the sending store of every new inbound
	// stream (on its first batch), before its messages are delivered: a
	// store that (re)connects may have restarted with other zone
	// addresses. Set before serving.
	onStream func(fromStore uint64)
	// waitStall, if set, holds inbound raft messages while an injected
	// stall is in progress (see faults.go). Set before serving.
	waitStall func(ctx context.Context) error
	// allocRegionID serves AllocRegionID (the store's); set before
	// serving.
	allocRegionID func(ctx context.Context) (uint64, error)
}

func newRaftService(storeID uint64, h raftstore.Handler, logger *slog.Logger) *raftService {
	return &raftService{storeID: storeID, handler: h, logger: logger, done: make(chan struct{})}
}

// stop ends every inbound stream and waits for their receivers.
func (s *raftService) stop() {
	s.stopOnce.Do(func() { close(s.done) })
}

// wait blocks until every receiver goroutine has returned. Call after the
// gRPC server has stopped, which unblocks their Recv calls.
func (s *raftService) wait() { s.receivers.Wait() }

// Stream receives batches of raft messages from one store until it closes
// the stream or this server stops.
func (s *raftService) Stream(stream grpc.ClientStreamingServer[kvpb.RaftMessageBatch, kvpb.Done]) error {
	return s.serve(func() error {
		first := true
		for {
			batch, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return stream.SendAndClose(&kvpb.Done{})
			}
			if err != nil {
				return err
			}
			if s.waitStall != nil {
				if err := s.waitStall(stream.Context()); err != nil {
					return err
				}
			}
			s.batches.Add(1)
			if first && len(batch.GetMsgs()) > 0 {
				first = false
				if s.onStream != nil {
					s.onStream(batch.GetMsgs()[0].GetFromStore())
				}
			}
			for _, rm := range batch.GetMsgs() {
				if err := s.deliver(rm, false, nil); err != nil {
					return err
				}
			}
		}
	})
}

// Snapshot receives one MsgSnap from its chunks. A streamed snapshot (its
// data a descriptor, raftstore.IsSnapshotDescriptor) goes to the store as
// a stream (raftstore.SnapshotReceiver), which checks it and writes it to a
// file as the chunks arrive: at most a chunk of it is in memory here. Any
// other is reassembled and delivered whole. It answers with an error if
// the store refuses the snapshot, so the sender reports the failure to
// raft.
func (s *raftService) Snapshot(stream grpc.ClientStreamingServer[kvpb.SnapshotChunk, kvpb.Done]) error {
	return s.serve(func() error {
		first, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return status.Error(codes.InvalidArgument, "empty snapshot stream")
		}
		if err != nil {
			return err
		}
		header := first.GetHeader()
		if header == nil {
			return status.Error(codes.InvalidArgument, "snapshot stream does not start with a header")
		}
		m, err := s.decode(header)
		if err != nil {
			return err
		}
		if m.Msg.Type != raftpb.MsgSnap || m.Msg.Snapshot == nil {
			return status.Errorf(codes.InvalidArgument, "snapshot header is a %s, not a MsgSnap", m.Msg.Type)
		}
		data := &chunkReader{stream: stream, buf: first.GetData(), n: int64(len(first.GetData()))}
		if recv, ok := s.handler.(raftstore.SnapshotReceiver); ok && raftstore.IsSnapshotDescriptor(m.Msg.Snapshot.Data) {
			if s.waitStall != nil {
				if err := s.waitStall(stream.Context()); err != nil {
					return err
				}
			}
			if err := recv.ReceiveSnapshot(m, data); err != nil {
				if data.err != nil {
					return data.err // the stream broke or overflowed
				}
				return toStatus(fmt.Errorf("receive snapshot of region %d: %w", m.RegionID, err))
			}
			return stream.SendAndClose(&kvpb.Done{})
		}
		whole, err := io.ReadAll(data)
		if err != nil {
			return err
		}
		if s.waitStall != nil {
			if err := s.waitStall(stream.Context()); err != nil {
				return err
			}
		}
		if err := s.deliver(header, true, whole); err != nil {
			return err
		}
		return stream.SendAndClose(&kvpb.Done{})
	})
}

// chunkReader reads a snapshot's data from its chunks, at most
// maxSnapshotSize bytes.
type chunkReader struct {
	stream grpc.ClientStreamingServer[kvpb.SnapshotChunk, kvpb.Done]
	buf    []byte
	n      int64
	err    error // the stream's own failure, if any
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		c, err := r.stream.Recv()
		if errors.Is(err, io.EOF) {
			return 0, io.EOF
		}
		if err != nil {
			r.err = err
			return 0, err
		}
		r.buf = c.GetData()
		if r.n += int64(len(r.buf)); r.n > maxSnapshotSize {
			r.err = status.Errorf(codes.ResourceExhausted, "snapshot over %d bytes", maxSnapshotSize)
			return 0, r.err
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// serve runs recv on its own goroutine so the handler can return as soon as
// the server stops, which ends the stream and unblocks recv.
func (s *raftService) serve(recv func() error) error {
	select {
	case <-s.done:
		return status.Error(codes.Unavailable, "server stopping")
	default:
	}
	s.receivers.Add(1)
	errc := make(chan error, 1)
	go func() {
		defer s.receivers.Done()
		errc <- recv()
	}()
	select {
	case err := <-errc:
		return err
	case <-s.done:
		return status.Error(codes.Unavailable, "server stopping")
	}
}

// decode checks and decodes one message addressed to this store.
func (s *raftService) decode(rm *kvpb.RaftMessage) (*raftstore.Message, error) {
	if rm.GetToStore() != s.storeID {
		return nil, status.Errorf(codes.InvalidArgument, "raft message for store %d arrived at store %d", rm.GetToStore(), s.storeID)
	}
	m := &raftstore.Message{RegionID: rm.GetRegionId(), FromStore: rm.GetFromStore(), ToStore: rm.GetToStore(), FromConfVer: rm.GetFromConfVer(),
		LeaseHorizon: time.Duration(rm.GetLeaseHorizonNanos())}
	if sp := rm.GetSafePoint(); sp != nil {
		m.SafePoint = &raftstore.SafePoint{Term: sp.GetTerm(), Commit: sp.GetCommit(), Time: time.Unix(0, sp.GetTimeUnixNano())}
	}
	if pn := rm.GetNotice(); pn != nil {
		// A notice is carried instead of a raft message, never with one.
		if len(rm.GetMessage()) > 0 {
			return nil, status.Errorf(codes.InvalidArgument, "raft message of region %d carries both a raft message and a notice", rm.GetRegionId())
		}
		n, ok := noticeFromPB(pn)
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "notice of region %d has an unknown kind %d", rm.GetRegionId(), pn.GetKind())
		}
		m.Notice = n
		return m, nil
	}
	if err := m.Msg.Unmarshal(rm.GetMessage()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "decode raft message of region %d: %v", rm.GetRegionId(), err)
	}
	return m, nil
}

// deliver decodes one message and steps it into the store. For a snapshot,
// rm is the MsgSnap header and snapData the reassembled payload.
//
// A message the handler refuses (unknown region, store stopping) is only
// logged: raft resends what matters. A message that does not decode, or is
// addressed to another store, means the peer is broken or misconfigured, so
// the stream is refused and the sender sees it.
func (s *raftService) deliver(rm *kvpb.RaftMessage, snap bool, snapData []byte) error {
	m, err := s.decode(rm)
	if err != nil {
		return err
	}
	if snap {
		if m.Notice != nil || m.Msg.Type != raftpb.MsgSnap || m.Msg.Snapshot == nil {
			return status.Errorf(codes.InvalidArgument, "snapshot header is a %s, not a MsgSnap", m.TypeName())
		}
		m.Msg.Snapshot.Data = snapData
	}
	if s.handler == nil {
		return status.Error(codes.Unavailable, "raft handler not ready")
	}
	if err := s.handler.HandleRaftMessage(m); err != nil {
		if snap {
			return toStatus(fmt.Errorf("apply snapshot of region %d: %w", m.RegionID, err))
		}
		s.logger.Debug("raft message refused", "region", m.RegionID, "from_store", m.FromStore,
			"type", m.TypeName(), "err", err)
	}
	return nil
}
