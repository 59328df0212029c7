package raftstore

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Filter decides the fate of one message on the in-memory network. Faults
// are values composed on the network, not branches in the code under test
// (like TiKV's simulated transport filters).
type Filter interface {
	// Apply returns drop=true to lose m, or a delay before delivering it.
	Apply(m *Message) (drop bool, delay time.Duration)
}

// FilterFunc adapts a function to Filter.
type FilterFunc func(m *Message) (bool, time.Duration)

func (f FilterFunc) Apply(m *Message) (bool, time.Duration) { return f(m) }

// DropFilter loses each message with probability Prob.
func DropFilter(prob float64) Filter {
	return FilterFunc(func(*Message) (bool, time.Duration) { return rand.Float64() < prob, 0 })
}

// DelayFilter delays every message by d plus up to jitter.
func DelayFilter(d, jitter time.Duration) Filter {
	return FilterFunc(func(*Message) (bool, time.Duration) {
		if jitter <= 0 {
			return false, d
		}
		return false, d + rand.N(jitter)
	})
}

// PartitionFilter cuts every link between the stores of side a and the rest.
func PartitionFilter(a ...uint64) Filter {
	in := make(map[uint64]bool, len(a))
	for _, id := range a {
		in[id] = true
	}
	return FilterFunc(func(m *Message) (bool, time.Duration) { return in[m.FromStore] != in[m.ToStore], 0 })
}

// IsolateFilter cuts one store off from all others, both directions.
func IsolateFilter(store uint64) Filter { return PartitionFilter(store) }

// OneWayFilter drops messages from one store to another only.
func OneWayFilter(from, to uint64) Filter {
	return FilterFunc(func(m *Message) (bool, time.Duration) { return m.FromStore == from && m.ToStore == to, 0 })
}

// MsgTypeFilter restricts inner to raft messages of the given types (no
// notice is one).
func MsgTypeFilter(inner Filter, types ...raftpb.MessageType) Filter {
	return FilterFunc(func(m *Message) (bool, time.Duration) {
		if m.Notice != nil {
			return false, 0
		}
		for _, t := range types {
			if m.Msg.Type == t {
				return inner.Apply(m)
			}
		}
		return false, 0
	})
}

// NoticeKindFilter restricts inner to notices of the given kinds.
func NoticeKindFilter(inner Filter, kinds ...NoticeKind) Filter {
	return FilterFunc(func(m *Message) (bool, time.Duration) {
		if m.Notice == nil {
			return false, 0
		}
		for _, k := range kinds {
			if m.Notice.Kind == k {
				return inner.Apply(m)
			}
		}
		return false, 0
	})
}

// InmemNetwork connects stores in one process. Messages are marshalled and
// unmarshalled on the way, as on a wire, so no memory is shared.
type InmemNetwork struct {
	mu       sync.RWMutex
	handlers map[uint64]Handler
	filters  map[int]Filter
	nextID   int
	wg       sync.WaitGroup
}

// NewInmemNetwork returns an empty network.
func NewInmemNetwork() *InmemNetwork {
	return &InmemNetwork{handlers: make(map[uint64]Handler), filters: make(map[int]Filter)}
}

// Register attaches a store's handler; messages to it are delivered.
func (n *InmemNetwork) Register(storeID uint64, h Handler) {
	n.mu.Lock()
	n.handlers[storeID] = h
	n.mu.Unlock()
}

// Unregister detaches a store (stopped or crashed): messages to it are lost.
func (n *InmemNetwork) Unregister(storeID uint64) {
	n.mu.Lock()
	delete(n.handlers, storeID)
	n.mu.Unlock()
}

// AddFilter installs f and returns a function that removes it.
func (n *InmemNetwork) AddFilter(f Filter) (remove func()) {
	n.mu.Lock()
	id := n.nextID
	n.nextID++
	n.filters[id] = f
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		delete(n.filters, id)
		n.mu.Unlock()
	}
}

// ClearFilters removes every filter (heals the network).
func (n *InmemNetwork) ClearFilters() {
	n.mu.Lock()
	n.filters = make(map[int]Filter)
	n.mu.Unlock()
}

