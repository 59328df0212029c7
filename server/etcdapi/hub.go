package etcdapi

import "sync"

// hub tells a store's watch feed, and its watchers still reading on their
// own, that the Applier applied a new revision here: they then read what
// it wrote (history, in revision order) from the store's state. Nothing
// takes an event from the hub itself, so a reader that is slow, or that
// starts between an apply and the end of its round, misses nothing: the
// state is the only source of events.
type hub struct {
	mu  sync.Mutex
	rev int64
	ch  chan struct{} // closed at the next revision
}

func newHub() *hub { return &hub{ch: make(chan struct{})} }

// applied records that rev was applied (its round may still be running).
func (h *hub) applied(rev int64) {
	h.mu.Lock()
	if rev > h.rev {
		h.rev = rev
	}
	close(h.ch)
	h.ch = make(chan struct{})
	h.mu.Unlock()
}

// next returns a channel closed at the next applied revision, and the last
// one applied.
func (h *hub) next() (<-chan struct{}, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ch, h.rev
}
