package netsim

import (
	"sync"
	"sync/atomic"

	"github.com/Shopify/toxiproxy/v2/toxics"
)

// gateToxicType is the toxiproxy type name of gateToxic.
const gateToxicType = "hedgekv_gate"

var registerGate sync.Once

// gate is the state one link's gate toxics share (one toxic per direction):
// whether the link is blackholed, and the bytes that passed it.
type gate struct {
	mu   sync.Mutex
	shut chan struct{} // non-nil while blackholed; closed when opened again
	n    atomic.Uint64
}

// wait returns a channel to wait on while the gate is shut, nil when open.
func (g *gate) wait() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shut
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

// gateToxic is the first toxic of every link, in both directions. While its
// gate is shut it takes nothing from its input, so data stops where it is
// (in toxiproxy's channels, then the kernel's socket buffers, then the
// sender's writes block), as TCP behaves while a partition drops and
// retransmits its segments; when the gate opens, the held data flows on in
// order. It also counts the bytes that pass.
//
// It is installed before the proxy starts and never removed or updated, so
// partitions neither add nor remove toxics at run time (toxiproxy issues
// #148 and #558).
type gateToxic struct {
	g *gate // set right after AddToxicJson, before the proxy starts
}

func (t *gateToxic) Pipe(stub *toxics.ToxicStub) {
	for {
		if w := t.g.wait(); w != nil {
			select {
			case <-stub.Interrupt:
				return
			case <-w:
			}
			continue
		}
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			// Shut between the check and the receive: hold this chunk too.
			if w := t.g.wait(); w != nil {
				select {
				case <-stub.Interrupt:
					t.g.n.Add(uint64(len(c.Data)))
					stub.Output <- c // never drop data
					return
				case <-w:
				}
			}
			t.g.n.Add(uint64(len(c.Data)))
			stub.Output <- c
		}
	}
}