// Wait blocks until delayed deliveries and snapshot streams in flight have
// landed or been lost.
func (n *InmemNetwork) Wait() { n.wg.Wait() }

// Transport returns the endpoint a store sends through.
func (n *InmemNetwork) Transport(storeID uint64) Transport {
	return &inmemTransport{net: n, from: storeID}
}

type inmemTransport struct {
	net  *InmemNetwork
	from uint64

	mu    sync.Mutex
	queue []*Message
}

func (t *inmemTransport) Send(m *Message) {
	// Copy through the wire format now: the caller may reuse m.
	c := &Message{RegionID: m.RegionID, FromStore: m.FromStore, ToStore: m.ToStore, FromConfVer: m.FromConfVer, LeaseHorizon: m.LeaseHorizon}
	if m.SafePoint != nil {
		sp := *m.SafePoint
		sp.Time = time.Unix(0, sp.Time.UnixNano()) // wall clock only, as on a wire
		c.SafePoint = &sp
	}
	if n := m.Notice; n != nil {
		nc := *n
		if n.Lease != nil {
			l := *n.Lease
			nc.Lease = &l
		}
		c.Notice = &nc
	} else {
		data, err := m.Msg.Marshal()
		if err != nil {
			return
		}
		if err := c.Msg.Unmarshal(data); err != nil {
			return
		}
	}
	t.mu.Lock()
	t.queue = append(t.queue, c)
	t.mu.Unlock()
}

func (t *inmemTransport) Flush() {
	t.mu.Lock()
	q := t.queue
	t.queue = nil
	t.mu.Unlock()
	for _, m := range q {
		t.net.deliver(t.from, m)
	}
}

func (n *InmemNetwork) deliver(from uint64, m *Message) {
	n.mu.RLock()
	var delay time.Duration
	drop := false
	for _, f := range n.filters {
		d, dl := f.Apply(m)
		drop = drop || d
		delay = max(delay, dl)
	}
	to, ok := n.handlers[m.ToStore]
	src := n.handlers[from]
	n.mu.RUnlock()
	if !ok || drop {
		if src != nil {
			if m.Msg.Type == raftpb.MsgSnap {
				src.ReportSnapshot(m, false)
			}
			src.ReportUnreachable(m.RegionID, m.ToPeer())
		}
		return
	}
	// A snapshot goes on its own goroutine even undelayed, as the gRPC
	// transport sends one: streaming a region of tens of MB (paced) must
	// not hold the sender's Ready loop, and with it every region of its
	// store, for seconds.
	if delay == 0 && m.Msg.Type != raftpb.MsgSnap {
		n.handle(src, to, m)
		return
	}
	n.wg.Add(1)
	time.AfterFunc(delay, func() {
		defer n.wg.Done()
		n.mu.RLock()
		to, ok := n.handlers[m.ToStore]
		n.mu.RUnlock()
		if ok {
			n.handle(src, to, m)
		} else if src != nil && m.Msg.Type == raftpb.MsgSnap {
			src.ReportSnapshot(m, false)
		}
	})
}

func (n *InmemNetwork) handle(src, to Handler, m *Message) {
	var err error
	if m.Msg.Type == raftpb.MsgSnap && m.Msg.Snapshot != nil && IsSnapshotDescriptor(m.Msg.Snapshot.Data) {
		err = streamSnapshot(src, to, m)
	} else {
		err = to.HandleRaftMessage(m)
	}
	if m.Msg.Type == raftpb.MsgSnap && src != nil {
		src.ReportSnapshot(m, err == nil)
	}
}

// streamSnapshot carries a streamed snapshot from src to dst as the gRPC
// transport does, without the chunks.
func streamSnapshot(src, dst Handler, m *Message) error {
	from, ok := src.(SnapshotSource)
	into, ok2 := dst.(SnapshotReceiver)
	if !ok || !ok2 {
		return fmt.Errorf("region %d: snapshot cannot be streamed: %w", m.RegionID, ErrInvalidRequest)
	}
	r, err := from.OpenSnapshot(m)
	if err != nil {
		return err
	}
	defer r.Close()
	return into.ReceiveSnapshot(m, r)
}
